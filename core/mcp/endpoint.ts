/**
 * The /mcp terminal handler: the HTTP rules of the streamable-HTTP transport
 * both eras share (Accept, Content-Type, Mcp-Session-Id syntax), the parse
 * of a POST body (`parse`, core/mcp/message.ts), and the era dispatch
 * (protocol.ts `eraOf`): session-era requests to the session registry
 * (legacy/session-registry.ts, legacy/session-requests.ts) or the HTTP
 * passthrough (legacy/passthrough.ts), 2026-07-28 requests to the stateless
 * handler (modern/handler.ts), both routed over the same upstream factories.
 * With peers (`cluster` or `workers`), another process's sessions and parked
 * calls are relayed to their owner, through the one door MCP has to
 * core/cluster (cluster.ts).
 */
import type { RequestContext, McpMessageInfo } from '../context.ts'
import type { Plugin } from '../plugin.ts'
import type { McpEndpoint } from '../server.ts'
import type { GatewayConfig } from '../config.ts'
import type { Metrics } from '../observability/metrics.ts'
import type { JsonRpcMessage, UpstreamFactory } from '../targets/types.ts'
import type { Logger } from 'pino'
import { ProxyError, RPC } from '../errors.ts'
import { streamLimits } from './sse.ts'
import { eraOf } from './protocol.ts'
import { createModernHandler } from './modern/handler.ts'
import { UpstreamPool, type PooledSummary } from './upstreams/pool.ts'
import { sharedFactory } from './legacy/shared-upstream.ts'
import { createCallMeters } from './upstreams/call-metrics.ts'
import { createMcpCluster, type McpCluster, type McpRelay } from './cluster.ts'
import { parseMcpBody } from './message.ts'
import { checkSessionIdSyntax, header } from './headers.ts'
import { SessionRegistry, type SessionSummary } from './legacy/session-registry.ts'
import { deleteSession, openSessionStream, postToSession } from './legacy/session-requests.ts'
import type { CredentialBroker } from './credentials.ts'

export interface McpEndpointOptions {
  /** One factory per configured target, in config order. */
  readonly targets: readonly UpstreamFactory[]
  /** The pipeline's plugins; those with `allowMcpOperation` filter lists and refuse calls. */
  readonly plugins: readonly Plugin[]
  readonly config: Pick<GatewayConfig['mcp'], 'session' | 'failClosed'> & {
    /** SSE bounds and tool labels; defaults as in the schema when absent. */
    readonly limits?: Partial<
      Pick<
        GatewayConfig['mcp']['limits'],
        'maxStreamBufferBytes' | 'maxBacklogBytes' | 'maxResumableStreams' | 'maxToolLabels' | 'maxTasksPerSession' | 'maxInputRequestsPerRound'
      >
    >
    /** Polling of session-era POST streams; off when absent. */
    readonly streams?: Partial<GatewayConfig['mcp']['streams']>
  }
  readonly log: Logger
  readonly metrics: Metrics
  /** When set (one HTTP target), session-era traffic is handed to it unchanged. */
  readonly passthrough?: McpEndpoint & { holds?(id: string): boolean }
  /**
   * This process's place in the deployment (cluster.ts): where per-subject session caps and task slots are
   * counted, the relay to the owner of another process's session or parked call, the ids it mints, the
   * secret task ids are sealed under. Default: one process alone (memory state, no relay, random ids).
   */
  readonly cluster?: McpCluster
  /**
   * What each target receives for each caller (core/credentials/, built once by the composition root): sessions,
   * pooled upstreams and 2026-07-28 requests reach a target with `auth` only with the caller's credential.
   * Absent: no target has `auth`.
   */
  readonly credentials?: CredentialBroker
}

export interface TargetSummary {
  readonly name: string
  readonly kind: 'stdio' | 'http'
  /** Sessions with a running upstream of this target. */
  readonly sessions: number
}

export interface GatewayMcpEndpoint extends McpEndpoint {
  sessions(): SessionSummary[]
  /** Ends the session whose id or unique 8+ character prefix is given. */
  endSession(idOrPrefix: string): boolean
  /** Stops accepting new sessions (initialize gets 503) and ends listen streams; existing sessions keep working. */
  drain(): void
  describeTargets(): TargetSummary[]
  /** Pooled upstreams (revision 2026-07-28, and `share: subject` targets), per (target, subject). */
  pooled(): PooledSummary[]
}

/** 2026-07-28 methods whose call may be parked on an InputRequiredResult (a retry carries its `requestState`). */
const PARKABLE = new Set(['tools/call', 'prompts/get', 'resources/read'])
/** Pooled upstreams per (target, subject) for 2026-07-28 requests (docs/protocol.md, "Revision 2026-07-28"). */
const POOLED_PER_SUBJECT = 2
/** The schema's default of mcp.limits.maxTasksPerSession, for callers that pass no limits (tests). */
const DEFAULT_MAX_TASKS = 100

export function createMcpEndpoint(opts: McpEndpointOptions): GatewayMcpEndpoint {
  return new Endpoint(opts)
}

