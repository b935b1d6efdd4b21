/**
 * Session-era traffic across replicas without balancer affinity (`cluster`).
 *
 * A session lives in one replica's memory (its stdio children, its streams).
 * Its id names that owner: `base64url(iv || AES-256-GCM(random16 || ownerUrl) || tag)`
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
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import { seal, sealKey, unseal } from './seal.ts'
import { Agent, request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http'
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https'
import type { Logger } from 'pino'
import type { RequestContext } from '../context.ts'
import { ProxyError, RPC } from '../errors.ts'
import { RELAYED_CLIENT_HEADER, type ClientRelay } from './client-address.ts'

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

/** Longest session id that is opened at all. */
const MAX_ID_CHARS = 512
const NONCE_BYTES = 16
/** Bytes of SHA-256 over the subject kept in a sealed passthrough id (binds it; the subject itself is not carried). */
const SUBJECT_BYTES = 16
/** Longest upstream session id that is sealed (the id stays well under the 512 characters `open` accepts). */
export const MAX_SEALED_UPSTREAM_ID = 256

// RFC 9110 §7.6.1: connection-specific fields are not forwarded.
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host', 'content-length'])

function sessionGone (): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: RPC.REQUEST_TIMEOUT })
}

export function createClusterForward (o: ClusterForwardOptions): ClusterForward {
  const key = sealKey(o.secret, 'session-id owner seal v1')
  const self = new URL(o.advertiseUrl).origin
  const selfBytes = Buffer.from(self, 'utf8')
  // A key of its own (another HKDF info): an owner id never opens as a passthrough id, nor the reverse.
  const upstreamKey = sealKey(o.secret, 'session-id passthrough seal v1')
  const agents = { http: new Agent({ keepAlive: true }), https: new HttpsAgent({ keepAlive: true }) }

  function open (id: string): string | undefined {
    return unseal(key, id, NONCE_BYTES + 1, MAX_ID_CHARS)?.subarray(NONCE_BYTES).toString('utf8')
  }

  /** The caller's subject as sealed: a digest, so a long subject does not lengthen the id (undefined: no token). */
  function subjectDigest (subject: string | undefined): Buffer {
    return createHash('sha256').update(subject === undefined ? '\0' : `s:${subject}`).digest().subarray(0, SUBJECT_BYTES)
  }

  return {
    newSessionId (): string {
      return seal(key, [randomBytes(NONCE_BYTES), selfBytes])
    },

    sealUpstream (target: string, subject: string | undefined, upstreamId: string): string | undefined {
      const up = Buffer.from(upstreamId, 'utf8')
      if (up.length === 0 || up.length > MAX_SEALED_UPSTREAM_ID) return undefined
      return seal(upstreamKey, [subjectDigest(subject), up], Buffer.from(target, 'utf8'))
    },

    openUpstream (target: string, subject: string | undefined, id: string): string | undefined {
      const plain = unseal(upstreamKey, id, SUBJECT_BYTES + 1, MAX_ID_CHARS, Buffer.from(target, 'utf8'))
      // Another subject's id is as unknown as a forged one.
      if (plain === undefined || !timingSafeEqual(plain.subarray(0, SUBJECT_BYTES), subjectDigest(subject))) return undefined
      return plain.subarray(SUBJECT_BYTES).toString('utf8')
    },

    remoteOwner (ctx: RequestContext, id: string): string | undefined {
      // A relayed request is answered here, never relayed again. Relayed means: it carries the
      // relay's own authenticated client-address header (client-address.ts), which no client can
      // make; a plain marker header could be set by any client to stop the relay of its request.
      if (ctx.req.headers[RELAYED_CLIENT_HEADER] !== undefined && o.clientRelay.verify(ctx.req) !== undefined) return undefined
      const owner = open(id)
      return owner === undefined || owner === self ? undefined : owner
    },

    async forward (ctx: RequestContext, owner: string, authorization?: string): Promise<void> {
      // The body is read through the context (bounded by maxBodyBytes, shared with
      // any hook that read it already): MCP POST bodies are single JSON-RPC messages.
      const body = ctx.method === 'POST' ? await ctx.readBody() : undefined
      const headers: OutgoingHttpHeaders = {}
      for (const [name, value] of Object.entries(ctx.req.headers)) {
        if (value !== undefined && !HOP_BY_HOP.has(name)) headers[name] = value
      }
      if (authorization !== undefined) headers.authorization = authorization
      if (body !== undefined) headers['content-length'] = body.length
      const target = new URL(ctx.path + (ctx.query === '' ? '' : `?${ctx.query}`), owner)
      // Replaces any header of the client's own: only the relay's signed one reaches the owner,
      // bound to the request target as it is sent (pathname + search).
      const sid = ctx.req.headers['mcp-session-id']
      headers[RELAYED_CLIENT_HEADER] = o.clientRelay.sign(ctx.clientAddress, ctx.method, target.pathname + target.search, typeof sid === 'string' ? sid : undefined)
      const https = target.protocol === 'https:'
      const log = ctx.log
      const upstream = await new Promise<IncomingMessage>((resolve, reject) => {
        const req = (https ? httpsRequest : httpRequest)(target, { method: ctx.method, headers, agent: https ? agents.https : agents.http })
        const timer = setTimeout(() => req.destroy(new Error(`no answer within ${o.forwardTimeoutMs} ms`)), o.forwardTimeoutMs)
        req.once('response', res => { clearTimeout(timer); resolve(res) })
        req.once('error', err => { clearTimeout(timer); reject(err) })
        // The client went away before the owner answered: stop asking.
        ctx.res.once('close', () => { if (!req.destroyed) req.destroy() })
        req.end(body)
      }).catch(async (err: unknown) => {
        log.info({ owner: target.host, err: (err as Error).message }, 'the session owner cannot be reached: answered 404 so the client initializes again')
        // Parsed on this path only (the relay never parses what it passes on), so that the
        // error answers the request's own JSON-RPC id rather than null.
        if (body !== undefined) await ctx.readMcpMessage().catch(() => undefined)
        throw sessionGone()
      })
      log.debug({ owner: target.host, status: upstream.statusCode }, 'forwarded to the session owner')
      const out: OutgoingHttpHeaders = {}
      for (const [name, value] of Object.entries(upstream.headers)) {
        if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value
      }
      if (upstream.headers['content-length'] !== undefined) out['content-length'] = upstream.headers['content-length']
      await ctx.writeHead(upstream.statusCode ?? 502, out)
      ctx.res.flushHeaders()
      await new Promise<void>(resolve => {
        upstream.pipe(ctx.res)
        const done = (): void => { resolve() }
        upstream.once('end', done)
        upstream.once('error', () => { ctx.res.destroy(); done() })
        ctx.res.once('close', () => { upstream.destroy(); done() })
      })
    },

    close (): void {
      agents.http.destroy()
      agents.https.destroy()
    },
  }
}
