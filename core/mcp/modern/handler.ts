/**
 * The stateless MCP revision 2026-07-28 on /mcp: no initialize, no
 * Mcp-Session-Id; each POST carries one request whose `_meta` holds the
 * protocol version and client capabilities, mirrored in the
 * `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers (validation.ts).
 * A target that speaks the revision itself (asked once with `server/discover`,
 * or configured: upstreams/target-era.ts) gets each request as it is: `_meta`,
 * input requests with their keys, `inputResponses` and `requestState`
 * untouched (native forwarding); any other target's requests are translated
 * onto pooled session-era upstreams (upstreams/pool.ts). Both go through the
 * same target namespace (routing/namespace.ts: naming, authorization, merged lists) as the
 * session era. endpoint.ts decides the request's era (protocol.ts) and calls
 * `post()` here; what this revision refuses is thrown as a ProxyError like
 * every other error. This file composes the modules: the state they share is
 * one ModernContext (context.ts), the method table is below.
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { META, MODERN_REVISION } from '../protocol.ts'
import { subjectKeyOf } from '../routing/subject-key.ts'
import { createModernContext, type ModernContext, type ModernOptions } from './context.ts'
import { closeParked } from './input-required.ts'
import { complete, discover, list } from './lists.ts'
import { listen } from './listen.ts'
import { named } from './named.ts'
import { LOG_LEVELS, ModernRequest } from './request.ts'
import { taskRequest } from './tasks.ts'
import { upstreamParams, validate } from './validation.ts'

export type { ModernOptions } from './context.ts'
export { SUPPORTED_VERSIONS } from './validation.ts'

export interface ModernHandler {
  /** Serves one POST whose era is modern; `body` is the parsed JSON. */
  post(ctx: RequestContext, body: unknown): Promise<void>
  /** Open subscriptions/listen streams. */
  readonly listening: number
  /** Ends listen streams gracefully (a result, then the stream ends). */
  close(): void
}

type Method = (cx: ModernContext, ex: ModernRequest, params: Record<string, unknown>, msg: JsonRpcMessage, method: string) => Promise<void>

/** The revision's methods; anything else (initialize, ping, logging/setLevel, resources/subscribe, tasks/result, tasks/list, ...) is not in it. */
const METHODS: Readonly<Record<string, Method>> = {
  'server/discover': (cx, ex) => discover(cx, ex),
  'tools/list': (cx, ex, params) => list(cx, ex, 'tools/list', params),
  'prompts/list': (cx, ex, params) => list(cx, ex, 'prompts/list', params),
  'resources/list': (cx, ex, params) => list(cx, ex, 'resources/list', params),
  'resources/templates/list': (cx, ex, params) => list(cx, ex, 'resources/templates/list', params),
  'tools/call': (cx, ex, params) => named(cx, ex, 'tools/call', params),
  'prompts/get': (cx, ex, params) => named(cx, ex, 'prompts/get', params),
  'resources/read': (cx, ex, params) => named(cx, ex, 'resources/read', params),
  'completion/complete': (cx, ex, params) => complete(cx, ex, params),
  'subscriptions/listen': (cx, ex, _params, msg) => listen(cx, ex, msg.params ?? {}),
  'tasks/get': (cx, ex, params, _msg, method) => taskRequest(cx, ex, method, params),
  'tasks/update': (cx, ex, params, _msg, method) => taskRequest(cx, ex, method, params),
  'tasks/cancel': (cx, ex, params, _msg, method) => taskRequest(cx, ex, method, params),
}

function dispatch(cx: ModernContext, ex: ModernRequest, msg: JsonRpcMessage): Promise<void> {
  const method = msg.method!
  const run = Object.hasOwn(METHODS, method) ? METHODS[method] : undefined
  if (run === undefined) return ex.fail(RPC.METHOD_NOT_FOUND, `Method not found: ${method}`, 404)
  return run(cx, ex, upstreamParams(msg.params), msg, method)
}

/** The request's shape before its headers are checked: one request, with an id (a notification is dropped). */
function refuseShape(body: unknown): JsonRpcMessage {
  if (Array.isArray(body)) {
    throw new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, `Invalid Request: JSON-RPC batches are not part of protocol revision ${MODERN_REVISION}`, {
      rpcCode: RPC.INVALID_REQUEST,
    })
  }
  const msg = body as JsonRpcMessage
  if (msg.method === undefined) {
    throw new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, 'Invalid Request: clients send no JSON-RPC responses in this revision', {
      rpcCode: RPC.INVALID_REQUEST,
    })
  }
  return msg
}

export function createModernHandler(opts: ModernOptions): ModernHandler {
  const cx = createModernContext(opts)
  const { log } = cx
  return {
    async post(ctx: RequestContext, body: unknown): Promise<void> {
      const msg = refuseShape(body)
      if (msg.id === undefined || msg.id === null) {
        // No client notification is defined over HTTP in this revision; accepted and dropped.
        await ctx.writeHead(202, { 'content-length': 0 })
        ctx.res.end()
        return
      }
      validate(ctx, msg)
      const meta = msg.params?._meta as Record<string, unknown>
      const level = meta[META.logLevel]
      const ex = new ModernRequest(
        ctx,
        msg.id,
        subjectKeyOf(ctx),
        typeof level === 'string' && LOG_LEVELS.includes(level) ? level : undefined,
        meta[META.clientCapabilities] as Record<string, unknown>,
        opts.streams
      )
      ex.meta = meta
      try {
        await dispatch(cx, ex, msg)
      } catch (err) {
        if (ex.finished || ctx.headersSent) {
          log.warn({ err: (err as Error).message }, 'modern request failed after the answer began')
          if (!ex.finished) await ex.fail(RPC.INTERNAL_ERROR, 'internal error')
          return
        }
        throw err
      }
    },

    get listening(): number {
      return cx.listens.size
    },

    close(): void {
      for (const end of [...cx.listens]) end()
      closeParked(cx)
    },
  }
}
