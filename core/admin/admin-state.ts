/**
 * What the admin listener reports, gathered from the running gateway:
 * the targets' upstream lifecycle (reported by the transports, read here
 * only when someone asks), the recent-request ring with
 * per-second traffic stats, scrape-time gauges (children, key set,
 * discovery), the targets' credentials as the credential layer describes
 * them (mode, header and env names, cache, last failure: never a secret),
 * the redacted config and the "try it" client.
 */
import type { Logger } from 'pino'
import type { LoadedConfig } from '../config.ts'
import type { Metrics } from '../observability/metrics.ts'
import type { Plugin, PluginDescription } from '../plugin.ts'
import type { RouteTable } from '../routes.ts'
import { INTERNAL_HEADER } from '../server.ts'
import { outcomeOf, type AccessRecord } from '../observability/access-log.ts'
import { denialText } from '../context.ts'
import type { AdminState, TryInput } from './admin.ts'
import type { PooledSummary, SessionSummary, TargetSummary } from '../mcp/index.ts'
import { liveChildCount, type TargetState } from '../targets/index.ts'
import { redactConfig, secretValues, createScrubber } from './redact.ts'
import { reasonCode } from './probes.ts'
import { runTry } from './admin-try.ts'
import type { TargetReadiness, TargetHealth } from '../targets/readiness.ts'
import type { TargetAuthSummary } from '../credentials/index.ts'

// ---- recent requests and traffic stats --------------------------------------

const RECENT_MAX = 200
const STATS_SECONDS = 300
const BUCKET_SECONDS = 10

interface Second {
  t: number
  count: number
  errors: number
  sumMs: number
  maxMs: number
}

/** The last requests of the MCP listener and per-second counts for the chart. */
export class RequestLog {
  readonly #recent: AccessRecord[] = []
  readonly #seconds: Second[] = []

  add(rec: AccessRecord): void {
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
  recent(): AccessRecord[] {
    return this.#recent.slice().reverse()
  }

  /** Requests, errors and latency over the last five minutes in ten-second buckets, oldest first. */
  stats(now = Date.now()): {
    bucketSeconds: number
    buckets: Array<{ start: number; count: number; errors: number; avgMs: number | null; maxMs: number | null }>
  } {
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
      buckets: acc.map(b => ({
        start: b.start,
        count: b.count,
        errors: b.errors,
        avgMs: b.count === 0 ? null : b.sumMs / b.count,
        maxMs: b.count === 0 ? null : b.maxMs,
      })),
    }
  }
}

/** How a request ended, for the UI: allowed, or which check refused it and why (`rule[i]: text` for a rule). */
export function decisionOf(rec: AccessRecord): { decision: string; reason: string | null } {
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
  /** Each target's upstream lifecycle, read when the admin asks (core/targets/lifecycle.ts). */
  readonly targets: ReadonlyArray<{ describe(): TargetState }>
  readonly requests: RequestLog
  readonly metrics: Metrics
  readonly log: Logger
  /** Origin of the MCP listener reachable from this process, e.g. `http://127.0.0.1:8080`. */
  readonly mcpOrigin: string
  /** Sent as INTERNAL_HEADER on the reads of the /.well-known documents: the UI's polling is not traffic. */
  readonly internalToken?: string
  readonly version: string
  /** Whether each target can start, and what that means for readiness (`mcp.readiness.targets`). */
  readonly targetReadiness?: TargetReadiness
  /** The targets' credentials (core/credentials/), described when the admin asks. */
  readonly credentials?: { describe(): readonly TargetAuthSummary[] }
}

/** What the targets view shows of a target's credentials: named fields only (a summary that carried more would not leak it). */
export interface TargetCredentialView {
  readonly mode: string
  readonly headerNames: readonly string[]
  readonly envNames: readonly string[]
  readonly cached: number
  readonly lastFailure: { readonly at: number; readonly reason: string } | null
}

function credentialView(d: TargetAuthSummary | undefined): TargetCredentialView | null {
  if (d === undefined) return null
  const f = d.lastFailure
  return {
    mode: d.mode,
    headerNames: [...d.headerNames],
    envNames: [...d.envNames],
    cached: d.cached,
    lastFailure: f === undefined ? null : { at: f.at, reason: f.reason },
  }
}

/** A plugin's description, or its error; asked only when someone looks. */
function describeOf(p: Plugin): PluginDescription | undefined {
  try {
    return p.describe?.()
  } catch (err) {
    return { error: (err as Error).message }
  }
}

