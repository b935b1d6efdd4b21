/**
 * Passthrough for a single remote streamable-HTTP target: /mcp is forwarded
 * with `http-proxy`, bodies and SSE streams piped, never buffered. It lives
 * in the MCP layer, not with the transports (core/targets/), because it
 * binds sessions to the caller's subject and drops the caller's credentials.
 *
 * What it rewrites (and nothing else): the session header both ways (the
 * client only ever sees gateway session ids, bound to the caller's subject),
 * the request's credentials (`Authorization` and `Cookie` are dropped, MCP
 * forbids token passthrough; the target's static headers are added), and the
 * response goes through `ctx.writeHead` so plugins' `onResponse` hooks run.
 */
import { SESSION_NOT_FOUND_RPC } from '../protocol.ts'
import { randomBytes } from 'node:crypto'
import { Agent as HttpAgent, type IncomingMessage, type ServerResponse, type OutgoingHttpHeaders, type IncomingHttpHeaders } from 'node:http'
import { Agent as HttpsAgent } from 'node:https'
import { Readable } from 'node:stream'
import { parse as parseUrl } from 'node:url'
import httpProxy from 'http-proxy'
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { TargetConfig } from '../../config.ts'
import { ProxyError, RPC } from '../../errors.ts'
import type { Metrics, Counter } from '../../observability/metrics.ts'
import { tracer } from '../../observability/tracing.ts'
import { subjectKeyOf } from '../routing/subject-key.ts'

export interface PassthroughSession {
  /** First 8 characters of the gateway session id (never the whole id). */
  readonly id: string
  readonly subject: string | undefined
  readonly createdAt: number
  readonly lastSeenAt: number
}

export interface HttpPassthrough {
  /** The /mcp terminal handler (McpEndpoint.handle). */
  handle(ctx: RequestContext): Promise<void>
  /** Live sessions, for the admin UI (no full ids, no upstream ids). */
  sessions(): PassthroughSession[]
  /** The id is a session this process has served (a lookup, no decryption): no need to relay it to an owner. */
  holds(id: string): boolean
  /** Best-effort DELETE of every upstream session only this process knows (not sealed ones), then forgets them. */
  close(): Promise<void>
}

/**
 * Sessions sealed into their ids (core/mcp/cluster-forward.ts, with `cluster`
 * or `workers`): the id carries the upstream session id, bound to the target
 * and the caller's key (its subject, or without a token its client address:
 * subject-key.ts), so every replica and worker serves it.
 */
export interface SealedSessions {
  seal(subjectKey: string, upstreamId: string): string | undefined
  open(subjectKey: string, id: string): string | undefined
}

export interface HttpPassthroughOptions {
  log: Logger
  metrics?: Metrics
  /** Sessions unused for this long are forgotten. Default 3600 s. */
  idleTimeoutSeconds?: number
  /** Upstream response-header timeout in ms. Default 30000. */
  proxyTimeoutMs?: number
  /** Makes gateway session ids; with `cluster`, ids that name this replica (core/mcp/cluster-forward.ts). */
  newSessionId?: () => string
  /** With `cluster` or `workers`: session ids carry the upstream session, so no request needs its owner. */
  sealed?: SealedSessions
}

/**
 * `key`: what the session is bound to, the subject or an anonymous caller's address (README: an anonymous
 * session answers only the address that opened it). `sealed`: the id carries the upstream session; this
 * entry only spares decrypting it on every request.
 */
interface Mapping { upstream: string; subject: string | undefined; key: string; createdAt: number; lastSeenAt: number; sealed: boolean }

interface Exchange {
  ctx: RequestContext
  /** Gateway session id the client presented, if any. */
  gatewayId: string | undefined
  /** Upstream session id sent upstream, if any. */
  upstreamId: string | undefined
  resolve: () => void
  reject: (err: unknown) => void
}

/** Response headers that belong to one hop only (RFC 9110 §7.6.1). */
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade'])

/**
 * Request headers never sent upstream: the caller's credentials (MCP forbids
 * token passthrough), the client's session id (replaced by the upstream's),
 * and the hop-by-hop connection headers (the keep-alive agent owns the
 * upstream connection; a client's `Connection: close` must not end it).
 */
