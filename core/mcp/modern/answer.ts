/**
 * How a 2026-07-28 answer is shaped: `resultType`, the caching hints and the serverInfo of the
 * upstream that answered (the gateway's with several targets) on every result (MCP 2026-07-28
 * Caching, `_meta`), the revision's error codes, and the HTTP status of an error answer.
 */
import type { JsonRpcMessage } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { GATEWAY_INFO, META, MODERN_RPC } from '../protocol.ts'
import type { PooledUpstream } from '../upstreams/pool.ts'
import type { ModernContext } from './context.ts'
import type { ModernRequest } from './request.ts'

const CACHEABLE = new Set(['server/discover', 'tools/list', 'prompts/list', 'resources/list', 'resources/templates/list', 'resources/read'])

/** HTTP status of an error answer (MCP 2026-07-28 streamable HTTP: -32021 and the header errors are 400). */
export function errorStatus(res: JsonRpcMessage): number {
  const code = res.error?.code
  return code === MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY || code === MODERN_RPC.HEADER_MISMATCH || code === MODERN_RPC.UNSUPPORTED_PROTOCOL_VERSION
    ? 400
    : 200
}

/** -32002 (resource not found) is reserved from 2026-07-28 on; the revision uses -32602. */
export function modernError(res: JsonRpcMessage): JsonRpcMessage {
  if (res.error?.code === RPC.RESOURCE_NOT_FOUND) res.error.code = RPC.INVALID_PARAMS
  return res
}

/** Results of this revision: `resultType`, caching hints, serverInfo (MCP 2026-07-28 Caching, `_meta`). */
export function decorate(cx: ModernContext, ex: ModernRequest, method: string, result: Record<string, unknown>, serverInfo: unknown): Record<string, unknown> {
  if (result.resultType === undefined) result.resultType = 'complete'
  if (CACHEABLE.has(method) && result.resultType === 'complete') {
    // The gateway cannot know how long an upstream's answer stays fresh.
    if (typeof result.ttlMs !== 'number' || result.ttlMs < 0) result.ttlMs = 0
    // Authenticated callers get results of their own upstreams, filtered by their rules.
    result.cacheScope = cx.checkers.length > 0 || ex.ctx.auth !== undefined || result.cacheScope === 'private' ? 'private' : 'public'
  }
  const meta = (result._meta ?? {}) as Record<string, unknown>
  result._meta = { ...meta, [META.serverInfo]: serverInfo }
  return result
}

/** The serverInfo an answer carries: the gateway's with several targets, else that of the upstream that answered. */
export function serverInfoOf(cx: ModernContext, entry: PooledUpstream | undefined): unknown {
  if (cx.multi || entry === undefined) return GATEWAY_INFO
  return entry.serverInfo ?? GATEWAY_INFO
}

/** The `tools` of a tools/list result, or none. */
export function toolsOf(result: unknown): unknown[] {
  const tools = (result as { tools?: unknown } | undefined)?.tools
  return Array.isArray(tools) ? tools : []
}
