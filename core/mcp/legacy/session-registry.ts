/**
 * The live sessions of the session era (2024-11-05..2025-11-25): who may
 * open one (the gateway's `maxSessions`, the subject's
 * `maxSessionsPerSubject` counted in shared state, shutdown), finding the
 * caller's, and the timers every session shares (idle expiry, upstream
 * request timeouts, SSE keep-alive, lease renewal). One object the endpoint
 * and the session-era requests hand around, where a closure held it before.
 */
import { randomBytes } from 'node:crypto'
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { Metrics } from '../../observability/metrics.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import type { SharedState } from '../cluster.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { isSessionRevision, KEEPALIVE_MS, negotiateRevision } from '../protocol.ts'
import { subjectKeyOf } from '../routing/subject-key.ts'
import { callerOf } from '../credentials.ts'
import { header } from '../headers.ts'
import { sessionLimit, shuttingDown, subjectSessionLimit } from '../refusals.ts'
import { Session, type SessionEnv } from './session.ts'
import type { SessionUpstreamFactory } from './shared-upstream.ts'

/** `reason` values of mcp_proxy_sessions_ended_total (each series starts at 0); upstream ends count as `upstream`. */
const SESSION_END_REASONS = ['idle', 'deleted', 'ended by admin', 'gateway closing', 'initialize failed', 'upstream'] as const

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

export interface SessionRegistryOptions {
  /** What every session shares; the registry adds `onEnd`. */
  readonly env: Omit<SessionEnv, 'onEnd'>
  /** One per target, in config order (`share: subject` targets wrapped over the pool). */
  readonly factories: readonly SessionUpstreamFactory[]
  readonly log: Logger
  readonly metrics: Metrics
  readonly idleMs: number
  readonly maxSessions: number
  readonly maxSessionsPerSubject: number
  /** Where per-subject slots are counted (memory, the primary's store, or Redis) and how long a slot outlives its renewals. */
  readonly caps: SharedState
  readonly leaseMs: number
  /** With `cluster`: ids that name this replica. */
  readonly newSessionId?: () => string
}

export function sessionNotFound(): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: RPC.REQUEST_TIMEOUT })
}

export function badRequest(code: 'MCPP_ERR_INVALID_REQUEST' | 'MCPP_ERR_SESSION_REQUIRED' | 'MCPP_ERR_PROTOCOL_VERSION', message: string): ProxyError {
  return new ProxyError(code, 400, message, { rpcCode: RPC.INVALID_REQUEST })
}

export class SessionRegistry {
  readonly env: SessionEnv
  readonly #opts: SessionRegistryOptions
  readonly #sessions = new Map<string, Session>()
  /** Sessions whose upstreams are still closing (children exiting); close() waits for them. */
  readonly #ending = new Set<Promise<void>>()
  readonly #timers: NodeJS.Timeout[] = []
  #draining = false
  #closed = false