const DROP = new Set(['authorization', 'cookie', 'proxy-authorization', 'mcp-session-id', 'connection', 'keep-alive', 'proxy-connection', 'upgrade'])

/**
 * The headers sent upstream: the client's without DROP, the upstream session
 * id and the target's static headers, built once before http-proxy copies
 * them (no `proxyReq` listener, so no removeHeader/setHeader pass that
 * validates each name again). A new object rather than `delete` on the
 * client's: a deleted key turns an object into a slow dictionary that
 * http-proxy's copy and node's ClientRequest then walk. The pipeline has run
 * by then, so nothing downstream reads the dropped headers.
 */
function upstreamRequestHeaders (headers: IncomingHttpHeaders, upstreamId: string | undefined, staticHeaders: ReadonlyArray<readonly [string, string]>): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {}
  for (const k of Object.keys(headers)) if (!DROP.has(k)) out[k] = headers[k]
  if (upstreamId !== undefined) out['mcp-session-id'] = upstreamId
  for (const [k, v] of staticHeaders) out[k] = v
  return out
}

/**
 * An HTTP target's own 401: a gateway error naming the target (502), never the target's status and
 * `WWW-Authenticate`, which would make the client take its valid gateway token for bad or follow the
 * target's authorization server (its `resource_metadata`). Logged, since only the operator can fix it.
 */
export function targetRefused (name: string, log: Logger): ProxyError {
  const message = `target "${name}" refused the gateway's credentials (401)`
  log.warn({ target: name }, message)
  return new ProxyError('MCPP_ERR_UPSTREAM', 502, message, { rpcCode: RPC.SERVER_ERROR, expose: true })
}

/** A gateway session id: 32 random bytes, base64url (visible ASCII per MCP). */
export function newSessionId (): string {
  return randomBytes(32).toString('base64url')
}

