/**
 * One 2026-07-28 client request and where its answer goes: JSON, or an SSE stream once a
 * notification (progress, log) must go first; writes stay in order. Closing the response cancels
 * the upstream calls made for it. Also the request's progress and log hooks on an upstream call.
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcId, JsonRpcMessage } from '../../targets/types.ts'
import { SseStream, SSE_HEADERS, type StreamLimits } from '../sse.ts'
import type { CallHooks, PoolCall } from '../upstreams/pool.ts'
import { callerOf, type Caller } from '../credentials.ts'

/** Log levels in order of severity (MCP logging); a request's `_meta` level keeps what is at least as severe. */
export const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']

/** One client request: where its answer goes (JSON, or SSE once a notification must go first). */
export class ModernRequest {
  readonly ctx: RequestContext
  readonly id: JsonRpcId
  readonly subjectKey: string
  readonly calls = new Set<PoolCall>()
  readonly logLevel: string | undefined
  readonly clientCapabilities: Record<string, unknown>
  /** The client's `_meta` as sent: what a native upstream gets with each request. */
  meta: Record<string, unknown> = {}
  stream: SseStream | undefined
  readonly streams: StreamLimits
  finished = false
  aborted = false
  #queue: Promise<void> = Promise.resolve()
  #caller: Caller | undefined

  constructor(
    ctx: RequestContext,
    id: JsonRpcId,
    subjectKey: string,
    logLevel: string | undefined,
    clientCapabilities: Record<string, unknown>,
    streams: StreamLimits
  ) {
    this.ctx = ctx
    this.streams = streams
    this.id = id
    this.subjectKey = subjectKey
    this.logLevel = logLevel
    this.clientCapabilities = clientCapabilities
    ctx.res.once('close', () => {
      if (this.finished) return
      // Closing the response is the cancellation signal (MCP 2026-07-28 "Cancellation").
      this.aborted = true
      for (const c of this.calls) c.cancel('client disconnected')
    })
  }

  get subject(): string | undefined {
    return this.ctx.auth?.subject
  }

  /** The caller as the credential layer sees it (../credentials.ts), made once, when a target with `auth` is reached. */
  get caller(): Caller {
    this.#caller ??= callerOf(this.ctx)
    return this.#caller
  }

  /** Writes in order: the first notification turns the answer into an SSE stream. */
  #enqueue(fn: () => Promise<void> | void): Promise<void> {
    this.#queue = this.#queue.then(fn).catch(err => {
      this.ctx.log.debug({ err }, 'write failed')
    })
    return this.#queue
  }

  notify(msg: JsonRpcMessage): void {
    if (this.finished || this.aborted) return
    void this.#enqueue(async () => {
      if (this.finished) return
      if (this.stream === undefined) {
        await this.ctx.writeHead(200, { ...SSE_HEADERS })
        this.stream = new SseStream(this.ctx.res, this.streams)
      }
      this.stream.send(msg)
    })
  }

  answer(msg: JsonRpcMessage, status = 200): Promise<void> {
    msg.id = this.id
    return this.#enqueue(async () => {
      if (this.finished) return
      this.finished = true
      if (this.stream !== undefined) {
        this.stream.end(msg)
        return
      }
      if (this.ctx.res.destroyed) return
      const body = JSON.stringify(msg)
      await this.ctx.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      this.ctx.res.end(body)
    })
  }

  fail(code: number, message: string, status = 200, data?: unknown): Promise<void> {
    return this.answer({ jsonrpc: '2.0', error: data === undefined ? { code, message } : { code, message, data } }, status)
  }
}

/** Progress and log hooks of `ex` (a retried request takes over the upstream call's hooks). */
export function hookTo(ex: ModernRequest, hooks: CallHooks): CallHooks {
  const min = ex.logLevel === undefined ? -1 : LOG_LEVELS.indexOf(ex.logLevel)
  hooks.onProgress = m => ex.notify(m)
  hooks.onLog =
    min < 0
      ? undefined
      : m => {
          if (LOG_LEVELS.indexOf(String(m.params?.level)) >= min) ex.notify(m)
        }
  return hooks
}
