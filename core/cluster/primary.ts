/**
 * `workers: N`: one gateway on every core of a machine. A primary process
 * forks N workers (node:cluster) that serve the MCP port together; the
 * primary itself serves no MCP request.
 *
 * It is the replica mechanism on one host (forward.ts): each worker listens
 * on a loopback port of its own as its advertise URL and seals its session
 * ids under a secret the primary draws for this run, so a session-era request
 * that lands on another worker is relayed to the worker that holds the
 * session (its streams, its stdio children); 2026-07-28 requests are served
 * wherever they land. With `cluster` set (replicas of workers), the
 * configured secret is used and each worker advertises the configured host
 * with its own port (node.ts).
 *
 * What must be shared goes through the primary over the cluster IPC channel
 * (messages.ts): per-subject session caps, rate limits and single-use codes
 * live in one in-memory store there (primary-store.ts, same contract and
 * semantics as shared-state.ts), unless `cluster.redis.url` is set (then
 * every worker talks to Redis). A worker that dies frees its cap slots at
 * once, and the primary kills the process groups of its stdio children
 * (reported as they start, worker.ts): no orphan survives a `kill -9`.
 *
 * Operators see one gateway: the primary binds the probe listener (/readyz
 * ready when every worker is; /metrics holds every worker's series with a
 * `worker` label, plus the primary's own: metrics-merge.ts) and the admin
 * listener, whose requests it relays to one worker (admin-relay.ts).
 * SIGTERM/SIGINT: readiness fails, `probes.shutdownDelayMs` passes, then
 * every worker drains. A worker that dies is logged and replaced, at most
 * `workerRestartsPerMinute` times a minute; its sessions are gone (clients
 * get 404 and initialize again).
 */
import cluster, { type Worker } from 'node:cluster'
import { randomBytes } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import type { Logger } from 'pino'
import type { GatewayConfig, LoadedConfig } from '../config.ts'
import { listenError } from '../listen-error.ts'
import { Metrics } from '../observability/metrics.ts'
import { collectProcessMetrics } from '../observability/process-metrics.ts'
import { createProbeServer, type ProbeServer } from '../admin/probes.ts'
import { createMemoryState } from './shared-state.ts'
import { createAdminRelay } from './admin-relay.ts'
import { mergeMetrics } from './metrics-merge.ts'
import { WORKER_ENV, type ToPrimary, type ToWorker } from './messages.ts'
import { PrimaryStore } from './primary-store.ts'
import { WorkerSlots, type Slot } from './worker-slots.ts'

export interface PrimaryOptions {
  readonly loaded: LoadedConfig
  readonly count: number
  readonly log: Logger
  /** Exit codes of bin/mcp-proxy.ts. */
  readonly exit: (code: number) => never
}

/** The primary's own listeners: probes and admin, bound before any worker starts. */
interface PrimaryListeners {
  readonly probes: ProbeServer | undefined
  readonly admin: Server | undefined
  close(): Promise<void>
}

function closeServer(s: Server): Promise<void> {
  return new Promise(resolve => {
    s.close(() => resolve())
    s.closeAllConnections()
  })
}

function listen(s: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    s.once('error', reject)
    s.listen(port, host, () => {
      s.off('error', reject)
      resolve()
    })
  })
}

/** Probes and admin, bound before any worker starts: a port in use fails start-up (exit 3) at once. */
async function bindListeners(config: Readonly<GatewayConfig>, log: Logger, metrics: Metrics, slots: WorkerSlots): Promise<PrimaryListeners> {
  const probes =
    config.probes === undefined
      ? undefined
      : createProbeServer({
          log,
          metrics,
          metricsToken: config.probes.metricsToken,
          ready: () => slots.readiness(),
          render: async () => {
            await metrics.collect()
            return mergeMetrics(await slots.metrics(), metrics.render())
          },
        })
  const admin = config.admin.enabled ? createServer(createAdminRelay(slots.all, log)) : undefined
  const close = async (): Promise<void> => {
    if (probes !== undefined) await probes.close()
    if (admin !== undefined) await closeServer(admin)
  }
  try {
    if (probes !== undefined)
      await listen(probes.server, config.probes!.port, config.probes!.host).catch((err: unknown) => {
        throw listenError(err, 'probes.port', config.probes!.port, config.probes!.host)
      })
    if (admin !== undefined)
      await listen(admin, config.admin.port, config.admin.host).catch((err: unknown) => {
        throw listenError(err, 'admin.port', config.admin.port, config.admin.host)
      })
  } catch (err) {
    await close()
    throw err
  }
  return { probes, admin, close }
}

