/**
 * The load generator's HTTP side: node:http with a keep-alive Agent whose
 * sockets are bounded, and a minimal streamable-HTTP MCP client (initialize,
 * notifications/initialized, tools/call echo, DELETE) that reads every answer
 * whole, JSON or SSE, and checks it is a result for the id it sent.
 */
import { Agent, request } from 'node:http'

export interface HttpAnswer {
  readonly status: number
  readonly headers: Record<string, string | string[] | undefined>
  readonly body: string
}

export function makeAgent(maxSockets: number): Agent {
  return new Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets, scheduling: 'fifo' })
}

export function send(agent: Agent, url: URL, method: string, headers: Record<string, string>, body?: string): Promise<HttpAnswer> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        agent,
        method,
        host: url.hostname,
        port: url.port,
        path: url.pathname + url.search,
        headers: body === undefined ? headers : { ...headers, 'content-length': Buffer.byteLength(body) },
      },
      res => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
        res.on('error', reject)
      }
    )
    req.on('error', reject)
    req.end(body)
  })
}

let nextId = 1
/** A fresh JSON-RPC id for every request of the run. */
export function freshId(): number {
  return nextId++
}

export const PROTOCOL_VERSION = '2025-06-18'

export function initializeBody(id: number): string {
  return JSON.stringify({
    jsonrpc: '2.0',
    id,
    method: 'initialize',
    params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'mcp-proxy-bench', version: '1' } },
  })
}

export function echoBody(id: number): string {
  return JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { message: `m${id}` } } })
}

/** Finds the JSON-RPC response with `id` in a JSON or SSE body; throws on an error or a missing answer. */
export function expectResult(ans: HttpAnswer, id: number, what: string): unknown {
  if (ans.status !== 200) throw new Error(`${what}: HTTP ${ans.status}: ${ans.body.slice(0, 300)}`)
  const ct = String(ans.headers['content-type'] ?? '')
  const candidates: string[] = ct.includes('text/event-stream')
    ? ans.body
        .split('\n')
        .filter(l => l.startsWith('data:'))
        .map(l => l.slice(5).trim())
    : [ans.body]
  for (const c of candidates) {
    if (c === '') continue
    const m = JSON.parse(c) as { id?: unknown; result?: unknown; error?: { message?: string } }
    if (m.id !== id) continue
    if (m.error !== undefined) throw new Error(`${what}: JSON-RPC error ${m.error.message ?? ''}`)
    return m.result
  }
  throw new Error(`${what}: no answer for id ${id} in ${ans.body.slice(0, 300)}`)
}

/** One streamable-HTTP MCP session (or none, for the bare bridge). */
export class McpHttpSession {
  readonly url: URL
  readonly agent: Agent
  readonly baseHeaders: Record<string, string>
  sessionId: string | undefined

  constructor(url: string, agent: Agent, extraHeaders: Record<string, string> = {}) {
    this.url = new URL(url)
    this.agent = agent
    this.baseHeaders = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...extraHeaders }
  }

  headers(): Record<string, string> {
    return this.sessionId === undefined ? this.baseHeaders : { ...this.baseHeaders, 'mcp-session-id': this.sessionId, 'mcp-protocol-version': PROTOCOL_VERSION }
  }

  async initialize(): Promise<void> {
    const id = freshId()
    const ans = await send(this.agent, this.url, 'POST', this.baseHeaders, initializeBody(id))
    expectResult(ans, id, 'initialize')
    const sid = ans.headers['mcp-session-id']
    this.sessionId = typeof sid === 'string' ? sid : undefined
    const note = await send(this.agent, this.url, 'POST', this.headers(), JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }))
    if (note.status !== 202 && note.status !== 200) throw new Error(`notifications/initialized: HTTP ${note.status}: ${note.body.slice(0, 200)}`)
  }

  async echo(): Promise<void> {
    const id = freshId()
    const ans = await send(this.agent, this.url, 'POST', this.headers(), echoBody(id))
    const result = expectResult(ans, id, 'tools/call') as { content?: Array<{ text?: string }> }
    if (result.content?.[0]?.text?.endsWith(`m${id}`) !== true) throw new Error(`tools/call: unexpected result ${JSON.stringify(result).slice(0, 200)}`)
  }

  async close(): Promise<void> {
    if (this.sessionId === undefined) return
    const ans = await send(this.agent, this.url, 'DELETE', this.headers())
    if (ans.status >= 300 && ans.status !== 405) throw new Error(`DELETE: HTTP ${ans.status}: ${ans.body.slice(0, 200)}`)
    this.sessionId = undefined
  }
}

const MODERN = '2026-07-28'

/**
 * Revision 2026-07-28 calls: no session, every request carries its protocol
 * version and client info in `_meta` and mirrors method and name in headers
 * (MCP 2026-07-28, Streamable HTTP), so any replica or worker serves it.
 */
export class ModernClient {
  readonly url: URL
  readonly agent: Agent
  readonly headers: Record<string, string>

  constructor(url: string, agent: Agent, extraHeaders: Record<string, string> = {}) {
    this.url = new URL(url)
    this.agent = agent
    this.headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN,
      'mcp-method': 'tools/call',
      'mcp-name': 'echo',
      ...extraHeaders,
    }
  }

  async echo(): Promise<void> {
    const id = freshId()
    const body = JSON.stringify({
      jsonrpc: '2.0',
      id,
      method: 'tools/call',
      params: {
        name: 'echo',
        arguments: { message: `m${id}` },
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientCapabilities': {},
          'io.modelcontextprotocol/clientInfo': { name: 'mcp-proxy-bench', version: '1' },
        },
      },
    })
    const result = expectResult(await send(this.agent, this.url, 'POST', this.headers, body), id, 'tools/call (2026-07-28)') as {
      content?: Array<{ text?: string }>
    }
    if (result.content?.[0]?.text?.endsWith(`m${id}`) !== true)
      throw new Error(`tools/call (2026-07-28): unexpected result ${JSON.stringify(result).slice(0, 200)}`)
  }

  async close(): Promise<void> {}
}
