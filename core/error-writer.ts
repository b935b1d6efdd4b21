/**
 * The one place that turns an error into a response. JSON-RPC errors on
 * /mcp (id of the request, or null); `{error, error_description}` on OAuth
 * endpoints and for authentication errors everywhere; a generic 500 with the
 * cause logged for anything unexpected.
 */
import type { RequestContext } from './context.ts'
import { ProxyError, RPC } from './errors.ts'
import { lingerClose } from './linger.ts'
import { bodyPending } from './request-body.ts'

function rpcIdOf(ctx: RequestContext): string | number | null {
  const body = ctx.mcp?.body as { id?: unknown } | undefined
  const id = body !== undefined && !Array.isArray(body) ? body.id : undefined
  return typeof id === 'string' || typeof id === 'number' ? id : null
}

/** Normalises anything thrown into a ProxyError, logging unexpected ones. */
export function toProxyError(ctx: RequestContext, err: unknown): ProxyError {
  if (ProxyError.is(err)) {
    if (err.statusCode >= 500) ctx.log.error({ code: err.code, err: err.cause ?? err }, err.message)
    return err
  }
  ctx.log.error({ err }, 'unexpected error')
  return new ProxyError('MCPP_ERR_INTERNAL', 500, 'internal error', { cause: err, expose: false })
}

export function errorBody(ctx: RequestContext, e: ProxyError): Record<string, unknown> {
  const message = e.expose ? e.message : 'internal error'
  if (e.oauthError !== undefined || ctx.kind !== 'mcp') {
    return { ...(e.data ?? {}), error: e.oauthError ?? (e.statusCode >= 500 ? 'server_error' : 'invalid_request'), error_description: message }
  }
  const code = e.rpcCode ?? (e.statusCode >= 500 ? RPC.INTERNAL_ERROR : RPC.SERVER_ERROR)
  return {
    jsonrpc: '2.0',
    id: rpcIdOf(ctx),
    // `data` of an exposed error is the JSON-RPC error's `data` (JSON-RPC 2.0 §5.1).
    error: e.data === undefined || !e.expose ? { code, message } : { code, message, data: e.data },
  }
}

/** Writes an error response if nothing was sent yet; otherwise ends the stream. */
export async function writeError(ctx: RequestContext, err: unknown): Promise<void> {
  const e = toProxyError(ctx, err)
  if (ctx.headersSent) {
    if (!ctx.res.writableEnded) ctx.res.end()
    return
  }
  const body = JSON.stringify(errorBody(ctx, e))
  ctx.denial ??= { reason: e.code }
  const headers: Record<string, string | number> = {
    ...e.headers,
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
  }
  // Refused before its body arrived (401, 413, 408...): close the connection
  // rather than let Node read, and wait for, the rest of a body nobody wants;
  // in stages, so that a reset does not take the answer with it (linger.ts).
  if (bodyPending(ctx.req)) {
    headers.connection = 'close'
    lingerClose(ctx.req, ctx.res)
  }
  await ctx.writeHead(e.statusCode, headers)
  ctx.res.end(body)
}
