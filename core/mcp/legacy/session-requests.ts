/**
 * The session era's requests on /mcp (Streamable HTTP of 2024-11-05 through
 * 2025-11-25), once the endpoint has checked the transport rules both eras
 * share and decided the era: POST (initialize, one message, or a batch where
 * the revision allows one), GET (the session's stream, or a resumed POST
 * stream) and DELETE, each against the session registry.
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { allowsBatch } from '../protocol.ts'
import { SseStream, SSE_HEADERS } from '../sse.ts'
import { header } from '../headers.ts'
import { badRequest, type SessionRegistry } from './session-registry.ts'

/** A parsed POST body of the session era: initialize opens a session, anything else goes to the caller's. */
export async function postToSession(sessions: SessionRegistry, ctx: RequestContext, body: unknown): Promise<void> {
  if (Array.isArray(body)) {
    const list = body as JsonRpcMessage[]
    if (list.some(m => m.method === 'initialize')) throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must not be part of a batch')
    const session = sessions.lookup(ctx)
    if (!allowsBatch(session.version))
      throw badRequest('MCPP_ERR_INVALID_REQUEST', `Invalid Request: JSON-RPC batches are not supported in protocol revision ${session.version}`)
    await session.receive(ctx, list)
    return
  }
  const msg = body as JsonRpcMessage
  if (msg.method === 'initialize') {
    if (header(ctx, 'mcp-session-id') !== undefined)
      throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must not carry an Mcp-Session-Id')
    if (msg.id === undefined || msg.id === null) throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must be a request')
    await initialize(sessions, ctx, msg)
    return
  }
  await sessions.lookup(ctx).receive(ctx, msg)
}

async function initialize(sessions: SessionRegistry, ctx: RequestContext, msg: JsonRpcMessage): Promise<void> {
  const { session, result } = await sessions.open(ctx, msg)
  ctx.log.debug({ session: session.id.slice(0, 8), protocolVersion: session.version }, 'session started')
  await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': session.id })
  new SseStream(ctx.res, sessions.env.streams).end({ jsonrpc: '2.0', id: msg.id, result })
}

/** GET: the session's server-to-client stream, or the continuation of a POST stream (Last-Event-ID). */
export async function openSessionStream(sessions: SessionRegistry, ctx: RequestContext): Promise<void> {
  const accept = header(ctx, 'accept') ?? ''
  if (!accept.includes('text/event-stream')) {
    throw new ProxyError('MCPP_ERR_NOT_ACCEPTABLE', 406, 'Not Acceptable: Accept must list text/event-stream', { rpcCode: RPC.INVALID_REQUEST })
  }
  const session = sessions.lookup(ctx)
  const streams = sessions.env.streams
  // A GET with Last-Event-ID naming a POST stream continues that stream (MCP 2025-11-25 transports, Resumability).
  const lastEventId = header(ctx, 'last-event-id')
  if (lastEventId !== undefined && session.canResume(lastEventId)) {
    await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': session.id })
    ctx.res.flushHeaders()
    session.resume(lastEventId, new SseStream(ctx.res, streams))
    return
  }
  if (session.hasGetStream) {
    throw new ProxyError('MCPP_ERR_STREAM_CONFLICT', 409, 'Conflict: this session already has an open GET stream', { rpcCode: RPC.INVALID_REQUEST })
  }
  await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': session.id })
  ctx.res.flushHeaders()
  session.attachGetStream(new SseStream(ctx.res, streams), lastEventId)
}

/** DELETE: ends the caller's session. */
export async function deleteSession(sessions: SessionRegistry, ctx: RequestContext): Promise<void> {
  const session = sessions.lookup(ctx)
  // Answer once the session is gone from the registry; a stdio child can
  // take up to its stage timeout to exit, which the client need not wait for.
  void sessions.end(session, 'deleted')
  await ctx.writeHead(200, { 'content-length': 0 })
  ctx.res.end()
}
