/**
 * The MCP listener: a plain node:http server where one request is one
 * pipeline pass. Builds the RequestContext, runs `onRequest` hooks, then the
 * matching plugin route or the /mcp terminal handler, and writes errors
 * through the one error writer. It owns the edge's bounds (header count,
 * body size and deadline (body-deadline.ts), start-up hold (startup-hold.ts),
 * graceful close) and hands bodies on
 * as bytes: the /mcp endpoint parses its own (`McpEndpoint.parse`), and what
 * a finished request leaves behind is observability/access-log.ts's.
 */
import { createServer, type IncomingMessage, type ServerResponse, type Server, type OutgoingHttpHeaders } from 'node:http'
import type { Socket } from 'node:net'
import { randomBytes } from 'node:crypto'
import type { Logger } from 'pino'
import { concealToken, type AuthInfo, type RequestContext, type ResponseContext, type Reply, type McpMessageInfo, type Denial } from './context.ts'
import type { Pipeline } from './pipeline.ts'
import type { RouteTable } from './routes.ts'
import type { RouteDef } from './plugin.ts'
import { ProxyError, RPC } from './errors.ts'
import { writeError, errorBody } from './error-writer.ts'
import { bodyPending, readBounded } from './request-body.ts'
import { BodyDeadline } from './body-deadline.ts'
import { HeldRequests, type StartupHold } from './startup-hold.ts'
import { BAD_REQUEST, HEADERS_TOO_LARGE, REQUEST_TIMEOUT, rawAnswer, type RawAnswer } from './raw-answer.ts'
import { parseJsonRpcBody } from './jsonrpc.ts'
import type { Metrics } from './observability/metrics.ts'
import { AccessLog, type AccessRecord } from './observability/access-log.ts'
import { ClientAddresses, type ClientRelay } from './cluster/client-address.ts'
import { tracer } from './observability/tracing.ts'

/** The terminal handler for /mcp (see core/mcp/). */
export interface McpEndpoint {
  handle(ctx: RequestContext): Promise<void>
  /**
   * A request for /mcp that this process does not serve (another replica's
   * session, `cluster`): answered before the pipeline, or undefined (or a
   * promise of `false`) to go on. Decided from the head alone: a body is
   * never read before the pipeline has authenticated the caller.
   */
  beforePipeline?(ctx: RequestContext): Promise<void | false> | undefined
  /**
   * Parses a POST /mcp body, handed over as bytes: the endpoint owns its
   * message format. Core calls it at most once per request (the first
   * `readMcpMessage()`, by a plugin or the endpoint) and keeps the result for
   * every later reader. Absent: plain JSON-RPC 2.0 framing (core/jsonrpc.ts).
   */
  parse?(body: Buffer): McpMessageInfo
  close(): Promise<void>
}

export interface ServerLimits {
  maxBodyBytes: number
  headersTimeoutMs: number
  requestTimeoutMs: number
  keepAliveTimeoutMs: number
  /** Most header fields a request may carry (431 beyond). Default 100. */
  maxHeaders?: number
  /** Time to receive a body once the head has arrived (408 beyond); 0: none. Default 10000. */
  bodyTimeoutMs?: number
}

const DEFAULT_MAX_HEADERS = 100
const DEFAULT_BODY_TIMEOUT_MS = 10_000

/**
 * How often Node checks `headersTimeout` / `requestTimeout`. Its default of
 * 30 s let a slowloris outlive a 2 s `headersTimeoutMs` by up to 30 s: check
 * four times per shortest timeout, at least every second.
 */
function checkingIntervalOf(limits: ServerLimits): number {
  const timeouts = [limits.headersTimeoutMs, limits.requestTimeoutMs].filter(ms => ms > 0)
  return timeouts.length === 0 ? 1000 : Math.min(1000, Math.max(100, Math.floor(Math.min(...timeouts) / 4)))
}

export type { StartupHold } from './startup-hold.ts'

