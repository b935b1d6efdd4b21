/**
 * The request metadata a 2026-07-28 POST must carry, checked against its body (MCP 2026-07-28
 * streamable HTTP, "Server Validation"), and the header value encoding both ways ("Value Encoding").
 * What fails is thrown as a ProxyError (400, -32020 / -32022 / -32602), written by the one error writer.
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { META, META_PREFIX, MODERN_REVISION, MODERN_RPC, SESSION_REVISIONS } from '../protocol.ts'
import { header } from '../headers.ts'

/** Every revision /mcp serves, newest first (what `supported` lists). */
export const SUPPORTED_VERSIONS: readonly string[] = [MODERN_REVISION, ...SESSION_REVISIONS]

/**
 * Methods whose `Mcp-Name` header is required, and the param it mirrors (MCP 2026-07-28 streamable
 * HTTP "Standard Headers"; the tasks extension, SEP-2663, adds its methods naming `params.taskId`).
 */
export const NAME_SOURCE: Record<string, 'name' | 'uri' | 'taskId'> = {
  'tools/call': 'name',
  'prompts/get': 'name',
  'resources/read': 'uri',
  'tasks/get': 'taskId',
  'tasks/update': 'taskId',
  'tasks/cancel': 'taskId',
}
const SENTINEL = /^=\?base64\?([A-Za-z0-9+/]*={0,2})\?=$/
/** A header value sent as it is (MCP 2026-07-28 "Value Encoding"); anything else is Base64-wrapped. */
const PLAIN_VALUE = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/

/** `Mcp-Name` (and `Mcp-Param-*`) value for an upstream: plain when it can be, else the Base64 sentinel form. */
export function encodeHeaderValue(v: string): string {
  return PLAIN_VALUE.test(v) && !v.startsWith('=?base64?') ? v : `=?base64?${Buffer.from(v, 'utf8').toString('base64')}?=`
}

export function mismatch(message: string): ProxyError {
  return new ProxyError('MCPP_ERR_HEADER_MISMATCH', 400, 'Header mismatch: ' + message, { rpcCode: MODERN_RPC.HEADER_MISMATCH })
}

function invalidParams(message: string): ProxyError {
  return new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, message, { rpcCode: RPC.INVALID_PARAMS })
}

/** `Mcp-Name` as the client meant it: the Base64 sentinel form decoded (MCP 2026-07-28 "Value Encoding"). */
function decodeHeaderValue(v: string): string | undefined {
  if (!v.startsWith('=?base64?')) return v
  const m = SENTINEL.exec(v)
  if (m === null) return undefined
  return Buffer.from(m[1]!, 'base64').toString('utf8')
}

/** Checks the request metadata headers against the body (MCP 2026-07-28 "Server Validation"). */
export function validate(ctx: RequestContext, msg: JsonRpcMessage): void {
  const version = header(ctx, 'mcp-protocol-version')
  if (version === undefined || version === '') throw mismatch('required MCP-Protocol-Version header is missing')
  if (version !== MODERN_REVISION) {
    throw new ProxyError('MCPP_ERR_PROTOCOL_VERSION', 400, 'Unsupported protocol version', {
      rpcCode: MODERN_RPC.UNSUPPORTED_PROTOCOL_VERSION,
      data: { supported: SUPPORTED_VERSIONS, requested: version },
    })
  }
  const meta = msg.params?._meta as Record<string, unknown> | undefined
  const metaVersion = meta?.[META.protocolVersion]
  if (typeof metaVersion !== 'string') throw invalidParams(`Invalid params: _meta["${META.protocolVersion}"] is required`)
  if (metaVersion !== version) throw mismatch(`MCP-Protocol-Version header value '${version}' does not match body value '${metaVersion}'`)
  const caps = meta![META.clientCapabilities]
  if (caps === null || typeof caps !== 'object' || Array.isArray(caps)) throw invalidParams(`Invalid params: _meta["${META.clientCapabilities}"] is required`)
  const method = header(ctx, 'mcp-method')
  if (method === undefined) throw mismatch('required Mcp-Method header is missing')
  if (method !== msg.method) throw mismatch(`Mcp-Method header value '${method}' does not match body value '${String(msg.method)}'`)
  const source = NAME_SOURCE[msg.method!]
  if (source !== undefined) {
    const raw = header(ctx, 'mcp-name')
    if (raw === undefined) throw mismatch('required Mcp-Name header is missing')
    const name = decodeHeaderValue(raw)
    if (name === undefined) throw mismatch('Mcp-Name header is not a valid Base64 sentinel value')
    const body = msg.params?.[source]
    if (name !== body) throw mismatch(`Mcp-Name header value '${name}' does not match body value '${String(body)}'`)
  }
}

/** Params for the session-era upstream: the revision's own `_meta` keys removed. */
export function upstreamParams(params: Record<string, unknown> | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(params ?? {}) }
  const meta = out._meta as Record<string, unknown> | undefined
  if (meta !== undefined) {
    const rest: Record<string, unknown> = {}
    for (const k of Object.keys(meta)) if (!k.startsWith(META_PREFIX)) rest[k] = meta[k]
    if (Object.keys(rest).length === 0) delete out._meta
    else out._meta = rest
  }
  return out
}