/** Runs the primary: forks the workers, serves probes and admin, and owns signals. Resolves once the listeners are bound. */
export async function runPrimary(o: PrimaryOptions): Promise<void> {
  const { config } = o.loaded
  const log = o.log.child({ component: 'workers' })
  const metrics = new Metrics()
  const stopProcessMetrics = collectProcessMetrics(metrics)
  const slots = new WorkerSlots(o.count)
  const restarts = metrics.counter('mcp_proxy_worker_restarts_total', 'Workers that died and were replaced')
  restarts.init(undefined)
  metrics.gauge('mcp_proxy_workers', 'Live worker processes').collect = () => [[undefined, slots.live]]
  let listeners: PrimaryListeners
  try {
    listeners = await bindListeners(config, log, metrics, slots)
  } catch (err) {
    stopProcessMetrics()
    throw err
  }
  const primary = new Primary({ o, log, slots, listeners, restarts: () => restarts.inc(), stopProcessMetrics })
  cluster.on('exit', (w, code, signal) => primary.exited(w, code, signal))
  process.on('SIGINT', () => primary.stop('SIGINT'))
  process.on('SIGTERM', () => primary.stop('SIGTERM'))

  for (const s of slots.all) primary.fork(s)
  const admin = listeners.admin !== undefined ? `${config.admin.host}:${config.admin.port}` : undefined
  log.info(
    { workers: o.count, pid: process.pid, probes: config.probes !== undefined ? `${config.probes.host}:${config.probes.port}` : undefined, admin },
    `mcp-proxy primary: starting ${o.count} workers on ${config.mcp.host}:${config.mcp.port}`
  )
}

interface PrimaryParts {
  readonly o: PrimaryOptions
  readonly log: Logger
  readonly slots: WorkerSlots
  readonly listeners: PrimaryListeners
  /** Counts a replacement (mcp_proxy_worker_restarts_total). */
  readonly restarts: () => void
  readonly stopProcessMetrics: () => void
}

/** The workers' lifecycle: forks, messages, deaths and replacements, and the ordered stop. */
class Primary {
  readonly #p: PrimaryParts
  readonly #config: Readonly<GatewayConfig>
  readonly #store: PrimaryStore
  /** The per-run secret every worker seals its session ids under. */
  readonly #secret = randomBytes(32).toString('base64url')
  /** When workers were replaced within the last minute. */
  readonly #restartTimes: number[] = []
  #stopping = false
  #startedAll = false
  #exitCode = 0
  #killTimer: NodeJS.Timeout | undefined
  #finishing: Promise<void> | undefined

  constructor(p: PrimaryParts) {
    this.#p = p
    this.#config = p.o.loaded.config
    this.#store = new PrimaryStore(createMemoryState(), p.log)
  }

  fork(slot: Slot): void {
    const w = cluster.fork({ [WORKER_ENV]: String(slot.n) })
    slot.worker = w
    slot.up = false
    slot.adminUrl = undefined
    w.on('message', (m: ToPrimary) => this.#onMessage(slot, w, m))
  }

  #onMessage(slot: Slot, w: Worker, m: ToPrimary): void {
    if (m === null || typeof m !== 'object') return
    switch (m.t) {
      case 'mcpp:hello':
        w.send({ t: 'mcpp:init', secret: this.#secret } satisfies ToWorker)
        break
      case 'mcpp:up':
        this.#up(slot, w, m.adminUrl)
        break
      case 'mcpp:state':
        void this.#store.serve(slot, w, m)
        break
      case 'mcpp:group':
        if (typeof m.pid === 'number' && m.pid > 0) {
          if (m.alive) slot.groups.add(m.pid)
          else slot.groups.delete(m.pid)
        }
        break
      case 'mcpp:answer':
        this.#p.slots.answered(m.id, m.value)
        break
    }
  }

  #up(slot: Slot, w: Worker, adminUrl: unknown): void {
    const { log, o, slots } = this.#p
    slot.up = true
    slot.adminUrl = typeof adminUrl === 'string' ? adminUrl : undefined
    log.info({ worker: slot.n, pid: w.process.pid }, 'worker serving')
    if (!this.#startedAll && slots.all.every(s => s.up)) {
      this.#startedAll = true
      log.info({ workers: o.count, mcp: `${this.#config.mcp.host}:${this.#config.mcp.port}` }, `all ${o.count} workers serving`)
    }
  }

  #killGroups(slot: Slot): void {
    for (const pid of slot.groups) {
      try {
        process.kill(-pid, 'SIGKILL')
      } catch {
        /* gone already */
      }
    }
    if (slot.groups.size > 0) this.#p.log.info({ worker: slot.n, groups: slot.groups.size }, 'killed the stdio children of a worker that exited')
    slot.groups.clear()
  }

