/**
 * Plain JSON-RPC 2.0 framing: the shape of one message and the parse of a
 * body (one message or a batch), with the error codes JSON-RPC defines. The
 * MCP layer builds its body parser on it (core/mcp/message.ts); the target
 * namespace and the era handlers only ever see messages that passed
 * `isJsonRpcMessage`.
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
export function isJsonRpcMessage(m: unknown): boolean {
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
  return 'result' in o !== 'error' in o
}

/** A request or notification, as far as `describe` reads one. */
export interface JsonRpcCall {
  readonly method?: string
  readonly params?: Record<string, unknown>
}

/**
 * Parses one JSON-RPC 2.0 body: a message or a non-empty batch of messages,
 * with the method of the (first) request or notification. `describe` names
 * what that message is about (`McpMessageInfo.name`): the MCP layer knows
 * which parameter that is, plain JSON-RPC does not. Throws a ProxyError with
 * -32700 for invalid JSON and -32600 for anything that is not JSON-RPC 2.0
 * (JSON-RPC 2.0 §5.1).
 */
export function parseJsonRpcBody(buf: Buffer, describe?: (m: JsonRpcCall | undefined) => string | undefined): McpMessageInfo {
  let body: unknown
  try {
    body = JSON.parse(buf.toString('utf8'))
  } catch {
    throw new ProxyError('MCPP_ERR_PARSE', 400, 'Parse error: body is not valid JSON', { rpcCode: RPC.PARSE_ERROR })
  }
  if (Array.isArray(body)) {
    if (body.length === 0 || !body.every(isJsonRpcMessage)) throw invalid()
    const first = body.find(m => typeof (m as { method?: unknown }).method === 'string') as JsonRpcCall | undefined
    return { body, method: first?.method, name: describe?.(first) }
  }
  if (!isJsonRpcMessage(body)) throw invalid()
  const m = body as JsonRpcCall
  return { body, method: m.method, name: describe?.(m) }
}

function invalid(): ProxyError {
  return new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, 'Invalid Request: not a JSON-RPC 2.0 message', { rpcCode: RPC.INVALID_REQUEST })
}
