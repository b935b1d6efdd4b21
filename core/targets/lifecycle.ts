/**
 * Upstream lifecycle as the transports report it (start, end, failure, last
 * error), kept per target for the admin view and the upstream gauges. The
 * transports call the observer on start and end only, never per message, so
 * nothing of this sits on the data path; pids and live lists are read from
 * the live upstreams when someone asks (describe(), a metrics scrape).
 */
import type { Metrics, Counter } from '../observability/metrics.ts'
import type { UpstreamInfo, UpstreamObserver } from './types.ts'
import { liveChildCount } from './stdio.ts'

export interface TargetState {
  readonly name: string
  readonly kind: 'stdio' | 'http'
  /** Upstreams (one per session, or per shared child) running now. */
  readonly live: ReadonlyArray<{ pid: number | undefined; startedAt: number | undefined }>
  /** Upstreams started since the gateway started. */
  readonly started: number
  /** Upstreams that failed to start or ended with an error. */
  readonly failures: number
  readonly lastError: string | null
  readonly lastErrorAt: number | null
}

/** The lifecycle of one target's upstreams. */
export class TargetLifecycle implements UpstreamObserver {
  readonly name: string
  readonly kind: 'stdio' | 'http'
  readonly #live = new Set<UpstreamInfo>()
  readonly #starts: Counter
  readonly #failures: Counter
  #started = 0
  #failed = 0
  #lastError: string | undefined
  #lastErrorAt: number | undefined

  constructor(name: string, kind: 'stdio' | 'http', starts: Counter, failures: Counter) {
    this.name = name
    this.kind = kind
    this.#starts = starts
    this.#failures = failures
    starts.init({ target: name })
    failures.init({ target: name })
  }

  get liveCount(): number {
    return this.#live.size
  }

  started(upstream: UpstreamInfo): void {
    this.#started++
    this.#starts.inc({ target: this.name })
    this.#live.add(upstream)
  }

  ended(upstream: UpstreamInfo, error: Error | undefined): void {
    // Only the first report of a live upstream counts (see UpstreamObserver.ended).
    if (!this.#live.delete(upstream) || error === undefined) return
    this.#failed++
    this.#failures.inc({ target: this.name })
    this.#lastError = error.message
    this.#lastErrorAt = Date.now()
  }

  describe(): TargetState {
    return {
      name: this.name,
      kind: this.kind,
      live: [...this.#live].map(u => ({ pid: u.pid, startedAt: u.startedAt })),
      started: this.#started,
      failures: this.#failed,
      lastError: this.#lastError ?? null,
      lastErrorAt: this.#lastErrorAt ?? null,
    }
  }
}

/**
 * One TargetLifecycle per target, with `mcp_proxy_upstream_starts_total`,
 * `mcp_proxy_upstream_failures_total` and the scrape-time gauges
 * `mcp_proxy_upstreams` and `mcp_proxy_child_processes`.
 */
export function observeTargets(targets: ReadonlyArray<{ readonly name: string; readonly kind: 'stdio' | 'http' }>, metrics: Metrics): TargetLifecycle[] {
  const starts = metrics.counter('mcp_proxy_upstream_starts_total', 'Upstreams started by target (each session starts its own, unless the target is shared)')
  const failures = metrics.counter('mcp_proxy_upstream_failures_total', 'Upstreams that failed to start or ended with an error, by target')
  const all = targets.map(t => new TargetLifecycle(t.name, t.kind, starts, failures))
  metrics.gauge('mcp_proxy_upstreams', 'Running upstreams (one per session and target, or per shared child) by target').collect = () =>
    all.map(s => [{ target: s.name }, s.liveCount])
  metrics.gauge('mcp_proxy_child_processes', 'Live stdio child processes').collect = () => [[undefined, liveChildCount()]]
  return all
}
