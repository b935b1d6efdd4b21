/**
 * Closed-loop load: N workers, each awaiting its own request before sending
 * the next, for a bounded duration and a bounded request count. A warm-up
 * phase runs first and is not recorded. Latencies are kept per request for
 * exact percentiles.
 */
import { performance } from 'node:perf_hooks'

export interface LoadOptions {
  readonly workers: number
  /** One request of worker `w`. */
  readonly op: (w: number) => Promise<void>
  readonly warmupMs: number
  readonly durationMs: number
  /** Upper bound on recorded requests (the run stops at whichever limit comes first). */
  readonly maxRequests: number
}

export interface Sample {
  readonly requests: number
  readonly errors: number
  readonly firstError: string | undefined
  readonly elapsedMs: number
  readonly latenciesMs: Float64Array
}

async function phase (opts: LoadOptions, durationMs: number, max: number, record: boolean): Promise<Sample> {
  const lat = new Float64Array(record ? max : 0)
  let n = 0
  let errors = 0
  let firstError: string | undefined
  const start = performance.now()
  const end = start + durationMs
  async function worker (w: number): Promise<void> {
    while (n < max && performance.now() < end && errors < 20) {
      const t0 = performance.now()
      try {
        await opts.op(w)
      } catch (err) {
        errors++
        firstError ??= (err as Error).message
        continue
      }
      if (n < max) {
        if (record) lat[n] = performance.now() - t0
        n++
      }
    }
  }
  await Promise.all(Array.from({ length: opts.workers }, (_, w) => worker(w)))
  const elapsedMs = performance.now() - start
  return { requests: n, errors, firstError, elapsedMs, latenciesMs: lat.subarray(0, record ? n : 0) }
}

export async function runClosedLoop (opts: LoadOptions): Promise<Sample> {
  if (opts.warmupMs > 0) await phase(opts, opts.warmupMs, opts.maxRequests, false)
  return phase(opts, opts.durationMs, opts.maxRequests, true)
}

export interface Summary {
  readonly requests: number
  readonly errors: number
  readonly firstError?: string
  readonly reqPerSec: number
  readonly p50Ms: number
  readonly p99Ms: number
  readonly meanMs: number
}

function percentile (sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!
}

/** Merges samples of alternating rounds: throughput over total time, percentiles over all requests. */
export function summarize (samples: readonly Sample[]): Summary {
  const total = samples.reduce((a, s) => a + s.latenciesMs.length, 0)
  const all = new Float64Array(total)
  let o = 0
  for (const s of samples) { all.set(s.latenciesMs, o); o += s.latenciesMs.length }
  all.sort()
  const requests = samples.reduce((a, s) => a + s.requests, 0)
  const elapsed = samples.reduce((a, s) => a + s.elapsedMs, 0)
  const errors = samples.reduce((a, s) => a + s.errors, 0)
  const firstError = samples.find(s => s.firstError !== undefined)?.firstError
  let sum = 0
  for (const v of all) sum += v
  return {
    requests,
    errors,
    ...(firstError !== undefined ? { firstError } : {}),
    reqPerSec: elapsed > 0 ? requests / (elapsed / 1000) : 0,
    p50Ms: percentile(all, 0.5),
    p99Ms: percentile(all, 0.99),
    meanMs: total > 0 ? sum / total : NaN,
  }
}
