/**
 * Session-era traffic across replicas without balancer affinity (`cluster`).
 *
 * A session lives in one replica's memory (its stdio children, its streams).
 * Its id names that owner (session-ids.ts): `base64url(iv || AES-256-GCM(random16 || ownerUrl) || tag)`
 * under a key derived from `cluster.secret`, so a client can neither read the
 * internal address nor forge an id that sends the gateway to a host of its
 * choosing (a forged or altered id fails authentication and is just unknown).
 * A replica that receives a request for a session it does not hold forwards
 * it before its own pipeline, unchanged (bearer token included: the
 * authentication plugin strips it from the request, so it could not be sent
 * later), to the owner's `advertiseUrl`; the owner runs its pipeline (token
 * verified, rules applied, session bound to its subject) as for a request it
 * had received itself. The relay trusts nothing and decides nothing. Callers
 * without a token are keyed by their address: the relay passes the address it
 * resolved in an authenticated header (client-address.ts), so the owner
 * finds an anonymous caller's session wherever the request landed. An owner that cannot be reached is gone with its sessions: the
 * client gets 404, which tells it to initialize again (MCP Streamable HTTP,
 * Session Management). A forwarded request (one carrying that authenticated
 * header) is never forwarded again.
 */
import { Agent, request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http'
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https'
import type { Logger } from 'pino'
import type { RequestContext } from '../context.ts'
import { ProxyError, RPC } from '../errors.ts'
import { RELAYED_CLIENT_HEADER, type ClientRelay } from './client-address.ts'
import { SessionIds } from './session-ids.ts'

export { MAX_SEALED_UPSTREAM_ID } from './session-ids.ts'

export interface ClusterForwardOptions {
  /** `cluster.secret`, the same on every replica. */
  readonly secret: string
  /** `cluster.advertiseUrl`: this replica's MCP listener as its peers reach it. */
  readonly advertiseUrl: string
  /** How long to wait for the owner's response head. */
  readonly forwardTimeoutMs: number
  readonly log: Logger
  /** Signs the client address the relay passes on (same `cluster.secret`). */
  readonly clientRelay: ClientRelay
}

export interface ClusterForward {
  /** A new session id naming this replica as the owner. */
  newSessionId(): string
  /** The owner's origin when `id` is a valid id of another replica and the request was not relayed already; else undefined. */
  remoteOwner(ctx: RequestContext, id: string): string | undefined
  /**
   * Sends the request to `owner` and pipes its answer back; 404 when the owner is gone.
   * `authorization`: the caller's Authorization header as it arrived, for a request whose
   * pipeline has run already (the authentication plugin removed it from the request).
   */
  forward(ctx: RequestContext, owner: string, authorization?: string): Promise<void>
  /**
   * A gateway session id that carries a passthrough session itself (the
   * upstream's Mcp-Session-Id, bound to the target and the caller's subject),
   * so any replica or worker serves it; undefined when the upstream id is too
   * long to seal (the caller then names an owner instead).
   */
  sealUpstream(target: string, subject: string | undefined, upstreamId: string): string | undefined
  /** The upstream session id sealed in `id` for this target and subject; undefined for any other id. */
  openUpstream(target: string, subject: string | undefined, id: string): string | undefined
  close(): void
}

// RFC 9110 §7.6.1: connection-specific fields are not forwarded.
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'content-length',
])

function sessionGone(): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: RPC.REQUEST_TIMEOUT })
}

/** The headers of one hop that go on to the next (RFC 9110 §7.6.1). */
function endToEnd(from: IncomingMessage['headers']): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(from)) {
    if (value !== undefined && !HOP_BY_HOP.has(name)) headers[name] = value
  }
  return headers
}

export function createClusterForward(o: ClusterForwardOptions): ClusterForward {
  return new ClusterForwarder(o)
}

class ClusterForwarder implements ClusterForward {
  readonly #o: ClusterForwardOptions
  readonly #ids: SessionIds
  readonly #agents = { http: new Agent({ keepAlive: true }), https: new HttpsAgent({ keepAlive: true }) }

  constructor(o: ClusterForwardOptions) {
    this.#o = o
    this.#ids = new SessionIds(o.secret, o.advertiseUrl)
  }

  /** A field, not a method: callers hand it on as a plain function (the session registries' id maker). */
  readonly newSessionId = (): string => this.#ids.newOwnerId()

