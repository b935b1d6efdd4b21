/**
 * Process and runtime metrics under the names prom-client's default
 * collectors use (process_*, nodejs_*), so existing Node.js dashboards and
 * alerts work, kept in our own registry: one exposition, no second registry
 * to merge, no dependency, and nothing synchronous on a scrape (prom-client
 * reads /proc with readFileSync/readdirSync there). Values are read when
 * scraped; only the event-loop delay monitor and the GC observer run between
 * scrapes, and both stop when the gateway closes.
 */
import { readdir, readFile } from 'node:fs/promises'
import { monitorEventLoopDelay, PerformanceObserver, type PerformanceEntry } from 'node:perf_hooks'
import { getHeapSpaceStatistics } from 'node:v8'
import type { Metrics } from './metrics.ts'

/** Start time of this process in seconds since the epoch. */
const START_SECONDS = Math.round((Date.now() - process.uptime() * 1000) / 1000)

/** GC kinds as perf_hooks numbers them (constants.NODE_PERFORMANCE_GC_*). */
const GC_KINDS: Record<number, string> = { 1: 'minor', 2: 'major', 4: 'incremental', 8: 'weakcb' }

/** Registers the process_* and nodejs_* families on `metrics`; returns a function that stops the monitors. */
export function collectProcessMetrics(metrics: Metrics): () => void {
  const cpu = (): NodeJS.CpuUsage => process.cpuUsage()
  metrics.counter('process_cpu_user_seconds_total', 'Total user CPU time spent in seconds.').collect = () => [[undefined, cpu().user / 1e6]]
  metrics.counter('process_cpu_system_seconds_total', 'Total system CPU time spent in seconds.').collect = () => [[undefined, cpu().system / 1e6]]
  metrics.counter('process_cpu_seconds_total', 'Total user and system CPU time spent in seconds.').collect = () => {
    const c = cpu()
    return [[undefined, (c.user + c.system) / 1e6]]
  }
  metrics.gauge('process_start_time_seconds', 'Start time of the process since unix epoch in seconds.').collect = () => [[undefined, START_SECONDS]]
  metrics.gauge('process_resident_memory_bytes', 'Resident memory size in bytes.').collect = () => [[undefined, process.memoryUsage.rss()]]

  // Linux only, read asynchronously before each scrape (absent elsewhere, like prom-client's).
  let openFds: number | undefined
  let maxFds: number | undefined
  if (process.platform === 'linux') {
    metrics.gauge('process_open_fds', 'Number of open file descriptors.').collect = () => (openFds === undefined ? [] : [[undefined, openFds]])
    metrics.gauge('process_max_fds', 'Maximum number of open file descriptors.').collect = () => (maxFds === undefined ? [] : [[undefined, maxFds]])
    metrics.beforeScrape(async () => {
      const [fds, limits] = await Promise.all([readdir('/proc/self/fd'), maxFds === undefined ? readFile('/proc/self/limits', 'utf8') : undefined])
      // readdir's own descriptor is in the list.
      openFds = fds.length - 1
      if (limits !== undefined) {
        const m = /^Max open files\s+(\d+)/m.exec(limits)
        if (m !== null) maxFds = Number(m[1])
      }
    })
  }

  const heap = (): NodeJS.MemoryUsage => process.memoryUsage()
  metrics.gauge('nodejs_heap_size_total_bytes', 'Process heap size from Node.js in bytes.').collect = () => [[undefined, heap().heapTotal]]
  metrics.gauge('nodejs_heap_size_used_bytes', 'Process heap size used from Node.js in bytes.').collect = () => [[undefined, heap().heapUsed]]
  metrics.gauge('nodejs_external_memory_bytes', 'Node.js external memory size in bytes.').collect = () => [[undefined, heap().external]]
  const spaces = (field: 'space_size' | 'space_used_size' | 'space_available_size') => () =>
    getHeapSpaceStatistics().map((s): [{ space: string }, number] => [{ space: s.space_name.replace(/_space$/, '') }, s[field]])
  metrics.gauge('nodejs_heap_space_size_total_bytes', 'Process heap space size total from Node.js in bytes.').collect = spaces('space_size')
  metrics.gauge('nodejs_heap_space_size_used_bytes', 'Process heap space size used from Node.js in bytes.').collect = spaces('space_used_size')
  metrics.gauge('nodejs_heap_space_size_available_bytes', 'Process heap space size available from Node.js in bytes.').collect = spaces('space_available_size')

  metrics.gauge(
    'nodejs_active_resources',
    'Number of active resources that are currently keeping the event loop alive, grouped by async resource type.'
  ).collect = () => {
    const byType = new Map<string, number>()
    for (const type of process.getActiveResourcesInfo()) byType.set(type, (byType.get(type) ?? 0) + 1)
    return [...byType].map(([type, n]): [{ type: string }, number] => [{ type }, n])
  }
  metrics.gauge('nodejs_active_resources_total', 'Total number of active resources.').collect = () => [[undefined, process.getActiveResourcesInfo().length]]

  const [major, minor, patch] = process.versions.node.split('.')
  metrics.gauge('nodejs_version_info', 'Node.js version info.').collect = () => [[{ version: process.version, major: major!, minor: minor!, patch: patch! }, 1]]

  // Event-loop delay: a libuv timer samples how late it fires (perf_hooks). Each scrape takes a
  // snapshot and resets the monitor, so the figures cover the time since the previous scrape.
  const delay = monitorEventLoopDelay({ resolution: 10 })
  delay.enable()
  const none = { min: 0, max: 0, mean: 0, stddev: 0, p50: 0, p90: 0, p99: 0 }
  let seen = none
  let lagNow = 0
  metrics.beforeScrape(
    () =>
      new Promise<void>(resolve => {
        seen =
          delay.count === 0
            ? none
            : {
                min: delay.min,
                max: delay.max,
                mean: delay.mean,
                stddev: delay.stddev,
                p50: delay.percentile(50),
                p90: delay.percentile(90),
                p99: delay.percentile(99),
              }
        delay.reset()
        // How long a callback queued now waits: the lag at this moment.
        const t0 = process.hrtime.bigint()
        setImmediate(() => {
          lagNow = Number(process.hrtime.bigint() - t0) / 1e9
          resolve()
        })
      })
  )
  metrics.gauge('nodejs_eventloop_lag_seconds', 'Lag of event loop in seconds.').collect = () => [[undefined, lagNow]]
  const lag = (key: keyof typeof none, help: string): void => {
    metrics.gauge(`nodejs_eventloop_lag_${key}_seconds`, help).collect = () => [[undefined, seen[key] / 1e9]]
  }
  lag('min', 'The minimum recorded event loop delay.')
  lag('max', 'The maximum recorded event loop delay.')
  lag('mean', 'The mean of the recorded event loop delays.')
  lag('stddev', 'The standard deviation of the recorded event loop delays.')
  lag('p50', 'The 50th percentile of the recorded event loop delays.')
  lag('p90', 'The 90th percentile of the recorded event loop delays.')
  lag('p99', 'The 99th percentile of the recorded event loop delays.')

  const gc = metrics.histogram(
    'nodejs_gc_duration_seconds',
    'Garbage collection duration by kind, one of major, minor, incremental or weakcb.',
    [0.001, 0.01, 0.1, 1, 2, 5]
  )
  for (const kind of Object.values(GC_KINDS)) gc.init({ kind })
  const gcHandles = new Map(Object.entries(GC_KINDS).map(([k, kind]) => [Number(k), gc.labels({ kind })]))
  const observer = new PerformanceObserver(list => {
    for (const e of list.getEntries() as Array<PerformanceEntry & { detail?: { kind?: number } }>) {
      gcHandles.get(e.detail?.kind ?? 0)?.observe(e.duration / 1000)
    }
  })
  observer.observe({ entryTypes: ['gc'] })

  return () => {
    delay.disable()
    observer.disconnect()
  }
}