export function createHttpPassthrough (target: TargetConfig, opts: HttpPassthroughOptions): HttpPassthrough {
  if (target.mcp === undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `mcp.targets: target ${target.name} is not an HTTP target`)
  const { url, headers: staticHeaders = {} } = target.mcp
  const staticEntries = Object.entries(staticHeaders).map(([k, v]) => [k.toLowerCase(), v] as const)
  const log = opts.log.child({ target: target.name })
  const idleMs = (opts.idleTimeoutSeconds ?? 3600) * 1000
  const sessions = new Map<string, Mapping>()
  const makeId = opts.newSessionId ?? newSessionId
  const exchanges = new WeakMap<IncomingMessage, Exchange>()
  const errors: Counter | undefined = opts.metrics?.counter('mcp_proxy_upstream_http_errors_total', 'Failed HTTP exchanges with remote MCP targets')
  // Without an agent http-proxy sends `Connection: close` and opens a new
  // upstream connection per request; that was most of its cost per request.
  const agentOptions = { keepAlive: true, maxSockets: 256, maxFreeSockets: 64 }
  // `servername` is the TLS SNI name: meaningless for plain HTTP, where an
  // empty one only spares node's Agent from working it out of the Host header
  // for every request (net.connect ignores it). HTTPS keeps the derived name.
  const plainAgentOptions = { ...agentOptions, servername: '' }
  const agent = url.startsWith('https:') ? new HttpsAgent(agentOptions) : new HttpAgent(plainAgentOptions)
  const proxy = httpProxy.createProxyServer({
    // Parsed once, with the same legacy parser http-proxy applies to a string
    // target (so the request options are identical): a string would be parsed
    // again on every request.
    target: parseUrl(url),
    agent,
    ignorePath: true,
    // `toProxy` only makes http-proxy take req.url as is instead of running
    // url.parse on it; with `ignorePath` that path is dropped anyway, so the
    // upstream request line is still the target's path.
    toProxy: true,
    changeOrigin: true,
    selfHandleResponse: true,
    proxyTimeout: opts.proxyTimeoutMs ?? 30000,
    xfwd: false,
  })

  const sweep = setInterval(function sweepIdleSessions () {
    const now = Date.now()
    for (const [id, m] of sessions) if (now - m.lastSeenAt > idleMs) sessions.delete(id)
  }, Math.min(idleMs, 60000))
  sweep.unref()

  /** The client's response headers: the upstream's without hop-by-hop ones, the session id mapped. */
  function responseHeaders (proxyRes: IncomingMessage, ex: Exchange, status: number): OutgoingHttpHeaders {
    const src = proxyRes.headers
    const out: OutgoingHttpHeaders = {}
    for (const k of Object.keys(src)) {
      const v = src[k]
      if (v !== undefined && !HOP.has(k) && k !== 'mcp-session-id' && k !== 'www-authenticate') out[k] = v
    }
    const upstreamSid = src['mcp-session-id']
    if (ex.gatewayId !== undefined) {
      if (status === 404 || ex.ctx.method === 'DELETE') sessions.delete(ex.gatewayId)
      else out['mcp-session-id'] = ex.gatewayId
    } else if (typeof upstreamSid === 'string' && upstreamSid !== '') {
      const key = subjectKeyOf(ex.ctx)
      const sealedId = opts.sealed?.seal(key, upstreamSid)
      const id = sealedId ?? makeId()
      const now = Date.now()
      sessions.set(id, { upstream: upstreamSid, subject: ex.ctx.auth?.subject, key, createdAt: now, lastSeenAt: now, sealed: sealedId !== undefined })
      ex.ctx.state.set('sessionId', id)
      out['mcp-session-id'] = id
    }
    return out
  }

  /** Sends the upstream's body after the head; settles the exchange when the response is done. */
  function forwardBody (proxyRes: IncomingMessage, res: ServerResponse, ex: Exchange): void {
    if (res.destroyed) {
      // The client is gone ('close' has been emitted already): drain the upstream answer.
      proxyRes.resume()
      ex.resolve()
      return
    }
    if (proxyRes.complete) {
      // The whole answer is here already (a short SSE answer comes in one
      // read): written and ended in this tick, so head, body and the chunked
      // terminator leave in one write instead of two. Nothing is held back:
      // the data has been received; reading it to the end also hands the
      // upstream connection back to the agent.
      for (let chunk: Buffer | null = proxyRes.read(); chunk !== null; chunk = proxyRes.read()) res.write(chunk)
      res.end()
      ex.resolve()
      return
    }
    // The head goes out with the first chunk. An SSE stream whose first
    // event is not here yet still gets its head at once: flushed if nothing
    // has been read after this turn.
    proxyRes.pipe(res)
    if (proxyRes.readableLength === 0) {
      setImmediate(function flushIdleHead () {
        if (!proxyRes.readableDidRead && !res.writableEnded && !res.destroyed) res.flushHeaders()
      })
    }
    proxyRes.once('error', () => res.destroy())
    // 'close' follows 'finish' on a finished response, and comes alone when the client goes away.
    res.once('close', function responseClosed () {
      if (!proxyRes.complete) proxyRes.destroy()
      ex.resolve()
    })
  }

  proxy.on('proxyRes', function forwardResponse (proxyRes: IncomingMessage, req: IncomingMessage, res: ServerResponse) {
    const ex = exchanges.get(req)
    if (ex === undefined) { proxyRes.resume(); return }
    // proxyTimeout bounds the wait for the head only: an SSE answer may stay
    // silent for longer (a slow tool) and must not be cut. The next request on
    // this keep-alive socket sets it again.
    proxyRes.socket?.setTimeout(0)
    if (proxyRes.statusCode === 401) {
      // The target refused the gateway's own credentials (its static headers): the client's token is
      // fine, and the target's challenge (its authorization server) is none of the client's business.
      proxyRes.resume()
      errors?.inc({ target: target.name })
      ex.reject(targetRefused(target.name, log))
      return
    }
    let head: Promise<void>
    try {
      const status = proxyRes.statusCode ?? 502
      head = ex.ctx.writeHead(status, responseHeaders(proxyRes, ex, status))
    } catch (err) {
      ex.reject(err)
      return
    }
    // Always after a turn of the microtask queue: by then the parser has
    // taken in whatever arrived with the head (often the whole answer).
    head.then(function sendBody () {
      try {
        forwardBody(proxyRes, res, ex)
      } catch (err) {
        ex.reject(err)
      }
    }, ex.reject)
  })

  proxy.on('error', function upstreamError (err: Error, req: IncomingMessage) {
    const ex = exchanges.get(req)
    errors?.inc({ target: target.name })
    log.warn({ err: err.message }, 'upstream request failed')
    ex?.reject(new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${target.name} is unreachable`, { rpcCode: RPC.INTERNAL_ERROR, expose: true, cause: err }))
  })

  /**
   * The /mcp handler. Not an async function: the exchange's own promise is
   * returned, settled by the response path, so a request costs no extra
   * async frame and await.
   */
  function handle (ctx: RequestContext): Promise<void> {
    const presented = ctx.req.headers['mcp-session-id']
    let gatewayId: string | undefined
    let upstreamId: string | undefined
    if (typeof presented === 'string' && presented !== '') {
      const key = subjectKeyOf(ctx)
      let m = sessions.get(presented)
      if (m === undefined && opts.sealed !== undefined) {
        // A sealed session first seen here (made by another worker or replica, or before this one
        // forgot it): opened once, then held like one made here.
        const upstream = opts.sealed.open(key, presented)
        if (upstream !== undefined) {
          const now = Date.now()
          m = { upstream, subject: ctx.auth?.subject, key, createdAt: now, lastSeenAt: now, sealed: true }
          sessions.set(presented, m)
        }
      }
      // Another subject (or another address, without a token) presenting an id is told the same as for an unknown id.
      if (m === undefined || m.key !== key) {
        return Promise.reject(new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: SESSION_NOT_FOUND_RPC }))
      }
      m.lastSeenAt = Date.now()
      gatewayId = presented
      upstreamId = m.upstream
      ctx.state.set('sessionId', presented)
    }
    // Traced: a client span, its context in the traceparent header and params._meta (the body is rewritten).
    if (tracer !== undefined) return tracer.passthroughCall(ctx, target.name).then(body => forward(ctx, gatewayId, upstreamId, body))
    // core may already have read the body (a plugin parsed the MCP message):
    // then it is replayed from the cached Buffer; otherwise req is piped.
    const consumed = ctx.req.readableEnded || ctx.mcp !== undefined || ctx.req.readableDidRead
    if (consumed) return ctx.readBody().then(buffered => forward(ctx, gatewayId, upstreamId, buffered))
    return forward(ctx, gatewayId, upstreamId, undefined)
  }

  /** Sends the request upstream; the promise settles when the exchange is over (and is then forgotten). */
  function forward (ctx: RequestContext, gatewayId: string | undefined, upstreamId: string | undefined, buffered: Buffer | undefined): Promise<void> {
    const req = ctx.req
    ctx.target = target.name
    const done = new Promise<void>((resolve, reject) => {
      exchanges.set(req, {
        ctx,
        gatewayId,
        upstreamId,
        resolve () { exchanges.delete(req); resolve() },
        reject (err) { exchanges.delete(req); reject(err) },
      })
    })
    req.headers = upstreamRequestHeaders(req.headers, upstreamId, staticEntries)
    try {
      // No per-request options object unless the body must be replayed: with
      // one, http-proxy copies its whole options object for every request.
      if (buffered === undefined) proxy.web(req, ctx.res)
      else proxy.web(req, ctx.res, { buffer: Readable.from([buffered]) })
    } catch (err) {
      exchanges.delete(req)
      return Promise.reject(err)
    }
    return done
  }

  return {
    handle,
    holds: id => sessions.has(id),
    sessions () {
      return [...sessions].map(([id, m]) => ({ id: id.slice(0, 8), subject: m.subject, createdAt: m.createdAt, lastSeenAt: m.lastSeenAt }))
    },
    async close () {
      clearInterval(sweep)
      // A sealed session is not this process's alone: other workers and replicas go on serving it.
      const all = [...sessions.values()].filter(m => !m.sealed)
      sessions.clear()
      await Promise.allSettled(all.map(async m => {
        const res = await fetch(url, { method: 'DELETE', headers: { ...staticHeaders, 'mcp-session-id': m.upstream }, signal: AbortSignal.timeout(2000) })
        await res.body?.cancel()
      }))
      proxy.close()
      agent.destroy()
    },
  }
}
