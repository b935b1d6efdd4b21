/**
 * The client-facing SSE streams of one session-era session: one per POST carrying requests (open
 * until each is answered), the standalone GET stream, the event ids and replay buffers that let a
 * client resume a lost stream with `Last-Event-ID` (MCP 2025-11-25 transports, Resumability),
 * polling, and where a message with no request of its own goes. Knows nothing of upstreams.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { Backlog, Replay, SseStream, SSE_HEADERS, frame, frameWithId, primingFrame, type StreamLimits } from '../sse.ts'

/**
 * One POST carrying requests: its SSE stream stays open until each request is
 * answered. The client may lose the stream and reconnect with `Last-Event-ID`
 * (a GET): `stream` is then the new response, and what it missed comes from `replay`.
 */
export interface PostStream {
  readonly ctx: RequestContext
  stream: SseStream
  open: number
  /** Event ids are `<key>.<seq>`: unique in the session and naming their stream (MCP 2025-11-25 transports, Resumability). */
  readonly key: string
  seq: number
  readonly replay: Replay
}

export class SessionStreams {
  readonly #limits: StreamLimits
  readonly #log: Logger
  /** Called when the GET stream opens or closes (the session's activity clock). */
  readonly #touch: () => void
  readonly #posts = new Set<PostStream>()
  #getStream: SseStream | undefined
  readonly #backlog: Backlog
  /** Event ids of the GET stream are `g.<seq>`; what it wrote is kept for a reconnection. */
  #getSeq = 0
  readonly #getReplay: Replay
  #streamSeq = 0
  /** Answered POST streams nobody held, kept for a GET with `Last-Event-ID`. */
  readonly #undelivered = new Map<string, PostStream>()

  constructor(limits: StreamLimits, log: Logger, touch: () => void) {
    this.#limits = limits
    this.#log = log
    this.#touch = touch
    this.#backlog = new Backlog(limits, log)
    this.#getReplay = new Replay(limits.maxBacklogBytes)
  }

  get hasGetStream(): boolean {
    return this.#getStream?.open === true
  }

