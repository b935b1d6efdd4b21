/**
 * Passthrough for a single remote streamable-HTTP target: /mcp is forwarded
 * with `http-proxy`, bodies and SSE streams piped, never buffered. It lives
 * in the MCP layer, not with the transports (core/targets/), because it
 * binds sessions to the caller's subject and drops the caller's credentials.
 *
 * What it rewrites (and nothing else): the session header both ways (the
 * client only ever sees gateway session ids, bound to the caller's subject),
 * the request's credentials (`Authorization` and `Cookie` are dropped, MCP
 * forbids token passthrough; the target's static headers are added, and with
 * the target's `auth` the caller's credential, resolved for each request
 * before anything is sent: ../credentials.ts), and the response goes through
 * `ctx.writeHead` so plugins' `onResponse` hooks run.
 */
import { SESSION_NOT_FOUND_RPC } from '../protocol.ts'
import { randomBytes } from 'node:crypto'
import { Agent as HttpAgent, type IncomingMessage, type ServerResponse } from 'node:http'
import { Agent as HttpsAgent } from 'node:https'
import { Readable } from 'node:stream'
import { parse as parseUrl } from 'node:url'
import httpProxy from 'http-proxy'
import type { Logger } from 'pino'
import type { McpMessageInfo, RequestContext } from '../../context.ts'
import { parseMcpBody } from '../message.ts'
import type { TargetConfig } from '../../config.ts'
import { ProxyError, RPC } from '../../errors.ts'
import type { Metrics, Counter } from '../../observability/metrics.ts'
import { tracer } from '../../observability/tracing.ts'
import { PassthroughSessions, type Mapping, type PassthroughSession } from './passthrough-sessions.ts'
import type { McpCluster, SealedSessions } from '../cluster.ts'
import { clientResponseHeaders, forwardBody, upstreamRequestHeaders, type Exchange } from './passthrough-exchange.ts'
import { callerOf, credentialReady, type Caller, type TargetAuth, type TargetCredential } from '../credentials.ts'

export type { PassthroughSession, SealedSessions }

export interface HttpPassthrough {
  /** The /mcp terminal handler (McpEndpoint.handle). */
  handle(ctx: RequestContext): Promise<void>
  /** McpEndpoint.parse: the passthrough itself pipes bodies unread. */
  parse(body: Buffer): McpMessageInfo
  /** Live sessions, for the admin UI (no full ids, no upstream ids). */
  sessions(): PassthroughSession[]
  /** The id is a session this process has served (a lookup, no decryption): no need to relay it to an owner. */
  holds(id: string): boolean
  /** Best-effort DELETE of every upstream session only this process knows (not sealed ones), then forgets them. */
  close(): Promise<void>
}

export interface HttpPassthroughOptions {
  log: Logger
  metrics?: Metrics
  /** `mcp.session.idleTimeoutSeconds`: sessions unused for this long are ended. Default 1800 s (the schema's). */
  idleTimeoutSeconds?: number
  /** `mcp.session.maxSessions`: an initialize beyond this many sessions gets 503. Default: no cap. */
  maxSessions?: number
  /** Upstream response-header timeout in ms. Default 30000. */
  proxyTimeoutMs?: number
  /**
   * This process's place in the deployment (../cluster.ts). With `cluster` or `workers`: gateway session
   * ids name this process as their owner, and carry the upstream session where it fits, so no request
   * needs its owner. Default: one process alone (random ids, nothing sealed).
   */
  cluster?: McpCluster
  /** The target's credential source (../credentials.ts, its `auth` block); absent: static headers only. */
  auth?: TargetAuth
}

/** The schema's default of `mcp.session.idleTimeoutSeconds`, for callers that pass none (tests). */
const DEFAULT_IDLE_SECONDS = 1800

/**
 * An HTTP target's own 401: a gateway error naming the target (502), never the target's status and
 * `WWW-Authenticate`, which would make the client take its valid gateway token for bad or follow the
 * target's authorization server (its `resource_metadata`). Logged, since only the operator can fix it.
 */
