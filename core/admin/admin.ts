/**
 * The admin listener (default 127.0.0.1:15000): the management page (/ui and
 * its two assets), the read-only admin API (/api/*) plus "end session" and
 * "try it", /metrics, /healthz and /readyz. Separate from the MCP listener
 * so it can stay on loopback. Hardening: a strict CSP (no inline script or
 * style), a Host check against DNS rebinding while bound to loopback, an
 * Origin check on every state-changing request, and the optional
 * `admin.token` over the whole listener (only /healthz and the stylesheet stay open).
 */
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Logger } from 'pino'
import type { Metrics } from '../observability/metrics.ts'
import { loadUiAssets, loginPage, type UiAssets } from './ui.ts'
import { validateTryInput, type TryInput } from './admin-try.ts'
import { apiError, readBody, send, BASE_HEADERS } from './admin-http.ts'
import { AdminToken, sameOrigin } from './admin-token.ts'

export type { TryInput } from './admin-try.ts'

/** What the admin API reads; built by `createAdminState` (admin-state.ts). */
export interface AdminState {
  /** Redacted effective config. */
  config(): unknown
  /** Version, uptime, readiness, counts: the page header. */
  overview(): unknown
  targets(): unknown
  /** Live sessions; each carries `handle` (the id prefix) that `endSession` accepts. Never a whole id. */
  sessions(): unknown
  endSession(handle: string): boolean
  /** Recent requests of the MCP listener, newest first, with their auth decision. */
  requests(): unknown
  /** Requests/errors/latency per ten seconds over the last five minutes. */
  stats(): unknown
  plugins(): unknown
  /** The OAuth documents the gateway serves, the key-set and discovery state. */
  oauth(): Promise<unknown>
  /** `targets`: whether each target can start (reported whether or not it counts for readiness). */
  /** `codes`: the same causes as `reasons`, as short codes for the probe listener (core/admin/probes.ts). */
  ready(): { ready: boolean; reasons: string[]; codes: string[]; targets?: unknown[] }
  /** Runs initialize -> tools/list -> tools/call against the gateway's own /mcp. */
  tryIt?(input: TryInput): Promise<unknown>
  /** Removes secret values from anything the API returns (defence in depth). */
  scrub?(value: unknown): unknown
}

export interface AdminOptions {
  log: Logger
  metrics: Metrics
  /**
   * The state, or a getter for it that returns undefined while the gateway
   * starts: the listener is bound early so probes get an answer (/healthz
   * 200, /readyz 503 "starting") instead of a refused connection.
   */
  state: AdminState | (() => AdminState | undefined)
  /** `admin.token`: when set, every route but /healthz needs it. */
  token?: string
  /** `admin.host`: while it is a loopback address, requests must name a loopback Host (DNS rebinding). */
  host?: string
}

const LOOPBACK_HOSTS = new Set(['127.0.0.1', '::1', 'localhost', '[::1]'])

/** `Host` header without its port, lower-cased; `[::1]` keeps its brackets. */
function hostName(host: string | undefined): string {
  if (host === undefined) return ''
  const h = host.trim().toLowerCase()
  if (h.startsWith('[')) return h.slice(0, h.indexOf(']') + 1)
  const i = h.lastIndexOf(':')
  return i === -1 ? h : h.slice(0, i)
}

/** Routes that are answered for GET only, with the state method that produces their JSON. */
const READ_ROUTES: Record<string, (s: AdminState) => unknown> = {
  '/api/overview': s => s.overview(),
  '/api/config': s => s.config(),
  '/api/targets': s => s.targets(),
  '/api/sessions': s => s.sessions(),
  '/api/requests': s => s.requests(),
  '/api/stats': s => s.stats(),
  '/api/plugins': s => s.plugins(),
  '/api/oauth': s => s.oauth(),
  '/api/ready': s => s.ready(),
}

/** What every request of the listener is answered with, built once. */
interface AdminListener {
  readonly log: Logger
  readonly metrics: Metrics
  readonly stateOf: () => AdminState | undefined
  readonly assets: UiAssets
  readonly loopbackOnly: boolean
  /** undefined without `admin.token`: every route is open. */
  readonly token: AdminToken | undefined
}

export function createAdminServer(opts: AdminOptions): Server {
  const given = opts.state
  const l: AdminListener = {
    log: opts.log,
    metrics: opts.metrics,
    stateOf: typeof given === 'function' ? given : () => given,
    assets: loadUiAssets(),
    loopbackOnly: opts.host === undefined || LOOPBACK_HOSTS.has(opts.host),
    token: opts.token !== undefined ? new AdminToken(opts.token) : undefined,
  }
  return createServer({ headersTimeout: 10_000, requestTimeout: 60_000 }, (req, res) => {
    handle(l, req, res).catch((err: unknown) => {
      l.log.error({ err, path: (req.url ?? '').split('?')[0] }, 'admin request failed')
      if (!res.headersSent) apiError(res, 500, 'server_error', 'internal error')
      else res.end()
    })
  })
}

