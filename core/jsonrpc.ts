/**
 * JSON-RPC 2.0 framing of a POST /mcp body: parsed and shape-checked once,
 * here, for both protocol eras. `RequestContext.readMcpMessage()` calls
 * `parseMcpBody`; the router and the era handlers only ever see messages
 * that passed `isJsonRpcMessage`.
 */
import type { McpMessageInfo } from './context.ts'
import { ProxyError, RPC } from './errors.ts'

export type JsonRpcId = string | number

/**
 * Any JSON-RPC 2.0 message (request, notification, response): the unit the
 * MCP layer, the target transports and the tracer all pass around, so it
 * lives here, beside the framing, and none of them owns it.
 */
export interface JsonRpcMessage {
  jsonrpc: '2.0'
  id?: JsonRpcId | null
  method?: string
  params?: Record<string, unknown>
  result?: unknown
  error?: { code: number; message: string; data?: unknown }
}

/**
 * Whether `m` has the shape of one JSON-RPC 2.0 message (JSON-RPC 2.0 §4,
 * §5): a request or notification (`method`, object or array `params`, no
 * `result`/`error`), or a response (`id` and exactly one of `result`,
 * `error`; `id: null` only on an error).
 */
export function isJsonRpcMessage (m: unknown): boolean {
  if (m === null || typeof m !== 'object' || Array.isArray(m)) return false
  const o = m as Record<string, unknown>
  if (o.jsonrpc !== '2.0') return false
  const hasId = 'id' in o
  if (hasId && typeof o.id !== 'string' && !(typeof o.id === 'number' && Number.isFinite(o.id)) && !(o.id === null && 'error' in o)) return false
  if ('method' in o) {
    if (typeof o.method !== 'string' || o.method === '') return false
    if ('params' in o && (o.params === null || typeof o.params !== 'object')) return false
    return !('result' in o) && !('error' in o)
  }
  if (!hasId) return false
  return ('result' in o) !== ('error' in o)
}

/**
 * Parses one POST /mcp body: a message or a non-empty batch of messages.
 * Throws a ProxyError with -32700 for invalid JSON and -32600 for anything
 * that is not JSON-RPC 2.0 (JSON-RPC 2.0 §5.1).
 */
export function parseMcpBody (buf: Buffer): McpMessageInfo {
  let body: unknown
  try {
    body = JSON.parse(buf.toString('utf8'))
  } catch {
    throw new ProxyError('MCPP_ERR_PARSE', 400, 'Parse error: body is not valid JSON', { rpcCode: RPC.PARSE_ERROR })
  }
  if (Array.isArray(body)) {
    if (body.length === 0 || !body.every(isJsonRpcMessage)) throw invalid()
    const first = body.find(m => typeof (m as { method?: unknown }).method === 'string') as { method: string; params?: Record<string, unknown> } | undefined
    return { body, method: first?.method, name: nameOf(first) }
  }
  if (!isJsonRpcMessage(body)) throw invalid()
  const m = body as { method?: string; params?: Record<string, unknown> }
  return { body, method: m.method, name: nameOf(m) }
}

/** What the access log names: the tool or prompt of tools/call and prompts/get, the URI of resources/*. */
function nameOf (m: { method?: string; params?: Record<string, unknown> } | undefined): string | undefined {
  const v = m?.method === 'tools/call' || m?.method === 'prompts/get' ? m.params?.name : m?.method?.startsWith('resources/') === true ? m.params?.uri : undefined
  return typeof v === 'string' ? v : undefined
}

function invalid (): ProxyError {
  return new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, 'Invalid Request: not a JSON-RPC 2.0 message', { rpcCode: RPC.INVALID_REQUEST })
}