export interface GatewayServerOptions {
  pipeline: Pipeline
  routes: RouteTable
  mcp: McpEndpoint
  log: Logger
  limits: ServerLimits
  metrics: Metrics
  /** `mcp.trustedProxies`: peers whose X-Forwarded-For names the client (see client-address.ts). */
  trustedProxies?: readonly string[]
  /** With `cluster`: the client address a peer replica relayed, authenticated (client-address.ts). */
  clientRelay?: ClientRelay
  /** Called once per finished request (admin UI's recent-requests list). */
  onAccess?: (rec: AccessRecord) => void
  /** Hold requests until `attach` (the gateway binds before its plugins exist). Default: serve at once. */
  hold?: StartupHold
  /**
   * The value of INTERNAL_HEADER on the gateway's own requests to itself (the
   * admin UI reading the /.well-known documents every 15 s): those are kept out
   * of the access log, the recent requests and the metrics. A per-process
   * random value, so no client can hide its requests by sending the header.
   */
  internalToken?: string
}

/** Header marking the gateway's own requests to its MCP listener (see `internalToken`). */
export const INTERNAL_HEADER = 'x-mcp-proxy-internal'

/**
 * Request ids: a random per-process prefix and a counter, unique within the
 * process and unlikely to repeat across restarts, without a randomUUID() per
 * request.
 */
const REQUEST_ID_PREFIX = randomBytes(6).toString('base64url')
let requestSeq = 0

function requestIdOf(req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  if (typeof given === 'string' && given !== '') {
    const clean = given.slice(0, 64).replace(/[^\w.-]/g, '')
    if (clean !== '') return clean
  }
  return newRequestId()
}

function newRequestId(): string {
  return `${REQUEST_ID_PREFIX}-${(++requestSeq).toString(36)}`
}

class Context implements RequestContext {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  readonly id: string
  readonly method: string
  readonly path: string
  readonly query: string
  readonly startedAt: bigint
  readonly kind: RequestContext['kind']
  /** The plugin route of this path, looked up once per request (kind, dispatch, metrics). */
  readonly route: RouteDef | undefined
  readonly state = new Map<string, unknown>()
  sessionId?: string
  mcp?: McpMessageInfo
  target?: string
  denial?: Denial
  headersSent = false
  ran = { count: 0 }
  /** Whether the body deadline tracks this request (body-deadline.ts). */
  receiving = false
  /** Fails the body read under way (`readBody`), if one is. */
  rejectBody: ((err: unknown) => void) | undefined
  #body: Promise<Buffer> | undefined
  #mcp: Promise<McpMessageInfo> | undefined
  #log: Logger | undefined
  #clientAddress: string | undefined
  #auth: AuthInfo | undefined
  readonly #server: GatewayServer

  constructor(server: GatewayServer, req: IncomingMessage, res: ServerResponse) {
    this.#server = server
    this.req = req
    this.res = res
    this.id = requestIdOf(req)
    this.method = req.method ?? 'GET'
    const url = req.url ?? '/'
    const q = url.indexOf('?')
    this.path = q === -1 ? url : url.slice(0, q)
    this.query = q === -1 ? '' : url.slice(q + 1)
    this.startedAt = process.hrtime.bigint()
    this.route = this.path === '/mcp' ? undefined : server.routes.get(this.path)
    this.kind = this.path === '/mcp' ? 'mcp' : this.route === undefined ? 'other' : (this.route.kind ?? 'oauth')
  }

  get auth(): AuthInfo | undefined {
    return this.#auth
  }

  /** Whatever plugin sets it, the caller's token is never an enumerable property of `ctx.auth`. */
  set auth(auth: AuthInfo | undefined) {
    this.#auth = auth === undefined ? undefined : concealToken(auth)
  }

  /** The per-request child logger, made on first use: most requests never log on their own. */
  get log(): Logger {
    this.#log ??= this.#server.log.child({ reqId: this.id })
    return this.#log
  }

  /** Whether `log` has been used, so the access line can go through the same logger. */
  get hasLog(): boolean {
    return this.#log !== undefined
  }

  get clientAddress(): string {
    this.#clientAddress ??= this.#server.clientAddresses.of(this.req)
    return this.#clientAddress
  }

  readBody(maxBytes?: number): Promise<Buffer> {
    const limit = this.#server.limits.maxBodyBytes
    this.#body ??= readBounded(this.req, maxBytes !== undefined && maxBytes < limit ? maxBytes : limit, this)
    return this.#body
  }

