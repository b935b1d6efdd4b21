/**
 * The pool of initialized upstreams, for both eras: the 2026-07-28 handler
 * (modern/) sends each stateless client request to one of them, and
 * `share: subject` sessions of the session era lease one shared child each
 * (legacy/shared-upstream.ts). The pool keys upstreams per (target, subject,
 * and era or declared capabilities); an upstream is never shared across
 * subjects: its state (resource subscriptions, log level, anything the server
 * keeps per connection) stays with the subject that created it. Idle
 * upstreams are closed after a timeout; a cap per key and a global cap bound
 * the processes. A stale upstream (a stdio child whose environment holds a
 * minted token past its freshness, `Upstream.staleAt`) is retired: no new
 * lease (the next acquire spawns a fresh child with a fresh credential), and
 * closed once its last lease ends. One pooled upstream and how the gateway
 * speaks to it are pooled-upstream.ts's.
 */
import type { Logger } from 'pino'
import { processLimit, shuttingDown } from '../refusals.ts'
import type { UpstreamFactory } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import type { TargetCallMeter } from './call-metrics.ts'
import { authOf, credentialClock, keyOnlyCaller, type CredentialBroker } from '../credentials.ts'
import { PooledUpstream, type AcquireHow } from './pooled-upstream.ts'

export { isNotModern, NotModernError, PooledUpstream } from './pooled-upstream.ts'
export type { AcquireHow, CallHooks, PoolCall, TargetEra } from './pooled-upstream.ts'

export interface PoolOptions {
  readonly log: Logger
  /** Upstreams per (target, subject); further concurrent requests share the least busy one. */
  readonly perKeyMax: number
  /** Upstreams in total; beyond it an idle upstream of another key is evicted, else 503. */
  readonly globalMax: number
  /** An upstream without requests in flight for this long is closed. */
  readonly idleMs: number
  readonly requestTimeoutMs: number
  /** Call metrics per target name (call-metrics.ts); absent, calls are not measured. */
  readonly meters?: ReadonlyMap<string, TargetCallMeter>
  /** The targets' credential sources (core/mcp/credentials.ts); absent: no target has `auth`. */
  readonly credentials?: CredentialBroker
}

/** What the admin side may see of a pooled upstream. */
export interface PooledSummary {
  readonly target: string
  readonly subject: string | undefined
  readonly pid: number | undefined
  readonly inFlight: number
  readonly leases: number
  readonly createdAt: number
  readonly lastUsedAt: number
}

/** The pool: (target, subject) -> upstreams. */
export class UpstreamPool {
  readonly #opts: PoolOptions
  readonly #byKey = new Map<string, PooledUpstream[]>()
  readonly #sweeper: NodeJS.Timeout
  /** The clock an upstream's staleAt is on (the credential broker's). */
  readonly #now: () => number
  #size = 0
  #closed = false

  constructor(opts: PoolOptions) {
    this.#opts = opts
    this.#now = credentialClock(opts.credentials)
    this.#sweeper = setInterval(() => this.#sweep(), Math.min(Math.max(Math.floor(opts.idleMs / 4), 100), 30_000))
    this.#sweeper.unref()
  }

  /** The pool's logger (a lease logs on it). */
  get log(): Logger {
    return this.#opts.log
  }

  get size(): number {
    return this.#size
  }