  /** Answers a POST with `requests` requests: 200 and an SSE stream, primed with its first event id. */
  async openPost(ctx: RequestContext, requests: number, sessionId: string): Promise<PostStream> {
    await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': sessionId })
    const stream = new SseStream(ctx.res, this.#limits)
    const post: PostStream = { ctx, stream, open: requests, key: `p${++this.#streamSeq}`, seq: 0, replay: new Replay(this.#limits.maxBacklogBytes) }
    this.#posts.add(post)
    stream.onClose(() => this.#postClosed(post, stream))
    stream.sendFrame(primingFrame(`${post.key}.0`))
    if (this.#limits.pollAfterMs > 0) this.#pollLater(post, stream)
    return post
  }

  /**
   * Attaches the standalone GET stream; false when one is already open. With the id of
   * an event of an earlier GET stream, the events written after it are sent first.
   */
  attachGetStream(stream: SseStream, lastEventId?: string): boolean {
    if (this.#getStream?.open === true) return false
    this.#getStream = stream
    this.#touch()
    stream.onClose(() => {
      if (this.#getStream === stream) this.#getStream = undefined
      this.#touch()
    })
    const m = lastEventId === undefined ? null : /^g\.(\d+)$/.exec(lastEventId)
    if (m !== null) for (const event of this.#getReplay.after(Number(m[1]))) if (!stream.sendFrame(event)) return true
    this.#backlog.drain(event => this.#getWrite(event))
    return true
  }

  /** Whether `lastEventId` names an event of a POST stream this session still knows. */
  canResume(lastEventId: string): boolean {
    return this.#resumable(lastEventId) !== undefined
  }

  /**
   * Continues a POST stream the client lost (GET with `Last-Event-ID`, MCP 2025-11-25
   * transports, Resumability): the events after that id, then, while its requests
   * are in flight, the rest as it comes; ends once they are answered.
   */
  resume(lastEventId: string, stream: SseStream): void {
    const found = this.#resumable(lastEventId)
    if (found === undefined) {
      stream.end()
      return
    }
    const [post, seq] = found
    this.#touch()
    for (const event of post.replay.after(seq)) if (!stream.sendFrame(event)) return
    if (post.open === 0) {
      stream.end()
      return
    }
    const old = post.stream
    post.stream = stream
    stream.onClose(() => this.#postClosed(post, stream))
    old.end()
  }

  /**
   * Polling (mcp.streams.pollAfterMs, off by default): the stream of a POST still
   * running after that long is closed, so that no stream outlives a balancer's idle
   * timeout; the client reconnects with Last-Event-ID after the `retry:` of the priming
   * event (MCP 2025-11-25 transports, SEP-1699: a server MAY close the connection after
   * an event with an id). Its requests go on, and their answers wait in the replay buffer.
   * Once: the stream that resumes it stays until the answers (a client resumes once, then
   * reads to the end, as the conformance suite's server-sse-polling does).
   */
  #pollLater(post: PostStream, stream: SseStream): void {
    const after = this.#limits.pollAfterMs
    const timer = setTimeout(() => {
      if (post.stream !== stream || post.open === 0 || !stream.open) return
      this.#log.debug(
        { stream: post.key, open: post.open },
        'POST stream polled: closed before its answers (mcp.streams.pollAfterMs); the client resumes with Last-Event-ID'
      )
      stream.end()
    }, after)
    timer.unref()
    stream.onClose(() => clearTimeout(timer))
  }

  #resumable(lastEventId: string): [PostStream, number] | undefined {
    const m = /^(p\d+)\.(\d+)$/.exec(lastEventId)
    if (m === null) return undefined
    for (const post of this.#posts) if (post.key === m[1]) return [post, Number(m[2])]
    const done = this.#undelivered.get(m[1]!)
    return done === undefined ? undefined : [done, Number(m[2])]
  }

  keepAlive(): void {
    this.#getStream?.keepAlive()
  }

  /** Ends every stream (the session's end). */
  endAll(): void {
    this.#getStream?.end()
    for (const post of this.#posts) post.stream.end()
    this.#posts.clear()
    this.#undelivered.clear()
  }

  /** The answer to one of `post`'s requests; the last one ends its stream (kept for a resumption when nobody held it). */
  answer(post: PostStream, msg: JsonRpcMessage): void {
    if (--post.open > 0) {
      this.emit(post, msg)
      return
    }
    const delivered = post.stream.open
    this.emit(post, msg, true)
    this.#posts.delete(post)
    if (delivered) return
    // Nobody holds the stream: its answers wait for a GET with Last-Event-ID.
    this.#undelivered.set(post.key, post)
    if (this.#undelivered.size > this.#limits.maxResumableStreams) this.#undelivered.delete(this.#undelivered.keys().next().value!)
  }

  /** One of `post`'s requests ended unanswered (cancelled by the client): the last one ends its stream. */
  drop(post: PostStream): void {
    if (--post.open > 0) return
    this.#posts.delete(post)
    post.stream.end()
  }

  /** Writes one message on a POST's stream, with its id, and keeps it for a reconnection. */
  emit(post: PostStream, msg: JsonRpcMessage, last = false): void {
    const seq = ++post.seq
    const event = frameWithId(`${post.key}.${seq}`, frame(msg))
    post.replay.push(seq, event)
    if (last) post.stream.endFrame(event)
    else post.stream.sendFrame(event)
  }

  /** Writes one event on the GET stream with the next id; false when there is none. */
  #getWrite(event: string): boolean {
    if (this.#getStream?.open !== true) return false
    const seq = ++this.#getSeq
    const withId = frameWithId(`g.${seq}`, event)
    this.#getReplay.push(seq, withId)
    return this.#getStream.sendFrame(withId)
  }

  /**
   * The client went away from a POST stream. Its requests go on: a disconnect is not a
   * cancellation (MCP 2025-11-25 transports, "Sending Messages to the Server"); only
   * notifications/cancelled, the request timeout or the session's end stop them.
   */
  #postClosed(post: PostStream, stream: SseStream): void {
    if (post.stream !== stream) return
    if (post.open === 0) {
      this.#posts.delete(post)
      return
    }
    this.#log.debug({ stream: post.key, open: post.open }, 'POST stream closed before its answers; requests go on (resumable with Last-Event-ID)')
  }

  /** Preferred stream, else the GET stream, else the newest open POST stream, else the backlog. */
  deliver(msg: JsonRpcMessage, preferred: PostStream | undefined): void {
    if (preferred?.stream.open === true) {
      this.emit(preferred, msg)
      return
    }
    if (this.#getStream?.open === true && this.#getWrite(frame(msg))) return
    let last: PostStream | undefined
    for (const post of this.#posts) if (post.stream.open) last = post
    if (last !== undefined) {
      this.emit(last, msg)
      return
    }
    this.#backlog.push(msg)
  }
}
