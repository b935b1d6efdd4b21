/**
 * What the admin listener reports, gathered from the running gateway:
 * upstream tracking wrapped around the target factories (child pids, starts,
 * failures, last error, upstream latency), the recent-request ring with
 * per-second traffic stats, scrape-time gauges (children, key set,
 * discovery), the redacted config and the "try it" client.
 */
import type { Logger } from 'pino'
import type { LoadedConfig } from '../config.ts'
import type { Metrics, Counter, Histogram, CounterHandle, HistogramHandle } from '../metrics.ts'
import type { Plugin, PluginDescription } from '../plugin.ts'
import type { RouteTable } from '../routes.ts'
import { outcomeOf, type AccessRecord } from '../server.ts'
import { denialText } from '../context.ts'
import type { JsonRpcId, JsonRpcMessage, Upstream, UpstreamFactory } from '../targets/types.ts'
import type { AdminState, TryInput } from './admin.ts'
import type { PooledSummary, SessionSummary, TargetSummary } from '../mcp/index.ts'
import { liveChildCount } from '../targets/index.ts'
import { redactConfig, secretValues, createScrubber } from './redact.ts'
import { runTry } from './admin-try.ts'
import { methodLabel, AdvertisedNames } from '../metric-labels.ts'
import type { TargetReadiness, TargetHealth } from '../target-readiness.ts'

// ---- upstream tracking -----------------------------------------------------

interface TargetStats {
  readonly target: string
  /** Metric handles per upstream method, bound once (see methodMeters). */
  readonly byMethod: Map<string, MethodMeters>
  /** Tool names this target advertised (label values), and their metric handles. */
  readonly tools: AdvertisedNames
  readonly byTool: Map<string, ToolMeters>
  readonly kind: 'stdio' | 'http'
  readonly live: Set<TrackedUpstream>
  started: number
  failures: number
  lastError: string | undefined
  lastErrorAt: number | undefined
}

/** Upstream requests awaiting an answer, per upstream; bounded so a silent upstream cannot grow it. */
const MAX_PENDING = 10_000

interface Meters { duration: Histogram; requests: Counter; starts: Counter; failures: Counter; toolDuration: Histogram; toolCalls: Counter }

/** `outcome` of mcp_proxy_tool_calls_total: `tool_error` is a result with isError (MCP server/tools, "Error Handling"). */
const TOOL_OUTCOMES = ['ok', 'tool_error', 'error', 'closed'] as const
type ToolOutcome = typeof TOOL_OUTCOMES[number]
type ToolMeters = { duration: HistogramHandle } & Record<ToolOutcome, CounterHandle>

/** The handles of one (target, tool label), made once; every series starts at 0. */
function toolMeters (stats: TargetStats, meters: Meters, tool: string): ToolMeters {
  let m = stats.byTool.get(tool)
  if (m === undefined) {
    const labels = { target: stats.target, tool }
    meters.toolDuration.init(labels)
    const counter = (outcome: ToolOutcome): CounterHandle => {
      meters.toolCalls.init({ ...labels, outcome })
      return meters.toolCalls.labels({ ...labels, outcome })
    }
    m = { duration: meters.toolDuration.labels(labels), ok: counter('ok'), tool_error: counter('tool_error'), error: counter('error'), closed: counter('closed') }
    // Bounded: tool labels come from AdvertisedNames (at most maxToolLabels, plus other).
    stats.byTool.set(tool, m)
  }
  return m
}

/** What an upstream request waits for: its method's meters, and for tools the tool's or a tools/list answer. */
interface Pending { meters: MethodMeters; t0: bigint; tool?: ToolMeters; list?: boolean }

interface MethodMeters { duration: HistogramHandle; ok: CounterHandle; error: CounterHandle; closed: CounterHandle }

/** Methods a client can name freely: past this many, handles are made per call instead of kept. */
const MAX_METHOD_HANDLES = 256

function methodMeters (stats: TargetStats, meters: Meters, name: string): MethodMeters {
  // A label value from a bounded set: the client names the method (metric-labels.ts).
  const method = methodLabel(name)
  let m = stats.byMethod.get(method)
  if (m === undefined) {
    const labels = { target: stats.target, method }
    m = {
      duration: meters.duration.labels(labels),
      ok: meters.requests.labels({ ...labels, outcome: 'ok' }),
      error: meters.requests.labels({ ...labels, outcome: 'error' }),
      closed: meters.requests.labels({ ...labels, outcome: 'closed' }),
    }
    if (stats.byMethod.size < MAX_METHOD_HANDLES) stats.byMethod.set(method, m)
  }
  return m
}

