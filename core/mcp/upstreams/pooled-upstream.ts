/**
 * One pooled upstream: an initialized connection to a target, owned by one
 * (target, subject), and the requests in flight on it. Upstream servers that
 * speak only the session era (`era: 'legacy'`: initialize handshake, one
 * conversation per stdio process) are initialized by the gateway, as their
 * client; upstreams that speak 2026-07-28 themselves (`era: 'modern'`) are
 * asked `server/discover` instead and get the revision's requests as they
 * are, ids and progress tokens mapped (stdio), or one stateless POST each
 * (HTTP, `Upstream.sendModern`). What comes back (answers, progress, logs,
 * server-to-client requests, change notifications) goes to the request it
 * belongs to, or to the listeners. Leases, caps and idle closing are the
 * pool's (pool.ts).
 */
import type { Logger } from 'pino'
import type { JsonRpcId, JsonRpcMessage, Upstream, UpstreamFactory } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { GATEWAY_INFO, INIT_TIMEOUT_MIN_MS, LATEST_SESSION_REVISION, META, MODERN_REVISION, rpcError } from '../protocol.ts'
import { UpstreamCalls } from './calls.ts'
import { UPSTREAM_CAPABILITIES, upstreamCapabilities, type Bridged } from './client-capabilities.ts'
import type { TargetCallMeter } from './call-metrics.ts'
import { isCredentialRefusal, keyOnlyCaller, upstreamFor, type Caller, type TargetAuth } from '../credentials.ts'

/** Hooks of one forwarded request. */
export interface CallHooks {
  /** `notifications/progress` for this request (token already mapped back). */
  onProgress?: (msg: JsonRpcMessage) => void
  /** `notifications/message` while this request is the only one in flight on its upstream. */
  onLog?: (msg: JsonRpcMessage) => void
  /**
   * A server-to-client request (sampling, elicitation) while this request is
   * in flight; answer it with `PooledUpstream.answer()`. Without this hook
   * such requests are refused.
   */
  onServerRequest?: (msg: JsonRpcMessage) => void
  /**
   * Modern era: any other notification of this request (a `subscriptions/listen`
   * stream's acknowledgement and change notifications).
   */
  onNotification?: (msg: JsonRpcMessage) => void
  /** Modern era over HTTP: the revision's request headers (Mcp-Method, Mcp-Name, Mcp-Param-*). */
  headers?: Readonly<Record<string, string>>
  /** 0: no timer here (the caller times the request itself and cancels it). */
  timeoutMs?: number
}

/**
 * The era a target speaks, and so how the gateway speaks to its pooled upstream: as its
 * session-era client (`legacy`: initialize, one conversation per connection), or in 2026-07-28
 * as is (`modern`). Not the era of a client's request (protocol.ts `eraOf`).
 */
export type TargetEra = 'legacy' | 'modern'

/** The `_meta` key of the revision's subscription ids (MCP 2026-07-28 Subscriptions). */
const SUBSCRIPTION_ID = META.subscriptionId

/** Thrown (as the cause of the 502) when a `modern` upstream's `server/discover` shows it does not speak 2026-07-28. */
export class NotModernError extends Error {}

/** Whether `err` from `acquire(..., { era: 'modern' })` says the target speaks only the session era. */
export function isNotModern(err: unknown): boolean {
  return (err as { cause?: unknown } | undefined)?.cause instanceof NotModernError
}

export interface PoolCall {
  readonly done: Promise<JsonRpcMessage>
  /** Stops waiting: `notifications/cancelled` goes upstream (with `reason` when given); `done` resolves with an error. */
  cancel(reason?: string): void
}

interface Pending {
  readonly id: number
  readonly resolve: (msg: JsonRpcMessage) => void
  readonly hooks: CallHooks
  readonly token: string | undefined
  readonly clientToken: unknown
  timer: NodeJS.Timeout | undefined
}

