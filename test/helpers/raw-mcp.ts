/**
 * Raw JSON-RPC over HTTP to a gateway's /mcp, for the tests that must see
 * exactly what a client sees (error codes and messages, notifications on a
 * POST stream), in both protocol eras: a session (initialize, then requests
 * with Mcp-Session-Id) and single 2026-07-28 requests (headers mirroring
 * the body).
 */
import { INIT_HEADERS, sseMessages } from './gateway-harness.ts'

export type Message = Record<string, any>

/** Every JSON-RPC message of a POST answer, SSE or JSON. */
async function messagesOf(res: Response): Promise<Message[]> {
  const text = await res.text()
  if ((res.headers.get('content-type') ?? '').startsWith('application/json')) {
    const json = JSON.parse(text) as Message | Message[]
    return Array.isArray(json) ? json : [json]
  }
  return sseMessages(text)
}

export interface RawSession {
  readonly id: string
  /** One request: its answer (the message with its id) and everything the POST stream carried before it. */
  call(method: string, params?: Record<string, unknown>): Promise<{ answer: Message; notes: Message[] }>
  /** A JSON-RPC batch (protocol 2025-03-26 only): the answers by id. */
  batch(requests: Array<{ method: string; params?: Record<string, unknown> }>): Promise<Map<number, Message>>
  close(): Promise<void>
}

export async function openSession(url: string, protocolVersion = '2025-11-25'): Promise<RawSession> {
  const init = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    }),
  })
  const id = init.headers.get('mcp-session-id')
  const [first] = await messagesOf(init)
  if (id === null || first?.result === undefined) throw new Error(`initialize failed: ${init.status} ${JSON.stringify(first)}`)
  const headers = { ...INIT_HEADERS, 'mcp-session-id': id, 'mcp-protocol-version': protocolVersion }
  await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) }).then(r => r.arrayBuffer())
  let seq = 0
  return {
    id,
    async call(method, params = {}) {
      const rid = ++seq
      const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: rid, method, params }) })
      const all = await messagesOf(res)
      const answer = all.find(m => m.id === rid)
      if (answer === undefined) throw new Error(`${method}: no answer (status ${res.status}): ${JSON.stringify(all)}`)
      return { answer, notes: all.filter(m => m !== answer) }
    },
    async batch(requests) {
      const body = requests.map(r => ({ jsonrpc: '2.0', id: ++seq, method: r.method, params: r.params ?? {} }))
      const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) })
      const out = new Map<number, Message>()
      for (const m of await messagesOf(res)) if (typeof m.id === 'number') out.set(m.id, m)
      if (out.size !== body.length) throw new Error(`batch: ${out.size} of ${body.length} answered (status ${res.status})`)
      return new Map(body.map((b, i) => [i, out.get(b.id)!]))
    },
    async close() {
      await fetch(url, { method: 'DELETE', headers }).then(r => r.arrayBuffer())
    },
  }
}

export const MODERN = '2026-07-28'

/** One 2026-07-28 request: the answer's status and its final JSON-RPC message. */
export async function modernCall(url: string, method: string, params: Record<string, unknown> = {}, id = 1): Promise<{ status: number; answer: Message }> {
  const body = {
    jsonrpc: '2.0',
    id,
    method,
    params: {
      ...params,
      _meta: {
        'io.modelcontextprotocol/protocolVersion': MODERN,
        'io.modelcontextprotocol/clientCapabilities': {},
        'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
      },
    },
  }
  const headers: Record<string, string> = { ...INIT_HEADERS, 'mcp-protocol-version': MODERN, 'mcp-method': method }
  const name = params.name ?? params.uri
  if (typeof name === 'string') headers['mcp-name'] = name
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) })
  const all = await messagesOf(res)
  const answer = all.findLast(m => m.id === id)
  if (answer === undefined) throw new Error(`${method}: no answer (status ${res.status}): ${JSON.stringify(all)}`)
  return { status: res.status, answer }
}

/**
 * Opens a 2026-07-28 `subscriptions/listen` stream, reads its first message (the
 * acknowledgement, MCP 2026-07-28 Subscriptions) and closes the stream.
 */
export async function listenAck(url: string, notifications: Record<string, unknown>): Promise<Message> {
  const ac = new AbortController()
  const res = await fetch(url, {
    method: 'POST',
    signal: ac.signal,
    headers: { ...INIT_HEADERS, 'mcp-protocol-version': MODERN, 'mcp-method': 'subscriptions/listen' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 'listen-1',
      method: 'subscriptions/listen',
      params: {
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientCapabilities': {},
          'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
        },
        notifications,
      },
    }),
  })
  if (res.body === null) throw new Error(`subscriptions/listen: no stream (status ${res.status})`)
  const reader = res.body.getReader()
  const decoder = new TextDecoder()
  let text = ''
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) throw new Error(`subscriptions/listen ended before its acknowledgement: ${text}`)
      text += decoder.decode(value, { stream: true })
      const [first] = sseMessages(text.slice(0, text.lastIndexOf('\n\n') + 2))
      if (first !== undefined) return first
    }
  } finally {
    ac.abort()
  }
}
