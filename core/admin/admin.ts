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
import { timingSafeEqual, createHmac, randomBytes } from 'node:crypto'
import type { Logger } from 'pino'
import type { Metrics } from '../observability/metrics.ts'
import { loadUiAssets, loginPage, type UiAssets } from './ui.ts'
import { validateTryInput, type TryInput } from './admin-try.ts'

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

const COOKIE = 'mcpp_admin'
const MAX_BODY = 64 * 1024
const LOOPBACK_HOSTS = new Set(['127.0.0.1', '::1', 'localhost', '[::1]'])

const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

const BASE_HEADERS = {
  'cache-control': 'no-store',
  'x-content-type-options': 'nosniff',
  // Not `no-referrer`: with it, browsers send `Origin: null` on same-origin POSTs and the Origin check could not tell them apart.
  'referrer-policy': 'same-origin',
  'x-frame-options': 'DENY',
  'cross-origin-resource-policy': 'same-origin',
  'cross-origin-opener-policy': 'same-origin',
  'content-security-policy': CSP,
} as const

function send (res: ServerResponse, status: number, body: unknown, type = 'application/json; charset=utf-8', extra: Record<string, string> = {}): void {
  const payload = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body, null, 2)
  res.writeHead(status, { ...BASE_HEADERS, 'content-type': type, 'content-length': Buffer.byteLength(payload), ...extra })
  res.end(payload)
}

function apiError (res: ServerResponse, status: number, error: string, description: string, extra: Record<string, string> = {}): void {
  send(res, status, { error, error_description: description }, undefined, extra)
}

/** `Host` header without its port, lower-cased; `[::1]` keeps its brackets. */
function hostName (host: string | undefined): string {
  if (host === undefined) return ''
  const h = host.trim().toLowerCase()
  if (h.startsWith('[')) return h.slice(0, h.indexOf(']') + 1)
  const i = h.lastIndexOf(':')
  return i === -1 ? h : h.slice(0, i)
}

function readBody (req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    req.on('data', (c: Buffer) => {
      size += c.length
      if (size > MAX_BODY) { req.removeAllListeners('data'); req.resume(); reject(new Error('too large')); return }
      chunks.push(c)
    })
    req.once('end', () => resolve(Buffer.concat(chunks)))
    req.once('error', reject)
  })
}