  readMcpMessage(): Promise<McpMessageInfo> {
    this.#mcp ??= this.readBody().then(buf => {
      const info = this.#server.parseMcp(buf)
      this.mcp = info
      return info
    })
    return this.#mcp
  }

  /**
   * Without a promise-returning `onResponse` hook the head is written before
   * this returns (a shared resolved promise): no async frame per response.
   */
  writeHead(status: number, headers: OutgoingHttpHeaders = {}): Promise<void> {
    if (this.headersSent) return Promise.reject(new Error('writeHead called twice'))
    this.headersSent = true
    // Every answer names its request (the client's X-Request-ID, cleaned, or ours), before
    // the hooks run so that CORS may expose it.
    headers['x-request-id'] = this.id
    const rctx: ResponseContext = { request: this, statusCode: status, headers }
    try {
      const pending = this.#server.pipeline.runResponse(rctx, this.ran.count)
      if (pending !== undefined) return pending.then(() => this.#commitHead(rctx))
      this.#commitHead(rctx)
      return RESOLVED
    } catch (err) {
      return Promise.reject(err)
    }
  }

  #commitHead(rctx: ResponseContext): void {
    if (!this.res.destroyed) this.res.writeHead(rctx.statusCode, rctx.headers)
  }
}

const RESOLVED: Promise<void> = Promise.resolve()

function ignore(): void {}

/** Sends a Reply through `writeHead` (so `onResponse` hooks run). */
export async function sendReply(ctx: RequestContext, reply: Reply): Promise<void> {
  const headers: OutgoingHttpHeaders = { ...reply.headers }
  let payload: string | Buffer | undefined
  if (reply.body === undefined) payload = undefined
  else if (typeof reply.body === 'string' || Buffer.isBuffer(reply.body)) payload = reply.body
  else {
    payload = JSON.stringify(reply.body)
    headers['content-type'] ??= 'application/json'
  }
  if (payload !== undefined) headers['content-length'] = Buffer.byteLength(payload)
  await ctx.writeHead(reply.status, headers)
  ctx.res.end(payload)
}

export class GatewayServer {
  readonly server: Server
  pipeline: Pipeline
  routes: RouteTable
  readonly log: Logger
  readonly limits: ServerLimits
  readonly clientAddresses: ClientAddresses
  #mcp: McpEndpoint
  readonly #access: AccessLog
  readonly #internalToken: string | undefined
  /** `maxHeaders` as a length of `rawHeaders` (name, value, name, value...). */
  readonly #maxRawHeaders: number
  #mcpHeadersTooLarge: RawAnswer | undefined
  /** Undefined with `bodyTimeoutMs: 0`. */
  readonly #bodyDeadline: BodyDeadline | undefined
  #inFlight = 0
  #drained: (() => void) | undefined
  /** Requests that arrived before `attach`. Undefined once attached, so the hot path pays one check. */
  #held: HeldRequests | undefined
  /** Open `GET /mcp` streams: idle by nature, ended at once on close. */
  readonly #streams = new Set<Context>()
  #closing = false

