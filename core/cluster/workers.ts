/**
 * `workers: N`: one gateway on every core of a machine. A primary process
 * forks N workers (node:cluster) that serve the MCP port together; the
 * primary itself serves no MCP request.
 *
 * It is the replica mechanism on one host (core/mcp/cluster-forward.ts):
 * each worker listens on a loopback port of its own as its advertise URL and
 * seals its session ids under a secret the primary draws for this run, so a
 * session-era request that lands on another worker is relayed to the worker
 * that holds the session (its streams, its stdio children); 2026-07-28
 * requests are served wherever they land. With `cluster` set (replicas of
 * workers), the configured secret is used and each worker advertises the
 * configured host with its own port.
 *
 * What must be shared goes through the primary over the cluster IPC channel:
 * per-subject session caps, rate limits and single-use codes live in one
 * in-memory store there (core/shared-state.ts, same contract and semantics),
 * unless `cluster.redis.url` is set (then every worker talks to Redis). A
 * worker that dies frees its cap slots at once, and the primary kills the
 * process groups of its stdio children (reported as they start): no orphan
 * survives a `kill -9`.
 *
 * Operators see one gateway: the primary binds the probe listener (/readyz
 * ready when every worker is; /metrics holds every worker's series with a
 * `worker` label, plus the primary's own) and the admin listener, whose
 * requests it relays to one worker's loopback admin listener (the lowest
 * live one, or the one named by `?worker=N` or an `Mcp-Proxy-Worker` header):
 * one UI port, never N listeners racing for it. SIGTERM/SIGINT: readiness
 * fails, `probes.shutdownDelayMs` passes, then every worker drains. A worker
 * that dies is logged and replaced, at most `workerRestartsPerMinute` times a
 * minute; its sessions are gone (clients get 404 and initialize again).
 */
import cluster, { type Worker } from 'node:cluster'
import { randomBytes } from 'node:crypto'
import { availableParallelism } from 'node:os'
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Logger } from 'pino'
import type { LoadedConfig } from '../config.ts'
import { listenError } from '../listen-error.ts'
import { Metrics } from '../observability/metrics.ts'
import { collectProcessMetrics } from '../observability/process-metrics.ts'
import { createProbeServer, type ProbeReadiness } from '../admin/probes.ts'
import { createMemoryState, type SharedState } from './shared-state.ts'
import { ProxyError } from '../errors.ts'
import { watchChildGroups } from '../targets/stdio.ts'

/** Set in a worker's environment: its slot, 1..N (stable across replacements, so metric labels are too). */
export const WORKER_ENV = 'MCP_PROXY_WORKER'
/** Selects the worker whose admin listener a request is relayed to. */
export const WORKER_HEADER = 'mcp-proxy-worker'

/** How long the primary waits for a worker's answer (readiness, metrics, a state operation). */
const ASK_TIMEOUT_MS = 2000

type StateOp = 'take' | 'join' | 'renew' | 'leave' | 'putOnce' | 'takeOnce'
const STATE_OPS: ReadonlySet<string> = new Set<StateOp>(['take', 'join', 'renew', 'leave', 'putOnce', 'takeOnce'])

type ToPrimary =
  | { t: 'mcpp:hello' }
  | { t: 'mcpp:up'; adminUrl?: string }
  | { t: 'mcpp:state'; id: number; op: StateOp; args: unknown[] }
  | { t: 'mcpp:group'; pid: number; alive: boolean }
  | { t: 'mcpp:answer'; id: number; value: unknown }
type ToWorker =
  | { t: 'mcpp:init'; secret: string }
  | { t: 'mcpp:state'; id: number; ok: boolean; value?: unknown; error?: string }
  | { t: 'mcpp:ask'; id: number; what: 'ready' | 'metrics' }

/** `workers` as a count: `auto` is the available cores. */
export function workerCount (value: number | 'auto'): number {
  return value === 'auto' ? Math.max(1, availableParallelism()) : value
}