function cookieValue (header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined
  for (const part of header.split(';')) {
    const i = part.indexOf('=')
    if (i !== -1 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim()
  }
  return undefined
}

function equal (a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b)
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

export function createAdminServer (opts: AdminOptions): Server {
  const { metrics, log } = opts
  const given = opts.state
  const stateOf = typeof given === 'function' ? given : () => given
  const assets: UiAssets = loadUiAssets()
  const loopbackOnly = opts.host === undefined || LOOPBACK_HOSTS.has(opts.host)
  // Keyed per process: the cookie proves the token was presented without being the token itself.
  const cookieKey = randomBytes(32)
  const tokenMac = (t: string): Buffer => createHmac('sha256', cookieKey).update(t).digest()
  const expected = opts.token !== undefined ? tokenMac(opts.token) : undefined
  const cookieFor = expected?.toString('base64url')

  function authorized (req: IncomingMessage): boolean {
    if (expected === undefined) return true
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '')
    if (m !== null) return equal(tokenMac(m[1]!), expected)
    const c = cookieValue(req.headers.cookie, COOKIE)
    if (c !== undefined) return equal(Buffer.from(c), Buffer.from(cookieFor!))
    return false
  }

  /** State-changing requests must come from this listener's own page (or a non-browser client, which sends no Origin). */
  function sameOrigin (req: IncomingMessage): boolean {
    const origin = req.headers.origin
    if (origin === undefined) return true
    try {
      return new URL(origin).host === (req.headers.host ?? '').toLowerCase()
    } catch {
      return false
    }
  }

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://admin.invalid')
    const path = url.pathname
    const method = req.method ?? 'GET'
    if (loopbackOnly && !LOOPBACK_HOSTS.has(hostName(req.headers.host))) {
      // A page on another site whose name resolves to 127.0.0.1 must not read this listener.
      return apiError(res, 421, 'misdirected_request', 'the admin listener answers loopback host names only')
    }
    if (path === '/healthz') {
      if (method !== 'GET' && method !== 'HEAD') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET, HEAD' })
      return send(res, 200, { status: 'ok' })
    }
    if (path === '/ui/app.css' && method === 'GET') return send(res, 200, assets.css, 'text/css; charset=utf-8')
    if (path === '/ui/login' && expected !== undefined) {
      if (method !== 'POST') return apiError(res, 405, 'method_not_allowed', 'use POST', { allow: 'POST' })
      if (!sameOrigin(req)) return apiError(res, 403, 'forbidden', 'cross-origin request refused')
      const form = new URLSearchParams((await readBody(req)).toString('utf8'))
      const given = form.get('token') ?? ''
      if (!equal(tokenMac(given), expected)) return send(res, 401, loginPage('That token is not valid.'), 'text/html; charset=utf-8')
      res.writeHead(303, {
        ...BASE_HEADERS,
        location: '/ui',
        'set-cookie': `${COOKIE}=${cookieFor}; Path=/; HttpOnly; SameSite=Strict`,
        'content-length': 0,
      })
      res.end()
      return
    }
    if (!authorized(req)) {
      // The sign-in form holds no data; 200 so a browser does not report a failed load.
      if (method === 'GET' && (path === '/ui' || path === '/ui/' || path === '/')) return send(res, 200, loginPage(), 'text/html; charset=utf-8')
      return apiError(res, 401, 'unauthorized', 'admin token required', { 'www-authenticate': 'Bearer realm="mcp-proxy-admin"' })
    }
    if (method !== 'GET' && method !== 'HEAD' && !sameOrigin(req)) return apiError(res, 403, 'forbidden', 'cross-origin request refused')

    if (path === '/' && method === 'GET') { res.writeHead(302, { ...BASE_HEADERS, location: '/ui', 'content-length': 0 }); res.end(); return }
    if (path === '/ui' || path === '/ui/') {
      if (method !== 'GET') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET' })
      return send(res, 200, assets.html, 'text/html; charset=utf-8')
    }
    if (path === '/ui/app.js' && method === 'GET') return send(res, 200, assets.js, 'text/javascript; charset=utf-8')
    const state = stateOf()
    if (state === undefined) {
      if (path === '/readyz') return send(res, 503, { status: 'not ready', reasons: ['the gateway is starting'] }, undefined, { 'retry-after': '1' })
      return apiError(res, 503, 'temporarily_unavailable', 'the gateway is starting', { 'retry-after': '1' })
    }
    const scrub = state.scrub ?? ((v: unknown) => v)
    if (path === '/readyz') {
      if (method !== 'GET' && method !== 'HEAD') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET, HEAD' })
      const r = state.ready()
      return send(res, r.ready ? 200 : 503, { status: r.ready ? 'ready' : 'not ready', reasons: r.reasons, ...(r.targets !== undefined ? { targets: r.targets } : {}) })
    }
    if (path === '/metrics') {
      if (method !== 'GET') return apiError(res, 405, 'method_not_allowed', 'use GET', { allow: 'GET' })
      await metrics.collect()
      return send(res, 200, metrics.render(), 'text/plain; version=0.0.4; charset=utf-8')
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
      try { handleId = decodeURIComponent(m[1]!) } catch { return apiError(res, 400, 'invalid_request', 'malformed session handle') }
      const ok = state.endSession(handleId)
      log.info({ session: handleId.slice(0, 8), ended: ok }, 'admin: end session')
      return ok ? send(res, 200, { ended: true }) : apiError(res, 404, 'not_found', 'no such session')
    }
    if (path === '/api/try' && state.tryIt !== undefined) {
      if (method !== 'POST') return apiError(res, 405, 'method_not_allowed', 'use POST', { allow: 'POST' })
      if (!(req.headers['content-type'] ?? '').toLowerCase().startsWith('application/json')) {
        return apiError(res, 415, 'unsupported_media_type', 'content-type must be application/json')
      }
      let input: unknown
      try { input = JSON.parse((await readBody(req)).toString('utf8')) } catch { return apiError(res, 400, 'invalid_request', 'body must be JSON of at most 64 KiB') }
      const checked = validateTryInput(input)
      if (typeof checked === 'string') return apiError(res, 400, 'invalid_request', checked)
      // Never log the input: it holds the caller's token.
      const result = await state.tryIt(checked)
      return send(res, 200, scrub(result))
    }
    apiError(res, 404, 'not_found', `no admin route ${path}`)
  }

  return createServer({ headersTimeout: 10_000, requestTimeout: 60_000 }, (req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err, path: (req.url ?? '').split('?')[0] }, 'admin request failed')
      if (!res.headersSent) apiError(res, 500, 'server_error', 'internal error')
      else res.end()
    })
  })
}
