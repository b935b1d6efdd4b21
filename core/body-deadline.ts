/**
 * The body deadline (`limits.bodyTimeoutMs`): the time a request's body may
 * take to arrive once its head has, 408 beyond. One sweep timer serves every
 * request whose body is still arriving, in arrival order (a timer per request
 * costs more on the hot path); a request leaves the sweep when its body is
 * complete or its response closes.
 */
import type { RequestContext } from './context.ts'
import { ProxyError } from './errors.ts'
import { writeError } from './error-writer.ts'

/** A request the deadline watches: the server's context, with the two fields the sweep reads and writes. */
export interface ArrivingBody extends RequestContext {
  /** Whether the deadline tracks this request's body. */
  receiving: boolean
  /** Fails the body read under way (`readBody`), if one is. */
  rejectBody: ((err: unknown) => void) | undefined
}

export class BodyDeadline {
  readonly #timeoutMs: number
  readonly #timeoutNs: bigint
  readonly #receiving = new Set<ArrivingBody>()
  readonly #sweep: NodeJS.Timeout

  /** `timeoutMs` > 0 (0 means no deadline: no BodyDeadline then). */
  constructor(timeoutMs: number) {
    this.#timeoutMs = timeoutMs
    this.#timeoutNs = BigInt(timeoutMs) * 1_000_000n
    this.#sweep = setInterval(() => this.#sweepBodies(), Math.min(1000, Math.max(25, Math.floor(timeoutMs / 4))))
    this.#sweep.unref()
  }

  track(ctx: ArrivingBody): void {
    this.#receiving.add(ctx)
    ctx.receiving = true
  }

  untrack(ctx: ArrivingBody): void {
    this.#receiving.delete(ctx)
    ctx.receiving = false
  }

  close(): void {
    clearInterval(this.#sweep)
  }

  /** Ends the requests whose body did not arrive within the deadline of their head. */
  #sweepBodies(): void {
    if (this.#receiving.size === 0) return
    const now = process.hrtime.bigint()
    for (const ctx of this.#receiving) {
      if (ctx.req.complete) {
        this.untrack(ctx)
        continue
      }
      // In arrival order: the first one still in time ends the sweep.
      if (now - ctx.startedAt < this.#timeoutNs) break
      this.untrack(ctx)
      this.#timedOut(ctx)
    }
  }

  #timedOut(ctx: ArrivingBody): void {
    const err = new ProxyError('MCPP_ERR_REQUEST_TIMEOUT', 408, `request body not received within ${this.#timeoutMs} ms`, { headers: { connection: 'close' } })
    if (ctx.rejectBody !== undefined) {
      // The handler reading it answers through its own error path (connection closed: the body is incomplete).
      ctx.req.removeAllListeners('data')
      ctx.rejectBody(err)
      return
    }
    if (ctx.headersSent) {
      ctx.req.socket.destroy()
      return
    }
    // Nobody reads this body through readBody (it is piped, or not read yet): answer here, then
    // end the request so whatever consumes it sees it aborted.
    ctx.res.once('close', () => {
      if (!ctx.req.complete) ctx.req.destroy()
    })
    writeError(ctx, err).catch(() => {
      ctx.res.destroy()
    })
  }
}