/** `--workers` as given on the command line; an error message when it is neither a count nor `auto`. */
export function parseWorkersFlag (text: string): number | 'auto' | string {
  if (text === 'auto') return 'auto'
  if (!/^\d{1,2}$/.test(text) || Number(text) < 1 || Number(text) > 64) return `--workers: must be an integer from 1 to 64 or "auto" (got "${text}")`
  return Number(text)
}

// ---------------------------------------------------------------- worker side

export interface WorkerChannel {
  readonly slot: number
  /** The per-run secret that seals session ids (drawn by the primary). */
  readonly secret: string
  /** Caps, limits and codes in the primary's store (the SharedState contract). */
  readonly shared: SharedState
  /** Tells the primary the worker serves (and where its admin listener is). */
  up(adminUrl: string | undefined): void
  /** Answers the primary's readiness and metrics questions. */
  answer(handlers: { ready(): ProbeReadiness | undefined; metrics(): Promise<string> }): void
}

function send (message: ToPrimary): void {
  // The channel is gone when the primary died: the worker is shutting down then ('disconnect').
  if (process.connected) process.send!(message)
}

/** In a worker: says hello, waits for the primary's secret, and reports child process groups from now on. */
export function connectWorker (log: Logger): Promise<WorkerChannel> {
  const slot = Number(process.env[WORKER_ENV])
  const pending = new Map<number, { resolve(v: unknown): void; reject(e: unknown): void; timer: NodeJS.Timeout }>()
  let nextId = 1
  let handlers: { ready(): ProbeReadiness | undefined; metrics(): Promise<string> } | undefined
  watchChildGroups((pid, alive) => send({ t: 'mcpp:group', pid, alive }))

  function unavailable (why: string): ProxyError {
    return new ProxyError('MCPP_ERR_SHARED_STATE', 503, 'Service Unavailable: shared state (the primary process) is unreachable', {
      cause: new Error(why), headers: { 'retry-after': '1' }, expose: true,
    })
  }

  function call (op: StateOp, args: unknown[]): Promise<unknown> {
    if (!process.connected) return Promise.reject(unavailable('IPC channel closed'))
    const id = nextId++
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { pending.delete(id); reject(unavailable(`no answer within ${ASK_TIMEOUT_MS} ms`)) }, ASK_TIMEOUT_MS)
      pending.set(id, { resolve, reject, timer })
      send({ t: 'mcpp:state', id, op, args })
    })
  }

  const shared: SharedState = {
    kind: 'primary',
    take: (key, capacity, windowMs) => call('take', [key, capacity, windowMs]) as Promise<number>,
    join: (key, member, limit, leaseMs) => call('join', [key, member, limit, leaseMs]) as Promise<boolean>,
    renew: async (entries, leaseMs) => { if (entries.length > 0) await call('renew', [entries, leaseMs]) },
    leave: async (key, member) => { await call('leave', [key, member]) },
    putOnce: (key, value, ttlMs) => call('putOnce', [key, value, ttlMs]) as Promise<boolean>,
    takeOnce: (key) => call('takeOnce', [key]) as Promise<string | undefined>,
    ready: () => process.connected ? { ready: true } : { ready: false, reason: 'the primary process is gone' },
    async close () {
      for (const [id, p] of pending) { clearTimeout(p.timer); p.reject(unavailable('closing')); pending.delete(id) }
    },
  }

  return new Promise((resolve, reject) => {
    process.on('message', (m: ToWorker) => {
      if (m === null || typeof m !== 'object') return
      if (m.t === 'mcpp:init') {
        resolve({
          slot,
          secret: m.secret,
          shared,
          up: adminUrl => send({ t: 'mcpp:up', adminUrl }),
          answer: h => { handlers = h },
        })
      } else if (m.t === 'mcpp:state') {
        const p = pending.get(m.id)
        if (p === undefined) return
        pending.delete(m.id)
        clearTimeout(p.timer)
        if (m.ok) p.resolve(m.value)
        else p.reject(unavailable(m.error ?? 'failed'))
      } else if (m.t === 'mcpp:ask') {
        const h = handlers
        const reply = (value: unknown): void => send({ t: 'mcpp:answer', id: m.id, value })
        if (h === undefined) reply(m.what === 'ready' ? undefined : '')
        else if (m.what === 'ready') reply(h.ready())
        else h.metrics().then(reply, (err: unknown) => { log.warn({ err }, 'rendering metrics for the primary failed'); reply('') })
      }
    })
    process.once('disconnect', () => reject(new Error('the primary process went away before start-up')))
    send({ t: 'mcpp:hello' })
  })
}

