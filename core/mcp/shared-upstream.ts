/**
 * `share: subject` for stdio targets: the sessions of one token subject share
 * a pooled, already initialized child (modern-pool.ts) instead of spawning one
 * each. A `SharedUpstream` is one session's lease on such a child and speaks
 * the plain `Upstream` contract, so the session layer (session.ts) does not
 * know the difference.
 *
 * What the lease does for its session:
 * - `initialize` is answered from the child's own initialize result (the
 *   gateway initialized it once), with the session's protocol revision;
 *   `notifications/initialized` stops here;
 * - requests go to the child under ids unique on it (the pool maps them, and
 *   progress tokens, back); `notifications/cancelled` cancels the matching one;
 * - `resources/subscribe`/`unsubscribe` are counted per URI on the child, and
 *   `notifications/resources/updated` reaches only the sessions subscribed;
 *   list-changed notifications reach every session on the child;
 * - a server-to-client request (sampling, elicitation) reaches this session
 *   only when its request is the one in flight on the child and its client
 *   declared the capability; otherwise the child gets "Method not found";
 *   `notifications/message` reaches the session whose request is the only one
 *   in flight; `logging/setLevel` is the child's, so the last one set wins.
 * When the child ends, every session on it sees its upstream close.
 */
import type { JsonRpcId, JsonRpcMessage, Upstream, UpstreamFactory } from '../targets/types.ts'
import { ProxyError, RPC } from '../errors.ts'
import type { CallHooks, PoolCall, PooledUpstream, UpstreamPool } from './modern-pool.ts'

/** Whose upstream a session creates: the session's token subject. */
export interface UpstreamOwner {
  /** Subject of the session's token, or a fixed key for anonymous callers. */
  readonly subjectKey: string
  readonly subject: string | undefined
}

/** A factory as a session uses it: told whose upstream it creates (only a shared lease cares). */
export interface SessionUpstreamFactory extends UpstreamFactory {
  create(owner?: UpstreamOwner): Upstream
}

const OK: Readonly<{ jsonrpc: '2.0'; result: Record<string, never> }> = { jsonrpc: '2.0', result: {} }
/** Server-to-client request method -> the client capability it needs. */
const NEEDS: Readonly<Record<string, string>> = { 'sampling/createMessage': 'sampling', 'elicitation/create': 'elicitation' }