/** GET and DELETE belong to sessions; revision 2026-07-28 answers them 405 (Streamable HTTP, Backward Compatibility). */
function modernNotAllowed(ctx: RequestContext): never {
  throw new ProxyError('MCPP_ERR_METHOD_NOT_ALLOWED', 405, `method ${ctx.method} not allowed in protocol revision 2026-07-28`, {
    headers: { allow: 'POST' },
    rpcCode: RPC.INVALID_REQUEST,
  })
}

class Endpoint implements GatewayMcpEndpoint {
  readonly beforePipeline: GatewayMcpEndpoint['beforePipeline']
  readonly #opts: McpEndpointOptions
  readonly #sessions: SessionRegistry
  readonly #pool: UpstreamPool
  readonly #modern: ReturnType<typeof createModernHandler>
  readonly #cluster: McpCluster
  /**
   * The Authorization header of a request that may be a retry of a parked call, as it arrived: the
   * authentication plugin removes it from the request, and the owner of the parked call runs its own
   * pipeline, so the relay passes it on (as it does for a session's requests). Kept out of the
   * context's fields that plugins see; gone with the request.
   */
  readonly #arrivedAuthorization = new WeakMap<RequestContext, string>()

  constructor(opts: McpEndpointOptions) {
    const { config, log } = opts
    this.#opts = opts
    const idleMs = config.session.idleTimeoutSeconds * 1000
    const streams = streamLimits({ ...config.limits, pollAfterMs: config.streams?.pollAfterMs, log, metrics: opts.metrics })
    // Timed where each call is tracked in flight (upstreams/calls.ts), for both eras.
    const meters = createCallMeters(
      opts.targets.map(f => f.target),
      opts.metrics,
      config.limits?.maxToolLabels
    )
    const requestTimeoutMs = config.session.requestTimeoutSeconds * 1000
    const maxTasks = config.limits?.maxTasksPerSession ?? DEFAULT_MAX_TASKS
    const checkers = opts.plugins.filter(p => typeof p.allowMcpOperation === 'function')
    const cluster = opts.cluster ?? createMcpCluster()
    this.#cluster = cluster
    const caps = cluster.shared
    // Revision 2026-07-28: stateless requests served by pooled upstreams, never shared across subjects.
    const credentials = opts.credentials
    const pool = new UpstreamPool({ log, perKeyMax: POOLED_PER_SUBJECT, globalMax: config.session.maxSessions, idleMs, requestTimeoutMs, meters, credentials })
    this.#pool = pool
    this.#sessions = new SessionRegistry({
      env: { log, meters, streams, requestTimeoutMs, failClosed: config.failClosed, maxTasks, checkers, credentials },
      // share: subject targets: the sessions of one subject lease the same pooled children.
      factories: opts.targets.map(f => (f.share === 'subject' ? sharedFactory(f, pool, maxTasks) : f)),
      log,
      metrics: opts.metrics,
      idleMs,
      maxSessions: config.session.maxSessions,
      maxSessionsPerSubject: config.session.maxSessionsPerSubject,
      caps,
      leaseMs: cluster.leaseMs,
      newSessionId: cluster.newSessionId,
    })
    const pooledGauge = opts.metrics.gauge('mcp_proxy_pooled_upstreams', 'Pooled upstreams: revision 2026-07-28 requests and share: subject targets')
    pooledGauge.collect = () => [[undefined, pool.size]]
    this.#modern = createModernHandler({
      targets: opts.targets,
      checkers,
      pool,
      log,
      failClosed: config.failClosed,
      streams,
      maxInputsPerRound: config.limits?.maxInputRequestsPerRound,
      maxTasks,
      cluster,
      credentials,
    })
    // Before the pipeline: the owner runs its own (the token is verified there, where
    // the session is bound to its subject); this replica only relays. Local sessions never decode their id.
    const relay = cluster.relay
    this.beforePipeline = relay === undefined ? undefined : ctx => this.#forwardForeignSession(ctx, relay)
  }

  parse(body: Buffer): McpMessageInfo {
    return parseMcpBody(body)
  }

  /**
   * The request's era is decided here, by one eraOf call, and handed on: a POST's once its body is read
   * (#post), any other request's from its headers. Only a passthrough (which pipes session-era bodies
   * unread) needs the headers' verdict on a POST before the body: if they do not make it the
   * passthrough's, the body decides in #post.
   */
  async handle(ctx: RequestContext): Promise<void> {
    checkSessionIdSyntax(ctx)
    const passthrough = this.#opts.passthrough
    if (ctx.method === 'POST') {
      if (passthrough !== undefined && eraOf(ctx) === 'legacy') return passthrough.handle(ctx)
      return this.#post(ctx)
    }
    const era = eraOf(ctx)
    if (passthrough !== undefined && era === 'legacy') return passthrough.handle(ctx)
    switch (ctx.method) {
      case 'GET':
        if (era === 'modern') modernNotAllowed(ctx)
        return openSessionStream(this.#sessions, ctx)
      case 'DELETE':
        if (era === 'modern') modernNotAllowed(ctx)
        return deleteSession(this.#sessions, ctx)
      default:
        throw new ProxyError('MCPP_ERR_METHOD_NOT_ALLOWED', 405, `method ${ctx.method} not allowed`, {
          headers: { allow: 'GET, POST, DELETE' },
          rpcCode: RPC.INVALID_REQUEST,
        })
    }
  }

  async #post(ctx: RequestContext): Promise<void> {
    const accept = header(ctx, 'accept') ?? ''
    if (!accept.includes('application/json') || !accept.includes('text/event-stream')) {
      throw new ProxyError('MCPP_ERR_NOT_ACCEPTABLE', 406, 'Not Acceptable: Accept must list application/json and text/event-stream', {
        rpcCode: RPC.INVALID_REQUEST,
      })
    }
    const ct = header(ctx, 'content-type') ?? ''
    if (!ct.toLowerCase().startsWith('application/json')) {
      throw new ProxyError('MCPP_ERR_UNSUPPORTED_MEDIA_TYPE', 415, 'Unsupported Media Type: Content-Type must be application/json', {
        rpcCode: RPC.INVALID_REQUEST,
      })
    }
    const { body } = await ctx.readMcpMessage()
    if (eraOf(ctx, body) === 'modern') {
      const relay = this.#cluster.relay
      if (relay !== undefined && (await this.#relayParkedRetry(ctx, body as JsonRpcMessage, relay))) return
      return this.#modern.post(ctx, body)
    }
    return postToSession(this.#sessions, ctx, body)
  }

  /** A request for a session another replica owns: relayed there before the pipeline (McpEndpoint.beforePipeline). */
  #forwardForeignSession(ctx: RequestContext, relay: McpRelay): Promise<void | false> | undefined {
    const sid = header(ctx, 'mcp-session-id')
    if (sid === undefined) {
      // Perhaps a retry of a call parked on another process: relayed after the pipeline (relayParkedRetry).
      const authorization = ctx.req.headers.authorization
      if (authorization !== undefined && ctx.method === 'POST' && PARKABLE.has(header(ctx, 'mcp-method') ?? ''))
        this.#arrivedAuthorization.set(ctx, authorization)
      return undefined
    }
    // A passthrough session this process has served is answered here without decrypting its id.
    if (this.#sessions.has(sid) || this.#opts.passthrough?.holds?.(sid) === true) return undefined
    const owner = relay.remoteOwner(ctx, sid)
    return owner === undefined ? undefined : relay.forward(ctx, owner)
  }

  /**
   * A 2026-07-28 retry whose `requestState` names another process as the owner of its parked call
   * (modern/handler.ts mints it as a session owner id): relayed there, and true. Runs in the terminal handler,
   * after the pipeline: the caller is authenticated before its body is read (a body of up to
   * maxBodyBytes read ahead of the token check let unauthenticated callers pin memory).
   */
  async #relayParkedRetry(ctx: RequestContext, msg: JsonRpcMessage, relay: McpRelay): Promise<boolean> {
    // The revision's Mcp-Method header names the method (checked against the body by the handler).
    if (Array.isArray(msg) || msg === null || typeof msg !== 'object' || !PARKABLE.has(header(ctx, 'mcp-method') ?? '')) return false
    const state = msg.params?.requestState
    const owner = typeof state === 'string' && header(ctx, 'mcp-session-id') === undefined ? relay.remoteOwner(ctx, state) : undefined
    if (owner === undefined) return false
    try {
      await relay.forward(ctx, owner, this.#arrivedAuthorization.get(ctx))
    } catch (err) {
      if (ctx.headersSent || !ProxyError.is(err) || err.code !== 'MCPP_ERR_SESSION_NOT_FOUND') throw err
      // The owner is gone with the parked call: the retry's state is unknown now, as the handler answers one
      // it never minted (MCP 2026-07-28 multi round-trip requests: an invalid requestState is rejected).
      const body = JSON.stringify({
        jsonrpc: '2.0',
        id: msg.id ?? null,
        error: { code: RPC.INVALID_PARAMS, message: 'Invalid params: unknown or expired requestState' },
      })
      await ctx.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      ctx.res.end(body)
    }
    return true
  }

  async close(): Promise<void> {
    this.#modern.close()
    await this.#sessions.close()
    await this.#pool.close()
    await this.#opts.passthrough?.close()
    this.#cluster.close()
  }

  sessions(): SessionSummary[] {
    return this.#sessions.summaries()
  }

  endSession(idOrPrefix: string): boolean {
    return this.#sessions.endByPrefix(idOrPrefix, 'ended by admin')
  }

  drain(): void {
    this.#sessions.drain()
    // Listen streams are idle by nature: ended now (a result, then the end
    // of the stream) instead of holding shutdown for the whole grace period.
    this.#modern.close()
  }

  pooled(): PooledSummary[] {
    return this.#pool.describe()
  }

  describeTargets(): TargetSummary[] {
    return this.#opts.targets.map(f => ({ name: f.target, kind: f.kind, sessions: this.#sessions.countWith(f.target) }))
  }
}