  constructor(opts: SessionRegistryOptions) {
    this.#opts = opts
    const gauge = opts.metrics.gauge('mcp_proxy_sessions', 'Open MCP sessions')
    gauge.collect = () => [[undefined, this.#sessions.size]]
    const sessionsEnded = opts.metrics.counter('mcp_proxy_sessions_ended_total', 'Ended MCP sessions by reason')
    for (const reason of SESSION_END_REASONS) sessionsEnded.init({ reason })
    this.env = {
      ...opts.env,
      onEnd: (session, reason) => {
        if (this.#sessions.get(session.id) !== session) return
        this.#sessions.delete(session.id)
        opts.caps.leave(session.subjectKey, session.id).catch((err: unknown) => {
          opts.log.warn({ err }, 'freeing a session slot in shared state failed (its lease expires)')
        })
        sessionsEnded.inc({ reason: reason.startsWith('upstream') ? 'upstream' : reason })
      },
    }
    this.#startTimers()
  }

  #startTimers(): void {
    const { idleMs, leaseMs, caps, log } = this.#opts
    const sessions = this.#sessions
    const every = (ms: number, fn: () => void): void => {
      const timer = setInterval(fn, ms)
      timer.unref()
      this.#timers.push(timer)
    }
    every(Math.min(Math.max(Math.floor(idleMs / 4), 100), 30_000), () => {
      const now = Date.now()
      for (const s of sessions.values()) {
        // A busy session (request in flight, or GET stream open) is active by definition.
        if (s.busy) s.lastActivityAt = now
        else if (now - s.lastActivityAt >= idleMs) void this.end(s, 'idle')
      }
    })
    // Upstream request timeouts: one timer for all sessions rather than one per request.
    every(Math.min(Math.max(Math.floor(this.env.requestTimeoutMs / 8), 100), 1000), () => {
      const now = Date.now()
      for (const s of sessions.values()) s.expireCalls(now)
    })
    every(KEEPALIVE_MS, () => {
      for (const s of sessions.values()) s.keepAlive()
    })
    // Shared slots are leases: renewed while their sessions live, so a dead replica's slots expire.
    if (caps.kind !== 'memory') {
      every(Math.max(1000, Math.floor(leaseMs / 3)), () => {
        const entries = [...sessions.values()].map(s => ({ key: s.subjectKey, member: s.id }))
        caps.renew(entries, leaseMs).catch((err: unknown) => {
          log.warn({ err }, 'renewing session leases in shared state failed')
        })
      })
    }
  }

  has(id: string): boolean {
    return this.#sessions.has(id)
  }

  /** The caller's session, or 400/404. Another subject's session is "not found". */
  lookup(ctx: RequestContext): Session {
    const sid = header(ctx, 'mcp-session-id')
    if (sid === undefined || sid === '') throw badRequest('MCPP_ERR_SESSION_REQUIRED', 'Bad Request: Mcp-Session-Id header is required')
    const s = this.#sessions.get(sid)
    if (s === undefined || s.ended || s.subjectKey !== subjectKeyOf(ctx)) throw sessionNotFound()
    const v = header(ctx, 'mcp-protocol-version')
    if (v !== undefined && !isSessionRevision(v)) throw badRequest('MCPP_ERR_PROTOCOL_VERSION', `Bad Request: unsupported MCP-Protocol-Version: ${v}`)
    ctx.sessionId = sid
    return s
  }

  /**
   * A new session for an initialize, within the caps, its upstreams started;
   * with the result to answer. Registered before the upstream handshake, so
   * concurrent initializes count against the caps.
   */
  async open(ctx: RequestContext, msg: JsonRpcMessage): Promise<{ session: Session; result: unknown }> {
    const { caps, leaseMs, maxSessions } = this.#opts
    if (this.#draining || this.#closed) throw shuttingDown()
    if (this.#sessions.size >= maxSessions) throw sessionLimit()
    const subjectKey = subjectKeyOf(ctx)
    const params = (msg.params ?? {}) as Record<string, unknown>
    const id = this.#opts.newSessionId?.() ?? randomBytes(24).toString('base64url')
    if (!(await caps.join(subjectKey, id, this.#opts.maxSessionsPerSubject, leaseMs))) throw subjectSessionLimit()
    if (this.#draining || this.#closed || this.#sessions.size >= maxSessions) {
      // Another initialize took the last slot (or shutdown began) while the cap was checked.
      void caps.leave(subjectKey, id).catch(() => {})
      throw sessionLimit()
    }
    const session = new Session({
      id,
      subject: ctx.auth?.subject,
      subjectKey,
      version: negotiateRevision(params.protocolVersion),
      factories: this.#opts.factories,
      env: this.env,
      caller: callerOf(ctx),
    })
    this.#sessions.set(id, session)
    ctx.sessionId = id
    const result = await session.start(params, ctx)
    if (session.ended) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, 'upstream closed during initialize', { rpcCode: RPC.SERVER_ERROR, expose: true })
    return { session, result }
  }

  /**
   * Ends a session now (out of the registry, pending requests failed, streams
   * ended: all synchronous in Session.end) and lets its upstreams finish
   * closing in the background, tracked.
   */
  end(session: Session, reason: string): Promise<void> {
    const done = session.end(reason).catch((err: unknown) => {
      this.#opts.log.warn({ err }, 'ending a session failed')
    })
    this.#ending.add(done)
    void done.finally(() => this.#ending.delete(done))
    return done
  }

  /** Ends the session whose id or unique 8+ character prefix is given. */
  endByPrefix(idOrPrefix: string, reason: string): boolean {
    let found = this.#sessions.get(idOrPrefix)
    if (found === undefined && idOrPrefix.length >= 8) {
      const matches = [...this.#sessions.values()].filter(s => s.id.startsWith(idOrPrefix))
      if (matches.length === 1) found = matches[0]
    }
    if (found === undefined) return false
    void this.end(found, reason)
    return true
  }

  /** No new sessions from now on (initialize gets 503); existing ones keep working. */
  drain(): void {
    this.#draining = true
  }

  summaries(): SessionSummary[] {
    return [...this.#sessions.values()].map(s => ({
      id: s.id.slice(0, 8),
      subject: s.subject,
      targets: s.links.filter(l => l.up).map(l => l.target),
      protocolVersion: s.version,
      createdAt: s.createdAt,
      lastActivityAt: s.lastActivityAt,
      pids: s.links.flatMap(l => (l.upstream.pid === undefined || !l.up ? [] : [l.upstream.pid])),
      getStream: s.hasGetStream,
      inFlight: s.inFlight,
    }))
  }

  /** Sessions with a running upstream of `target`. */
  countWith(target: string): number {
    return [...this.#sessions.values()].filter(s => s.links.some(l => l.target === target && l.up)).length
  }

  /** Stops the timers, ends every session and waits for their upstreams to close. */
  async close(): Promise<void> {
    this.#closed = true
    for (const timer of this.#timers) clearInterval(timer)
    for (const s of [...this.#sessions.values()]) void this.end(s, 'gateway closing')
    await Promise.allSettled([...this.#ending])
  }
}
