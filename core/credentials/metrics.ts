/**
 * The credential layer's metrics, declared once per broker and bound per
 * target at start-up with every series at 0 (a dashboard shows 0 before the
 * first exchange, and rate() sees it): `mcp_proxy_credential_exchanges_total`
 * {target, result: hit (answered from the cache, or by another request's
 * exchange in flight) | miss (an exchange with the IdP)},
 * `mcp_proxy_credential_failures_total` {target, reason (FAILURE_REASONS)},
 * `mcp_proxy_credential_cache_entries` {target}. Labels are the configured
 * target names and a fixed list: nothing from a caller or the IdP.
 */
import type { CounterHandle, Metrics } from '../observability/metrics.ts'
import { FAILURE_REASONS, type FailureReason } from './failures.ts'

/** One target's series. */
export interface TargetMetrics {
  readonly hit: CounterHandle
  readonly miss: CounterHandle
  failed(reason: FailureReason): void
  entries(n: number): void
}

/**
 * Binds `target`'s series. `exchanging`: the target mints tokens (every
 * series); otherwise only its claim failures exist.
 */
export function targetMetrics(metrics: Metrics, target: string, exchanging: boolean): TargetMetrics {
  const exchanges = metrics.counter(
    'mcp_proxy_credential_exchanges_total',
    'Credential resolves of targets with tokenExchange or onBehalfOf, by result (hit: no new exchange, miss: an exchange with the IdP)'
  )
  const failures = metrics.counter('mcp_proxy_credential_failures_total', 'Failed credential resolves by target and reason')
  const entries = metrics.gauge('mcp_proxy_credential_cache_entries', 'Minted tokens cached, by target')
  const reasons: readonly FailureReason[] = exchanging ? FAILURE_REASONS : ['claim']
  const byReason = new Map<FailureReason, CounterHandle>()
  for (const reason of reasons) {
    failures.init({ target, reason })
    byReason.set(reason, failures.labels({ target, reason }))
  }
  if (exchanging) {
    exchanges.init({ target, result: 'hit' })
    exchanges.init({ target, result: 'miss' })
    entries.set(0, { target })
  }
  return {
    hit: exchanges.labels({ target, result: 'hit' }),
    miss: exchanges.labels({ target, result: 'miss' }),
    failed(reason) {
      ;(byReason.get(reason) ?? failures.labels({ target, reason })).inc()
    },
    entries(n) {
      entries.set(n, { target })
    },
  }
}
