/**
 * One server-sent-events response: `message` events carrying JSON-RPC
 * messages, comment keep-alives, and a close callback. Each event is one
 * string and one write. What node:http holds unsent for a client that does
 * not read is bounded in bytes (`mcp.limits.maxStreamBufferBytes`): once the
 * client is behind (`write` returned false, no 'drain' yet) and the next
 * event would go past the bound, the stream is destroyed — its buffer freed
 * at once — logged and counted. Also the per-session backlog of messages
 * that found no open stream, bounded in bytes as well. Both eras use these.
 */
import type { ServerResponse } from 'node:http'
import type { Logger } from 'pino'
import type { Counter } from '../observability/metrics.ts'

export const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' } as const

/** Defaults of `mcp.limits.maxStreamBufferBytes` and `maxBacklogBytes` (schemas/config.schema.json). */
export const DEFAULT_STREAM_BUFFER_BYTES = 8 * 1024 * 1024
export const DEFAULT_BACKLOG_BYTES = 1024 * 1024
/** Default of `mcp.limits.maxResumableStreams`. */
export const DEFAULT_RESUMABLE_STREAMS = 8
/** Messages a backlog keeps at most, whatever their size. */
const BACKLOG_MAX_MESSAGES = 256

/** The limits every stream of an endpoint shares, and where slowness is reported. */
export interface StreamLimits {
  readonly maxBufferedBytes: number
  readonly maxBacklogBytes: number
  /** POST streams per session kept for a reconnection after their answers were written to nobody. */
  readonly maxResumableStreams: number
  /** `mcp.streams.pollAfterMs`: a POST stream still running after this long is closed for the client to resume; 0: never. */
  readonly pollAfterMs: number
  readonly log: Logger
  /** `mcp_proxy_sse_slow_streams_closed_total` */
  readonly slowClosed: Counter
  /** `mcp_proxy_sse_backlog_dropped_total` */
  readonly backlogDropped: Counter
  /** The open streams, for `mcp_proxy_sse_buffered_bytes` (summed when /metrics is scraped, nothing per write). */
  readonly open: Set<SseStream>
}

export function frame(msg: unknown): string {
  return 'event: message\ndata: ' + JSON.stringify(msg) + '\n\n'
}

/** An event with its id (MCP 2025-11-25 transports, "Resumability and Redelivery"). */
export function frameWithId(id: string, event: string): string {
  return 'id: ' + id + '\n' + event
}

/** Reconnection delay a client is told in the priming event (SSE `retry:`). */
const RETRY_MS = 1000

/**
 * The priming event a resumable stream starts with: an id and empty data, so that a
 * client cut before the first message can still reconnect with `Last-Event-ID`, and
 * how soon to do so (MCP 2025-11-25 transports, "Sending Messages to the Server").
 */
export function primingFrame(id: string): string {
  return 'id: ' + id + '\nretry: ' + String(RETRY_MS) + '\ndata:\n\n'
}

/**
 * The events one stream wrote, kept for a client that reconnects with
 * `Last-Event-ID`: the newest within `maxBytes` (mcp.limits.maxBacklogBytes),
 * the oldest dropped first. Entries are the framed events, shared with the writes.
 */
export class Replay {
  readonly #maxBytes: number
  #events: Array<{ seq: number; event: string; size: number }> = []
  #bytes = 0

  constructor(maxBytes: number) {
    this.#maxBytes = maxBytes
  }

  get bytes(): number {
    return this.#bytes
  }

