/**
 * HTTP upstream: a streamable-HTTP MCP client (MCP 2025-03-26+ transport) for
 * a remote server. One HttpUpstream holds at most one upstream session (the
 * legacy era's, opened by the initialize exchange); 2026-07-28 requests go
 * through `sendModern` as stateless POSTs beside it.
 *
 * Each message is POSTed over one keep-alive agent per process; JSON answers
 * and SSE streams are delivered message by message through `onMessage` (or a
 * 2026-07-28 request's `related`) as they arrive, never buffering a whole
 * stream, and a stream cut before its answer is resumed with Last-Event-ID.
 * The upstream's `Mcp-Session-Id` and negotiated protocol version are
 * captured from the initialize exchange and sent on every later request,
 * and a GET stream carries the server's own messages. Only the target's
 * static headers, the caller's attachment (UpstreamAttachment.headers: a
 * credential minted for this target, opaque here) and a trace context are
 * sent: the client's Authorization header never reaches this module (MCP
 * forbids token passthrough).
 *
 * start() does no network I/O: the initialize POST is the reachability check,
 * and its failure reaches the client as a JSON-RPC error for that request.
 */
import type { Logger } from 'pino'
import { ProxyError, RPC } from '../errors.ts'
import type { Metrics, Counter } from '../observability/metrics.ts'
import type { JsonRpcId, JsonRpcMessage, Upstream, UpstreamAttachment, UpstreamObserver } from './types.ts'
import { tracer } from '../observability/tracing.ts'
import { post, type Answer } from './http-post.ts'
import { SseParser } from './sse-parser.ts'

export interface HttpUpstreamOptions {
  target: string
  /** The remote MCP endpoint. */
  url: string
  /** Static headers of the target (a gateway-owned credential, say). */
  headers?: Readonly<Record<string, string>>
  /** The caller's headers, asked for before each exchange (UpstreamAttachment.headers); absent: none, no await. */
  attach?: UpstreamAttachment['headers']
  log: Logger
  metrics?: Metrics
  /** Told of start and end (lifecycle.ts); never of messages. */
  observer?: UpstreamObserver
  /** Largest SSE event / JSON body accepted from the upstream. Default 16 MiB. */
  maxMessageBytes?: number
  /** How often the server-to-client GET stream is reopened after it drops. Default 5. */
  maxReconnects?: number
}

/** Request headers the gateway never lets a target's static headers override. */
const RESERVED = new Set([
  'mcp-session-id',
  'mcp-protocol-version',
  'content-type',
  'accept',
  'content-length',
  'host',
  'connection',
  'transfer-encoding',
  'last-event-id',
])

function isRequest(m: JsonRpcMessage): m is JsonRpcMessage & { id: JsonRpcId; method: string } {
  return typeof m.method === 'string' && (typeof m.id === 'string' || typeof m.id === 'number')
}

type Attached = Readonly<Record<string, string>>

/** An attachment that refused its headers: the exchange it was asked for fails with its `reason`. */
class AttachmentRefused extends Error {
  readonly reason: unknown
  constructor(reason: unknown) {
    super('attachment refused')
    this.reason = reason
  }
}

function refused(reason: unknown): never {
  throw new AttachmentRefused(reason)
}

function isThenable<T>(v: T | Promise<T>): v is Promise<T> {
  return typeof (v as { then?: unknown }).then === 'function'
}

/** `h` with the attached headers (lower-cased) after the static ones; never a reserved or an `mcp-*` one, which are the transport's. */
function withAttached(h: Record<string, string>, attached: Attached): Record<string, string> {
  for (const [k, v] of Object.entries(attached)) {
    const name = k.toLowerCase()
    if (!RESERVED.has(name) && !name.startsWith('mcp-')) h[name] = v
  }
  return h
}

