/**
 * The probe listener (`probes: {port, host}`): GET /healthz, /readyz and
 * /metrics and nothing else, for the kubelet and a scraper on the pod
 * network. The admin listener stays on loopback with its UI and token; this
 * one exposes no session, no config and no action, so it needs no token for
 * the probes. /metrics may ask for a token of its own (`probes.metricsToken`),
 * never the admin token.
 *
 * Readiness fails first on SIGTERM (`terminating()`), while the MCP listener
 * keeps serving for `shutdownDelayMs`: endpoints controllers and balancers
 * stop sending before the gateway stops accepting.
 */
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http'
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import type { Logger } from 'pino'
import type { Metrics } from '../observability/metrics.ts'

/**
 * `reasons` are details for the admin listener (they may name commands, hosts,
 * targets); `codes` the same causes as short codes, all the probe listener shows.
 */
export interface ProbeReadiness {
  ready: boolean
  reasons: string[]
  codes?: string[]
}

/** A cause of not being ready, as the probe listener may show it: `[a-z0-9_]`, else a generic code. */
export function reasonCode(code: string | undefined, fallback: string): string {
  return code !== undefined && /^[a-z][a-z0-9_]{0,47}$/.test(code) ? code : fallback
}

export interface ProbeOptions {
  log: Logger
  metrics: Metrics
  /** The gateway's readiness; undefined while it starts. With `workers`, the primary asks its workers (a promise). */
  ready(): ProbeReadiness | undefined | Promise<ProbeReadiness | undefined>
  /** Refreshes scrape-time metrics before /metrics renders. */
  beforeScrape?(): void
  /** Renders /metrics instead of `metrics.render()` (`workers`: every worker's series, labelled). */
  render?(): Promise<string>
  /** `probes.metricsToken`: when set, /metrics needs it as a bearer token. */
  metricsToken?: string
}

export interface ProbeServer {
  readonly server: Server
  /** From now on /readyz answers 503 "shutting down" (SIGTERM). */
  terminating(): void
  close(): Promise<void>
}

const HEADERS = { 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' } as const

function send(res: ServerResponse, status: number, body: string, type: string, extra: Record<string, string> = {}): void {
  res.writeHead(status, { ...HEADERS, 'content-type': type, 'content-length': Buffer.byteLength(body), ...extra })
  res.end(body)
}

function json(res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}): void {
  send(res, status, JSON.stringify(body), 'application/json; charset=utf-8', extra)
}

export function createProbeServer(opts: ProbeOptions): ProbeServer {
  const { log, metrics } = opts
  let shuttingDown = false
  // Compared as MACs under a per-process key: equal length, so timingSafeEqual never throws or leaks the length.
  const macKey = randomBytes(32)
  const mac = (t: string): Buffer => createHmac('sha256', macKey).update(t).digest()
  const expected = opts.metricsToken !== undefined ? mac(opts.metricsToken) : undefined

  function scrapeAllowed(req: IncomingMessage): boolean {
    if (expected === undefined) return true
    const h = req.headers.authorization ?? ''
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h)
    return m !== null && timingSafeEqual(mac(m[1]!), expected)
  }

  // Each branch answers with `return json(…)`: one answer per request, no fall-through.
  async function handle(req: IncomingMessage, res: ServerResponse) {
    const path = (req.url ?? '/').split('?', 1)[0]!
    const method = req.method ?? 'GET'
    if (path !== '/healthz' && path !== '/readyz' && path !== '/metrics') {
      return json(res, 404, { error: 'not_found', error_description: 'the probe listener serves /healthz, /readyz and /metrics only' })
    }
    if (method !== 'GET' && method !== 'HEAD') return json(res, 405, { error: 'method_not_allowed', error_description: 'use GET' }, { allow: 'GET, HEAD' })
    if (path === '/healthz') return json(res, 200, { status: 'ok' })
    // Unauthenticated, on the pod network: ready or not and reason codes, never the details
    // (stdio command paths, target names, the IdP's address); those are on the admin listener.
    if (path === '/readyz') {
      if (shuttingDown) return json(res, 503, { status: 'not ready', reasons: ['shutting_down'] })
      const r = await opts.ready()
      if (r === undefined) return json(res, 503, { status: 'not ready', reasons: ['starting'] }, { 'retry-after': '1' })
      const codes = r.ready ? [] : [...new Set(r.codes ?? ['not_ready'])]
      return json(res, r.ready ? 200 : 503, { status: r.ready ? 'ready' : 'not ready', reasons: codes })
    }
    if (!scrapeAllowed(req)) {
      log.warn({ address: req.socket.remoteAddress }, 'probe listener: /metrics without a valid metrics token')
      return json(res, 401, { error: 'unauthorized', error_description: 'metrics token required' }, { 'www-authenticate': 'Bearer realm="mcp-proxy-metrics"' })
    }
    opts.beforeScrape?.()
    send(res, 200, opts.render !== undefined ? await opts.render() : metrics.render(), 'text/plain; version=0.0.4; charset=utf-8')
  }

  // Probes are tiny: short timeouts keep an idle or slow connection from holding a socket.
  const server = createServer({ headersTimeout: 10_000, requestTimeout: 10_000, keepAliveTimeout: 5_000 }, (req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err }, 'probe request failed')
      if (!res.headersSent) json(res, 500, { error: 'server_error', error_description: 'internal error' })
      else res.end()
    })
  })

  return {
    server,
    terminating() {
      shuttingDown = true
    },
    close() {
      return new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
    },
  }
}