  push(seq: number, event: string): void {
    const size = Buffer.byteLength(event)
    if (size > this.#maxBytes) return
    while (this.#events.length > 0 && this.#bytes + size > this.#maxBytes) this.#bytes -= this.#events.shift()!.size
    this.#events.push({ seq, event, size })
    this.#bytes += size
  }

  /** The kept events after `seq`, oldest first. */
  after(seq: number): string[] {
    return this.#events.filter(e => e.seq > seq).map(e => e.event)
  }
}

export class SseStream {
  readonly res: ServerResponse
  readonly #limits: StreamLimits
  #closed = false
  #closeHandlers: Array<() => void> = []
  /** `write` returned false and 'drain' has not come yet: the client is behind. */
  #behind = false
  /** An event larger than the bound, accepted while the client kept up, widens the bound until 'drain'. */
  #slack = 0
  readonly #caughtUp = (): void => {
    this.#behind = false
    this.#slack = 0
  }

  constructor(res: ServerResponse, limits: StreamLimits) {
    this.res = res
    this.#limits = limits
    limits.open.add(this)
    res.once('close', () => {
      limits.open.delete(this)
      this.#closed = true
      res.off('drain', this.#caughtUp)
      const hs = this.#closeHandlers
      this.#closeHandlers = []
      for (const h of hs) h()
    })
  }

  /** False once the response ended or the client went away. */
  get open(): boolean {
    return !this.#closed && !this.res.writableEnded && !this.res.destroyed
  }

  onClose(fn: () => void): void {
    if (this.#closed) fn()
    else this.#closeHandlers.push(fn)
  }

  /** Writes one `message` event; false when the stream is gone (or was just closed as too slow). */
  send(msg: unknown): boolean {
    if (!this.open) return false
    return this.sendFrame(frame(msg))
  }

  /** Writes one event already framed (a backlog entry). */
  sendFrame(event: string): boolean {
    if (!this.open || !this.#fits(event)) return false
    if (!this.#behind && event.length > this.#limits.maxBufferedBytes) this.#slack = Buffer.byteLength(event)
    if (!this.res.write(event) && !this.#behind) {
      this.#behind = true
      this.res.once('drain', this.#caughtUp)
    }
    return true
  }

  /** Ends the stream with a last event already framed. */
  endFrame(event: string): void {
    if (this.open && this.#fits(event)) this.res.end(event)
  }

  /** Ends the stream, optionally with a last event (headers and event go out in one write). */
  end(last?: unknown): void {
    if (!this.open) return
    if (last === undefined) {
      this.res.end()
      return
    }
    const event = frame(last)
    if (this.#fits(event)) this.res.end(event)
  }

  keepAlive(): void {
    // A client that is behind gains nothing from a comment.
    if (this.open && !this.#behind) this.res.write(': keep-alive\n\n')
  }

  /**
   * Whether `event` may be buffered: always while the client keeps up (node
   * holds less than its high-water mark then), else only within the bound
   * (plus the size of an oversized event it took while keeping up).
   * A stream past it is destroyed: its unsent bytes are freed now, not when
   * a stuck client would read them.
   */
  #fits(event: string): boolean {
    if (!this.#behind) return true
    const buffered = this.res.writableLength
    if (buffered + Buffer.byteLength(event) <= this.#limits.maxBufferedBytes + this.#slack) return true
    this.#limits.slowClosed.inc()
    this.#limits.log.warn(
      { bufferedBytes: buffered, limit: this.#limits.maxBufferedBytes },
      'closed a slow SSE stream (client not reading; mcp.limits.maxStreamBufferBytes)'
    )
    this.res.destroy()
    return false
  }
}

/**
 * Messages for a session that has no open stream, until a GET stream comes:
 * the newest kept within `maxBacklogBytes` (and 256 messages), the oldest
 * dropped first and counted. Entries are stored framed, so each message is
 * serialized once.
 */
export class Backlog {
  readonly #limits: StreamLimits
  readonly #log: Logger
  #events: string[] = []
  #bytes = 0
  /** Dropped since the backlog was last handed over: logged once per episode. */
  #dropping = false

  constructor(limits: StreamLimits, log: Logger) {
    this.#limits = limits
    this.#log = log
  }

  get bytes(): number {
    return this.#bytes
  }

  push(msg: unknown): void {
    const event = frame(msg)
    const size = Buffer.byteLength(event)
    let dropped = 0
    if (size > this.#limits.maxBacklogBytes) dropped = 1
    else {
      while (this.#events.length > 0 && (this.#bytes + size > this.#limits.maxBacklogBytes || this.#events.length >= BACKLOG_MAX_MESSAGES)) {
        this.#bytes -= Buffer.byteLength(this.#events.shift()!)
        dropped++
      }
      this.#events.push(event)
      this.#bytes += size
    }
    if (dropped === 0) return
    this.#limits.backlogDropped.inc(undefined, dropped)
    if (!this.#dropping) {
      this.#dropping = true
      this.#log.warn({ limit: this.#limits.maxBacklogBytes }, 'session backlog full: dropping the oldest messages (no open stream; mcp.limits.maxBacklogBytes)')
    }
  }

  /** Hands every kept event to `write`, oldest first, and empties the backlog. */
  drain(write: (event: string) => boolean): void {
    const events = this.#events
    this.#events = []
    this.#bytes = 0
    this.#dropping = false
    for (const e of events) if (!write(e)) break
  }

  /** Hands every kept message to `stream`, oldest first, and empties the backlog. */
  flushTo(stream: SseStream): void {
    const events = this.#events
    this.#events = []
    this.#bytes = 0
    this.#dropping = false
    for (const e of events) if (!stream.sendFrame(e)) break
  }
}

/** The limits of one endpoint, with their metrics registered. */
export function streamLimits(opts: {
  maxStreamBufferBytes?: number
  maxBacklogBytes?: number
  maxResumableStreams?: number
  pollAfterMs?: number
  log: Logger
  metrics: import('../observability/metrics.ts').Metrics
}): StreamLimits {
  const slowClosed = opts.metrics.counter(
    'mcp_proxy_sse_slow_streams_closed_total',
    'SSE streams closed because the client did not read and the buffer reached mcp.limits.maxStreamBufferBytes'
  )
  const backlogDropped = opts.metrics.counter(
    'mcp_proxy_sse_backlog_dropped_total',
    'Messages dropped from a session backlog (no open stream) past mcp.limits.maxBacklogBytes'
  )
  slowClosed.init()
  backlogDropped.init()
  const open = new Set<SseStream>()
  // What the gateway itself holds unsent for SSE clients right now: the quantity maxStreamBufferBytes bounds per stream.
  opts.metrics.gauge('mcp_proxy_sse_buffered_bytes', 'Bytes written to open SSE streams and not yet sent to their clients').collect = () => {
    let bytes = 0
    for (const s of open) bytes += s.res.writableLength
    return [[undefined, bytes]]
  }
  return {
    maxBufferedBytes: opts.maxStreamBufferBytes ?? DEFAULT_STREAM_BUFFER_BYTES,
    maxBacklogBytes: opts.maxBacklogBytes ?? DEFAULT_BACKLOG_BYTES,
    maxResumableStreams: opts.maxResumableStreams ?? DEFAULT_RESUMABLE_STREAMS,
    pollAfterMs: opts.pollAfterMs ?? 0,
    log: opts.log,
    slowClosed,
    backlogDropped,
    open,
  }
}