// --------------------------------------------------------------- primary side

/** Adds `worker="N"` to every series of a Prometheus text exposition, and merges families (HELP/TYPE once). */
export function mergeMetrics (parts: ReadonlyArray<{ worker: number; text: string }>, own: string): string {
  const families = new Map<string, { meta: string[]; samples: string[] }>()
  const familyOf = (name: string): { meta: string[]; samples: string[] } => {
    let f = families.get(name)
    if (f === undefined) { f = { meta: [], samples: [] }; families.set(name, f) }
    return f
  }
  const add = (text: string, label: string | undefined): void => {
    let current: { meta: string[]; samples: string[] } | undefined
    for (const line of text.split('\n')) {
      if (line === '') continue
      if (line.startsWith('# ')) {
        const [, kind, name] = line.split(' ', 3)
        if (kind !== 'HELP' && kind !== 'TYPE') continue
        current = familyOf(name!)
        if (current.meta.length < 2 && !current.meta.some(m => m.startsWith(`# ${kind} `))) current.meta.push(line)
        continue
      }
      const brace = line.indexOf('{')
      const space = line.indexOf(' ')
      const target = current ?? familyOf(line.slice(0, brace !== -1 && brace < space ? brace : space))
      if (label === undefined) target.samples.push(line)
      else if (brace !== -1 && brace < space) target.samples.push(`${line.slice(0, brace + 1)}${label},${line.slice(brace + 1)}`.replace(',}', '}'))
      else target.samples.push(`${line.slice(0, space)}{${label}}${line.slice(space)}`)
    }
  }
  add(own, undefined)
  for (const p of parts) add(p.text, `worker="${p.worker}"`)
  let out = ''
  for (const f of families.values()) out += f.meta.join('\n') + '\n' + (f.samples.length > 0 ? f.samples.join('\n') + '\n' : '')
  return out
}

interface Slot {
  readonly n: number
  worker: Worker | undefined
  /** The worker finished start-up (its gateway serves). */
  up: boolean
  adminUrl: string | undefined
  /** Process groups of its stdio children. */
  readonly groups: Set<number>
  /** Cap slots it holds in the store, by `${key} ${member}` (keys may hold any character; members are session ids). */
  readonly joins: Map<string, { key: string; member: string }>
}

export interface PrimaryOptions {
  readonly loaded: LoadedConfig
  readonly count: number
  readonly log: Logger
  /** Exit codes of bin/mcp-proxy.ts. */
  readonly exit: (code: number) => never
}

