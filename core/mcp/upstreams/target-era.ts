/**
 * The era a target speaks, as opposed to the era of a client's request (protocol.ts `eraOf`):
 * configured (`protocol: 2026-07-28` / `protocol: session`), or asked once with `server/discover`
 * (`protocol: auto`; MCP 2026-07-28 versioning: cached per server, asked again when the cached
 * answer fails). Owns the cache and the probes under way, so a target is probed once however
 * many requests want its answer at the same time.
 */
import type { Logger } from 'pino'
import type { UpstreamFactory } from '../../targets/types.ts'
import { isNotModern, type TargetEra, type UpstreamPool } from './pool.ts'
import type { Caller } from '../credentials.ts'

/**
 * Native upstreams per (target, subject): one. A server of the revision takes concurrent requests
 * on one connection, and a change one request makes (a list change, say) must reach the
 * subscriptions/listen another holds on that connection (stdio has no shared bus between processes).
 */
export const NATIVE_PER_KEY = 1

/** The era of each target, as configured or found (`of`). */
export class TargetEras {
  readonly #pool: UpstreamPool
  readonly #log: Logger
  /** Targets' eras as found by their `server/discover` (protocol: auto). */
  readonly #known = new Map<string, TargetEra>()
  readonly #probes = new Map<string, Promise<void>>()

  constructor(pool: UpstreamPool, log: Logger) {
    this.#pool = pool
    this.#log = log
  }

  /**
   * Whether `factory` speaks 2026-07-28. A probe that fails (network, 5xx) fails this request
   * and is tried again by the next one; the probing upstream stays pooled under the asking
   * subject, whose request uses it next.
   */
  async of(factory: UpstreamFactory, subjectKey: string, subject: string | undefined, caller?: Caller): Promise<TargetEra> {
    if (factory.protocol === '2026-07-28') return 'modern'
    if (factory.protocol === 'session') return 'legacy'
    const known = this.#known.get(factory.target)
    if (known !== undefined) return known
    let probe = this.#probes.get(factory.target)
    if (probe === undefined) {
      probe = (async () => {
        try {
          this.#pool.release(await this.#pool.acquire(factory, subjectKey, subject, NATIVE_PER_KEY, { era: 'modern', caller }))
          this.#known.set(factory.target, 'modern')
        } catch (err) {
          if (!isNotModern(err)) throw err
          this.#known.set(factory.target, 'legacy')
        }
        // Logged in the config's words (`protocol: session`), as operators set it.
        this.#log.info(
          { target: factory.target, era: this.#known.get(factory.target) === 'modern' ? 'modern' : 'session' },
          'target era found by server/discover'
        )
      })().finally(() => this.#probes.delete(factory.target))
      this.#probes.set(factory.target, probe)
    }
    await probe
    return this.#known.get(factory.target) ?? 'legacy'
  }

  /** A target found native that stopped speaking the revision: the session era from now on. */
  demote(target: string): void {
    this.#known.set(target, 'legacy')
  }
}
