/**
 * CORS for browser-based MCP clients. Preflights are answered here, first in
 * the pipeline, so they need no token and never reach an upstream; every
 * other answer (401s and errors included) is decorated in onResponse. A
 * request to /mcp whose Origin is present and not allowed gets 403 (MCP
 * transport security: DNS-rebinding protection).
 */
import type { OutgoingHttpHeaders } from 'node:http'
import { definePlugin, ProxyError, type Plugin, type Reply, type RequestContext, type ResponseContext } from '../../core/plugin-api.ts'
import optionsSchema from './schema.json' with { type: 'json' }

/** Options as validated by schema.json (defaults applied); any may be missing when built by hand. */
export interface CorsOptions {
  allowOrigins?: string[]
  allowHeaders?: string[]
  exposeHeaders?: string[]
  allowMethods?: string[]
  allowCredentials?: boolean
  maxAgeSeconds?: number
}

/** Request headers MCP clients send; always allowed. */
export const ALWAYS_ALLOWED_HEADERS = [
  'Authorization',
  'Content-Type',
  'Accept',
  'Mcp-Session-Id',
  'MCP-Protocol-Version',
  'Last-Event-ID',
  'Mcp-Method',
  'Mcp-Name',
]
/** Response headers browsers must be able to read: the challenge and the MCP session id. */
export const ALWAYS_EXPOSED_HEADERS = ['WWW-Authenticate', 'Mcp-Session-Id']

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/

function normaliseOrigin(origin: string): string {
  return origin.trim().replace(/\/+$/, '').toLowerCase()
}

function union(a: readonly string[], b: readonly string[]): string[] {
  const seen = new Set<string>()
  const out: string[] = []
  for (const h of [...a, ...b]) {
    if (h === '*' || seen.has(h.toLowerCase())) continue
    seen.add(h.toLowerCase())
    out.push(h)
  }
  return out
}

function appendVary(headers: OutgoingHttpHeaders, value: string): void {
  const cur = headers.vary
  const list =
    cur === undefined
      ? []
      : String(cur)
          .split(',')
          .map(s => s.trim())
          .filter(Boolean)
  if (!list.some(v => v.toLowerCase() === value.toLowerCase() || v === '*')) list.push(value)
  headers.vary = list.join(', ')
}

interface Decision {
  readonly origin: string
  readonly allowed: boolean
}

export default definePlugin<CorsOptions>({
  name: 'cors',
  engine: '^1',
  optionsSchema: optionsSchema as Record<string, unknown>,
  policy: 'cors',
  summary(options) {
    const origins = options.allowOrigins ?? []
    return `Origin checked: browser requests from origins other than the gateway's own${origins.length > 0 ? ` and ${origins.join(', ')}` : ''} refused (403)`
  },
  create(options, env) {
    const origins = options.allowOrigins ?? []
    const allowAll = origins.includes('*')
    const allowed = new Set(origins.filter(o => o !== '*').map(normaliseOrigin))
    // The gateway's own origin is always allowed. With no `cors` block this
    // plugin still runs (first in the default pipeline), so a browser request
    // from any other origin gets 403: MCP transports MUST validate Origin
    // (DNS-rebinding protection), whether or not CORS is configured.
    if (URL.canParse(env?.baseUrl ?? '')) {
      const own = new URL(env.baseUrl)
      allowed.add(normaliseOrigin(own.origin))
      // A base URL derived from a loopback listener: its other loopback spellings are the same origin to a user.
      if (own.hostname === 'localhost')
        for (const h of ['127.0.0.1', '[::1]']) allowed.add(normaliseOrigin(`${own.protocol}//${h}${own.port === '' ? '' : ':' + own.port}`))
    }
    const credentials = options.allowCredentials === true && !allowAll
    const headersAll = (options.allowHeaders ?? []).includes('*')
    const allowHeaders = union(ALWAYS_ALLOWED_HEADERS, options.allowHeaders ?? []).join(', ')
    const exposeHeaders = union(options.exposeHeaders ?? [], ALWAYS_EXPOSED_HEADERS).join(', ')
    const allowMethods = (options.allowMethods ?? ['GET', 'POST', 'DELETE', 'OPTIONS']).join(', ')
    const maxAge = String(options.maxAgeSeconds ?? 600)

    /** The Access-Control-Allow-Origin value: never a reflected arbitrary origin with credentials. */
    const allowOriginFor = (origin: string): string => (allowAll ? '*' : origin)

    function preflight(ctx: RequestContext): Reply {
      const headers: OutgoingHttpHeaders = {
        'access-control-allow-methods': allowMethods,
        'access-control-max-age': maxAge,
      }
      const requested = ctx.req.headers['access-control-request-headers']
      // `*` in Access-Control-Allow-Headers never covers Authorization (Fetch standard), so reflect what was asked.
      if (headersAll && typeof requested === 'string') {
        const asked = requested
          .split(',')
          .map(s => s.trim())
          .filter(s => TOKEN.test(s))
        headers['access-control-allow-headers'] = union(ALWAYS_ALLOWED_HEADERS, asked).join(', ')
      } else {
        headers['access-control-allow-headers'] = allowHeaders
      }
      appendVary(headers, 'Access-Control-Request-Headers')
      appendVary(headers, 'Access-Control-Request-Method')
      if (!allowAll) appendVary(headers, 'Origin')
      return { status: 204, headers }
    }

    const plugin: Plugin = {
      name: 'cors',
      onRequest(ctx) {
        const origin = ctx.req.headers.origin
        if (typeof origin !== 'string') return undefined
        const ok = allowAll || allowed.has(normaliseOrigin(origin))
        const decision: Decision = { origin, allowed: ok }
        ctx.state.set('cors', decision)
        const isPreflight = ctx.method === 'OPTIONS' && ctx.req.headers['access-control-request-method'] !== undefined
        if (!ok) {
          if (ctx.path === '/mcp' || isPreflight) {
            ctx.denial = { reason: 'origin not allowed' }
            throw new ProxyError('MCPP_ERR_FORBIDDEN', 403, 'origin not allowed')
          }
          return undefined
        }
        return isPreflight ? preflight(ctx) : undefined
      },
      onResponse(rctx: ResponseContext) {
        const d = rctx.request.state.get('cors') as Decision | undefined
        if (d === undefined || !d.allowed) return
        const h = rctx.headers
        // Routes that are public by design (protected resource metadata) already say `*`: keep it.
        if (h['access-control-allow-origin'] !== '*') {
          h['access-control-allow-origin'] = allowOriginFor(d.origin)
          if (!allowAll) appendVary(h, 'Origin')
          if (credentials) h['access-control-allow-credentials'] = 'true'
        }
        if (rctx.request.method !== 'OPTIONS') h['access-control-expose-headers'] = exposeHeaders
      },
      describe() {
        return { allowOrigins: origins, allowCredentials: credentials, allowHeaders, exposeHeaders, allowMethods }
      },
    }
    return plugin
  },
})