  /**
   * An initialized upstream of `factory` for `subjectKey`, leased: the caller
   * must call `release()` when its request (or listen stream, or shared
   * session) is over. `perKeyMax` caps the upstreams of this key.
   */
  async acquire(
    factory: UpstreamFactory,
    subjectKey: string,
    subject: string | undefined,
    perKeyMax = this.#opts.perKeyMax,
    how: AcquireHow = {}
  ): Promise<PooledUpstream> {
    if (this.#closed) throw shuttingDown()
    const key =
      factory.target +
      '\u0000' +
      subjectKey +
      (how.era === 'modern' ? '\u0000modern' : how.capabilities === undefined ? '' : '\u0000caps:' + [...how.capabilities].sort().join(','))
    const list = this.#byKey.get(key) ?? []
    const now = this.#now()
    // A stale upstream (its credential expired) takes no new lease: retired, it ends with its last lease.
    const live = [...list].filter(e => !e.closed && !this.#retired(e, now))
    let entry: PooledUpstream | undefined
    let created = false
    // Least busy first; a new upstream only when every one is busy and the cap allows.
    for (const e of live) if (entry === undefined || e.leases < entry.leases) entry = e
    if (entry === undefined || (entry.leases > 0 && live.length < perKeyMax)) {
      if (this.#size >= this.#opts.globalMax && !this.#evictIdle()) {
        if (entry === undefined) throw processLimit()
      } else {
        entry = new PooledUpstream(
          factory,
          key,
          subject,
          this.#opts.log,
          this.#opts.requestTimeoutMs,
          e => this.#remove(e),
          this.#opts.meters?.get(factory.target),
          how.caller === undefined ? { ...how, caller: keyOnlyCaller(subjectKey, subject) } : how,
          authOf(this.#opts.credentials, factory.target)
        )
        created = true
        list.push(entry)
        this.#byKey.set(key, list)
        this.#size++
      }
    }
    entry.leases++
    entry.lastUsedAt = Date.now()
    if (how.caller !== undefined) entry.caller = how.caller
    try {
      await entry.ready
    } catch (err) {
      entry.leases--
      throw err
    }
    if (entry.closed) {
      entry.leases--
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${factory.target} closed`, { rpcCode: RPC.SERVER_ERROR, expose: true })
    }
    if (!created && entry.stale(this.#now())) {
      // It went stale while this request waited for it: lease another. One created for this request serves it
      // whatever its staleAt (a token of unknown lifetime is fresh for the request at hand only).
      this.release(entry)
      return this.acquire(factory, subjectKey, subject, perKeyMax, how)
    }
    return entry
  }

  /** Whether `entry` is retired (its credential went stale): a lease on it should move to a fresh one. */
  retires(entry: PooledUpstream): boolean {
    return entry.stale(this.#now())
  }

  /** Ends a lease; a stale upstream's last one closes it. */
  release(entry: PooledUpstream): void {
    if (entry.leases > 0) entry.leases--
    entry.lastUsedAt = Date.now()
    if (entry.leases === 0) this.#retired(entry, this.#now())
  }

  describe(): PooledSummary[] {
    const out: PooledSummary[] = []
    for (const list of this.#byKey.values()) {
      for (const e of list) {
        out.push({
          target: e.target,
          subject: e.subject,
          pid: e.upstream.pid,
          inFlight: e.inFlight,
          leases: e.leases,
          createdAt: e.createdAt,
          lastUsedAt: e.lastUsedAt,
        })
      }
    }
    return out
  }

  async close(): Promise<void> {
    this.#closed = true
    clearInterval(this.#sweeper)
    const all = [...this.#byKey.values()].flat()
    await Promise.allSettled(all.map(e => e.close()))
  }

  #remove(e: PooledUpstream): void {
    const list = this.#byKey.get(e.key)
    if (list === undefined) return
    const i = list.indexOf(e)
    if (i < 0) return
    list.splice(i, 1)
    this.#size--
    if (list.length === 0) this.#byKey.delete(e.key)
  }

  /**
   * Whether `e` is stale at `now` (Upstream.staleAt: a stdio child's credential expired): it gets
   * no new lease, and is closed here once it has none.
   */
  #retired(e: PooledUpstream, now: number): boolean {
    if (!e.stale(now)) return false
    if (e.leases === 0 && !e.closed) {
      this.#opts.log.info({ target: e.target, pid: e.upstream.pid }, 'closing pooled upstream: its credential is stale')
      void e.close()
    }
    return true
  }

  /** Closes the longest-idle upstream without leases; false when there is none. */
  #evictIdle(): boolean {
    let victim: PooledUpstream | undefined
    for (const list of this.#byKey.values()) {
      for (const e of list) if (e.leases === 0 && e.up && (victim === undefined || e.lastUsedAt < victim.lastUsedAt)) victim = e
    }
    if (victim === undefined) return false
    void victim.close()
    return true
  }

  #sweep(): void {
    const now = Date.now()
    const clock = this.#now()
    for (const list of [...this.#byKey.values()]) {
      for (const e of [...list]) {
        if (this.#retired(e, clock)) continue
        if (e.leases === 0 && e.up && now - e.lastUsedAt >= this.#opts.idleMs) {
          this.#opts.log.debug({ target: e.target }, 'closing idle pooled upstream')
          void e.close()
        }
      }
    }
  }
}