/** The gate (Host, token, Origin) and the routes that need no gateway state: health, the page and its assets. */
async function handle(l: AdminListener, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://admin.invalid')
  const path = url.pathname
  const method = req.method ?? 'GET'
  if (l.loopbackOnly && !LOOPBACK_HOSTS.has(hostName(req.headers.host))) {
    // A page on another site whose name resolves to 127.0.0.1 must not read this listener.
    return apiError(res, 421, 'misdirected_request', 'the admin listener answers loopback host names only')
  }
  if (path === '/healthz') {
    if (method !== 'GET' && method !== 'HEAD') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET, HEAD' })
    return send(res, 200, { status: 'ok' })
  }
  if (path === '/ui/app.css' && method === 'GET') return send(res, 200, l.assets.css, 'text/css; charset=utf-8')
  if (path === '/ui/login' && l.token !== undefined) return l.token.login(req, res)
  if (l.token !== undefined && !l.token.authorized(req)) {
    // The sign-in form holds no data; 200 so a browser does not report a failed load.
    if (method === 'GET' && (path === '/ui' || path === '/ui/' || path === '/')) return send(res, 200, loginPage(), 'text/html; charset=utf-8')
    return apiError(res, 401, 'unauthorized', 'admin token required', { 'www-authenticate': 'Bearer realm="mcp-proxy-admin"' })
  }
  if (method !== 'GET' && method !== 'HEAD' && !sameOrigin(req)) return apiError(res, 403, 'forbidden', 'cross-origin request refused')

  if (path === '/' && method === 'GET') {
    res.writeHead(302, { ...BASE_HEADERS, location: '/ui', 'content-length': 0 })
    res.end()
    return
  }
  if (path === '/ui' || path === '/ui/') {
    if (method !== 'GET') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET' })
    return send(res, 200, l.assets.html, 'text/html; charset=utf-8')
  }
  if (path === '/ui/app.js' && method === 'GET') return send(res, 200, l.assets.js, 'text/javascript; charset=utf-8')
  const state = l.stateOf()
  if (state === undefined) {
    if (path === '/readyz') return send(res, 503, { status: 'not ready', reasons: ['the gateway is starting'] }, undefined, { 'retry-after': '1' })
    return apiError(res, 503, 'temporarily_unavailable', 'the gateway is starting', { 'retry-after': '1' })
  }
  return handleWithState(l, state, req, res, path, method)
}

/** The routes that read the gateway: /readyz, /metrics and the admin API. */
async function handleWithState(l: AdminListener, state: AdminState, req: IncomingMessage, res: ServerResponse, path: string, method: string): Promise<void> {
  const scrub = state.scrub ?? ((v: unknown) => v)
  if (path === '/readyz') {
    if (method !== 'GET' && method !== 'HEAD') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET, HEAD' })
    const r = state.ready()
    return send(res, r.ready ? 200 : 503, {
      status: r.ready ? 'ready' : 'not ready',
      reasons: r.reasons,
      ...(r.targets !== undefined ? { targets: r.targets } : {}),
    })
  }
  if (path === '/metrics') {
    if (method !== 'GET') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET' })
    await l.metrics.collect()
    return send(res, 200, l.metrics.render(), 'text/plain; version=0.0.4; charset=utf-8')
  }
  const read = READ_ROUTES[path]
  if (read !== undefined) {
    if (method !== 'GET') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET' })
    return send(res, 200, scrub(await read(state)))
  }
  const m = /^\/api\/sessions\/([^/]+)$/.exec(path)
  if (m !== null) {
    if (method !== 'DELETE') return apiError(res, 405, 'method_not_allowed', 'use DELETE', { allow: 'DELETE' })
    let handleId: string
    try {
      handleId = decodeURIComponent(m[1]!)
    } catch {
      return apiError(res, 400, 'invalid_request', 'malformed session handle')
    }
    const ok = state.endSession(handleId)
    l.log.info({ session: handleId.slice(0, 8), ended: ok }, 'admin: end session')
    return ok ? send(res, 200, { ended: true }) : apiError(res, 404, 'not_found', 'no such session')
  }
  if (path === '/api/try' && state.tryIt !== undefined) return tryIt(state, req, res, method, scrub)
  apiError(res, 404, 'not_found', `no admin route ${path}`)
}

/** POST /api/try: "try it" against the gateway's own /mcp. */
async function tryIt(state: AdminState, req: IncomingMessage, res: ServerResponse, method: string, scrub: (v: unknown) => unknown): Promise<void> {
  if (method !== 'POST') return apiError(res, 405, 'method_not_allowed', 'use POST', { allow: 'POST' })
  if (!(req.headers['content-type'] ?? '').toLowerCase().startsWith('application/json')) {
    return apiError(res, 415, 'unsupported_media_type', 'content-type must be application/json')
  }
  let input: unknown
  try {
    input = JSON.parse((await readBody(req)).toString('utf8'))
  } catch {
    return apiError(res, 400, 'invalid_request', 'body must be JSON of at most 64 KiB')
  }
  const checked = validateTryInput(input)
  if (typeof checked === 'string') return apiError(res, 400, 'invalid_request', checked)
  // Never log the input: it holds the caller's token.
  const result = await state.tryIt!(checked)
  return send(res, 200, scrub(result))
}
