/**
 * The /mcp terminal handler: HTTP rules of the streamable-HTTP transport
 * (Accept, Content-Type, Mcp-Session-Id, MCP-Protocol-Version, batches),
 * the session registry with its caps and idle expiry, and the era dispatch
 * (revision.ts): session-era requests to their Session (session.ts),
 * 2026-07-28 requests to the stateless handler (modern.ts), both routed by
 * router.ts over the same upstream factories.
 */
import { randomBytes } from 'node:crypto'
import type { Logger } from 'pino'
import type { RequestContext } from '../context.ts'
import type { Plugin } from '../plugin.ts'
import type { McpEndpoint } from '../server.ts'
import type { GatewayConfig } from '../config.ts'
import type { Metrics } from '../observability/metrics.ts'
import type { JsonRpcMessage, UpstreamFactory } from '../targets/types.ts'
import { ProxyError, RPC } from '../errors.ts'
import { SseStream, SSE_HEADERS, streamLimits } from './sse.ts'
import { Session, type SessionEnv } from './legacy/session.ts'
import { allowsBatch, eraOf, isSessionRevision, negotiateRevision } from './protocol.ts'
import { createModernHandler } from './modern/handler.ts'
import { UpstreamPool, type PooledSummary } from './upstreams/pool.ts'
import { sharedFactory } from './legacy/shared-upstream.ts'
import { subjectKeyOf } from './routing/subject-key.ts'
import { createCallMeters } from './upstreams/call-metrics.ts'
import { createMemoryState, type SharedState } from '../cluster/shared-state.ts'
import type { ClusterForward } from '../cluster/forward.ts'
import { createTaskSeal } from './upstreams/task-seal.ts'
import { sessionLimit, shuttingDown, subjectSessionLimit } from './refusals.ts'
import { parseMcpBody } from './message.ts'
import { checkSessionIdSyntax, header } from './headers.ts'

/** `reason` values of mcp_proxy_sessions_ended_total (each series starts at 0); upstream ends count as `upstream`. */
const SESSION_END_REASONS = ['idle', 'deleted', 'ended by admin', 'gateway closing', 'initialize failed', 'upstream'] as const

export interface McpEndpointOptions {
  /** One factory per configured target, in config order. */
  readonly targets: readonly UpstreamFactory[]
  /** The pipeline's plugins; those with `allowMcpOperation` filter lists and refuse calls. */
  readonly plugins: readonly Plugin[]
  readonly config: Pick<GatewayConfig['mcp'], 'session' | 'failClosed'> & {
    /** SSE bounds and tool labels; defaults as in the schema when absent. */
    readonly limits?: Partial<Pick<GatewayConfig['mcp']['limits'], 'maxStreamBufferBytes' | 'maxBacklogBytes' | 'maxResumableStreams' | 'maxToolLabels' | 'maxTasksPerSession' | 'maxInputRequestsPerRound'>>
    /** Polling of session-era POST streams; off when absent. */
    readonly streams?: Partial<GatewayConfig['mcp']['streams']>
  }
  readonly log: Logger
  readonly metrics: Metrics
  /** When set (one HTTP target), session-era traffic is handed to it unchanged. */
  readonly passthrough?: McpEndpoint & { holds?(id: string): boolean }
  /**
   * Where per-subject session caps are counted: this process's memory by
   * default, Redis with `cluster.redis` so the cap holds across replicas.
   * `leaseMs`: how long a slot outlives a replica that stopped renewing it.
   */
  readonly shared?: { readonly state: SharedState; readonly leaseMs: number }
  /** With `cluster`: session ids name their owner, and another replica's sessions are forwarded to it. */
  readonly cluster?: ClusterForward
  /** The cluster/worker secret: 2026-07-28 task ids are sealed under a key derived from it (any process serves them). */
  readonly secret?: string
}

/** What the admin UI shows about one session. Never the whole id. */
export interface SessionSummary {
  /** First 8 characters of the session id. */
  readonly id: string
  readonly subject: string | undefined
  readonly targets: readonly string[]
  readonly protocolVersion: string
  readonly createdAt: number
  readonly lastActivityAt: number
  readonly pids: readonly number[]
  readonly getStream: boolean
  readonly inFlight: number
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
const KEEPALIVE_MS = 15_000
/** Pooled upstreams per (target, subject) for 2026-07-28 requests (docs/protocol.md, "Revision 2026-07-28"). */
const POOLED_PER_SUBJECT = 2
/** The schema's default of mcp.limits.maxTasksPerSession, for callers that pass no limits (tests). */
const DEFAULT_MAX_TASKS = 100

function sessionNotFound (): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: RPC.REQUEST_TIMEOUT })
}

