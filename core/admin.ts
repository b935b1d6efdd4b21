/**
 * The admin listener (default 127.0.0.1:15000): /ui, /api/*, /metrics,
 * /healthz, /readyz. Separate from the MCP listener so it can stay on
 * loopback; optionally protected by `admin.token`.
 */
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http'
import { timingSafeEqual, createHash } from 'node:crypto'
import type { Logger } from 'pino'
import type { Metrics } from './metrics.ts'
import { renderUi } from './ui.ts'

export interface AdminState {
  /** Redacted effective config. */
  config(): unknown
  targets(): unknown
  sessions(): unknown
  endSession(id: string): boolean
  requests(): unknown
  plugins(): unknown
  oauth(): Promise<unknown>
  ready(): { ready: boolean; reasons: string[] }
}

export interface AdminOptions {
  log: Logger
  metrics: Metrics
  state: AdminState
  token?: string
}

function send (res: ServerResponse, status: number, body: unknown, type = 'application/json'): void {
  const payload = typeof body === 'string' ? body : JSON.stringify(body, null, 2)
  res.writeHead(status, {
    'content-type': type,
    'content-length': Buffer.byteLength(payload),
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'x-frame-options': 'DENY',
    ...(type.startsWith('text/html') ? { 'content-security-policy': "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; connect-src 'self' *; img-src 'self' data:" } : {}),
  })
  res.end(payload)
}

function digest (s: string): Buffer { return createHash('sha256').update(s).digest() }

export function createAdminServer (opts: AdminOptions): Server {
  const { state, metrics, log } = opts
  const tokenDigest = opts.token !== undefined ? digest(opts.token) : undefined
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://admin.invalid')
    const path = url.pathname
    if (tokenDigest !== undefined && path !== '/healthz') {
      const h = req.headers.authorization ?? ''
      const m = /^Bearer\s+(.+)$/i.exec(h)
      const given = m?.[1] ?? url.searchParams.get('token') ?? ''
      if (!timingSafeEqual(digest(given), tokenDigest)) {
        res.setHeader('www-authenticate', 'Bearer realm="mcp-proxy-admin"')
        send(res, 401, { error: 'unauthorized', error_description: 'admin token required' })
        return
      }
    }
    if (req.method === 'GET' && (path === '/ui' || path === '/ui/')) return send(res, 200, renderUi(), 'text/html; charset=utf-8')
    if (req.method === 'GET' && path === '/') { res.writeHead(302, { location: '/ui' }); res.end(); return }
    if (req.method === 'GET' && path === '/healthz') return send(res, 200, { status: 'ok' })
    if (req.method === 'GET' && path === '/readyz') {
      const r = state.ready()
      return send(res, r.ready ? 200 : 503, { status: r.ready ? 'ready' : 'not ready', reasons: r.reasons })
    }
    if (req.method === 'GET' && path === '/metrics') return send(res, 200, metrics.render(), 'text/plain; version=0.0.4; charset=utf-8')
    if (req.method === 'GET' && path === '/api/config') return send(res, 200, state.config())
    if (req.method === 'GET' && path === '/api/targets') return send(res, 200, state.targets())
    if (req.method === 'GET' && path === '/api/sessions') return send(res, 200, state.sessions())
    if (req.method === 'GET' && path === '/api/requests') return send(res, 200, state.requests())
    if (req.method === 'GET' && path === '/api/plugins') return send(res, 200, state.plugins())
    if (req.method === 'GET' && path === '/api/oauth') return send(res, 200, await state.oauth())
    const m = /^\/api\/sessions\/([^/]+)$/.exec(path)
    if (m !== null && req.method === 'DELETE') {
      const ok = state.endSession(decodeURIComponent(m[1]!))
      return send(res, ok ? 200 : 404, ok ? { ended: true } : { error: 'not_found', error_description: 'no such session' })
    }
    send(res, 404, { error: 'not_found', error_description: `no admin route ${path}` })
  }
  return createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err }, 'admin request failed')
      if (!res.headersSent) send(res, 500, { error: 'server_error', error_description: 'internal error' })
      else res.end()
    })
  })
}