class TrackedUpstream implements Upstream {
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}
  readonly #inner: Upstream
  readonly #stats: TargetStats
  readonly #pending = new Map<JsonRpcId, Pending>()
  readonly #meters: Meters
  #didFail = false

  constructor (inner: Upstream, stats: TargetStats, meters: Meters) {
    this.#inner = inner
    this.#stats = stats
    this.#meters = meters
    inner.onMessage = (msg) => {
      if (msg.method === undefined && msg.id !== undefined && msg.id !== null) this.#answered(msg.id, msg.error === undefined ? 'ok' : 'error', msg)
      this.onMessage(msg)
    }
    inner.onClose = (err) => {
      this.#stats.live.delete(this)
      if (err !== undefined) this.#failed(err)
      for (const id of [...this.#pending.keys()]) this.#answered(id, 'closed')
      this.onClose(err)
    }
  }

  get target (): string { return this.#inner.target }
  get kind (): 'stdio' | 'http' { return this.#inner.kind }
  get pid (): number | undefined { return this.#inner.pid }
  get startedAt (): number | undefined { return this.#inner.startedAt }
  get lastError (): string | undefined { return this.#inner.lastError }
  get alive (): boolean { return this.#inner.alive }

  async start (): Promise<void> {
    this.#stats.started++
    this.#meters.starts.inc({ target: this.#stats.target })
    this.#stats.live.add(this)
    try {
      await this.#inner.start()
    } catch (err) {
      this.#stats.live.delete(this)
      this.#failed(err as Error)
      throw err
    }
  }

  send (message: JsonRpcMessage): void {
    const { id, method } = message
    const timed = method !== undefined && id !== undefined && id !== null
    if (timed) {
      if (this.#pending.size >= MAX_PENDING) this.#pending.clear()
      const p: Pending = { meters: methodMeters(this.#stats, this.#meters, method), t0: process.hrtime.bigint() }
      if (method === 'tools/call') {
        const name = message.params?.name
        p.tool = toolMeters(this.#stats, this.#meters, typeof name === 'string' ? this.#stats.tools.label(name) : 'other')
      } else if (method === 'tools/list') p.list = true
      this.#pending.set(id, p)
    }
    try {
      this.#inner.send(message)
    } catch (err) {
      if (timed) this.#answered(id, 'closed')
      throw err
    }
  }

  close (): Promise<void> { return this.#inner.close() }

  #answered (id: JsonRpcId, outcome: 'ok' | 'error' | 'closed', msg?: JsonRpcMessage): void {
    const p = this.#pending.get(id)
    if (p === undefined) return
    this.#pending.delete(id)
    const seconds = Number(process.hrtime.bigint() - p.t0) / 1e9
    p.meters.duration.observe(seconds)
    p.meters[outcome].inc()
    if (p.tool !== undefined) {
      p.tool.duration.observe(seconds)
      p.tool[outcome === 'ok' && (msg?.result as { isError?: unknown } | undefined)?.isError === true ? 'tool_error' : outcome].inc()
    } else if (p.list === true && outcome === 'ok') {
      // The tools this target advertises become label values (bounded, metric-labels.ts).
      const tools = (msg?.result as { tools?: unknown } | undefined)?.tools
      if (Array.isArray(tools)) {
        for (const t of tools) {
          const name = (t as { name?: unknown } | null)?.name
          if (this.#stats.tools.add(name)) toolMeters(this.#stats, this.#meters, name)
        }
      }
    }
  }

  #failed (err: Error): void {
    // A start failure may also be reported through onClose: count it once.
    if (this.#didFail) return
    this.#didFail = true
    this.#stats.failures++
    this.#meters.failures.inc({ target: this.#stats.target })
    this.#stats.lastError = err.message
    this.#stats.lastErrorAt = Date.now()
  }
}

export interface TargetState {
  readonly name: string
  readonly kind: 'stdio' | 'http'
  /** Upstreams (one per session) running now. */
  readonly live: ReadonlyArray<{ pid: number | undefined; startedAt: number | undefined }>
  /** Upstreams started since the gateway started (each session starts its own). */
  readonly started: number
  /** Upstreams that failed to start or ended with an error. */
  readonly failures: number
  readonly lastError: string | null
  readonly lastErrorAt: number | null
}

export interface UpstreamTracker {
  /** The factories to hand to the MCP endpoint instead of the originals. */
  readonly factories: UpstreamFactory[]
  describe(): TargetState[]
}

/**
 * Wraps each target factory so every upstream it creates is counted and
 * timed: `mcp_proxy_upstream_duration_seconds{target,method}`,
 * `mcp_proxy_upstream_requests_total{target,method,outcome}`, and the live
 * upstream gauges. The wrapper is transparent to the session layer.
 */
export function trackUpstreams (factories: readonly UpstreamFactory[], metrics: Metrics, opts: { maxToolLabels?: number } = {}): UpstreamTracker {
  const meters: Meters = {
    duration: metrics.histogram('mcp_proxy_upstream_duration_seconds', 'Time from forwarding a request to an upstream to its answer, by target and MCP method'),
    requests: metrics.counter('mcp_proxy_upstream_requests_total', 'Requests forwarded to upstreams by target, MCP method and outcome (ok, error, closed)'),
    starts: metrics.counter('mcp_proxy_upstream_starts_total', 'Upstreams started by target (each session starts its own, unless the target is shared)'),
    failures: metrics.counter('mcp_proxy_upstream_failures_total', 'Upstreams that failed to start or ended with an error, by target'),
    toolCalls: metrics.counter('mcp_proxy_tool_calls_total', 'tools/call requests forwarded to upstreams by target, tool (advertised names, else other) and outcome (ok, tool_error, error, closed)'),
    toolDuration: metrics.histogram('mcp_proxy_tool_call_duration_seconds', 'Time from forwarding a tools/call upstream to its answer, by target and tool'),
  }
  const maxTools = opts.maxToolLabels ?? 200
  const all: TargetStats[] = factories.map(f => ({
    target: f.target, kind: f.kind, live: new Set(), byMethod: new Map(), tools: new AdvertisedNames(maxTools), byTool: new Map(),
    started: 0, failures: 0, lastError: undefined, lastErrorAt: undefined,
  }))
  for (const s of all) {
    meters.starts.init({ target: s.target })
    meters.failures.init({ target: s.target })
    toolMeters(s, meters, 'other')
  }
  metrics.gauge('mcp_proxy_upstreams', 'Running upstreams (one per session and target, or per shared child) by target').collect = () => all.map(s => [{ target: s.target }, s.live.size])
  metrics.gauge('mcp_proxy_child_processes', 'Live stdio child processes').collect = () => [[undefined, liveChildCount()]]
  return {
    factories: factories.map((f, i): UpstreamFactory => {
      const stats = all[i]!
      // Everything of the factory (share, ...) but create(), which is wrapped.
      return {
        ...f,
        create (): Upstream {
          return new TrackedUpstream(f.create(), stats, meters)
        },
      }
    }),
    describe (): TargetState[] {
      return all.map(s => ({
        name: s.target,
        kind: s.kind,
        live: [...s.live].map(u => ({ pid: u.pid, startedAt: u.startedAt })),
        started: s.started,
        failures: s.failures,
        lastError: s.lastError ?? null,
        lastErrorAt: s.lastErrorAt ?? null,
      }))
    },
  }
}

// ---- recent requests and traffic stats --------------------------------------

const RECENT_MAX = 200
const STATS_SECONDS = 300
const BUCKET_SECONDS = 10

interface Second { t: number; count: number; errors: number; sumMs: number; maxMs: number }

/** The last requests of the MCP listener and per-second counts for the chart. */
export class RequestLog {
  readonly #recent: AccessRecord[] = []
  readonly #seconds: Second[] = []

  add (rec: AccessRecord): void {
    this.#recent.push(rec)
    if (this.#recent.length > RECENT_MAX) this.#recent.shift()
    const t = Math.floor(rec.at / 1000)
    let last = this.#seconds[this.#seconds.length - 1]
    if (last === undefined || last.t !== t) {
      last = { t, count: 0, errors: 0, sumMs: 0, maxMs: 0 }
      this.#seconds.push(last)
      while (this.#seconds.length > 0 && this.#seconds[0]!.t <= t - STATS_SECONDS) this.#seconds.shift()
    }
    last.count++
    if (rec.status >= 400 || rec.status === 0) last.errors++
    last.sumMs += rec.durationMs
    if (rec.durationMs > last.maxMs) last.maxMs = rec.durationMs
  }

  /** Newest first. */
  recent (): AccessRecord[] {
    return this.#recent.slice().reverse()
  }

  /** Requests, errors and latency over the last five minutes in ten-second buckets, oldest first. */
  stats (now = Date.now()): { bucketSeconds: number; buckets: Array<{ start: number; count: number; errors: number; avgMs: number | null; maxMs: number | null }> } {
    const end = Math.floor(now / 1000 / BUCKET_SECONDS) * BUCKET_SECONDS + BUCKET_SECONDS
    const n = STATS_SECONDS / BUCKET_SECONDS
    const start = end - n * BUCKET_SECONDS
    const acc = Array.from({ length: n }, (_, i) => ({ start: (start + i * BUCKET_SECONDS) * 1000, count: 0, errors: 0, sumMs: 0, maxMs: 0 }))
    for (const s of this.#seconds) {
      const i = Math.floor((s.t - start) / BUCKET_SECONDS)
      const b = acc[i]
      if (b === undefined) continue
      b.count += s.count
      b.errors += s.errors
      b.sumMs += s.sumMs
      if (s.maxMs > b.maxMs) b.maxMs = s.maxMs
    }
    return {
      bucketSeconds: BUCKET_SECONDS,
      buckets: acc.map(b => ({ start: b.start, count: b.count, errors: b.errors, avgMs: b.count === 0 ? null : b.sumMs / b.count, maxMs: b.count === 0 ? null : b.maxMs })),
    }
  }
}

/** How a request ended, for the UI: allowed, or which check refused it and why (`rule[i]: text` for a rule). */
export function decisionOf (rec: AccessRecord): { decision: string; reason: string | null } {
  const d = rec.denial
  const reason = d === undefined ? null : denialText(d)
  const decision = outcomeOf(rec.status, d)
  if (decision === 'unauthenticated') return { decision, reason: reason ?? 'no or invalid token' }
  return { decision, reason: decision === 'allowed' ? null : reason }
}

// ---- the admin state ----------------------------------------------------------

/** The part of the MCP endpoint the admin state reads (core/mcp/endpoint.ts). */
export interface AdminEndpointView {
  sessions(): readonly SessionSummary[]
  endSession(idOrPrefix: string): boolean
  describeTargets(): readonly TargetSummary[]
  /** Pooled upstreams: `share: subject` children and revision 2026-07-28 upstreams. */
  pooled?(): readonly PooledSummary[]
}

export interface AdminStateOptions {
  readonly loaded: LoadedConfig
  readonly plugins: readonly Plugin[]
  readonly routes: RouteTable
  readonly endpoint: AdminEndpointView
  readonly tracker: UpstreamTracker
  readonly requests: RequestLog
  readonly metrics: Metrics
  readonly log: Logger
  /** Origin of the MCP listener reachable from this process, e.g. `http://127.0.0.1:8080`. */
  readonly mcpOrigin: string
  readonly version: string
  /** Whether each target can start, and what that means for readiness (`mcp.readiness.targets`). */
  readonly targetReadiness?: TargetReadiness
}

/** A plugin's description, or its error; asked only when someone looks. */
function describeOf (p: Plugin): PluginDescription | undefined {
  try { return p.describe?.() } catch (err) { return { error: (err as Error).message } }
}

/** The first description section of that name any plugin fills (`PluginDescription`). */
function sectionOf<K extends 'keySet' | 'discovery'> (plugins: readonly Plugin[], key: K): PluginDescription[K] | undefined {
  for (const p of plugins) {
    const s = describeOf(p)?.[key]
    if (s !== undefined) return s as PluginDescription[K]
  }
  return undefined
}

export function createAdminState (opts: AdminStateOptions): AdminState {
  const { loaded, plugins, routes, endpoint, tracker, requests, metrics } = opts
  const scrub = createScrubber(secretValues(loaded.config, loaded.secretPaths))
  const redacted = redactConfig(loaded.config, loaded.secretPaths)
  const startedAt = Date.now()

  // Plugins register their own metrics through env.metrics (key set, discovery, ...).
  metrics.gauge('mcp_proxy_build_info', 'Gateway version').collect = () => [[{ version: opts.version }, 1]]

  function ready (): { ready: boolean; reasons: string[]; targets: TargetHealth[] } {
    const reasons: string[] = [...(opts.targetReadiness?.reasons() ?? [])]
    for (const p of plugins) {
      let r: ReturnType<NonNullable<Plugin['ready']>> | undefined
      try { r = p.ready?.() } catch (err) { r = { ready: false, reason: (err as Error).message } }
      if (r === undefined || r === true) continue
      if (r === false) reasons.push(`${p.name}: not ready`)
      else if (!r.ready) reasons.push(`${p.name}: ${r.reason ?? 'not ready'}`)
    }
    const targets = opts.targetReadiness?.targets() ?? loaded.config.mcp.targets.map(t => ({ name: t.name, ok: true }))
    return { ready: reasons.length === 0, reasons: scrub(reasons) as string[], targets: scrub(targets) as TargetHealth[] }
  }
  metrics.gauge('mcp_proxy_ready', '1 when every plugin reports ready (see /readyz)').collect = () => [[undefined, ready().ready ? 1 : 0]]

  return {
    scrub,
    config: () => redacted,
    overview: () => {
      const r = ready()
      return {
        version: opts.version,
        startedAt,
        uptimeSeconds: Math.round((Date.now() - startedAt) / 1000),
        ready: r.ready,
        reasons: r.reasons,
        sessions: endpoint.sessions().length,
        children: liveChildCount(),
      }
    },
    targets: () => {
      const sessionsByTarget = new Map(endpoint.describeTargets().map(d => [d.name, d.sessions]))
      const tracked = new Map(tracker.describe().map(d => [d.name, d]))
      const cfg = redacted as { mcp: { targets: Array<Record<string, unknown> & { name: string }> } }
      return cfg.mcp.targets.map(t => {
        const s = tracked.get(t.name)
        const stdio = t.stdio as { cmd: string; args?: string[]; share?: string } | undefined
        const http = t.mcp as { url: string } | undefined
        return {
          name: t.name,
          kind: stdio !== undefined ? 'stdio' : 'http',
          share: stdio?.share ?? null,
          // Children shared by a subject's sessions (share: subject), and stateless-revision upstreams.
          pooled: (endpoint.pooled?.() ?? []).filter(p => p.target === t.name).map(p => ({ pid: p.pid ?? null, subject: p.subject ?? null, leases: p.leases, inFlight: p.inFlight })),
          command: stdio !== undefined ? [stdio.cmd, ...(stdio.args ?? [])].join(' ') : http?.url,
          sessions: sessionsByTarget.get(t.name) ?? 0,
          pids: s?.live.flatMap(l => l.pid === undefined ? [] : [l.pid]) ?? [],
          started: s?.started ?? 0,
          failures: s?.failures ?? 0,
          lastError: s?.lastError ?? null,
          lastErrorAt: s?.lastErrorAt ?? null,
        }
      })
    },
    sessions: () => {
      const now = Date.now()
      return endpoint.sessions().map(s => ({
        ...s,
        handle: s.id,
        ageSeconds: Math.round((now - s.createdAt) / 1000),
        idleSeconds: Math.round((now - s.lastActivityAt) / 1000),
      }))
    },
    endSession: handle => endpoint.endSession(handle),
    requests: () => requests.recent().map(r => ({ ...r, ...decisionOf(r) })),
    stats: () => requests.stats(),
    plugins: () => plugins.map(p => ({ name: p.name, routes: (p.routes ?? []).map(r => ({ path: r.path, methods: r.methods })), state: describeOf(p) ?? null })),
    oauth: async () => {
      const documents: Record<string, unknown> = {}
      for (const path of routes.paths().filter(p => p.startsWith('/.well-known/') && !p.endsWith('client-registration'))) {
        try {
          const r = await fetch(`${opts.mcpOrigin}${path}`, { signal: AbortSignal.timeout(5000), headers: { accept: 'application/json' } })
          documents[path] = r.ok ? await r.json() : { status: r.status, body: await r.text().then(t => t.slice(0, 2000)) }
        } catch (err) { documents[path] = { error: (err as Error).message } }
      }
      return { documents, keySet: sectionOf(plugins, 'keySet') ?? null, discovery: sectionOf(plugins, 'discovery') ?? null }
    },
    ready,
    tryIt: (input: TryInput) => runTry(`${opts.mcpOrigin}/mcp`, input),
  }
}