function badRequest (code: 'MCPP_ERR_INVALID_REQUEST' | 'MCPP_ERR_SESSION_REQUIRED' | 'MCPP_ERR_PROTOCOL_VERSION', message: string): ProxyError {
  return new ProxyError(code, 400, message, { rpcCode: RPC.INVALID_REQUEST })
}

export function createMcpEndpoint (opts: McpEndpointOptions): GatewayMcpEndpoint {
  const { config, log } = opts
  const cluster = opts.cluster
  const sessions = new Map<string, Session>()
  const caps = opts.shared?.state ?? createMemoryState()
  const leaseMs = opts.shared?.leaseMs ?? Number.POSITIVE_INFINITY
  const idleMs = config.session.idleTimeoutSeconds * 1000
  let draining = false
  let closed = false
  /** Sessions whose upstreams are still closing (children exiting); close() waits for them. */
  const ending = new Set<Promise<void>>()

  /**
   * Ends a session now (out of the registry, pending requests failed, streams
   * ended: all synchronous in Session.end) and lets its upstreams finish
   * closing in the background, tracked.
   */
  function endSession (session: Session, reason: string): Promise<void> {
    const done = session.end(reason).catch((err: unknown) => { log.warn({ err }, 'ending a session failed') })
    ending.add(done)
    void done.finally(() => ending.delete(done))
    return done
  }

  const sessionGauge = opts.metrics.gauge('mcp_proxy_sessions', 'Open MCP sessions')
  sessionGauge.collect = () => [[undefined, sessions.size]]
  const sessionsEnded = opts.metrics.counter('mcp_proxy_sessions_ended_total', 'Ended MCP sessions by reason')
  for (const reason of SESSION_END_REASONS) sessionsEnded.init({ reason })

  const streams = streamLimits({ ...config.limits, pollAfterMs: config.streams?.pollAfterMs, log, metrics: opts.metrics })
  // Timed where each call is tracked in flight (calls.ts), for both eras.
  const meters = createCallMeters(opts.targets.map(f => f.target), opts.metrics, config.limits?.maxToolLabels)
  const env: SessionEnv = {
    log,
    meters,
    streams,
    requestTimeoutMs: config.session.requestTimeoutSeconds * 1000,
    failClosed: config.failClosed,
    maxTasks: config.limits?.maxTasksPerSession ?? DEFAULT_MAX_TASKS,
    checkers: opts.plugins.filter(p => typeof p.allowMcpOperation === 'function'),
    onEnd (session, reason) {
      if (sessions.get(session.id) !== session) return
      sessions.delete(session.id)
      caps.leave(session.subjectKey, session.id).catch((err: unknown) => { log.warn({ err }, 'freeing a session slot in shared state failed (its lease expires)') })
      sessionsEnded.inc({ reason: reason.startsWith('upstream') ? 'upstream' : reason })
    },
  }

  const sweeper = setInterval(function sweepIdleSessions () {
    const now = Date.now()
    for (const s of sessions.values()) {
      // A busy session (request in flight, or GET stream open) is active by definition.
      if (s.busy) s.lastActivityAt = now
      else if (now - s.lastActivityAt >= idleMs) void endSession(s, 'idle')
    }
  }, Math.min(Math.max(Math.floor(idleMs / 4), 100), 30_000))
  sweeper.unref()
  // Upstream request timeouts: one timer for all sessions rather than one per request.
  const expirer = setInterval(function expireUpstreamCalls () {
    const now = Date.now()
    for (const s of sessions.values()) s.expireCalls(now)
  }, Math.min(Math.max(Math.floor(env.requestTimeoutMs / 8), 100), 1000))
  expirer.unref()
  const keepAlive = setInterval(function keepStreamsAlive () {
    for (const s of sessions.values()) s.keepAlive()
  }, KEEPALIVE_MS)
  keepAlive.unref()
  // Shared slots are leases: renewed while their sessions live, so a dead replica's slots expire.
  const renewer = caps.kind === 'memory'
    ? undefined
    : setInterval(function renewSessionLeases () {
      const entries = [...sessions.values()].map(s => ({ key: s.subjectKey, member: s.id }))
      caps.renew(entries, leaseMs).catch((err: unknown) => { log.warn({ err }, 'renewing session leases in shared state failed') })
    }, Math.max(1000, Math.floor(leaseMs / 3)))
  renewer?.unref()

  // Revision 2026-07-28: stateless requests served by pooled upstreams, never shared across subjects.
  const pool = new UpstreamPool({
    log,
    perKeyMax: POOLED_PER_SUBJECT,
    globalMax: config.session.maxSessions,
    idleMs,
    requestTimeoutMs: env.requestTimeoutMs,
    meters,
  })
  const pooledGauge = opts.metrics.gauge('mcp_proxy_pooled_upstreams', 'Pooled upstreams: revision 2026-07-28 requests and share: subject targets')
  pooledGauge.collect = () => [[undefined, pool.size]]
  const modernHandler = createModernHandler({ targets: opts.targets, checkers: env.checkers, pool, log, failClosed: config.failClosed, streams, maxInputsPerRound: config.limits?.maxInputRequestsPerRound, maxTasks: env.maxTasks, taskSeal: createTaskSeal(opts.secret), shared: caps, mintState: opts.cluster?.newSessionId })
  // share: subject targets: the sessions of one subject lease the same pooled children.
  const sessionFactories = opts.targets.map(f => f.share === 'subject' ? sharedFactory(f, pool, env.maxTasks) : f)

  /** The caller's session, or 400/404. Another subject's session is "not found". */
  function lookup (ctx: RequestContext): Session {
    const sid = header(ctx, 'mcp-session-id')
    if (sid === undefined || sid === '') throw badRequest('MCPP_ERR_SESSION_REQUIRED', 'Bad Request: Mcp-Session-Id header is required')
    const s = sessions.get(sid)
    if (s === undefined || s.ended || s.subjectKey !== subjectKeyOf(ctx)) throw sessionNotFound()
    const v = header(ctx, 'mcp-protocol-version')
    if (v !== undefined && !isSessionRevision(v)) throw badRequest('MCPP_ERR_PROTOCOL_VERSION', `Bad Request: unsupported MCP-Protocol-Version: ${v}`)
    ctx.sessionId = sid
    return s
  }

  /** GET and DELETE belong to sessions; revision 2026-07-28 answers them 405 (Streamable HTTP, Backward Compatibility). */
  function modernNotAllowed (ctx: RequestContext): never {
    throw new ProxyError('MCPP_ERR_METHOD_NOT_ALLOWED', 405, `method ${ctx.method} not allowed in protocol revision 2026-07-28`, { headers: { allow: 'POST' }, rpcCode: RPC.INVALID_REQUEST })
  }

  async function post (ctx: RequestContext): Promise<void> {
    const accept = header(ctx, 'accept') ?? ''
    if (!accept.includes('application/json') || !accept.includes('text/event-stream')) {
      throw new ProxyError('MCPP_ERR_NOT_ACCEPTABLE', 406, 'Not Acceptable: Accept must list application/json and text/event-stream', { rpcCode: RPC.INVALID_REQUEST })
    }
    const ct = header(ctx, 'content-type') ?? ''
    if (!ct.toLowerCase().startsWith('application/json')) {
      throw new ProxyError('MCPP_ERR_UNSUPPORTED_MEDIA_TYPE', 415, 'Unsupported Media Type: Content-Type must be application/json', { rpcCode: RPC.INVALID_REQUEST })
    }
    const { body } = await ctx.readMcpMessage()
    if (eraOf(ctx, body) === 'modern') {
      if (cluster !== undefined && await relayParkedRetry(ctx, body as JsonRpcMessage, cluster)) return
      return modernHandler.post(ctx, body)
    }
    if (Array.isArray(body)) {
      const list = body as JsonRpcMessage[]
      if (list.some(m => m.method === 'initialize')) throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must not be part of a batch')
      const session = lookup(ctx)
      if (!allowsBatch(session.version)) throw badRequest('MCPP_ERR_INVALID_REQUEST', `Invalid Request: JSON-RPC batches are not supported in protocol revision ${session.version}`)
      await session.receive(ctx, list)
      return
    }
    const msg = body as JsonRpcMessage
    if (msg.method === 'initialize') {
      if (header(ctx, 'mcp-session-id') !== undefined) throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must not carry an Mcp-Session-Id')
      if (msg.id === undefined || msg.id === null) throw badRequest('MCPP_ERR_INVALID_REQUEST', 'Invalid Request: initialize must be a request')
      await initialize(ctx, msg)
      return
    }
    await lookup(ctx).receive(ctx, msg)
  }

  async function initialize (ctx: RequestContext, msg: JsonRpcMessage): Promise<void> {
    if (draining || closed) throw shuttingDown()
    if (sessions.size >= config.session.maxSessions) throw sessionLimit()
    const subjectKey = subjectKeyOf(ctx)
    const params = (msg.params ?? {}) as Record<string, unknown>
    const id = opts.cluster?.newSessionId() ?? randomBytes(24).toString('base64url')
    if (!await caps.join(subjectKey, id, config.session.maxSessionsPerSubject, leaseMs)) throw subjectSessionLimit()
    if (draining || closed || sessions.size >= config.session.maxSessions) {
      // Another initialize took the last slot (or shutdown began) while the cap was checked.
      void caps.leave(subjectKey, id).catch(() => {})
      throw sessionLimit()
    }
    const session = new Session({
      id, subject: ctx.auth?.subject, subjectKey, version: negotiateRevision(params.protocolVersion), factories: sessionFactories, env,
    })
    // Registered before the upstream handshake so concurrent initializes count against the caps.
    sessions.set(id, session)
    ctx.sessionId = id
    const result = await session.start(params, ctx)
    if (session.ended) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, 'upstream closed during initialize', { rpcCode: RPC.SERVER_ERROR, expose: true })
    ctx.log.debug({ session: id.slice(0, 8), protocolVersion: session.version }, 'session started')
    await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': id })
    new SseStream(ctx.res, streams).end({ jsonrpc: '2.0', id: msg.id, result })
  }

  async function get (ctx: RequestContext): Promise<void> {
    if (eraOf(ctx) === 'modern') modernNotAllowed(ctx)
    const accept = header(ctx, 'accept') ?? ''
    if (!accept.includes('text/event-stream')) {
      throw new ProxyError('MCPP_ERR_NOT_ACCEPTABLE', 406, 'Not Acceptable: Accept must list text/event-stream', { rpcCode: RPC.INVALID_REQUEST })
    }
    const session = lookup(ctx)
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

  async function del (ctx: RequestContext): Promise<void> {
    if (eraOf(ctx) === 'modern') modernNotAllowed(ctx)
    const session = lookup(ctx)
    // Answer once the session is gone from the registry; a stdio child can
    // take up to its stage timeout to exit, which the client need not wait for.
    void endSession(session, 'deleted')
    await ctx.writeHead(200, { 'content-length': 0 })
    ctx.res.end()
  }

  /**
   * The Authorization header of a request that may be a retry of a parked call, as it arrived: the
   * authentication plugin removes it from the request, and the owner of the parked call runs its own
   * pipeline, so the relay passes it on (as it does for a session's requests). Kept out of the
   * context's fields that plugins see; gone with the request.
   */
  const arrivedAuthorization = new WeakMap<RequestContext, string>()

  /**
   * A 2026-07-28 retry whose `requestState` names another process as the owner of its parked call
   * (modern.ts mints it as a session owner id): relayed there, and true. Runs in the terminal handler,
   * after the pipeline: the caller is authenticated before its body is read (a body of up to
   * maxBodyBytes read ahead of the token check let unauthenticated callers pin memory).
   */
  async function relayParkedRetry (ctx: RequestContext, msg: JsonRpcMessage, cluster: ClusterForward): Promise<boolean> {
    // The revision's Mcp-Method header names the method (checked against the body by the handler).
    if (Array.isArray(msg) || msg === null || typeof msg !== 'object' || !PARKABLE.has(header(ctx, 'mcp-method') ?? '')) return false
    const state = msg.params?.requestState
    const owner = typeof state === 'string' && header(ctx, 'mcp-session-id') === undefined ? cluster.remoteOwner(ctx, state) : undefined
    if (owner === undefined) return false
    try {
      await cluster.forward(ctx, owner, arrivedAuthorization.get(ctx))
    } catch (err) {
      if (ctx.headersSent || !ProxyError.is(err) || err.code !== 'MCPP_ERR_SESSION_NOT_FOUND') throw err
      // The owner is gone with the parked call: the retry's state is unknown now, as the handler answers one
      // it never minted (MCP 2026-07-28 multi round-trip requests: an invalid requestState is rejected).
      const body = JSON.stringify({ jsonrpc: '2.0', id: msg.id ?? null, error: { code: RPC.INVALID_PARAMS, message: 'Invalid params: unknown or expired requestState' } })
      await ctx.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      ctx.res.end(body)
    }
    return true
  }

  return {
    // Before the pipeline: the owner runs its own (the token is verified there, where
    // the session is bound to its subject); this replica only relays. Local sessions never decode their id.
    beforePipeline: cluster === undefined
      ? undefined
      : function forwardForeignSession (ctx: RequestContext): Promise<void | false> | undefined {
        const sid = header(ctx, 'mcp-session-id')
        if (sid === undefined) {
          // Perhaps a retry of a call parked on another process: relayed after the pipeline (relayParkedRetry).
          const authorization = ctx.req.headers.authorization
          if (authorization !== undefined && ctx.method === 'POST' && PARKABLE.has(header(ctx, 'mcp-method') ?? '')) arrivedAuthorization.set(ctx, authorization)
          return undefined
        }
        // A passthrough session this process has served is answered here without decrypting its id.
        if (sessions.has(sid) || opts.passthrough?.holds?.(sid) === true) return undefined
        const owner = cluster.remoteOwner(ctx, sid)
        return owner === undefined ? undefined : cluster.forward(ctx, owner)
      },

    parse: parseMcpBody,

    async handle (ctx: RequestContext): Promise<void> {
      checkSessionIdSyntax(ctx)
      if (opts.passthrough !== undefined && eraOf(ctx) === 'session') return opts.passthrough.handle(ctx)
      switch (ctx.method) {
        case 'POST': return post(ctx)
        case 'GET': return get(ctx)
        case 'DELETE': return del(ctx)
        default:
          throw new ProxyError('MCPP_ERR_METHOD_NOT_ALLOWED', 405, `method ${ctx.method} not allowed`, { headers: { allow: 'GET, POST, DELETE' }, rpcCode: RPC.INVALID_REQUEST })
      }
    },

    async close (): Promise<void> {
      closed = true
      clearInterval(sweeper)
      clearInterval(expirer)
      clearInterval(keepAlive)
      clearInterval(renewer)
      modernHandler.close()
      for (const s of [...sessions.values()]) void endSession(s, 'gateway closing')
      await Promise.allSettled([...ending])
      await pool.close()
      await opts.passthrough?.close()
      opts.cluster?.close()
    },

    sessions (): SessionSummary[] {
      return [...sessions.values()].map(s => ({
        id: s.id.slice(0, 8),
        subject: s.subject,
        targets: s.links.filter(l => l.up).map(l => l.target),
        protocolVersion: s.version,
        createdAt: s.createdAt,
        lastActivityAt: s.lastActivityAt,
        pids: s.links.flatMap(l => l.upstream.pid === undefined || !l.up ? [] : [l.upstream.pid]),
        getStream: s.hasGetStream,
        inFlight: s.inFlight,
      }))
    },

    endSession (idOrPrefix: string): boolean {
      let found = sessions.get(idOrPrefix)
      if (found === undefined && idOrPrefix.length >= 8) {
        const matches = [...sessions.values()].filter(s => s.id.startsWith(idOrPrefix))
        if (matches.length === 1) found = matches[0]
      }
      if (found === undefined) return false
      void endSession(found, 'ended by admin')
      return true
    },

    drain (): void {
      draining = true
      // Listen streams are idle by nature: ended now (a result, then the end
      // of the stream) instead of holding shutdown for the whole grace period.
      modernHandler.close()
    },

    pooled (): PooledSummary[] {
      return pool.describe()
    },

    describeTargets (): TargetSummary[] {
      return opts.targets.map(f => ({
        name: f.target,
        kind: f.kind,
        sessions: [...sessions.values()].filter(s => s.links.some(l => l.target === f.target && l.up)).length,
      }))
    },
  }
}