export class HttpUpstream implements Upstream {
  readonly target: string
  readonly kind = 'http' as const
  readonly pid = undefined
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}

  readonly #opts: HttpUpstreamOptions
  readonly #log: Logger
  readonly #static: Record<string, string>
  readonly #max: number
  readonly #aborts = new Set<AbortController>()
  /** The target's URL, parsed once by start() (every POST is sent to it). */
  #url: URL | undefined
  #state: 'new' | 'running' | 'closed' = 'new'
  #sessionId: string | undefined
  #protocolVersion: string | undefined
  #initializeId: JsonRpcId | undefined
  #startedAt: number | undefined
  #lastError: string | undefined
  #closeReported = false
  #getStreamOpen = false
  #closing: Promise<void> | undefined
  #closedByUs = false
  readonly #errors: Counter | undefined

  constructor(opts: HttpUpstreamOptions) {
    this.#opts = opts
    this.target = opts.target
    this.#log = opts.log.child({ target: opts.target })
    this.#max = opts.maxMessageBytes ?? 16 * 1024 * 1024
    this.#static = {}
    for (const [k, v] of Object.entries(opts.headers ?? {})) {
      if (!RESERVED.has(k.toLowerCase())) this.#static[k.toLowerCase()] = v
    }
    this.#errors = opts.metrics?.counter('mcp_proxy_upstream_http_errors_total', 'Failed HTTP exchanges with remote MCP targets')
  }

  get startedAt(): number | undefined {
    return this.#startedAt
  }
  get lastError(): string | undefined {
    return this.#lastError
  }
  get alive(): boolean {
    return this.#state === 'running'
  }
  /** The upstream's own session id (never shown to clients). */
  get upstreamSessionId(): string | undefined {
    return this.#sessionId
  }
  get protocolVersion(): string | undefined {
    return this.#protocolVersion
  }

  async start(): Promise<void> {
    if (this.#state !== 'new') throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`)
    this.#opts.observer?.started(this)
    try {
      const u = new URL(this.#opts.url)
      if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error('not http(s)')
      this.#url = u
    } catch (err) {
      this.#state = 'closed'
      this.#lastError = 'invalid url'
      const failure = new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} failed to start: invalid url`, { cause: err })
      this.#opts.observer?.ended(this, failure)
      throw failure
    }
    this.#state = 'running'
    this.#startedAt = Date.now()
  }

  /**
   * The attachment's headers for one exchange: undefined without an attachment, the value itself when
   * it is at hand (no await on the hot path), else a promise; a rejection becomes an AttachmentRefused.
   */
  #attached(): Attached | Promise<Attached> | undefined {
    const attach = this.#opts.attach
    if (attach === undefined) return undefined
    try {
      const h = attach()
      return isThenable(h) ? h.then(undefined, refused) : h
    } catch (err) {
      return Promise.reject(new AttachmentRefused(err))
    }
  }

  /** The request headers: static, then attached, then the exchange's own and the session's (which always win). */
  #headers(extra: Record<string, string>, attached?: Attached): Record<string, string> {
    const h: Record<string, string> = attached === undefined ? { ...this.#static, ...extra } : Object.assign(withAttached({ ...this.#static }, attached), extra)
    if (this.#sessionId !== undefined) h['mcp-session-id'] = this.#sessionId
    if (this.#protocolVersion !== undefined) h['mcp-protocol-version'] = this.#protocolVersion
    return h
  }

  send(message: JsonRpcMessage): void {
    if (this.#state !== 'running') throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`)
    if (message.method === 'initialize' && isRequest(message)) this.#initializeId = message.id
    void this.#post(message)
  }

  /** Requests sent with sendModern() by id: closing one's stream is its cancellation (MCP 2026-07-28). */
  readonly #modern = new Map<JsonRpcId, AbortController>()

  sendModern(message: JsonRpcMessage, headers: Readonly<Record<string, string>>, related: (message: JsonRpcMessage) => void): void {
    if (this.#state !== 'running') throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`)
    const extra: Record<string, string> = {}
    // The revision's own headers only: nothing of a client's request besides them reaches this module.
    for (const [k, v] of Object.entries(headers)) {
      const name = k.toLowerCase()
      if (name === 'mcp-protocol-version' || name === 'mcp-method' || name === 'mcp-name' || name.startsWith('mcp-param-')) extra[name] = v
    }
    void this.#post(message, { headers: extra, related })
  }

  abortModern(id: JsonRpcId): void {
    this.#modern.get(id)?.abort()
  }

  #deliver(m: unknown): void {
    if (m === null || typeof m !== 'object' || (m as { jsonrpc?: unknown }).jsonrpc !== '2.0') {
      this.#log.warn('dropped upstream message that is not JSON-RPC')
      return
    }
    const msg = m as JsonRpcMessage
    if (this.#initializeId !== undefined && msg.id === this.#initializeId && msg.method === undefined) {
      const v = (msg.result as { protocolVersion?: unknown } | undefined)?.protocolVersion
      if (typeof v === 'string') this.#protocolVersion = v
      this.#initializeId = undefined
    }
    try {
      this.onMessage(msg)
    } catch (err) {
      this.#log.error({ err }, 'onMessage handler threw')
    }
  }

  #fail(message: JsonRpcMessage, detail: string, code: number = RPC.INTERNAL_ERROR, text = `target ${this.target}: ${detail}`): void {
    this.#errors?.inc({ target: this.target })
    this.#lastError = detail
    this.#log.warn({ method: message.method, detail }, 'upstream request failed')
    // Also after the upstream ended on its own: the pending call fails fast.
    if (isRequest(message) && !this.#closedByUs) {
      this.#deliver({ jsonrpc: '2.0', id: message.id, error: { code, message: text } })
    }
  }

  /**
   * The caller's credential for this exchange was refused (the attachment rejected): this request fails
   * with the refusal's message (the credential layer's, naming the target), the upstream goes on.
   */
  #credentialRefused(message: JsonRpcMessage, reason: unknown): void {
    const exposed = ProxyError.is(reason) && reason.expose
    const text = exposed ? reason.message : `target ${this.target}: no credential for this request`
    this.#log.debug({ method: message.method, err: reason instanceof Error ? reason.message : String(reason) }, 'exchange not sent: credential refused')
    if (isRequest(message) && !this.#closedByUs) {
      this.#deliver({ jsonrpc: '2.0', id: message.id, error: { code: (exposed ? reason.rpcCode : undefined) ?? RPC.SERVER_ERROR, message: text } })
    }
  }

  /**
   * The target's own 401: its credentials are the gateway's (static headers), not the client's.
   * Answered as the gateway's error naming the target, never with the target's body or challenge.
   */
  #refused(message: JsonRpcMessage): void {
    const text = `target "${this.target}" refused the gateway's credentials (401)`
    this.#fail(message, text, RPC.SERVER_ERROR, text)
  }

  async #post(message: JsonRpcMessage, modern?: { headers: Record<string, string>; related: (m: JsonRpcMessage) => void }): Promise<void> {
    const ac = new AbortController()
    this.#aborts.add(ac)
    if (modern !== undefined && isRequest(message)) this.#modern.set(message.id, ac)
    let answered = false
    let res: Answer | undefined
    try {
      const pending = this.#attached()
      const attached = pending === undefined || !isThenable(pending) ? pending : await pending
      if (ac.signal.aborted) return
      const hadSession = modern === undefined && this.#sessionId !== undefined
      const base = { accept: 'application/json, text/event-stream', 'content-type': 'application/json' }
      // 2026-07-28 requests are stateless: no session id, the revision's headers instead.
      const headers =
        modern === undefined
          ? this.#headers(base, attached)
          : attached === undefined
            ? { ...this.#static, ...modern.headers, ...base }
            : Object.assign(withAttached({ ...this.#static }, attached), modern.headers, base)
      tracer?.httpHeaders(message, headers)
      res = await post(this.#url!, headers, JSON.stringify(message), ac.signal)
      const sid = res.headers.get('mcp-session-id')
      if (sid !== null && message.method === 'initialize') this.#sessionId = sid
      if (res.status === 404 && hadSession) {
        void res.body?.cancel().catch(() => {})
        this.#fail(message, 'upstream session not found', RPC.CONNECTION_CLOSED)
        this.#gone(new Error(`target ${this.target}: upstream session ended (HTTP 404)`))
        return
      }
      if (res.status === 401) {
        void res.body?.cancel().catch(() => {})
        this.#refused(message)
        return
      }
      const type = (res.headers.get('content-type') ?? '').toLowerCase()
      if (!res.ok && modern !== undefined && res.status < 500 && type.startsWith('application/json') && isRequest(message)) {
        // The revision answers its errors (-32021, -32602, ...) with a 4xx and a JSON-RPC body: that error is the answer.
        const text = await this.#readBounded(res)
        let body: JsonRpcMessage | undefined
        try {
          body = JSON.parse(text) as JsonRpcMessage
        } catch {
          body = undefined
        }
        if (body?.error !== undefined && typeof body.error.code === 'number') {
          this.#deliver({ jsonrpc: '2.0', id: message.id, error: body.error })
          return
        }
        this.#fail(message, `upstream answered HTTP ${res.status}`)
        return
      }
      if (!res.ok) {
        void res.body?.cancel().catch(() => {})
        this.#fail(message, `upstream answered HTTP ${res.status}`)
        return
      }
      if (res.status === 202 || res.body === null) {
        void res.body?.cancel().catch(() => {})
        if (isRequest(message)) this.#fail(message, `upstream answered HTTP ${res.status} without a response`)
        else if (message.method === 'notifications/initialized') void this.#openGetStream()
        return
      }
      if (type.startsWith('text/event-stream')) {
        const waitFor = isRequest(message) ? message.id : undefined
        const parser = this.#messageParser(waitFor, modern?.related)
        answered = await this.#readSse(res, waitFor, parser)
        // An upstream may close the stream early and expect a reconnection (MCP 2025-11-25
        // transports, resumability; SEP-1699 polling): resumable when it gave event ids.
        // A 2026-07-28 request has no session to reconnect to.
        if (!answered && modern === undefined && waitFor !== undefined && parser.lastEventId !== undefined) answered = await this.#resume(parser, waitFor, ac)
        if (!answered && isRequest(message)) {
          this.#fail(message, 'upstream stream ended before the response')
        }
        return
      }
      if (type.startsWith('application/json')) {
        const text = await this.#readBounded(res)
        const body = text.trim() === '' ? undefined : (JSON.parse(text) as unknown)
        if (Array.isArray(body)) for (const m of body) this.#deliver(m)
        else if (body !== undefined) this.#deliver(body)
        else if (isRequest(message)) this.#fail(message, 'upstream answered an empty body')
        return
      }
      void res.body?.cancel().catch(() => {})
      this.#fail(message, `upstream answered unexpected content-type ${type.slice(0, 60) || '(none)'}`)
    } catch (err) {
      // A reader that threw (a body past its bound) left the answer open: drop it.
      void res?.body?.cancel().catch(() => {})
      if (ac.signal.aborted) return
      if (err instanceof AttachmentRefused) this.#credentialRefused(message, err.reason)
      else this.#fail(message, `upstream request failed: ${(err as Error).message}`)
    } finally {
      this.#aborts.delete(ac)
      if (modern !== undefined && isRequest(message) && this.#modern.get(message.id) === ac) this.#modern.delete(message.id)
    }
  }

  async #readBounded(res: Answer): Promise<string> {
    const decoder = new TextDecoder()
    let out = ''
    let size = 0
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      size += chunk.byteLength
      if (size > this.#max) throw new Error(`upstream body larger than ${this.#max} bytes`)
      out += decoder.decode(chunk, { stream: true })
    }
    return out + decoder.decode()
  }

  /** Answers to the requests a message parser saw: kept with the parser across reconnections. */
  readonly #answeredBy = new WeakMap<SseParser, Set<JsonRpcId>>()

  /**
   * A parser that delivers each message event and notes the answer to `waitFor`;
   * with `related`, the stream's notifications go there instead of `onMessage`.
   */
  #messageParser(waitFor: JsonRpcId | undefined, related?: (m: JsonRpcMessage) => void): SseParser {
    const answered = new Set<JsonRpcId>()
    const parser = new SseParser(ev => {
      if (ev.event !== 'message' || ev.data.trim() === '') return
      let body: unknown
      try {
        body = JSON.parse(ev.data)
      } catch {
        this.#log.warn({ data: ev.data.slice(0, 200) }, 'dropped SSE event that is not JSON')
        return
      }
      const list = Array.isArray(body) ? body : [body]
      for (const m of list) {
        const msg = m as JsonRpcMessage
        if (waitFor !== undefined && msg?.id === waitFor && msg.method === undefined) answered.add(waitFor)
        if (related !== undefined && typeof msg?.method === 'string' && msg.id === undefined && msg.jsonrpc === '2.0') {
          try {
            related(msg)
          } catch (err) {
            this.#log.error({ err }, 'related handler threw')
          }
          continue
        }
        this.#deliver(m)
      }
    }, this.#max)
    this.#answeredBy.set(parser, answered)
    return parser
  }

  /** Streams SSE events to onMessage; true when a response to `waitFor` arrived. */
  async #readSse(res: Answer, waitFor: JsonRpcId | undefined, parser?: SseParser): Promise<boolean> {
    const p = parser ?? this.#messageParser(waitFor)
    const answered = (): boolean => waitFor !== undefined && this.#answeredBy.get(p)?.has(waitFor) === true
    const decoder = new TextDecoder()
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      p.feed(decoder.decode(chunk, { stream: true }))
      // The request's stream may stay open after its answer; we're done with it.
      if (answered()) {
        void res.body?.cancel().catch(() => {})
        break
      }
    }
    return answered()
  }

  /**
   * Reconnects to a request stream the upstream closed before the answer: a GET with
   * `Last-Event-ID`, after the `retry:` it asked for (capped at 30 s), at most
   * `maxReconnects` times in a row without progress. True once the answer arrived.
   */
  async #resume(parser: SseParser, waitFor: JsonRpcId, ac: AbortController): Promise<boolean> {
    const max = this.#opts.maxReconnects ?? 5
    for (let attempt = 0; attempt < max && this.#state === 'running' && !ac.signal.aborted; attempt++) {
      await new Promise(resolve => setTimeout(resolve, Math.min(parser.retry ?? 1000, 30000)))
      if (this.#state !== 'running' || ac.signal.aborted) return false
      const before = parser.lastEventId
      const attached = this.#attached()
      const res = await fetch(this.#opts.url, {
        method: 'GET',
        headers: this.#headers({ accept: 'text/event-stream', 'last-event-id': parser.lastEventId! }, attached === undefined ? undefined : await attached),
        signal: ac.signal,
      })
      if (res.status === 404) {
        void res.body?.cancel().catch(() => {})
        this.#gone(new Error(`target ${this.target}: upstream session ended (HTTP 404)`))
        return false
      }
      if (!res.ok || !(res.headers.get('content-type') ?? '').toLowerCase().startsWith('text/event-stream')) {
        void res.body?.cancel().catch(() => {})
        this.#log.warn({ status: res.status }, 'upstream refused to resume a request stream')
        return false
      }
      if (await this.#readSse(res, waitFor, parser)) return true
      if (parser.lastEventId !== before) attempt = -1
    }
    return false
  }

  /** Opens the server-to-client GET stream (MCP streamable HTTP); 405 means the server has none. */
  async #openGetStream(): Promise<void> {
    if (this.#getStreamOpen || this.#state !== 'running') return
    this.#getStreamOpen = true
    const parser = new SseParser(ev => {
      if (ev.event !== 'message' || ev.data.trim() === '') return
      try {
        const body = JSON.parse(ev.data) as unknown
        for (const m of Array.isArray(body) ? body : [body]) this.#deliver(m)
      } catch {
        this.#log.warn('dropped SSE event that is not JSON')
      }
    }, this.#max)
    const max = this.#opts.maxReconnects ?? 5
    try {
      for (let attempt = 0; attempt <= max && this.#state === 'running'; attempt++) {
        if (attempt > 0) await new Promise(resolve => setTimeout(resolve, Math.min(parser.retry ?? 1000, 30000)))
        if (this.#state !== 'running') return
        const ac = new AbortController()
        this.#aborts.add(ac)
        try {
          const extra: Record<string, string> = { accept: 'text/event-stream' }
          if (parser.lastEventId !== undefined) extra['last-event-id'] = parser.lastEventId
          // A refused credential drops this attempt like a dropped stream: the next one asks again.
          const attached = this.#attached()
          const headers = this.#headers(extra, attached === undefined ? undefined : await attached)
          if (this.#state !== 'running') return
          const res = await fetch(this.#opts.url, { method: 'GET', headers, signal: ac.signal })
          if (res.status === 405) {
            void res.body?.cancel().catch(() => {})
            return
          }
          if (res.status === 404) {
            void res.body?.cancel().catch(() => {})
            this.#gone(new Error(`target ${this.target}: upstream session ended (HTTP 404)`))
            return
          }
          if (!res.ok || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
            void res.body?.cancel().catch(() => {})
            this.#log.info({ status: res.status }, 'upstream offers no server-to-client stream')
            return
          }
          attempt = 0
          await this.#readSse(res, undefined, parser)
        } catch (err) {
          if (ac.signal.aborted) return
          const reason = err instanceof AttachmentRefused ? err.reason : err
          this.#log.debug({ err: (reason as Error | undefined)?.message }, 'server-to-client stream dropped')
        } finally {
          this.#aborts.delete(ac)
        }
      }
    } finally {
      this.#getStreamOpen = false
    }
  }

  /** The upstream session ended on its own. */
  #gone(error: Error): void {
    if (this.#state !== 'running') return
    this.#state = 'closed'
    this.#lastError = error.message
    for (const ac of this.#aborts) ac.abort()
    this.#reportClose(error)
  }

  #reportClose(error: Error | undefined): void {
    if (this.#closeReported) return
    this.#closeReported = true
    this.#opts.observer?.ended(this, error)
    try {
      this.onClose(error)
    } catch (err) {
      this.#log.error({ err }, 'onClose handler threw')
    }
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      const wasRunning = this.#state === 'running'
      this.#state = 'closed'
      this.#closedByUs = true
      for (const ac of this.#aborts) ac.abort()
      this.#aborts.clear()
      if (wasRunning && this.#sessionId !== undefined) {
        // Ends the upstream session; 405 means the server does not allow it (fine).
        try {
          const attached = this.#attached()
          const headers = this.#headers({}, attached === undefined ? undefined : await attached)
          const res = await fetch(this.#opts.url, { method: 'DELETE', headers, signal: AbortSignal.timeout(5000) })
          void res.body?.cancel().catch(() => {})
        } catch (err) {
          const reason = err instanceof AttachmentRefused ? err.reason : err
          this.#log.debug({ err: (reason as Error).message }, 'DELETE of the upstream session failed')
        }
      }
      this.#reportClose(undefined)
    })()
    return this.#closing
  }
}
