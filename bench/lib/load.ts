/**
 * Load shapes. Closed loop: N workers, each awaiting its own request before
 * sending the next (measures capacity: at saturation latency is queueing).
 * Fixed rate (open loop): N connections on a fixed schedule, latency
 * corrected for coordinated omission (measures the time a request spends in
 * the system at a load it can carry). Both are bounded in duration and in
 * requests; a warm-up runs first and is not recorded. Latencies are kept per
 * request for exact percentiles.
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

async function phase(opts: LoadOptions, durationMs: number, max: number, record: boolean): Promise<Sample> {
  const lat = new Float64Array(record ? max : 0)
  let n = 0
  let errors = 0
  let firstError: string | undefined
  const start = performance.now()
  const end = start + durationMs
  async function worker(w: number): Promise<void> {
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

export async function runClosedLoop(opts: LoadOptions): Promise<Sample> {
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

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!
}

/** Merges samples of alternating rounds: throughput over total time, percentiles over all requests. */
export function summarize(samples: readonly Sample[]): Summary {
  const total = samples.reduce((a, s) => a + s.latenciesMs.length, 0)
  const all = new Float64Array(total)
  let o = 0
  for (const s of samples) {
    all.set(s.latenciesMs, o)
    o += s.latenciesMs.length
  }
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

export interface FixedRateOptions {
  /** Connections; each has at most one request in flight. */
  readonly workers: number
  readonly op: (w: number) => Promise<void>
  /** Total offered rate over all connections, requests per second. */
  readonly ratePerSec: number
  /** Unrecorded lead-in at the same rate. */
  readonly warmupMs: number
  /** Window in which requests are scheduled. */
  readonly durationMs: number
  readonly maxRequests: number
  /** After the window, slots still unsent are given up at this much later (bounds a system that falls behind). */
  readonly graceMs: number
}

export interface RateSample extends Sample {
  /** Requests scheduled in the recorded window. */
  readonly scheduled: number
  /** Scheduled but never sent (the system fell so far behind that the grace time ran out). */
  readonly unsent: number
  /** Slots at which the connection was still busy with the previous request (their wait counts). */
  readonly lateSlots: number
  /** The load generator's own timer lateness summed over the idle slots, and their number (diagnostic). */
  readonly timerLateMs: number
  readonly idleSlots: number
}

async function ratePhase(opts: FixedRateOptions, durationMs: number, record: boolean): Promise<RateSample> {
  const max = opts.maxRequests
  const lat = new Float64Array(record ? max : 0)
  const intervalMs = (1000 * opts.workers) / opts.ratePerSec
  let n = 0
  let errors = 0
  let firstError: string | undefined
  let scheduled = 0
  let unsent = 0
  let lateSlots = 0
  let timerLateMs = 0
  let idleSlots = 0
  let lastDone = 0
  const start = performance.now()
  const end = start + durationMs
  const giveUp = end + opts.graceMs
  async function worker(w: number): Promise<void> {
    // Connections are staggered evenly over one interval so the offered load is smooth, not bursts of `workers`.
    const base = start + (w * intervalMs) / opts.workers
    for (let k = 0; ; k++) {
      const slot = base + k * intervalMs
      if (slot >= end || scheduled >= max) return
      scheduled++
      let now = performance.now()
      if (now > giveUp || errors >= 20) {
        unsent++
        continue
      }
      let from: number
      if (now < slot) {
        // Idle at the slot: wait for it, and time from the actual send, so the
        // generator's own timer lateness is not charged to the system.
        await new Promise(resolve => setTimeout(resolve, slot - now))
        from = performance.now()
        // Node's timers have 1 ms granularity and may fire a fraction early; early sends are timed from the send too.
        timerLateMs += Math.max(0, from - slot)
        idleSlots++
      } else {
        // Still busy with the previous request when this one was due: the wait
        // is the system's, so time from the slot (coordinated omission corrected).
        from = slot
        lateSlots++
      }
      try {
        await opts.op(w)
      } catch (err) {
        errors++
        firstError ??= (err as Error).message
        continue
      }
      now = performance.now()
      lastDone = Math.max(lastDone, now)
      if (record && n < max) lat[n] = now - from
      n++
    }
  }
  await Promise.all(Array.from({ length: opts.workers }, (_, w) => worker(w)))
  // Achieved rate over the window, or until the last answer when the system ran past it.
  const elapsedMs = Math.max(end, lastDone) - start
  return {
    requests: n,
    errors,
    firstError,
    elapsedMs,
    latenciesMs: lat.subarray(0, record ? Math.min(n, max) : 0),
    scheduled,
    unsent,
    lateSlots,
    timerLateMs,
    idleSlots,
  }
}

/**
 * Open loop at a fixed rate: every connection sends on its own fixed
 * schedule (one request in flight at most, keep-alive), and latency runs
 * from the scheduled send time when a request had to wait for the previous
 * one. Below the system's capacity this measures the time a request spends in
 * the system, not in a queue the load generator built (as a saturating closed
 * loop does).
 */
export async function runFixedRate(opts: FixedRateOptions): Promise<RateSample> {
  if (opts.warmupMs > 0) await ratePhase(opts, opts.warmupMs, false)
  return ratePhase(opts, opts.durationMs, true)
}

export interface RateSummary extends Summary {
  readonly offeredPerSec: number
  readonly scheduled: number
  readonly unsent: number
  readonly lateSlots: number
  /** Mean lateness of the generator's timers at idle slots (not charged to the system). */
  readonly meanTimerLateMs: number
  /** Achieved at least 95% of the offered rate, every slot sent, no errors. */
  readonly sustained: boolean
}

export function summarizeRate(samples: readonly RateSample[], offeredPerSec: number): RateSummary {
  const s = summarize(samples)
  const scheduled = samples.reduce((a, x) => a + x.scheduled, 0)
  const unsent = samples.reduce((a, x) => a + x.unsent, 0)
  const lateSlots = samples.reduce((a, x) => a + x.lateSlots, 0)
  const idle = samples.reduce((a, x) => a + x.idleSlots, 0)
  const meanTimerLateMs = idle === 0 ? NaN : samples.reduce((a, x) => a + x.timerLateMs, 0) / idle
  return {
    ...s,
    offeredPerSec,
    scheduled,
    unsent,
    lateSlots,
    meanTimerLateMs,
    sustained: unsent === 0 && s.errors === 0 && s.reqPerSec >= 0.95 * offeredPerSec,
  }
}