export function targetRefused(name: string, log: Logger): ProxyError {
  const message = `target "${name}" refused the gateway's credentials (401)`
  log.warn({ target: name }, message)
  return new ProxyError('MCPP_ERR_UPSTREAM', 502, message, { rpcCode: RPC.SERVER_ERROR, expose: true })
}

/** A gateway session id: 32 random bytes, base64url (visible ASCII per MCP). */
export function newSessionId(): string {
  return randomBytes(32).toString('base64url')
}

function sessionNotFound(): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: SESSION_NOT_FOUND_RPC })
}

/** The keep-alive agent and the http-proxy server for one target URL. */
function createProxy(url: string, proxyTimeoutMs: number): { proxy: httpProxy; agent: HttpAgent } {
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
    proxyTimeout: proxyTimeoutMs,
    xfwd: false,
  })
  return { proxy, agent }
}

/** An exchange with the promise its request's handler returns. */
interface PendingExchange extends Exchange {
  readonly done: Promise<void>
}

/** What ending an exchange gives back: its request forgotten, its session no longer busy, its slot free. Always true. */
function endExchange(
  exchanges: WeakMap<IncomingMessage, Exchange>,
  req: IncomingMessage,
  table: PassthroughSessions,
  mapping: Mapping | undefined,
  reserved: boolean
): true {
  exchanges.delete(req)
  if (mapping !== undefined) mapping.inFlight--
  else if (reserved) table.release()
  return true
}

export function createHttpPassthrough(target: TargetConfig, opts: HttpPassthroughOptions): HttpPassthrough {
  if (target.mcp === undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `mcp.targets: target ${target.name} is not an HTTP target`)
  return new Passthrough(target.name, target.mcp, opts)
}

/**
 * The passthrough of one target: its proxy, its session table and the
 * exchanges under way (found again by their request in the proxy's events).
 */
class Passthrough implements HttpPassthrough {
  readonly #name: string
  readonly #url: string
  readonly #staticHeaders: Readonly<Record<string, string>>
  readonly #staticEntries: ReadonlyArray<readonly [string, string]>
  readonly #log: Logger
  readonly #table: PassthroughSessions
  readonly #exchanges = new WeakMap<IncomingMessage, Exchange>()
  readonly #errors: Counter | undefined
  readonly #proxy: httpProxy
  readonly #agent: HttpAgent
  readonly #auth: TargetAuth | undefined