/** How `acquire()` reaches the target: its era, and (session era) which capabilities to declare. */
export interface AcquireHow {
  readonly era?: TargetEra
  /**
   * Session era: the capabilities declared upstream; upstreams are pooled per set, so a server's
   * capability-gated tools are seen only by clients that declared the capability. Absent:
   * UPSTREAM_CAPABILITIES.
   */
  readonly capabilities?: readonly Bridged[]
  /**
   * Session era: exactly these client capabilities declared upstream (a shared child declares
   * its clients' own, shared-upstream.ts); the caller names the set in its key. Wins over `capabilities`.
   */
  readonly declare?: Readonly<Record<string, unknown>>
  /** The caller whose request leases the upstream (credentials.ts): the pooled upstream keeps the latest one of its key. */
  readonly caller?: Caller
}

/** One initialized upstream owned by one (target, subject). */
export class PooledUpstream {
  readonly target: string
  readonly key: string
  readonly subject: string | undefined
  readonly upstream: Upstream
  /**
   * The latest caller of this upstream's key (set by each lease): a target with `auth` gets this
   * caller's credential on the next exchange (credentials.ts), so a refreshed client token replaces the old one.
   */
  caller: Caller
  readonly era: TargetEra
  /** Session era: what was declared in `initialize`. */
  readonly declared: Record<string, unknown>
  readonly createdAt = Date.now()
  lastUsedAt = Date.now()
  /** Requests (and listen streams) currently holding this upstream. */
  leases = 0
  up = false
  closed = false
  initResult: Record<string, unknown> | undefined
  readonly ready: Promise<void>
  /** Change notifications (list_changed, resources/updated) go to these (subscriptions/listen). */
  readonly listeners = new Set<(msg: JsonRpcMessage) => void>()
  /** Called once when this upstream ends (crash, idle close, gateway close). */
  readonly onGone = new Set<() => void>()
  readonly #pending: UpstreamCalls<Pending>
  readonly #progress = new Map<string, Pending>()
  /** Upstream URI -> holders subscribed to it. */
  readonly #subscriptions = new Map<string, number>()
  readonly #log: Logger
  readonly #timeoutMs: number
  readonly #unregister: (entry: PooledUpstream) => void

