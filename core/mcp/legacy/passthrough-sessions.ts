/**
 * The passthrough's session table: gateway session ids mapped to the
 * upstream's, bound to the caller's key (subject, or client address without a
 * token), and held to the same bounds as every other session
 * (`mcp.session.idleTimeoutSeconds`, `mcp.session.maxSessions`). An explicit
 * object the passthrough's request path hands around, rather than state a
 * closure captures.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import { subjectKeyOf } from '../routing/subject-key.ts'
import { sessionLimit } from '../refusals.ts'
import type { SealedSessions } from '../cluster.ts'
import type { Caller } from '../credentials.ts'

export interface PassthroughSession {
  /** First 8 characters of the gateway session id (never the whole id). */
  readonly id: string
  readonly subject: string | undefined
  readonly createdAt: number
  readonly lastSeenAt: number
}

/**
 * `key`: what the session is bound to, the subject or an anonymous caller's address (docs/security.md: an
 * anonymous session answers only the address that opened it). `sealed`: the id carries the upstream session;
 * this entry only spares decrypting it on every request. `inFlight`: exchanges under way (an open GET stream
 * among them), during which the session is not idle.
 */
export interface Mapping {
  readonly upstream: string
  readonly subject: string | undefined
  readonly key: string
  readonly createdAt: number
  lastSeenAt: number
  readonly sealed: boolean
  inFlight: number
  /** A target with `auth`: the session's latest caller, whose cached credential ends it upstream (idle). */
  caller?: Caller
}

export interface PassthroughSessionsOptions {
  readonly log: Logger
  /** Sessions unused for this long are ended. */
  readonly idleMs: number
  /** Sessions this process holds at most; an initialize beyond it is refused (503). */
  readonly maxSessions: number
  readonly makeId: () => string
  readonly sealed: SealedSessions | undefined
  /** Ends an upstream session this process alone knows (best effort), with its latest caller's credential if any. */
  readonly endUpstream: (upstreamId: string, caller?: Caller) => Promise<void>
}

export class PassthroughSessions {
  readonly #opts: PassthroughSessionsOptions
  readonly #byId = new Map<string, Mapping>()
  /** Requests without a session id under way: each may open a session, so each holds a slot until it ends. */
  #opening = 0
  readonly #sweep: NodeJS.Timeout

  constructor(opts: PassthroughSessionsOptions) {
    this.#opts = opts
    this.#sweep = setInterval(() => this.#sweepIdle(), Math.min(Math.max(Math.floor(opts.idleMs / 4), 100), 30_000))
    this.#sweep.unref()
  }

  has(id: string): boolean {
    return this.#byId.has(id)
  }

  /**
   * The caller's session named by `presented`, or undefined (unknown, or
   * another caller's: the same answer). A sealed id first seen here (made by
   * another worker or replica, or before this one forgot it) is opened once,
   * then held like one made here.
   */
  find(ctx: RequestContext, presented: string): Mapping | undefined {
    const key = subjectKeyOf(ctx)
    let m = this.#byId.get(presented)
    if (m === undefined && this.#opts.sealed !== undefined) {
      const upstream = this.#opts.sealed.open(key, presented)
      if (upstream !== undefined) {
        const now = Date.now()
        m = { upstream, subject: ctx.auth?.subject, key, createdAt: now, lastSeenAt: now, sealed: true, inFlight: 0 }
        this.#byId.set(presented, m)
      }
    }
    if (m === undefined || m.key !== key) return undefined
    m.lastSeenAt = Date.now()
    return m
  }

  /**
   * A slot for a request without a session id (an initialize, or an error
   * the upstream answers): refused at `maxSessions`, counting the requests
   * still under way. Give it back with `release`.
   */
  reserve(): void {
    if (this.#byId.size + this.#opening >= this.#opts.maxSessions) throw sessionLimit()
    this.#opening++
  }

  release(): void {
    this.#opening--
  }

  /** Records the session the upstream just made; its gateway id. */
  open(ctx: RequestContext, upstreamSid: string, caller?: Caller): string {
    const key = subjectKeyOf(ctx)
    const sealedId = this.#opts.sealed?.seal(key, upstreamSid)
    const id = sealedId ?? this.#opts.makeId()
    const now = Date.now()
    this.#byId.set(id, {
      upstream: upstreamSid,
      subject: ctx.auth?.subject,
      key,
      createdAt: now,
      lastSeenAt: now,
      sealed: sealedId !== undefined,
      inFlight: 0,
      caller,
    })
    return id
  }

  /** Forgets a session the upstream ended (its 404, or a DELETE). */
  forget(id: string): void {
    this.#byId.delete(id)
  }

  list(): PassthroughSession[] {
    return [...this.#byId].map(([id, m]) => ({ id: id.slice(0, 8), subject: m.subject, createdAt: m.createdAt, lastSeenAt: m.lastSeenAt }))
  }

  /**
   * Ends the idle sessions. One this process alone holds is ended upstream
   * too; a sealed one is only forgotten here (other workers and replicas may
   * go on serving it; the next request opens it again).
   */
  #sweepIdle(): void {
    const now = Date.now()
    for (const [id, m] of this.#byId) {
      if (m.inFlight > 0) m.lastSeenAt = now
      else if (now - m.lastSeenAt >= this.#opts.idleMs) {
        this.#byId.delete(id)
        if (!m.sealed) this.#endUpstream(m.upstream, m.caller)
      }
    }
  }

  #endUpstream(upstream: string, caller: Caller | undefined): void {
    this.#opts.endUpstream(upstream, caller).catch((err: unknown) => {
      this.#opts.log.debug({ err }, 'ending an idle upstream session failed')
    })
  }

  /** Best-effort end of every upstream session only this process knows (not sealed ones), then forgets them all. */
  async close(): Promise<void> {
    clearInterval(this.#sweep)
    const all = [...this.#byId.values()].filter(m => !m.sealed)
    this.#byId.clear()
    await Promise.allSettled(all.map(m => this.#opts.endUpstream(m.upstream, m.caller)))
  }
}
