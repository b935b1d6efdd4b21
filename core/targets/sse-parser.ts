/**
 * Incremental text/event-stream parsing for the HTTP transport: the
 * framing alone (WHATWG HTML §9.2), with a bound on one event, so the
 * transport can read a stream message by message without buffering it.
 */

/** One dispatched event. */
export interface SseEvent {
  event: string
  data: string
  id?: string
}

/**
 * Incremental text/event-stream parser (WHATWG HTML §9.2). Feed decoded text
 * in any chunking; `onEvent` runs once per dispatched event. An event larger
 * than `maxEventBytes` throws.
 */
export class SseParser {
  readonly #onEvent: (e: SseEvent) => void
  readonly #max: number
  #buf = ''
  #data: string[] = []
  #dataLen = 0
  #event = ''
  /** Last event id seen (for Last-Event-ID on reconnect). */
  lastEventId: string | undefined
  /** Reconnection delay the server asked for, in ms. */
  retry: number | undefined

  constructor(onEvent: (e: SseEvent) => void, maxEventBytes = 16 * 1024 * 1024) {
    this.#onEvent = onEvent
    this.#max = maxEventBytes
  }

  feed(text: string): void {
    this.#buf += text
    let start = 0
    for (;;) {
      const cr = this.#buf.indexOf('\r', start)
      const lf = this.#buf.indexOf('\n', start)
      if (cr === -1 && lf === -1) break
      let end: number
      let next: number
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        // A lone CR at the very end may be the first half of CRLF: wait.
        if (cr === this.#buf.length - 1) break
        end = cr
        next = this.#buf[cr + 1] === '\n' ? cr + 2 : cr + 1
      } else {
        end = lf
        next = lf + 1
      }
      this.#line(this.#buf.slice(start, end))
      start = next
    }
    this.#buf = this.#buf.slice(start)
    if (this.#buf.length + this.#dataLen > this.#max) throw new Error(`SSE event larger than ${this.#max} bytes`)
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length > 0) {
        const ev: SseEvent = { event: this.#event || 'message', data: this.#data.join('\n') }
        if (this.lastEventId !== undefined) ev.id = this.lastEventId
        this.#data = []
        this.#dataLen = 0
        this.#event = ''
        this.#onEvent(ev)
      } else {
        this.#event = ''
      }
      return
    }
    if (line.startsWith(':')) return
    const colon = line.indexOf(':')
    const field = colon === -1 ? line : line.slice(0, colon)
    let value = colon === -1 ? '' : line.slice(colon + 1)
    if (value.startsWith(' ')) value = value.slice(1)
    switch (field) {
      case 'data':
        this.#data.push(value)
        this.#dataLen += value.length + 1
        if (this.#dataLen > this.#max) throw new Error(`SSE event larger than ${this.#max} bytes`)
        break
      case 'event':
        this.#event = value
        break
      case 'id':
        if (!value.includes('\0')) this.lastEventId = value
        break
      case 'retry':
        if (/^\d+$/.test(value)) this.retry = Number(value)
        break
      default:
        break
    }
  }
}