  constructor(
    factory: UpstreamFactory,
    key: string,
    subject: string | undefined,
    log: Logger,
    timeoutMs: number,
    onGone: (entry: PooledUpstream) => void,
    meter?: TargetCallMeter,
    how: AcquireHow = {},
    auth?: TargetAuth
  ) {
    this.target = factory.target
    this.era = how.era ?? 'legacy'
    this.declared = how.declare ?? (how.capabilities === undefined ? UPSTREAM_CAPABILITIES : upstreamCapabilities(how.capabilities))
    this.#pending = new UpstreamCalls<Pending>(meter)
    this.key = key
    this.subject = subject
    this.#log = log.child({ target: factory.target, pooled: true })
    this.#timeoutMs = timeoutMs
    this.#unregister = onGone
    this.caller = how.caller ?? keyOnlyCaller(key, subject) // the pool always gives one
    this.upstream = upstreamFor(factory, auth, this, this.#log)
    this.upstream.onMessage = msg => this.#fromUpstream(msg)
    this.upstream.onClose = err => this.#closedByUpstream(err)
    this.ready = this.#start()
  }

  get inFlight(): number {
    return this.#pending.size
  }

  /**
   * Whether what the upstream carries has gone stale (a stdio child's environment holds a minted
   * token past its freshness: `Upstream.staleAt`): the pool gives it no new lease and closes it
   * once its leases end.
   */
  stale(now: number): boolean {
    const at = this.upstream.staleAt
    return at !== undefined && at <= now
  }

  /** The upstream's name and version: `initialize`'s serverInfo, or `server/discover`'s `_meta` serverInfo. */
  get serverInfo(): unknown {
    if (this.era === 'legacy') return this.initResult?.serverInfo
    return (this.initResult?._meta as Record<string, unknown> | undefined)?.[META.serverInfo]
  }

  /**
   * The revision's probe (MCP 2026-07-28 versioning, backward compatibility):
   * `server/discover` listing 2026-07-28 is a modern server. Any other answer,
   * or silence on stdio, is a session-era one (NotModernError); a transport
   * failure (HTTP 5xx, network, a crash) is only a failure, asked again later.
   */
  async #discover(): Promise<void> {
    const res = await this.call(
      {
        jsonrpc: '2.0',
        method: 'server/discover',
        params: { _meta: { [META.protocolVersion]: MODERN_REVISION, [META.clientInfo]: GATEWAY_INFO, [META.clientCapabilities]: {} } },
      },
      { timeoutMs: Math.max(this.#timeoutMs, INIT_TIMEOUT_MIN_MS), headers: { 'mcp-protocol-version': MODERN_REVISION, 'mcp-method': 'server/discover' } }
    ).done
    const versions = (res.result as { supportedVersions?: unknown } | undefined)?.supportedVersions
    if (Array.isArray(versions) && versions.includes(MODERN_REVISION)) {
      this.initResult = res.result as Record<string, unknown>
      return
    }
    const code = res.error?.code
    const failed = this.closed || code === RPC.INTERNAL_ERROR || (code === RPC.REQUEST_TIMEOUT && this.upstream.kind === 'http')
    if (failed) throw new Error(res.error?.message ?? 'server/discover failed')
    throw new NotModernError(`target ${this.target} does not speak ${MODERN_REVISION}: ${res.error?.message ?? 'server/discover lists other versions'}`)
  }

  async #start(): Promise<void> {
    try {
      await this.upstream.start()
      if (this.era === 'modern') {
        await this.#discover()
        this.up = true
        return
      }
      // The gateway is the session-era client here. It declares what it bridges
      // to multi round-trip results (modern/input-required.ts): by default sampling and form
      // elicitation; for 2026-07-28 clients exactly the ones they declare
      // (sampling, elicitation, roots), so that no tool gated on another shows.
      const res = await this.call(
        {
          jsonrpc: '2.0',
          method: 'initialize',
          params: { protocolVersion: LATEST_SESSION_REVISION, capabilities: this.declared, clientInfo: GATEWAY_INFO },
        },
        { timeoutMs: Math.max(this.#timeoutMs, INIT_TIMEOUT_MIN_MS) }
      ).done
      if (res.error !== undefined) throw new Error(res.error.message)
      this.initResult = (res.result ?? {}) as Record<string, unknown>
      this.upstream.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
      this.up = true
    } catch (err) {
      if (isCredentialRefusal(err)) {
        // The caller's credential (a stdio child's environment) was refused: answered as it is.
        void this.close()
        throw err
      }
      if (err instanceof NotModernError) this.#log.info({ err: err.message }, 'upstream speaks only the session era')
      else this.#log.warn({ err: (err as Error).message }, 'pooled upstream failed to start')
      void this.close()
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${this.target} failed to start`, { rpcCode: RPC.SERVER_ERROR, expose: true, cause: err })
    }
  }

  /**
   * Sends one request upstream under a fresh id (the message is mutated:
   * id, and a progress token mapped to one unique on this upstream).
   */
  call(msg: JsonRpcMessage, hooks: CallHooks = {}): PoolCall {
    const id = this.#pending.nextId()
    msg.id = id
    const meta = msg.params?._meta as Record<string, unknown> | undefined
    const clientToken = meta?.progressToken
    let token: string | undefined
    // A 2026-07-28 HTTP request has a stream of its own: its progress needs no mapping.
    const ownStream = this.era === 'modern' && this.upstream.sendModern !== undefined
    if (clientToken !== undefined && meta !== undefined && !ownStream) {
      // Two requests of one subject may carry the same token: make it unique upstream.
      token = `mcpp-${id}`
      meta.progressToken = token
    }
    let resolve!: (m: JsonRpcMessage) => void
    const done = new Promise<JsonRpcMessage>(r => {
      resolve = r
    })
    const pending: Pending = { id, resolve, hooks, token, clientToken, timer: undefined }
    this.lastUsedAt = Date.now()
    if (this.closed) {
      resolve(rpcError(RPC.CONNECTION_CLOSED, `upstream ${this.target} closed`))
      return { done, cancel() {} }
    }
    this.#pending.add(pending, msg)
    if (token !== undefined) this.#progress.set(token, pending)
    try {
      if (ownStream) this.upstream.sendModern!(msg, hooks.headers ?? {}, m => this.#related(pending, m))
      else this.upstream.send(msg)
    } catch {
      this.#settle(pending, rpcError(RPC.CONNECTION_CLOSED, `upstream ${this.target} closed`))
      return { done, cancel() {} }
    }
    if (hooks.timeoutMs !== 0) {
      pending.timer = setTimeout(() => {
        if (!this.#pending.remove(pending)) return
        this.#cancelUpstream(id, 'request timed out')
        this.#settle(pending, rpcError(RPC.REQUEST_TIMEOUT, 'Request timed out'))
      }, hooks.timeoutMs ?? this.#timeoutMs)
    }
    return {
      done,
      cancel: (reason?: string) => {
        if (!this.#pending.remove(pending)) return
        this.#cancelUpstream(id, reason)
        this.#settle(pending, rpcError(RPC.REQUEST_TIMEOUT, 'Request cancelled'))
      },
    }
  }

  /**
   * `resources/subscribe` counted per URI: the upstream is asked once, however
   * many holders (listen streams, shared sessions) want the URI.
   */
  async subscribe(uri: string): Promise<JsonRpcMessage> {
    const n = this.#subscriptions.get(uri) ?? 0
    if (n > 0) {
      this.#subscriptions.set(uri, n + 1)
      return { jsonrpc: '2.0', result: {} }
    }
    const r = await this.call({ jsonrpc: '2.0', method: 'resources/subscribe', params: { uri } }).done
    if (r.error === undefined) this.#subscriptions.set(uri, (this.#subscriptions.get(uri) ?? 0) + 1)
    return r
  }

  /** Drops one holder of `uri`; the last one unsubscribes upstream (fire and forget). */
  unsubscribe(uri: string): void {
    const n = this.#subscriptions.get(uri) ?? 0
    if (n > 1) {
      this.#subscriptions.set(uri, n - 1)
      return
    }
    if (n === 0) return
    this.#subscriptions.delete(uri)
    if (this.up && !this.closed) void this.call({ jsonrpc: '2.0', method: 'resources/unsubscribe', params: { uri } }).done
  }

  /** Answers a server-to-client request of this upstream. */
  answer(id: JsonRpcId, result: unknown, error?: { code: number; message: string }): void {
    this.notify(error === undefined ? { jsonrpc: '2.0', id, result } : { jsonrpc: '2.0', id, error })
  }

  /** Fire-and-forget request whose answer is not needed (e.g. resources/unsubscribe on close). */
  notify(msg: JsonRpcMessage): void {
    if (!this.up || this.closed) return
    try {
      this.upstream.send(msg)
    } catch {
      /* reported through onClose */
    }
  }

  #settle(p: Pending, msg: JsonRpcMessage): void {
    this.#pending.remove(p)
    if (p.token !== undefined) this.#progress.delete(p.token)
    clearTimeout(p.timer)
    this.lastUsedAt = Date.now()
    p.resolve(msg)
  }

  /** `reason` absent: none is sent (it is optional, MCP 2025-11-25 utilities, Cancellation). */
  #cancelUpstream(id: number, reason: string | undefined): void {
    // 2026-07-28 over HTTP: closing the request's stream is the cancellation.
    if (this.era === 'modern' && this.upstream.abortModern !== undefined) this.upstream.abortModern(id)
    else this.notify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: reason === undefined ? { requestId: id } : { requestId: id, reason } })
  }

  /** A notification on the stream of one 2026-07-28 HTTP request: it is that request's. */
  #related(p: Pending, msg: JsonRpcMessage): void {
    switch (msg.method) {
      case 'notifications/progress':
        p.hooks.onProgress?.(msg)
        return
      case 'notifications/message':
        p.hooks.onLog?.(msg)
        return
      default:
        p.hooks.onNotification?.(msg)
    }
  }

  #fromUpstream(msg: JsonRpcMessage): void {
    if (msg.method === undefined) {
      const p = this.#pending.answered(msg)
      if (p === undefined) {
        this.#log.debug({ id: msg.id }, 'upstream answered an unknown request')
        return
      }
      this.#settle(p, msg)
      return
    }
    if (msg.id !== undefined && msg.id !== null && this.era === 'modern') {
      // The revision has no server-to-client requests (MCP 2026-07-28 stdio: the server MUST NOT write them).
      this.#log.debug({ method: msg.method }, 'dropped a request from a 2026-07-28 upstream')
      return
    }
    if (msg.id !== undefined && msg.id !== null) {
      if (msg.method === 'ping') {
        this.answer(msg.id, {})
        return
      }
      // Server-to-client request: stdio carries no related-request marker, so
      // it goes to the request in flight that can take one (MRTR bridge) only
      // when there is exactly one; otherwise it is refused rather than guessed.
      let target: Pending | undefined
      let candidates = 0
      for (const p of this.#pending.values())
        if (p.hooks.onServerRequest !== undefined) {
          target = p
          candidates++
        }
      // roots/list only where roots were declared: asked within a call, it is bridged like the others.
      if (target === undefined || candidates > 1 || (msg.method === 'roots/list' && this.declared.roots === undefined)) {
        this.answer(msg.id, undefined, { code: RPC.METHOD_NOT_FOUND, message: 'Method not found' })
        return
      }
      target.hooks.onServerRequest!(msg)
      return
    }
    switch (msg.method) {
      case 'notifications/progress': {
        const p = this.#progress.get(msg.params?.progressToken as string)
        if (p === undefined) return
        msg.params!.progressToken = p.clientToken
        p.hooks.onProgress?.(msg)
        return
      }
      case 'notifications/message': {
        // stdio has no per-request stream. A 2026-07-28 server logs only for requests carrying
        // io.modelcontextprotocol/logLevel (MCP 2026-07-28 server/utilities/logging, "Per-request log
        // level"), so the one such request in flight is the source; a session-era upstream logs at its
        // process level for whatever runs. Anything else cannot be attributed and is dropped.
        let only: Pending | undefined
        let candidates = 0
        for (const p of this.#pending.values()) {
          if (this.era === 'modern' && p.hooks.onLog === undefined) continue
          only = p
          candidates++
        }
        if (candidates !== 1) {
          this.#log.debug({ candidates }, 'log notification not attributable to one request: dropped')
          return
        }
        only!.hooks.onLog?.(msg)
        return
      }
      case 'notifications/cancelled':
        return
      default: {
        const sub = (msg.params?._meta as Record<string, unknown> | undefined)?.[SUBSCRIPTION_ID]
        if (this.era === 'modern' && sub !== undefined) {
          // A subscriptions/listen stream's: its id is the listen request's on this upstream.
          for (const p of this.#pending.values()) if (p.id === sub) p.hooks.onNotification?.(msg)
          return
        }
        for (const l of this.listeners) l(msg)
      }
    }
  }

  #failAll(message: string): void {
    for (const p of this.#pending.drain()) this.#settle(p, rpcError(RPC.CONNECTION_CLOSED, message))
  }

  #closedByUpstream(err: Error | undefined): void {
    const wasClosed = this.closed
    this.closed = true
    this.up = false
    if (!wasClosed) this.#log.warn({ err: err?.message }, 'pooled upstream closed')
    this.#failAll(`upstream ${this.target} closed`)
    this.#gone()
  }

  #gone(): void {
    this.#unregister(this)
    const hs = [...this.onGone]
    this.onGone.clear()
    for (const h of hs) h()
  }

  async close(): Promise<void> {
    if (!this.closed) {
      this.closed = true
      this.up = false
      this.#failAll(`upstream ${this.target} closed`)
      this.#gone()
    }
    await this.upstream.close()
  }
}
