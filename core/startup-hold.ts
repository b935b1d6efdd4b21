/**
 * The start-up hold. The gateway binds its listener before its plugins exist
 * (so `{base_url}` knows the actual port when the config says 0); requests
 * that arrive in between wait here, within bounds (`mcp.limits.startup*`),
 * and are then answered by the real pipeline, so no request meets a
 * half-started gateway (docs/configuration.md, "Running"). Past the bounds,
 * or at a shutdown before start-up ended, they get 503.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Logger } from 'pino'

/** Requests that arrive before `attach` are held within these bounds (`mcp.limits.startup*`). */
export interface StartupHold {
  /** Requests held at once; more get 503 at once. */
  maxRequests: number
  /** How long one request is held before it gets 503. */
  timeoutMs: number
}

type Answer = (req: IncomingMessage, res: ServerResponse) => void

interface HeldRequest {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  readonly timer: NodeJS.Timeout
}

export class HeldRequests {
  readonly #held = new Set<HeldRequest>()
  readonly #limits: StartupHold
  readonly #log: Logger
  /** The 503 "starting" (the server writes it: its body has the shape of the path). */
  readonly #refuse: Answer

  constructor(limits: StartupHold, log: Logger, refuse: Answer) {
    this.#limits = limits
    this.#log = log
    this.#refuse = refuse
  }

  /** Holds a request that arrived during start-up, up to the limits; otherwise 503 + Retry-After. */
  hold(req: IncomingMessage, res: ServerResponse): void {
    const held = this.#held
    const limits = this.#limits
    if (held.size >= limits.maxRequests) {
      this.#log.warn({ held: held.size }, 'start-up: too many requests held; answering 503')
      this.#refuse(req, res)
      return
    }
    const h: HeldRequest = {
      req,
      res,
      timer: setTimeout(() => {
        if (!held.delete(h)) return
        this.#log.warn({ path: (req.url ?? '').split('?')[0], holdMs: limits.timeoutMs }, 'start-up: request held too long; answering 503')
        this.#refuse(req, res)
      }, limits.timeoutMs),
    }
    h.timer.unref()
    held.add(h)
    res.once('close', () => {
      if (held.delete(h)) clearTimeout(h.timer)
    })
  }

  /** Start-up is over: every request still held is served, in arrival order. */
  release(serve: Answer): void {
    for (const h of this.#held) {
      clearTimeout(h.timer)
      if (!h.res.destroyed) serve(h.req, h.res)
    }
  }

  /** Shutdown before start-up ended: every request still held gets 503. */
  refuseAll(): void {
    for (const h of this.#held) {
      clearTimeout(h.timer)
      if (!h.res.destroyed) this.#refuse(h.req, h.res)
    }
  }
}