  sealUpstream(target: string, subject: string | undefined, upstreamId: string): string | undefined {
    return this.#ids.sealUpstream(target, subject, upstreamId)
  }

  openUpstream(target: string, subject: string | undefined, id: string): string | undefined {
    return this.#ids.openUpstream(target, subject, id)
  }

  remoteOwner(ctx: RequestContext, id: string): string | undefined {
    // A relayed request is answered here, never relayed again. Relayed means: it carries the
    // relay's own authenticated client-address header (client-address.ts), which no client can
    // make; a plain marker header could be set by any client to stop the relay of its request.
    if (ctx.req.headers[RELAYED_CLIENT_HEADER] !== undefined && this.#o.clientRelay.verify(ctx.req) !== undefined) return undefined
    const owner = this.#ids.ownerOf(id)
    return owner === undefined || owner === this.#ids.self ? undefined : owner
  }

  async forward(ctx: RequestContext, owner: string, authorization?: string): Promise<void> {
    // The body is read through the context (bounded by maxBodyBytes, shared with
    // any hook that read it already): MCP POST bodies are single JSON-RPC messages.
    const body = ctx.method === 'POST' ? await ctx.readBody() : undefined
    const headers = endToEnd(ctx.req.headers)
    if (authorization !== undefined) headers.authorization = authorization
    if (body !== undefined) headers['content-length'] = body.length
    const target = new URL(ctx.path + (ctx.query === '' ? '' : `?${ctx.query}`), owner)
    // Replaces any header of the client's own: only the relay's signed one reaches the owner,
    // bound to the request target as it is sent (pathname + search).
    const sid = ctx.req.headers['mcp-session-id']
    headers[RELAYED_CLIENT_HEADER] = this.#o.clientRelay.sign(
      ctx.clientAddress,
      ctx.method,
      target.pathname + target.search,
      typeof sid === 'string' ? sid : undefined
    )
    const upstream = await this.#ask(ctx, target, headers, body).catch(async (err: unknown) => {
      ctx.log.info({ owner: target.host, err: (err as Error).message }, 'the session owner cannot be reached: answered 404 so the client initializes again')
      // Parsed on this path only (the relay never parses what it passes on), so that the
      // error answers the request's own JSON-RPC id rather than null.
      if (body !== undefined) await ctx.readMcpMessage().catch(() => undefined)
      throw sessionGone()
    })
    ctx.log.debug({ owner: target.host, status: upstream.statusCode }, 'forwarded to the session owner')
    await pipeBack(ctx, upstream)
  }

  close(): void {
    this.#agents.http.destroy()
    this.#agents.https.destroy()
  }

  /** Sends the request to the owner; resolves with its response head. */
  #ask(ctx: RequestContext, target: URL, headers: OutgoingHttpHeaders, body: Buffer | undefined): Promise<IncomingMessage> {
    const https = target.protocol === 'https:'
    const timeoutMs = this.#o.forwardTimeoutMs
    return new Promise<IncomingMessage>((resolve, reject) => {
      const req = (https ? httpsRequest : httpRequest)(target, { method: ctx.method, headers, agent: https ? this.#agents.https : this.#agents.http })
      const timer = setTimeout(() => req.destroy(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs)
      req.once('response', res => {
        clearTimeout(timer)
        resolve(res)
      })
      req.once('error', err => {
        clearTimeout(timer)
        reject(err)
      })
      // The client went away before the owner answered: stop asking.
      ctx.res.once('close', () => {
        if (!req.destroyed) req.destroy()
      })
      req.end(body)
    })
  }
}

/** The owner's answer to the client, head then body as it streams (an SSE stream included). */
async function pipeBack(ctx: RequestContext, upstream: IncomingMessage): Promise<void> {
  const out = endToEnd(upstream.headers)
  if (upstream.headers['content-length'] !== undefined) out['content-length'] = upstream.headers['content-length']
  await ctx.writeHead(upstream.statusCode ?? 502, out)
  ctx.res.flushHeaders()
  await new Promise<void>(resolve => {
    upstream.pipe(ctx.res)
    const done = (): void => {
      resolve()
    }
    upstream.once('end', done)
    upstream.once('error', () => {
      ctx.res.destroy()
      done()
    })
    ctx.res.once('close', () => {
      upstream.destroy()
      done()
    })
  })
}