export class SharedUpstream implements Upstream {
  readonly target: string
  readonly kind = 'stdio' as const
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}
  readonly #pool: UpstreamPool
  readonly #factory: UpstreamFactory
  readonly #owner: UpstreamOwner
  #entry: PooledUpstream | undefined
  /** Session's upstream id -> the call on the shared child. */
  readonly #calls = new Map<JsonRpcId, PoolCall>()
  readonly #subscribed = new Set<string>()
  /** Client capabilities from the session's initialize. */
  #clientCaps: Record<string, unknown> = {}
  #closed = false
  #startedAt: number | undefined

  constructor (pool: UpstreamPool, factory: UpstreamFactory, owner: UpstreamOwner) {
    this.target = factory.target
    this.#pool = pool
    this.#factory = factory
    this.#owner = owner
  }

  get pid (): number | undefined { return this.#entry?.upstream.pid }
  get startedAt (): number | undefined { return this.#startedAt }
  get lastError (): string | undefined { return this.#entry?.upstream.lastError }
  get alive (): boolean { return !this.#closed && this.#entry?.up === true }

  /**
   * One set of hooks for every call of this lease. No timer on the child: the
   * session times each request itself and cancels it (`notifications/cancelled`).
   */
  readonly #hooks: CallHooks = {
    onProgress: (m) => this.#deliver(m),
    onLog: (m) => this.#deliver(m),
    onServerRequest: (req) => this.#serverRequest(req),
    timeoutMs: 0,
  }

  readonly #listener = (msg: JsonRpcMessage): void => {
    if (this.#closed) return
    if (msg.method === 'notifications/resources/updated') {
      const uri = msg.params?.uri
      if (typeof uri !== 'string' || !this.#subscribed.has(uri)) return
    }
    // One object per session: the session may rewrite it (URI markers).
    this.onMessage(structuredClone(msg))
  }

  readonly #gone = (): void => {
    if (this.#closed) return
    this.#closed = true
    this.#calls.clear()
    this.onClose(new Error(`shared upstream ${this.target} closed`))
  }

  async start (): Promise<void> {
    const entry = await this.#pool.acquire(this.#factory, this.#owner.subjectKey, this.#owner.subject, this.#factory.processesPerSubject ?? 1)
    if (this.#closed) {
      this.#pool.release(entry)
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${this.target} closed`, { rpcCode: RPC.SERVER_ERROR, expose: true })
    }
    this.#entry = entry
    this.#startedAt = Date.now()
    entry.listeners.add(this.#listener)
    entry.onGone.add(this.#gone)
  }

  send (msg: JsonRpcMessage): void {
    const entry = this.#entry
    if (this.#closed || entry === undefined || !entry.up) {
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${this.target} closed`, { rpcCode: RPC.CONNECTION_CLOSED })
    }
    if (msg.method === undefined) {
      // The client's answer to a server-to-client request: its id is the child's already.
      entry.notify(msg)
      return
    }
    if (msg.id === undefined || msg.id === null) {
      this.#notification(entry, msg)
      return
    }
    const id = msg.id
    switch (msg.method) {
      case 'initialize': {
        const params = msg.params ?? {}
        this.#clientCaps = (params.capabilities ?? {}) as Record<string, unknown>
        const result = { ...entry.initResult, protocolVersion: params.protocolVersion ?? entry.initResult?.protocolVersion }
        this.#answerSoon({ jsonrpc: '2.0', id, result })
        return
      }
      case 'resources/subscribe': case 'resources/unsubscribe': {
        const uri = msg.params?.uri
        if (typeof uri !== 'string') break
        if (msg.method === 'resources/unsubscribe') {
          if (this.#subscribed.delete(uri)) entry.unsubscribe(uri)
          this.#answerSoon({ ...OK, id })
          return
        }
        if (this.#subscribed.has(uri)) {
          this.#answerSoon({ ...OK, id })
          return
        }
        this.#subscribed.add(uri)
        void entry.subscribe(uri).then(r => {
          if (r.error !== undefined) this.#subscribed.delete(uri)
          else if (this.#closed) entry.unsubscribe(uri)
          this.#deliver({ ...r, id })
        })
        return
      }
    }
    const call = entry.call(msg, this.#hooks)
    this.#calls.set(id, call)
    void call.done.then(r => {
      if (this.#calls.get(id) !== call) return
      this.#calls.delete(id)
      r.id = id
      this.#deliver(r)
    })
  }

  #notification (entry: PooledUpstream, msg: JsonRpcMessage): void {
    switch (msg.method) {
      case 'notifications/initialized':
        return
      case 'notifications/cancelled': {
        const rid = msg.params?.requestId as JsonRpcId | undefined
        const call = rid === undefined ? undefined : this.#calls.get(rid)
        if (call === undefined) return
        this.#calls.delete(rid!)
        call.cancel(typeof msg.params?.reason === 'string' ? msg.params.reason : 'cancelled')
        return
      }
      case 'notifications/roots/list_changed':
        // The gateway declared no roots to the shared child.
        return
      default:
        entry.notify(msg)
    }
  }

  #serverRequest (req: JsonRpcMessage): void {
    const cap = NEEDS[req.method!]
    if (cap === undefined || this.#clientCaps[cap] === undefined || this.#closed) {
      this.#entry?.answer(req.id!, undefined, { code: RPC.METHOD_NOT_FOUND, message: 'Method not found' })
      return
    }
    this.#deliver(req)
  }

  #deliver (msg: JsonRpcMessage): void {
    if (!this.#closed) this.onMessage(msg)
  }

  /** Answers given here, not by the child, still arrive after `send()` returns, as the child's would. */
  #answerSoon (msg: JsonRpcMessage): void {
    queueMicrotask(() => this.#deliver(msg))
  }

  async close (): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    const entry = this.#entry
    for (const call of this.#calls.values()) call.cancel('session ended')
    this.#calls.clear()
    if (entry !== undefined) {
      entry.listeners.delete(this.#listener)
      entry.onGone.delete(this.#gone)
      for (const uri of this.#subscribed) entry.unsubscribe(uri)
      this.#subscribed.clear()
      this.#pool.release(entry)
    }
    this.onClose(undefined)
  }
}

/** The factory a session uses for a `share: subject` target: a lease per session. */
export function sharedFactory (factory: UpstreamFactory, pool: UpstreamPool): SessionUpstreamFactory {
  return {
    ...factory,
    create (owner?: UpstreamOwner): Upstream {
      if (owner === undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `target ${factory.target}: a shared upstream needs its owner`)
      return new SharedUpstream(pool, factory, owner)
    },
  }
}