/** Runs the primary: forks the workers, serves probes and admin, and owns signals. Resolves once the listeners are bound. */
export async function runPrimary (o: PrimaryOptions): Promise<void> {
  const { config } = o.loaded
  const log = o.log.child({ component: 'workers' })
  const metrics = new Metrics()
  const stopProcessMetrics = collectProcessMetrics(metrics)
  const store = createMemoryState()
  const secret = randomBytes(32).toString('base64url')
  const slots: Slot[] = Array.from({ length: o.count }, (_, i) => ({ n: i + 1, worker: undefined, up: false, adminUrl: undefined, groups: new Set(), joins: new Map() }))
  const restarts: number[] = []
  const restartCounter = metrics.counter('mcp_proxy_worker_restarts_total', 'Workers that died and were replaced')
  restartCounter.init(undefined)
  metrics.gauge('mcp_proxy_workers', 'Live worker processes').collect = () => [[undefined, slots.filter(s => s.worker !== undefined).length]]
  let stopping = false
  let startedAll = false
  const asks = new Map<number, { resolve(v: unknown): void; timer: NodeJS.Timeout }>()
  let nextAsk = 1

  function ask (slot: Slot, what: 'ready' | 'metrics'): Promise<unknown> {
    const w = slot.worker
    if (w === undefined || !w.isConnected()) return Promise.resolve(undefined)
    const id = nextAsk++
    return new Promise(resolve => {
      const timer = setTimeout(() => { asks.delete(id); resolve(undefined) }, ASK_TIMEOUT_MS)
      asks.set(id, { resolve, timer })
      w.send({ t: 'mcpp:ask', id, what } satisfies ToWorker)
    })
  }

  async function readiness (): Promise<ProbeReadiness | undefined> {
    const answers = await Promise.all(slots.map(async s => ({ s, r: s.up ? await ask(s, 'ready') as ProbeReadiness | undefined : undefined })))
    const reasons: string[] = []
    const codes: string[] = []
    for (const { s, r } of answers) {
      if (s.worker === undefined) { reasons.push(`worker ${s.n}: not running`); codes.push('worker_not_running') } else if (r === undefined) {
        reasons.push(`worker ${s.n}: starting`)
        codes.push('worker_starting')
      } else if (!r.ready) {
        reasons.push(...r.reasons.map(x => `worker ${s.n}: ${x}`))
        codes.push(...(r.codes ?? ['not_ready']))
      }
    }
    return { ready: reasons.length === 0, reasons, codes }
  }

  async function renderAll (): Promise<string> {
    await metrics.collect()
    const parts = await Promise.all(slots.map(async s => ({ worker: s.n, text: s.up ? String(await ask(s, 'metrics') ?? '') : '' })))
    return mergeMetrics(parts, metrics.render())
  }

  function killGroups (slot: Slot): void {
    for (const pid of slot.groups) {
      try { process.kill(-pid, 'SIGKILL') } catch { /* gone already */ }
    }
    if (slot.groups.size > 0) log.info({ worker: slot.n, groups: slot.groups.size }, 'killed the stdio children of a worker that exited')
    slot.groups.clear()
  }

  function freeJoins (slot: Slot): void {
    for (const { key, member } of slot.joins.values()) void store.leave(key, member)
    slot.joins.clear()
  }

  async function onState (slot: Slot, w: Worker, m: { id: number; op: StateOp; args: unknown[] }): Promise<void> {
    const a = m.args
    let value: unknown
    try {
      if (!STATE_OPS.has(m.op) || !Array.isArray(a)) throw new Error(`unknown operation ${String(m.op)}`)
      switch (m.op) {
        case 'take': value = await store.take(a[0] as string, a[1] as number, a[2] as number); break
        case 'join':
          value = await store.join(a[0] as string, a[1] as string, a[2] as number, a[3] as number)
          if (value === true) slot.joins.set(`${a[0] as string} ${a[1] as string}`, { key: a[0] as string, member: a[1] as string })
          break
        case 'renew': await store.renew(a[0] as Array<{ key: string; member: string }>, a[1] as number); break
        case 'leave':
          await store.leave(a[0] as string, a[1] as string)
          slot.joins.delete(`${a[0] as string} ${a[1] as string}`)
          break
        case 'putOnce': value = await store.putOnce(a[0] as string, a[1] as string, a[2] as number); break
        case 'takeOnce': value = await store.takeOnce(a[0] as string); break
      }
      if (w.isConnected()) w.send({ t: 'mcpp:state', id: m.id, ok: true, value } satisfies ToWorker)
    } catch (err) {
      log.error({ err, worker: slot.n }, 'shared state operation failed')
      if (w.isConnected()) w.send({ t: 'mcpp:state', id: m.id, ok: false, error: (err as Error).message } satisfies ToWorker)
    }
  }

  function fork (slot: Slot): void {
    const w = cluster.fork({ [WORKER_ENV]: String(slot.n) })
    slot.worker = w
    slot.up = false
    slot.adminUrl = undefined
    w.on('message', (m: ToPrimary) => {
      if (m === null || typeof m !== 'object') return
      switch (m.t) {
        case 'mcpp:hello': w.send({ t: 'mcpp:init', secret } satisfies ToWorker); break
        case 'mcpp:up':
          slot.up = true
          slot.adminUrl = typeof m.adminUrl === 'string' ? m.adminUrl : undefined
          log.info({ worker: slot.n, pid: w.process.pid }, 'worker serving')
          if (!startedAll && slots.every(s => s.up)) {
            startedAll = true
            log.info({ workers: o.count, mcp: `${config.mcp.host}:${config.mcp.port}` }, `all ${o.count} workers serving`)
          }
          break
        case 'mcpp:state': void onState(slot, w, m); break
        case 'mcpp:group':
          if (typeof m.pid === 'number' && m.pid > 0) {
            if (m.alive) slot.groups.add(m.pid)
            else slot.groups.delete(m.pid)
          }
          break
        case 'mcpp:answer': {
          const p = asks.get(m.id)
          if (p !== undefined) { asks.delete(m.id); clearTimeout(p.timer); p.resolve(m.value) }
          break
        }
      }
    })
  }

  // Probes and admin are bound before any worker starts: a port in use fails start-up (exit 3) at once.
  const probes = config.probes === undefined
    ? undefined
    : createProbeServer({ log, metrics, metricsToken: config.probes.metricsToken, ready: () => readiness(), render: renderAll })
  const admin = config.admin.enabled ? createServer((req, res) => relayAdmin(req, res)) : undefined
  const closeServer = (s: import('node:http').Server): Promise<void> => new Promise(resolve => { s.close(() => resolve()); s.closeAllConnections() })
  const listen = (s: import('node:http').Server, port: number, host: string): Promise<void> => new Promise((resolve, reject) => {
    s.once('error', reject)
    s.listen(port, host, () => { s.off('error', reject); resolve() })
  })
  try {
    if (probes !== undefined) await listen(probes.server, config.probes!.port, config.probes!.host).catch((err: unknown) => { throw listenError(err, 'probes.port', config.probes!.port, config.probes!.host) })
    if (admin !== undefined) await listen(admin, config.admin.port, config.admin.host).catch((err: unknown) => { throw listenError(err, 'admin.port', config.admin.port, config.admin.host) })
  } catch (err) {
    if (probes !== undefined) await probes.close()
    if (admin !== undefined) await closeServer(admin)
    stopProcessMetrics()
    throw err
  }

  function answerJson (res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}): void {
    const text = JSON.stringify(body)
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...extra })
    res.end(text)
  }

  function relayAdmin (req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://admin')
    const asked = url.searchParams.get('worker') ?? (typeof req.headers[WORKER_HEADER] === 'string' ? req.headers[WORKER_HEADER] : undefined)
    if (asked !== undefined && (!/^\d{1,2}$/.test(asked) || Number(asked) < 1 || Number(asked) > o.count)) {
      log.info({ worker: asked.slice(0, 20) }, 'admin request for a worker that does not exist')
      answerJson(res, 400, { error: 'invalid_request', error_description: `worker must be an integer from 1 to ${o.count}` })
      return
    }
    const slot = asked !== undefined ? slots[Number(asked) - 1]! : slots.find(s => s.adminUrl !== undefined)
    if (slot?.adminUrl === undefined) {
      answerJson(res, 503, { error: 'unavailable', error_description: asked !== undefined ? `worker ${asked} is not serving` : 'no worker is serving yet' }, { 'retry-after': '1' })
      return
    }
    const headers = { ...req.headers }
    delete headers[WORKER_HEADER]
    const up = httpRequest(new URL(req.url ?? '/', slot.adminUrl), { method: req.method, headers }, answer => {
      const out: Record<string, string | string[]> = { [WORKER_HEADER]: String(slot.n) }
      // RFC 9110 §7.6.1: the connection's own fields stay with that connection (the body is re-framed here).
      for (const [name, value] of Object.entries(answer.headers)) {
        if (value !== undefined && name !== 'connection' && name !== 'keep-alive' && name !== 'transfer-encoding') out[name] = value
      }
      res.writeHead(answer.statusCode ?? 502, out)
      answer.pipe(res)
    })
    up.once('error', err => {
      log.warn({ worker: slot.n, err: err.message }, 'admin request to a worker failed')
      if (!res.headersSent) { res.writeHead(502, { 'content-type': 'application/json' }); res.end('{"error":"bad_gateway","error_description":"the worker did not answer"}') } else res.destroy()
    })
    res.once('close', () => { if (!up.destroyed) up.destroy() })
    req.pipe(up)
  }

  let exitCode = 0
  cluster.on('exit', (w, code, signal) => {
    const slot = slots.find(s => s.worker === w)
    if (slot === undefined) return
    killGroups(slot)
    freeJoins(slot)
    const wasUp = slot.up
    slot.worker = undefined
    slot.up = false
    slot.adminUrl = undefined
    if (stopping) {
      if (slots.every(s => s.worker === undefined)) void finish()
      return
    }
    if (!startedAll && !wasUp) {
      // Start-up failed (port in use, bad plugin options the check could not see): no restart loop, the worker's own exit code.
      log.error({ worker: slot.n, code, signal }, 'a worker failed to start: stopping')
      exitCode = code ?? 3
      stop('start-up failure')
      return
    }
    log.error({ worker: slot.n, pid: w.process.pid, code, signal }, 'worker died: its sessions are gone (their clients get 404 and initialize again); starting a replacement')
    const now = Date.now()
    while (restarts.length > 0 && now - restarts[0]! > 60_000) restarts.shift()
    if (restarts.length >= config.workerRestartsPerMinute) {
      log.error({ limit: config.workerRestartsPerMinute }, 'workerRestartsPerMinute reached: stopping the gateway')
      exitCode = 1
      stop('worker restart limit')
      return
    }
    restarts.push(now)
    restartCounter.inc()
    fork(slot)
  })

  let finishing: Promise<void> | undefined
  function finish (): Promise<void> {
    finishing ??= (async () => {
      clearTimeout(killTimer)
      if (probes !== undefined) await probes.close()
      if (admin !== undefined) await closeServer(admin)
      await store.close()
      stopProcessMetrics()
      log.info('stopped')
      o.exit(exitCode)
    })()
    return finishing
  }

  let killTimer: NodeJS.Timeout | undefined
  function stop (reason: string): void {
    if (stopping) {
      log.warn({ reason }, 'second signal: killing the workers now')
      for (const s of slots) { s.worker?.process.kill('SIGKILL'); killGroups(s) }
      o.exit(1)
    }
    stopping = true
    log.info({ reason }, 'shutting down: not ready; then every worker drains')
    probes?.terminating()
    const delay = config.probes?.shutdownDelayMs ?? 0
    setTimeout(() => {
      for (const s of slots) s.worker?.process.kill('SIGTERM')
      if (slots.every(s => s.worker === undefined)) { void finish(); return }
      // A worker that does not finish its drain in time is killed (its children with it).
      killTimer = setTimeout(() => {
        for (const s of slots) if (s.worker !== undefined) { log.warn({ worker: s.n }, 'worker did not stop in time: killed'); s.worker.process.kill('SIGKILL') }
      }, config.mcp.limits.shutdownGraceMs + 10_000)
    }, delay)
  }
  process.on('SIGINT', () => stop('SIGINT'))
  process.on('SIGTERM', () => stop('SIGTERM'))

  for (const s of slots) fork(s)
  log.info({ workers: o.count, pid: process.pid, probes: config.probes !== undefined ? `${config.probes.host}:${config.probes.port}` : undefined, admin: admin !== undefined ? `${config.admin.host}:${config.admin.port}` : undefined },
    `mcp-proxy primary: starting ${o.count} workers on ${config.mcp.host}:${config.mcp.port}`)
}