/** The first description section of that name any plugin fills (`PluginDescription`). */
function sectionOf<K extends 'keySet' | 'discovery'>(plugins: readonly Plugin[], key: K): PluginDescription[K] | undefined {
  for (const p of plugins) {
    const s = describeOf(p)?.[key]
    if (s !== undefined) return s as PluginDescription[K]
  }
  return undefined
}

export function createAdminState(opts: AdminStateOptions): AdminState {
  const { loaded, plugins, routes, endpoint, requests, metrics } = opts
  const scrub = createScrubber(secretValues(loaded.config, loaded.secretPaths))
  const redacted = redactConfig(loaded.config, loaded.secretPaths)
  const startedAt = Date.now()

  // Plugins register their own metrics through env.metrics (key set, discovery, ...).
  metrics.gauge('mcp_proxy_build_info', 'Gateway version').collect = () => [[{ version: opts.version }, 1]]

  /** `reasons` and `targets` in detail (admin listener); `codes` the same causes for the probe listener. */
  function ready(): { ready: boolean; reasons: string[]; codes: string[]; targets: TargetHealth[] } {
    const reasons: string[] = [...(opts.targetReadiness?.reasons() ?? [])]
    const codes: string[] = reasons.length > 0 ? ['target_unavailable'] : []
    for (const p of plugins) {
      let r: ReturnType<NonNullable<Plugin['ready']>> | undefined
      try {
        r = p.ready?.()
      } catch (err) {
        r = { ready: false, reason: (err as Error).message }
      }
      if (r === undefined || r === true) continue
      if (r === false) {
        reasons.push(`${p.name}: not ready`)
        codes.push('plugin_not_ready')
      } else if (!r.ready) {
        reasons.push(`${p.name}: ${r.reason ?? 'not ready'}`)
        codes.push(reasonCode(r.code, 'plugin_not_ready'))
      }
    }
    const targets = opts.targetReadiness?.targets() ?? loaded.config.mcp.targets.map(t => ({ name: t.name, ok: true }))
    return { ready: reasons.length === 0, reasons: scrub(reasons) as string[], codes, targets: scrub(targets) as TargetHealth[] }
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
      const tracked = new Map(opts.targets.map(l => l.describe()).map(d => [d.name, d]))
      const credentials = new Map((opts.credentials?.describe() ?? []).map(d => [d.target, d]))
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
          pooled: (endpoint.pooled?.() ?? [])
            .filter(p => p.target === t.name)
            .map(p => ({ pid: p.pid ?? null, subject: p.subject ?? null, leases: p.leases, inFlight: p.inFlight })),
          command: stdio !== undefined ? [stdio.cmd, ...(stdio.args ?? [])].join(' ') : http?.url,
          sessions: sessionsByTarget.get(t.name) ?? 0,
          pids: s?.live.flatMap(l => (l.pid === undefined ? [] : [l.pid])) ?? [],
          started: s?.started ?? 0,
          failures: s?.failures ?? 0,
          lastError: s?.lastError ?? null,
          lastErrorAt: s?.lastErrorAt ?? null,
          // Mode, header/env names, cached credentials, last failure; null without `auth`.
          credentials: credentialView(credentials.get(t.name)),
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
    plugins: () =>
      plugins.map(p => ({ name: p.name, routes: (p.routes ?? []).map(r => ({ path: r.path, methods: r.methods })), state: describeOf(p) ?? null })),
    oauth: async () => {
      const documents: Record<string, unknown> = {}
      for (const path of routes.paths().filter(p => p.startsWith('/.well-known/') && !p.endsWith('client-registration'))) {
        try {
          const headers: Record<string, string> = { accept: 'application/json' }
          if (opts.internalToken !== undefined) headers[INTERNAL_HEADER] = opts.internalToken
          const r = await fetch(`${opts.mcpOrigin}${path}`, { signal: AbortSignal.timeout(5000), headers })
          documents[path] = r.ok ? await r.json() : { status: r.status, body: await r.text().then(t => t.slice(0, 2000)) }
        } catch (err) {
          documents[path] = { error: (err as Error).message }
        }
      }
      return { documents, keySet: sectionOf(plugins, 'keySet') ?? null, discovery: sectionOf(plugins, 'discovery') ?? null }
    },
    ready,
    tryIt: (input: TryInput) => runTry(`${opts.mcpOrigin}/mcp`, input),
  }
}
