/**
 * What every finished request leaves behind: one access log line, the
 * request counter and duration histogram (by route, status and a bounded MCP
 * method label), and a record for the admin UI's recent requests. Kept out
 * of the listener so the HTTP edge only says when a request ended.
 */
import type { Logger } from 'pino'
import { denialText, type Denial, type RequestContext } from '../context.ts'
import type { Metrics, Counter, Histogram, CounterHandle, HistogramHandle } from './metrics.ts'
import { methodLabel } from './metric-labels.ts'

export interface AccessRecord {
  id: string
  method: string
  path: string
  status: number
  durationMs: number
  mcpMethod?: string
  sessionId?: string
  subject?: string
  denial?: Denial
  at: number
  /** The tool a `tools/call` named (clipped, as in the access log). */
  tool?: string
}

/** Client-chosen strings (tool names, URIs, user agents) are cut to this many characters in the access log. */
const MAX_LOGGED_CHARS = 256

function clip(s: string): string {
  return s.length > MAX_LOGGED_CHARS ? s.slice(0, MAX_LOGGED_CHARS) + '…' : s
}

/**
 * How a request ended, for the access log and the admin UI: `allowed`,
 * `unauthenticated` (401), `forbidden` (403), `denied` (a per-operation
 * refusal answered inside a 2xx), or `error`.
 */
export function outcomeOf(status: number, denial: Denial | undefined): 'allowed' | 'unauthenticated' | 'forbidden' | 'denied' | 'error' {
  if (status === 401) return 'unauthenticated'
  if (status === 403) return 'forbidden'
  if (denial !== undefined && status < 400) return 'denied'
  if (status >= 400 || status === 0) return 'error'
  return 'allowed'
}

/** Bound metric handles kept per route for (status, MCP method) pairs. */
const MAX_METHOD_HANDLES = 256

interface RouteMeters {
  readonly duration: HistogramHandle
  /** Request counters by status, then MCP method. */
  readonly requests: Map<number, Map<string, CounterHandle>>
  /** How many counters `requests` holds (at most MAX_METHOD_HANDLES). */
  handles: number
}

export class AccessLog {
  readonly #log: Logger
  readonly #onAccess: ((rec: AccessRecord) => void) | undefined
  readonly #requests: Counter
  readonly #duration: Histogram
  /** Metric handles per route, then per status and MCP method, bound on first use. */
  readonly #routeMeters = new Map<string, RouteMeters>()

  constructor(log: Logger, metrics: Metrics, onAccess: ((rec: AccessRecord) => void) | undefined) {
    this.#log = log
    this.#onAccess = onAccess
    this.#requests = metrics.counter('mcp_proxy_requests_total', 'Requests by route, status and MCP method')
    this.#duration = metrics.histogram('mcp_proxy_request_duration_seconds', 'Time to response end by route')
  }

  /**
   * One finished request. `route`: the route label (`/mcp`, a plugin route's
   * path, or `other`); `status` 0 when no head was sent; `hasLog`: whether
   * the request's own child logger exists (the line then goes through it).
   * Positional, so a request costs no argument object.
   */
  record(ctx: RequestContext, route: string, status: number, durationMs: number, hasLog: boolean): void {
    this.#count(ctx, route, status, durationMs)
    const sessionId = ctx.sessionId?.slice(0, 8)
    if (this.#log.isLevelEnabled('info')) this.#line(ctx, status, durationMs, hasLog, sessionId)
    this.#onAccess?.({
      id: ctx.id,
      method: ctx.method,
      path: ctx.path,
      status,
      durationMs,
      mcpMethod: ctx.mcp?.method,
      sessionId,
      subject: ctx.auth?.subject,
      denial: ctx.denial,
      at: Date.now(),
      tool: ctx.mcp?.method === 'tools/call' && ctx.mcp.name !== undefined ? clip(ctx.mcp.name) : undefined,
    })
  }

  #count(ctx: RequestContext, route: string, status: number, durationMs: number): void {
    // A label value from a bounded set: the client names the method (metric-labels.ts).
    const named = ctx.mcp?.method
    const mcpMethod = named === undefined ? '' : methodLabel(named)
    let rm = this.#routeMeters.get(route)
    if (rm === undefined) {
      rm = { duration: this.#duration.labels({ route }), requests: new Map(), handles: 0 }
      this.#routeMeters.set(route, rm)
    }
    // By status, then method: no key string built per request.
    let byMethod = rm.requests.get(status)
    if (byMethod === undefined) {
      byMethod = new Map()
      rm.requests.set(status, byMethod)
    }
    let requests = byMethod.get(mcpMethod)
    if (requests === undefined) {
      requests = this.#requests.labels({ route, status, mcp_method: mcpMethod })
      // A client names the MCP method: keep a bounded number of handles.
      if (rm.handles < MAX_METHOD_HANDLES) {
        byMethod.set(mcpMethod, requests)
        rm.handles++
      }
    }
    requests.inc()
    rm.duration.observe(durationMs / 1000)
  }

  /** The access line. No child logger just for it: the request id goes in the object. */
  #line(ctx: RequestContext, status: number, durationMs: number, hasLog: boolean, sessionId: string | undefined): void {
    const info = ctx.mcp
    const named = info?.name === undefined ? undefined : clip(info.name)
    const ua = ctx.req.headers['user-agent']
    const line = {
      reqId: hasLog ? undefined : ctx.id,
      method: ctx.method,
      path: ctx.path,
      status,
      durationMs: Math.round(durationMs * 1000) / 1000,
      client: ctx.clientAddress,
      userAgent: ua === undefined ? undefined : clip(ua),
      mcpMethod: info?.method,
      tool: info?.method === 'tools/call' ? named : undefined,
      prompt: info?.method === 'prompts/get' ? named : undefined,
      uri: info?.method?.startsWith('resources/') === true ? named : undefined,
      target: ctx.target,
      sessionId,
      subject: ctx.auth?.subject,
      outcome: outcomeOf(status, ctx.denial),
      denial: ctx.denial === undefined ? undefined : clip(denialText(ctx.denial)),
    }
    const log = hasLog ? ctx.log : this.#log
    log.info(line, 'request')
  }
}
