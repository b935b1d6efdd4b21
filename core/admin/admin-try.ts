/**
 * The "try it" panel's server side: runs initialize -> tools/list ->
 * (tools/call) against the gateway's own /mcp with the token the operator
 * pasted, then ends the session. Done here rather than in the browser
 * because /mcp is another origin (CORS) and may not allow the admin page's.
 * The token is used for these requests only: never logged, stored or echoed.
 */
import { readCapped } from '../read-capped.ts'
import { VERSION } from '../version.ts'

export interface TryInput {
  /** Bearer token to send; empty or absent sends none (shows the 401 path). */
  token?: string
  /** Tool to call after tools/list; absent stops after the list. */
  tool?: string
  arguments?: Record<string, unknown>
  protocolVersion?: string
}

export interface TryStep {
  step: string
  status: number
  durationMs: number
  /** JSON-RPC result, or the error body of a non-2xx answer. */
  result?: unknown
  error?: unknown
  /** `WWW-Authenticate` of a 401/403 answer (no secrets: the challenge the gateway sends). */
  challenge?: string
}

const MAX_RESPONSE_BYTES = 1024 * 1024
const STEP_TIMEOUT_MS = 30_000
const DEFAULT_VERSION = '2025-06-18'

/** Parses an answer that is either JSON or an SSE stream of `message` events; returns the response to `id`. */
function pick(text: string, contentType: string, id: number): unknown {
  if (contentType.includes('text/event-stream')) {
    let found: unknown
    for (const block of text.split(/\r?\n\r?\n/)) {
      const data = block
        .split(/\r?\n/)
        .filter(l => l.startsWith('data:'))
        .map(l => l.slice(5).replace(/^ /, ''))
        .join('\n')
      if (data === '') continue
      try {
        const msg = JSON.parse(data) as { id?: unknown }
        if (msg.id === id) found = msg
      } catch {
        /* a keep-alive or partial event */
      }
    }
    return found
  }
  try {
    return JSON.parse(text)
  } catch {
    return text.slice(0, 2000)
  }
}

export function validateTryInput(v: unknown): TryInput | string {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return 'body must be a JSON object'
  const o = v as Record<string, unknown>
  for (const k of Object.keys(o)) if (!['token', 'tool', 'arguments', 'protocolVersion'].includes(k)) return `unknown field ${k}`
  if (o.token !== undefined && (typeof o.token !== 'string' || o.token.length > 16384 || /[\r\n]/.test(o.token))) return 'token must be a single-line string'
  if (o.tool !== undefined && (typeof o.tool !== 'string' || o.tool === '' || o.tool.length > 256)) return 'tool must be a non-empty string'
  if (o.arguments !== undefined && (o.arguments === null || typeof o.arguments !== 'object' || Array.isArray(o.arguments))) return 'arguments must be an object'
  if (o.protocolVersion !== undefined && (typeof o.protocolVersion !== 'string' || !/^\d{4}-\d{2}-\d{2}$/.test(o.protocolVersion)))
    return 'protocolVersion must look like 2025-06-18'
  return o as TryInput
}

export async function runTry(mcpUrl: string, input: TryInput): Promise<{ steps: TryStep[]; sessionEnded: boolean }> {
  const steps: TryStep[] = []
  const base: Record<string, string> = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
  const token = input.token?.trim()
  if (token !== undefined && token !== '') base.authorization = `Bearer ${token.replace(/^Bearer\s+/i, '')}`
  let sessionId: string | undefined
  let version = input.protocolVersion ?? DEFAULT_VERSION
  let nextId = 1

  const call = async (step: string, method: string, params: Record<string, unknown> | undefined, notification = false): Promise<TryStep> => {
    const id = nextId++
    const headers: Record<string, string> = { ...base }
    if (sessionId !== undefined) {
      headers['mcp-session-id'] = sessionId
      headers['mcp-protocol-version'] = version
    }
    const body = notification ? { jsonrpc: '2.0', method, ...(params ? { params } : {}) } : { jsonrpc: '2.0', id, method, ...(params ? { params } : {}) }
    const t0 = performance.now()
    const out: TryStep = { step, status: 0, durationMs: 0 }
    try {
      const res = await fetch(mcpUrl, { method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(STEP_TIMEOUT_MS) })
      out.status = res.status
      const sid = res.headers.get('mcp-session-id')
      if (sid !== null && sessionId === undefined) sessionId = sid
      const challenge = res.headers.get('www-authenticate')
      if (challenge !== null) out.challenge = challenge
      const text = (await readCapped(res, MAX_RESPONSE_BYTES)).toString('utf8')
      if (!notification || !res.ok) {
        const msg = pick(text, res.headers.get('content-type') ?? '', id) as { result?: unknown; error?: unknown } | undefined
        if (res.ok && msg !== undefined && typeof msg === 'object' && 'result' in msg) out.result = msg.result
        else out.error = msg !== undefined && typeof msg === 'object' && 'error' in msg ? msg.error : (msg ?? `HTTP ${res.status}`)
      }
    } catch (err) {
      out.error = (err as Error).name === 'TimeoutError' ? `no answer within ${STEP_TIMEOUT_MS} ms` : (err as Error).message
    }
    out.durationMs = Math.round((performance.now() - t0) * 10) / 10
    steps.push(out)
    return out
  }

  const init = await call('initialize', 'initialize', {
    protocolVersion: version,
    capabilities: {},
    clientInfo: { name: 'mcp-proxy-admin-try', version: VERSION },
  })
  if (init.result === undefined) return { steps, sessionEnded: false }
  const negotiated = (init.result as { protocolVersion?: unknown }).protocolVersion
  if (typeof negotiated === 'string') version = negotiated
  await call('notifications/initialized', 'notifications/initialized', undefined, true)
  const list = await call('tools/list', 'tools/list', {})
  if (list.result !== undefined && input.tool !== undefined) {
    await call('tools/call', 'tools/call', { name: input.tool, arguments: input.arguments ?? {} })
  }
  let sessionEnded = false
  if (sessionId !== undefined) {
    const headers: Record<string, string> = { ...base, 'mcp-session-id': sessionId, 'mcp-protocol-version': version }
    try {
      const res = await fetch(mcpUrl, { method: 'DELETE', headers, signal: AbortSignal.timeout(STEP_TIMEOUT_MS) })
      await res.arrayBuffer()
      sessionEnded = res.ok
    } catch {
      /* the session expires on its own */
    }
  }
  return { steps, sessionEnded }
}
