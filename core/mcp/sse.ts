/**
 * One server-sent-events response: `message` events carrying JSON-RPC
 * messages, comment keep-alives, and a close callback. Each event is one
 * string and one write; nothing is buffered here beyond what node:http does.
 */
import type { ServerResponse } from 'node:http'

export const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' } as const

function frame (msg: unknown): string {
  return 'event: message\ndata: ' + JSON.stringify(msg) + '\n\n'
}

export class SseStream {
  readonly res: ServerResponse
  #closed = false
  #closeHandlers: Array<() => void> = []

  constructor (res: ServerResponse) {
    this.res = res
    res.once('close', () => {
      this.#closed = true
      const hs = this.#closeHandlers
      this.#closeHandlers = []
      for (const h of hs) h()
    })
  }

  /** False once the response ended or the client went away. */
  get open (): boolean {
    return !this.#closed && !this.res.writableEnded && !this.res.destroyed
  }

  onClose (fn: () => void): void {
    if (this.#closed) fn()
    else this.#closeHandlers.push(fn)
  }

  /** Writes one `message` event; false when the stream is gone. */
  send (msg: unknown): boolean {
    if (!this.open) return false
    this.res.write(frame(msg))
    return true
  }

  /** Ends the stream, optionally with a last event (headers and event go out in one write). */
  end (last?: unknown): void {
    if (!this.open) return
    if (last === undefined) this.res.end()
    else this.res.end(frame(last))
  }

  keepAlive (): void {
    if (this.open) this.res.write(': keep-alive\n\n')
  }
}