  /** node:cluster 'exit': the worker's children and cap slots go with it; then stop, or replace it. */
  exited(w: Worker, code: number | null, signal: string | null): void {
    const { log, slots } = this.#p
    const slot = slots.all.find(s => s.worker === w)
    if (slot === undefined) return
    this.#killGroups(slot)
    this.#store.freeJoins(slot)
    const wasUp = slot.up
    slot.worker = undefined
    slot.up = false
    slot.adminUrl = undefined
    if (this.#stopping) {
      if (slots.all.every(s => s.worker === undefined)) void this.#finish()
      return
    }
    if (!this.#startedAll && !wasUp) {
      // Start-up failed (port in use, bad plugin options the check could not see): no restart loop, the worker's own exit code.
      log.error({ worker: slot.n, code, signal }, 'a worker failed to start: stopping')
      this.#exitCode = code ?? 3
      this.stop('start-up failure')
      return
    }
    log.error(
      { worker: slot.n, pid: w.process.pid, code, signal },
      'worker died: its sessions are gone (their clients get 404 and initialize again); starting a replacement'
    )
    this.#replace(slot)
  }

  #replace(slot: Slot): void {
    const limit = this.#config.workerRestartsPerMinute
    const now = Date.now()
    while (this.#restartTimes.length > 0 && now - this.#restartTimes[0]! > 60_000) this.#restartTimes.shift()
    if (this.#restartTimes.length >= limit) {
      this.#p.log.error({ limit }, 'workerRestartsPerMinute reached: stopping the gateway')
      this.#exitCode = 1
      this.stop('worker restart limit')
      return
    }
    this.#restartTimes.push(now)
    this.#p.restarts()
    this.fork(slot)
  }

  #finish(): Promise<void> {
    this.#finishing ??= (async () => {
      clearTimeout(this.#killTimer)
      await this.#p.listeners.close()
      await this.#store.close()
      this.#p.stopProcessMetrics()
      this.#p.log.info('stopped')
      this.#p.o.exit(this.#exitCode)
    })()
    return this.#finishing
  }

  /** Readiness fails, `probes.shutdownDelayMs` passes, then every worker drains; a second call kills them. */
  stop(reason: string): void {
    const { log, slots, o, listeners } = this.#p
    if (this.#stopping) {
      log.warn({ reason }, 'second signal: killing the workers now')
      for (const s of slots.all) {
        s.worker?.process.kill('SIGKILL')
        this.#killGroups(s)
      }
      o.exit(1)
    }
    this.#stopping = true
    log.info({ reason }, 'shutting down: not ready; then every worker drains')
    listeners.probes?.terminating()
    setTimeout(() => this.#drainWorkers(), this.#config.probes?.shutdownDelayMs ?? 0)
  }

  #drainWorkers(): void {
    const { log, slots } = this.#p
    for (const s of slots.all) s.worker?.process.kill('SIGTERM')
    if (slots.all.every(s => s.worker === undefined)) {
      void this.#finish()
      return
    }
    // A worker that does not finish its drain in time is killed (its children with it).
    this.#killTimer = setTimeout(() => {
      for (const s of slots.all)
        if (s.worker !== undefined) {
          log.warn({ worker: s.n }, 'worker did not stop in time: killed')
          s.worker.process.kill('SIGKILL')
        }
    }, this.#config.mcp.limits.shutdownGraceMs + 10_000)
  }
}