  constructor(name: string, mcp: NonNullable<TargetConfig['mcp']>, opts: HttpPassthroughOptions) {
    this.#name = name
    this.#url = mcp.url
    this.#staticHeaders = mcp.headers ?? {}
    this.#staticEntries = Object.entries(this.#staticHeaders).map(([k, v]) => [k.toLowerCase(), v] as const)
    this.#log = opts.log.child({ target: name })
    this.#auth = opts.auth
    this.#errors = opts.metrics?.counter('mcp_proxy_upstream_http_errors_total', 'Failed HTTP exchanges with remote MCP targets')
    this.#table = new PassthroughSessions({
      log: this.#log,
      idleMs: (opts.idleTimeoutSeconds ?? DEFAULT_IDLE_SECONDS) * 1000,
      maxSessions: opts.maxSessions ?? Number.POSITIVE_INFINITY,
      makeId: opts.cluster?.newSessionId ?? newSessionId,
      sealed: opts.cluster?.sealedSessions(name),
      endUpstream: (upstreamId, caller) => this.#deleteUpstream(upstreamId, caller),
    })
    const { proxy, agent } = createProxy(this.#url, opts.proxyTimeoutMs ?? 30000)
    this.#proxy = proxy
    this.#agent = agent
    proxy.on('proxyRes', (proxyRes: IncomingMessage, req: IncomingMessage, res: ServerResponse) => this.#forwardResponse(proxyRes, req, res))
    proxy.on('error', (err: Error, req: IncomingMessage) => this.#upstreamError(err, req))
  }

  /**
   * The /mcp handler. Not an async function: the exchange's own promise is
   * returned, settled by the response path, so a request costs no extra
   * async frame and await.
   */
  handle(ctx: RequestContext): Promise<void> {
    const presented = ctx.req.headers['mcp-session-id']
    let mapping: Mapping | undefined
    let gatewayId: string | undefined
    if (typeof presented === 'string' && presented !== '') {
      mapping = this.#table.find(ctx, presented)
      // Another subject (or another address, without a token) presenting an id is told the same as for an unknown id.
      if (mapping === undefined) return Promise.reject(sessionNotFound())
      gatewayId = presented
      ctx.sessionId = presented
    } else if (ctx.method === 'POST') {
      // A request without a session id may open one: it holds a slot under maxSessions while it lasts.
      try {
        this.#table.reserve()
      } catch (err) {
        return Promise.reject(err)
      }
    }
    const ex = this.#exchange(ctx, gatewayId, mapping)
    const auth = this.#auth
    if (auth === undefined) return this.#send(ex, undefined)
    // The caller's credential for this request: cached (no await), or resolved before anything is sent,
    // so a refusal is answered as it is (its status and challenge).
    const caller = callerOf(ctx)
    if (mapping !== undefined) mapping.caller = caller
    ex.caller = caller
    const ready = credentialReady(auth, caller, this.#log, ctx)
    if (ready === undefined) return this.#send(ex, auth.peek(caller)?.headers)
    return ready.then(
      c => this.#send(ex, (c as TargetCredential).headers),
      err => this.#fail(ex, err)
    )
  }

  /** Reads or pipes the body, and forwards the request with the caller's `attached` headers. */
  #send(ex: PendingExchange, attached: Readonly<Record<string, string>> | undefined): Promise<void> {
    const { ctx } = ex
    // Traced: a client span, its context in the traceparent header and params._meta (the body is rewritten).
    if (tracer !== undefined)
      return tracer.passthroughCall(ctx, this.#name).then(
        body => this.#forward(ex, body, attached),
        err => this.#fail(ex, err)
      )
    // core may already have read the body (a plugin parsed the MCP message):
    // then it is replayed from the cached Buffer; otherwise req is piped.
    const consumed = ctx.req.readableEnded || ctx.mcp !== undefined || ctx.req.readableDidRead
    if (consumed)
      return ctx.readBody().then(
        buffered => this.#forward(ex, buffered, attached),
        err => this.#fail(ex, err)
      )
    return this.#forward(ex, undefined, attached)
  }

  /** The exchange of one request; its promise settles when the exchange is over (and it is then forgotten). */
  #exchange(ctx: RequestContext, gatewayId: string | undefined, mapping: Mapping | undefined): PendingExchange {
    const req = ctx.req
    const table = this.#table
    const exchanges = this.#exchanges
    // A request without a session id holds a maxSessions slot (`reserve` in handle) until it ends.
    const reserved = gatewayId === undefined && ctx.method === 'POST'
    if (mapping !== undefined) mapping.inFlight++
    let settled = false
    let resolve!: () => void
    let reject!: (err: unknown) => void
    const done = new Promise<void>((res, rej) => {
      resolve = res
      reject = rej
    })
    return {
      ctx,
      gatewayId,
      mapping,
      done,
      resolve() {
        if (!settled) settled = endExchange(exchanges, req, table, mapping, reserved)
        resolve()
      },
      reject(err) {
        if (!settled) settled = endExchange(exchanges, req, table, mapping, reserved)
        reject(err)
      },
    }
  }

  #fail(ex: PendingExchange, err: unknown): Promise<void> {
    ex.reject(err)
    return ex.done
  }

  /** Sends the request upstream; the promise settles when the exchange is over. */
  #forward(ex: PendingExchange, buffered: Buffer | undefined, attached: Readonly<Record<string, string>> | undefined): Promise<void> {
    const { ctx } = ex
    const req = ctx.req
    ctx.target = this.#name
    this.#exchanges.set(req, ex)
    req.headers = upstreamRequestHeaders(req.headers, ex.mapping?.upstream, this.#staticEntries, attached)
    try {
      // No per-request options object unless the body must be replayed: with
      // one, http-proxy copies its whole options object for every request.
      if (buffered === undefined) this.#proxy.web(req, ctx.res)
      else this.#proxy.web(req, ctx.res, { buffer: Readable.from([buffered]) })
    } catch (err) {
      ex.reject(err)
    }
    return ex.done
  }

  /** The head of the upstream's answer: the session id mapped, the head written through the pipeline, then the body. */
  #forwardResponse(proxyRes: IncomingMessage, req: IncomingMessage, res: ServerResponse): void {
    const ex = this.#exchanges.get(req)
    if (ex === undefined) {
      proxyRes.resume()
      return
    }
    // proxyTimeout bounds the wait for the head only: an SSE answer may stay
    // silent for longer (a slow tool) and must not be cut. The next request on
    // this keep-alive socket sets it again.
    proxyRes.socket?.setTimeout(0)
    if (proxyRes.statusCode === 401) {
      // The target refused the gateway's own credentials (its static headers): the client's token is
      // fine, and the target's challenge (its authorization server) is none of the client's business.
      proxyRes.resume()
      this.#errors?.inc({ target: this.#name })
      ex.reject(targetRefused(this.#name, this.#log))
      return
    }
    let head: Promise<void>
    try {
      const status = proxyRes.statusCode ?? 502
      head = ex.ctx.writeHead(status, this.#responseHeaders(proxyRes, ex, status))
    } catch (err) {
      ex.reject(err)
      return
    }
    // Always after a turn of the microtask queue: by then the parser has
    // taken in whatever arrived with the head (often the whole answer).
    head.then(function sendBody() {
      try {
        forwardBody(proxyRes, res, ex)
      } catch (err) {
        ex.reject(err)
      }
    }, ex.reject)
  }

  /** The client's response headers: the upstream's without hop-by-hop ones, the session id mapped. */
  #responseHeaders(proxyRes: IncomingMessage, ex: Exchange, status: number): ReturnType<typeof clientResponseHeaders> {
    const out = clientResponseHeaders(proxyRes.headers)
    const upstreamSid = proxyRes.headers['mcp-session-id']
    if (ex.gatewayId !== undefined) {
      if (status === 404 || ex.ctx.method === 'DELETE') this.#table.forget(ex.gatewayId)
      else out['mcp-session-id'] = ex.gatewayId
    } else if (typeof upstreamSid === 'string' && upstreamSid !== '') {
      const id = this.#table.open(ex.ctx, upstreamSid, ex.caller)
      ex.ctx.sessionId = id
      out['mcp-session-id'] = id
    }
    return out
  }

  #upstreamError(err: Error, req: IncomingMessage): void {
    const ex = this.#exchanges.get(req)
    this.#errors?.inc({ target: this.#name })
    this.#log.warn({ err: err.message }, 'upstream request failed')
    ex?.reject(new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.#name} is unreachable`, { rpcCode: RPC.INTERNAL_ERROR, expose: true, cause: err }))
  }

  /** Ends an idle upstream session, with its caller's cached credential (an idle sweep asks the IdP for nothing). */
  async #deleteUpstream(upstreamId: string, caller: Caller | undefined): Promise<void> {
    const attached = caller === undefined ? undefined : this.#auth?.peek(caller)?.headers
    const res = await fetch(this.#url, {
      method: 'DELETE',
      headers: { ...this.#staticHeaders, ...attached, 'mcp-session-id': upstreamId },
      signal: AbortSignal.timeout(2000),
    })
    await res.body?.cancel()
  }

  /** The endpoint's parser (McpEndpoint.parse), for a plugin or a trace that reads the body this pipes. */
  parse(body: Buffer): McpMessageInfo {
    return parseMcpBody(body)
  }

  holds(id: string): boolean {
    return this.#table.has(id)
  }

  sessions(): PassthroughSession[] {
    return this.#table.list()
  }

  async close(): Promise<void> {
    // A sealed session is not this process's alone: other workers and replicas go on serving it.
    await this.#table.close()
    this.#proxy.close()
    this.#agent.destroy()
  }
}