  constructor(opts: GatewayServerOptions) {
    this.pipeline = opts.pipeline
    this.routes = opts.routes
    this.log = opts.log
    this.limits = opts.limits
    this.clientAddresses = new ClientAddresses(opts.trustedProxies, opts.clientRelay)
    this.#mcp = opts.mcp
    this.#access = new AccessLog(opts.log, opts.metrics, opts.onAccess)
    this.#internalToken = opts.internalToken
    if (opts.hold !== undefined) this.#held = new HeldRequests(opts.hold, opts.log, (req, res) => this.#refuseStarting(req, res))
    this.server = createServer(
      {
        headersTimeout: opts.limits.headersTimeoutMs,
        requestTimeout: opts.limits.requestTimeoutMs,
        keepAliveTimeout: opts.limits.keepAliveTimeoutMs,
        maxHeaderSize: 16384,
        connectionsCheckingInterval: checkingIntervalOf(opts.limits),
      },
      (req, res) => {
        if (this.#held === undefined) void this.handle(req, res)
        else this.#held.hold(req, res)
      }
    )
    const maxHeaders = opts.limits.maxHeaders ?? DEFAULT_MAX_HEADERS
    this.#maxRawHeaders = maxHeaders * 2
    // Node drops the fields past maxHeadersCount without a word (a second
    // Authorization among them went unseen): keep one more than the limit so
    // handle() sees the excess and refuses the request.
    this.server.maxHeadersCount = maxHeaders + 1
    this.server.on('clientError', (err, socket) => this.#clientError(err, socket as Socket))
    const bodyTimeoutMs = opts.limits.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS
    if (bodyTimeoutMs > 0) this.#bodyDeadline = new BodyDeadline(bodyTimeoutMs)
  }

  /**
   * A connection the HTTP parser gave up on (no request object exists):
   * 431 for an oversized head, 408 when the head (or, with requestTimeoutMs,
   * the whole request) came too slowly, 400 for anything else; then close.
   */
  #clientError(err: Error & { code?: string; rawPacket?: Buffer }, socket: Socket): void {
    const answer =
      err.code === 'HPE_HEADER_OVERFLOW' ? this.#headerOverflow(err.rawPacket) : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? REQUEST_TIMEOUT : BAD_REQUEST
    // As Node's own handler does: never write into a response already under way.
    const current = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage
    if (!socket.writable || current?.headersSent === true) {
      this.log.debug({ code: err.code, err: err.message }, 'client error on a closed or answering connection')
      socket.destroy()
      return
    }
    // No request object, so no client X-Request-ID to trust: a fresh id names this answer and its log line.
    const reqId = newRequestId()
    this.log.info({ reqId, code: err.code, status: answer.status, remote: socket.remoteAddress }, 'client error')
    socket.write(answer.statusLine + 'x-request-id: ' + reqId + '\r\n' + answer.rest, 'latin1')
    socket.destroySoon()
  }

  /**
   * The 431 for a head the parser refused. Node 24's parser refuses more fields
   * than maxHeadersCount itself (Node 20 and 22 drop the excess silently, and
   * `handle` counts them): the answer names both bounds, and is a JSON-RPC
   * error when the packet shows a request line for /mcp.
   */
  #headerOverflow(packet: Buffer | undefined): RawAnswer {
    const line = packet?.subarray(0, 64).toString('latin1') ?? ''
    if (!/^[A-Z]+ \/mcp[ ?]/.test(line)) return HEADERS_TOO_LARGE
    this.#mcpHeadersTooLarge ??= rawAnswer(
      431,
      `request header fields too large: more than ${this.#maxRawHeaders / 2} header fields, or a head over 16 KiB`,
      true
    )
    return this.#mcpHeadersTooLarge
  }

  /**
   * Swaps in the real pipeline, routes and /mcp handler. The gateway binds
   * its listener first (so `{base_url}` knows the actual port when the config
   * says 0), then creates the plugins and attaches them here.
   */
  attach(pipeline: Pipeline, routes: RouteTable, mcp: McpEndpoint): void {
    this.pipeline = pipeline
    this.routes = routes
    this.#mcp = mcp
    const held = this.#held
    this.#held = undefined
    held?.release((req, res) => {
      void this.handle(req, res)
    })
  }

  /** A POST /mcp body parsed by the attached endpoint's own parser (McpEndpoint.parse), else as plain JSON-RPC. */
  parseMcp(body: Buffer): McpMessageInfo {
    const mcp = this.#mcp
    return mcp.parse !== undefined ? mcp.parse(body) : parseJsonRpcBody(body)
  }

  /**
   * 503 "starting" in the body shape of the path (JSON-RPC on /mcp, OAuth
   * elsewhere), written directly: no plugin is there to run, and the caller
   * logged why (an expected condition, not an error with a stack).
   */
  #refuseStarting(req: IncomingMessage, res: ServerResponse): void {
    if (res.headersSent || res.destroyed) return
    const ctx = new Context(this, req, res)
    const body = JSON.stringify(
      errorBody(
        ctx,
        new ProxyError('MCPP_ERR_STARTING', 503, 'Service Unavailable: the gateway is starting', {
          expose: true,
          rpcCode: RPC.SERVER_ERROR,
        })
      )
    )
    res.writeHead(503, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store', 'retry-after': '1' })
    res.end(body)
  }

  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const ctx = new Context(this, req, res)
    tracer?.requestStarted(ctx)
    this.#inFlight++
    // 'close' comes once per response: `on` spares the once-wrapper.
    res.on('close', () => this.#finish(ctx))
    if (this.#bodyDeadline !== undefined && bodyPending(req)) this.#bodyDeadline.track(ctx)
    try {
      if (req.rawHeaders.length > this.#maxRawHeaders) {
        throw new ProxyError('MCPP_ERR_TOO_MANY_HEADERS', 431, `more than ${this.#maxRawHeaders / 2} header fields`, {
          headers: { connection: 'close' },
          rpcCode: RPC.INVALID_REQUEST,
        })
      }
      if (ctx.method === 'GET' && ctx.kind === 'mcp') {
        if (this.#closing) {
          throw new ProxyError('MCPP_ERR_SHUTTING_DOWN', 503, 'Service Unavailable: the gateway is shutting down', {
            headers: { 'retry-after': '1' },
            expose: true,
            rpcCode: RPC.SERVER_ERROR,
          })
        }
        this.#streams.add(ctx)
      }
      const elsewhere = ctx.path === '/mcp' ? this.#mcp.beforePipeline?.(ctx) : undefined
      if (elsewhere !== undefined && (await elsewhere) !== false) return
      const pending = this.pipeline.runRequest(ctx, ctx.ran)
      const reply = pending instanceof Promise ? await pending : pending
      if (reply !== undefined) {
        await sendReply(ctx, reply)
        return
      }
      const route = ctx.route
      if (route !== undefined) {
        if (!route.methods.includes(ctx.method)) {
          throw new ProxyError('MCPP_ERR_METHOD_NOT_ALLOWED', 405, `method ${ctx.method} not allowed`, {
            headers: { allow: route.methods.join(', ') },
            oauthError: 'invalid_request',
          })
        }
        await sendReply(ctx, await route.handler(ctx))
        return
      }
      if (ctx.path === '/mcp') {
        await this.#mcp.handle(ctx)
        return
      }
      throw new ProxyError('MCPP_ERR_NOT_FOUND', 404, `no route for ${ctx.path}`, { oauthError: 'not_found' })
    } catch (err) {
      try {
        await writeError(ctx, err)
      } catch (err2) {
        ctx.log.error({ err: err2 }, 'failed to write error response')
        res.destroy()
      }
    }
  }

  #finish(ctx: Context): void {
    this.#inFlight--
    if (ctx.receiving) this.#bodyDeadline!.untrack(ctx)
    if (ctx.method === 'GET') this.#streams.delete(ctx)
    const durationMs = Number(process.hrtime.bigint() - ctx.startedAt) / 1e6
    const status = ctx.res.headersSent ? ctx.res.statusCode : 0
    tracer?.requestFinished(ctx, status)
    if (this.#internalToken !== undefined && ctx.req.headers[INTERNAL_HEADER] === this.#internalToken) {
      if (this.#inFlight === 0) this.#drained?.()
      return
    }
    const route = ctx.kind === 'mcp' ? '/mcp' : ctx.route !== undefined ? ctx.path : 'other'
    this.#access.record(ctx, route, status, durationMs, ctx.hasLog)
    if (this.#inFlight === 0) this.#drained?.()
  }

  listen(port: number, host: string): Promise<{ port: number; host: string }> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(port, host, () => {
        this.server.off('error', reject)
        const a = this.server.address() as import('node:net').AddressInfo
        resolve({ port: a.port, host: a.address })
      })
    })
  }

  /**
   * Stops accepting, ends idle `GET /mcp` streams at once, waits up to
   * `graceMs` for the requests still in flight, then closes every socket.
   * A GET stream only carries what the server sends on its own (MCP
   * 2025-06-18 Streamable HTTP, "Listening for Messages from the Server"):
   * no answer to a client request is lost by ending it, and the client
   * reconnects elsewhere. Requests still held from start-up get 503.
   */
  async close(graceMs: number): Promise<void> {
    this.#closing = true
    const held = this.#held
    this.#held = undefined
    held?.refuseAll()
    const closed = new Promise<void>(resolve => this.server.close(() => resolve()))
    this.server.closeIdleConnections()
    for (const ctx of this.#streams) {
      if (!ctx.res.headersSent || ctx.res.writableEnded) continue
      // A pipe into this response (HTTP passthrough) may still write once
      // before it sees 'finish': that write-after-end error must not be uncaught.
      ctx.res.on('error', ignore)
      ctx.res.end()
    }
    if (this.#inFlight > 0) {
      await Promise.race([
        new Promise<void>(resolve => {
          this.#drained = resolve
        }),
        new Promise<void>(resolve => setTimeout(resolve, graceMs).unref()),
      ])
    }
    this.server.closeAllConnections()
    this.#bodyDeadline?.close()
    await closed
  }
}
