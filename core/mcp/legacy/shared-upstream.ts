/**
 * `share: subject` for stdio targets: the sessions of one token subject share
 * a pooled, already initialized child (upstreams/pool.ts) instead of spawning one
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
 * - tasks (MCP 2025-11-25 tasks) are the session's whose call created them:
 *   `notifications/tasks/status` reaches only that session (one the child
 *   sends before its `CreateTaskResult` is held until that result names the
 *   task), `tasks/list` lists only its tasks, and `tasks/get|result|cancel`
 *   of another session's task are unknown (-32602);
 * - a server-to-client request (sampling, elicitation) reaches this session
 *   only when its request is the one in flight on the child and its client
 *   declared the capability; otherwise the child gets "Method not found";
 *   `notifications/message` reaches the session whose request is the only one
 *   in flight; `logging/setLevel` is the child's, so the last one set wins.
 * When the child ends, every session on it sees its upstream close.
 *
 * Children are pooled per (subject, declared capabilities): a child is
 * initialized with exactly the sampling and elicitation capabilities of the
 * clients it serves, so a server that gates tools on them shows each client
 * only what it may use, and never learns a capability on behalf of a client
 * that did not declare it. Roots are never declared to a shared child (it
 * asks for them outside any one client's request, which no lease can answer).
 */
import type { JsonRpcId, JsonRpcMessage, Upstream, UpstreamAttachment, UpstreamFactory } from '../../targets/types.ts'
import type { Caller } from '../credentials.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { TASK_METHODS } from '../protocol.ts'
import type { CallHooks, PoolCall, PooledUpstream, UpstreamPool } from '../upstreams/pool.ts'
import { TaskLedger, isTerminal } from '../upstreams/task-ledger.ts'
import { EarlyTaskStatus } from '../upstreams/early-task-status.ts'
import { CAPABILITY_OF_REQUEST, SHARED_CHILD_BRIDGED } from '../upstreams/client-capabilities.ts'

/** Whose upstream a session creates: the session's token subject. */
export interface UpstreamOwner {
  /** Subject of the session's token, or a fixed key for anonymous callers. */
  readonly subjectKey: string
  readonly subject: string | undefined
  /** The session's latest caller (../credentials.ts): a shared child of a target with `auth` is spawned with its credential. */
  readonly caller?: Caller
}

/**
 * A factory as a session uses it: `attach` is the session caller's, as for any factory; `owner` says
 * whose session it is (only a shared lease cares: its pooled child carries the credential of the
 * owner's caller, attached by the pool, so a lease ignores `attach`).
 */
export interface SessionUpstreamFactory extends UpstreamFactory {
  create(attach?: UpstreamAttachment, owner?: UpstreamOwner): Upstream
}

const OK: Readonly<{ jsonrpc: '2.0'; result: Record<string, never> }> = { jsonrpc: '2.0', result: {} }

/** The bridged part of a client's declared capabilities, and a key naming it (stable: sorted keys). */
function declared(caps: Record<string, unknown>): { caps: Record<string, unknown>; key: string } {
  const out: Record<string, unknown> = {}
  for (const k of SHARED_CHILD_BRIDGED) if (caps[k] !== null && typeof caps[k] === 'object') out[k] = caps[k]
  return { caps: out, key: canonical(out) }
}

function canonical(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null'
  if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']'
  const o = v as Record<string, unknown>
  return (
    '{' +
    Object.keys(o)
      .sort()
      .map(k => JSON.stringify(k) + ':' + canonical(o[k]))
      .join(',') +
    '}'
  )
}

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
  /** Tasks this session created on the child (MCP 2025-11-25 tasks), under the child's ids. */
  readonly #tasks: TaskLedger<true>
  /** Task-augmented calls of this session in flight on the child. */
  #creating = 0
  /** Statuses of tasks no session is known to own yet, while this session has a task-augmented call in flight. */
  readonly #early: EarlyTaskStatus
  /** Client capabilities from the session's initialize. */
  #clientCaps: Record<string, unknown> = {}
  /** The pool key and declared capabilities of this lease's child (a move to a fresh child leases the same). */
  #lease: { key: string; declare: Record<string, unknown> } | undefined
  /** Messages sent while the lease moves to a fresh child, in order. */
  #queued: JsonRpcMessage[] | undefined
  #closed = false
  #startedAt: number | undefined

  constructor(pool: UpstreamPool, factory: UpstreamFactory, owner: UpstreamOwner, maxTasks: number) {
    this.target = factory.target
    this.#pool = pool
    this.#factory = factory
    this.#owner = owner
    this.#tasks = new TaskLedger(maxTasks)
    this.#early = new EarlyTaskStatus(maxTasks)
  }

  get pid(): number | undefined {
    return this.#entry?.upstream.pid
  }
  get startedAt(): number | undefined {
    return this.#startedAt
  }
  get lastError(): string | undefined {
    return this.#entry?.upstream.lastError
  }
  get alive(): boolean {
    return !this.#closed && this.#entry?.up === true
  }

  /**
   * One set of hooks for every call of this lease. No timer on the child: the
   * session times each request itself and cancels it (`notifications/cancelled`).
   */
  readonly #hooks: CallHooks = {
    onProgress: m => this.#deliver(m),
    onLog: m => this.#deliver(m),
    onServerRequest: req => this.#serverRequest(req),
    timeoutMs: 0,
  }

  readonly #listener = (msg: JsonRpcMessage): void => {
    if (this.#closed) return
    if (msg.method === 'notifications/resources/updated') {
      const uri = msg.params?.uri
      if (typeof uri !== 'string' || !this.#subscribed.has(uri)) return
    }
    if (msg.method === 'notifications/tasks/status') {
      const taskId = msg.params?.taskId
      if (!this.#tasks.has(taskId)) {
        if (this.#creating > 0 && typeof taskId === 'string') this.#early.hold(structuredClone(msg), true)
        return
      }
      if (isTerminal(msg.params?.status)) this.#tasks.end(taskId)
    }
    // One object per session: the session may rewrite it (URI markers).
    this.onMessage(structuredClone(msg))
  }

  /** A task-augmented call of this session was answered: `taskId` is the session's now, and its held statuses follow the result. */
  #created(taskId: string | undefined): void {
    if (--this.#creating === 0 && taskId === undefined) {
      this.#early.clear()
      return
    }
    if (taskId === undefined) return
    const held = this.#early.take(taskId)
    if (this.#creating === 0) this.#early.clear()
    for (const m of held) {
      if (isTerminal(m.params?.status)) this.#tasks.end(taskId)
      this.#deliver(m)
    }
  }

  readonly #gone = (): void => {
    if (this.#closed) return
    this.#closed = true
    this.#calls.clear()
    this.onClose(new Error(`shared upstream ${this.target} closed`))
  }

  /** Nothing to start yet: which child serves this lease depends on the capabilities its initialize declares. */
  async start(): Promise<void> {
    if (this.#closed) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${this.target} closed`, { rpcCode: RPC.SERVER_ERROR, expose: true })
  }

  /** Leases a child of this subject initialized with the client's capabilities (`declared`), then answers the session's initialize from its result. */
  async #initialize(id: JsonRpcId, params: Record<string, unknown>): Promise<void> {
    this.#clientCaps = (params.capabilities ?? {}) as Record<string, unknown>
    const { caps, key } = declared(this.#clientCaps)
    let entry: PooledUpstream
    try {
      // The child's initialize declares `caps` (upstreams/pool.ts): no wrapper on its message path.
      this.#lease = { key: this.#owner.subjectKey + '\u0000' + key, declare: caps }
      entry = await this.#acquire()
    } catch (err) {
      this.#answerSoon({ jsonrpc: '2.0', id, error: { code: RPC.SERVER_ERROR, message: (err as Error).message } })
      return
    }
    if (this.#closed) {
      this.#pool.release(entry)
      return
    }
    this.#entry = entry
    this.#startedAt = Date.now()
    entry.listeners.add(this.#listener)
    entry.onGone.add(this.#gone)
    this.#answerSoon({ jsonrpc: '2.0', id, result: { ...entry.initResult, protocolVersion: params.protocolVersion ?? entry.initResult?.protocolVersion } })
  }

  #acquire(): Promise<PooledUpstream> {
    const { key, declare } = this.#lease!
    return this.#pool.acquire(this.#factory, key, this.#owner.subject, this.#factory.processesPerSubject ?? 1, { declare, caller: this.#owner.caller })
  }

  /**
   * A child whose environment holds a stale credential (upstreams/pool.ts) is left at a quiet point:
   * nothing of this session in flight on it, no task of it known there, since the fresh child knows
   * neither. Its subscriptions are made again on the fresh child; messages sent meanwhile wait, in
   * order. The child's log level is the last one a session sets, as on any shared child.
   */
  #moveIfStale(entry: PooledUpstream): boolean {
    if (this.#calls.size > 0 || this.#tasks.size > 0 || this.#creating > 0 || !this.#pool.retires(entry)) return false
    this.#queued = []
    void this.#acquire().then(
      fresh => {
        if (this.#closed) return this.#pool.release(fresh)
        entry.listeners.delete(this.#listener)
        entry.onGone.delete(this.#gone)
        for (const uri of this.#subscribed) {
          entry.unsubscribe(uri)
          void fresh.subscribe(uri)
        }
        this.#pool.release(entry)
        this.#entry = fresh
        fresh.listeners.add(this.#listener)
        fresh.onGone.add(this.#gone)
        this.#flush()
      },
      (err: unknown) => {
        // No fresh child (its credential refused, the process cap): this one serves on, stale as it is.
        this.#entry = entry
        this.#pool.log.warn({ target: this.target, err: (err as Error).message }, 'shared child with a stale credential kept: no fresh one')
        this.#flush()
      }
    )
    return true
  }

  #flush(): void {
    const queued = this.#queued ?? []
    this.#queued = undefined
    for (const m of queued) {
      try {
        this.send(m)
      } catch (err) {
        if (m.id !== undefined && m.id !== null && m.method !== undefined)
          this.#deliver({ jsonrpc: '2.0', id: m.id, error: { code: RPC.CONNECTION_CLOSED, message: (err as Error).message } })
      }
    }
  }

  send(msg: JsonRpcMessage): void {
    if (msg.method === 'initialize' && msg.id !== undefined && msg.id !== null && this.#entry === undefined && !this.#closed) {
      void this.#initialize(msg.id, msg.params ?? {})
      return
    }
    if (this.#queued !== undefined) {
      this.#queued.push(msg)
      return
    }
    const stale = this.#entry
    if (stale !== undefined && !this.#closed && msg.method !== undefined && this.#moveIfStale(stale)) {
      this.#queued!.push(msg)
      return
    }
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
      case 'initialize':
        this.#answerSoon({ jsonrpc: '2.0', id, error: { code: RPC.INVALID_REQUEST, message: 'already initialized' } })
        return
      case 'resources/subscribe':
      case 'resources/unsubscribe': {
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
    const method = msg.method
    const taskMethod = TASK_METHODS.has(method)
    const taskId = taskMethod ? msg.params?.taskId : undefined
    // The child knows every session's tasks; this session may name only its own.
    if (taskMethod && !this.#tasks.has(taskId)) {
      this.#answerSoon({ jsonrpc: '2.0', id, error: { code: RPC.INVALID_PARAMS, message: 'Unknown task' } })
      return
    }
    const augmented = method === 'tools/call' && msg.params?.task !== undefined
    const call = entry.call(msg, this.#hooks)
    this.#calls.set(id, call)
    if (!augmented && !taskMethod && method !== 'tasks/list') {
      // No task in play: the answer goes back as it is, with no task bookkeeping on the hot path.
      void call.done.then(r => {
        if (this.#calls.get(id) !== call) return
        this.#calls.delete(id)
        r.id = id
        this.#deliver(r)
      })
      return
    }
    if (augmented) this.#creating++
    void call.done.then(r => {
      const current = this.#calls.get(id) === call
      const created = current && augmented ? (r.result as { task?: { taskId?: unknown } } | undefined)?.task?.taskId : undefined
      if (current) {
        if (typeof created === 'string') this.#tasks.add(created, true)
        this.#calls.delete(id)
        this.#tasksSeen(method, taskId, r)
        r.id = id
        this.#deliver(r)
      }
      if (augmented) this.#created(typeof created === 'string' ? created : undefined)
    })
  }

  /** What an answer tells of this session's tasks: a terminal one is ended, tasks/list keeps only this session's. */
  #tasksSeen(method: string, taskId: unknown, r: JsonRpcMessage): void {
    const result = r.result as { status?: unknown; tasks?: Array<{ taskId?: unknown }> } | undefined
    if (result === undefined) return
    if (method === 'tasks/list' && Array.isArray(result.tasks)) result.tasks = result.tasks.filter(x => this.#tasks.has(x.taskId))
    else if (method === 'tasks/result' || (TASK_METHODS.has(method) && isTerminal(result.status))) this.#tasks.end(taskId)
  }

  #notification(entry: PooledUpstream, msg: JsonRpcMessage): void {
    switch (msg.method) {
      case 'notifications/initialized':
        return
      case 'notifications/cancelled': {
        const rid = msg.params?.requestId as JsonRpcId | undefined
        const call = rid === undefined ? undefined : this.#calls.get(rid)
        if (call === undefined) return
        this.#calls.delete(rid!)
        // No reason from the client, none upstream (it is optional: MCP 2025-11-25 utilities, Cancellation).
        call.cancel(typeof msg.params?.reason === 'string' ? msg.params.reason : undefined)
        return
      }
      case 'notifications/roots/list_changed':
        // The gateway declared no roots to the shared child.
        return
      default:
        entry.notify(msg)
    }
  }

  #serverRequest(req: JsonRpcMessage): void {
    // A lease bridges to its session (and so declared to the shared child) all but roots.
    const cap = CAPABILITY_OF_REQUEST[req.method!]
    if (cap === undefined || !SHARED_CHILD_BRIDGED.includes(cap) || this.#clientCaps[cap] === undefined || this.#closed) {
      this.#entry?.answer(req.id!, undefined, { code: RPC.METHOD_NOT_FOUND, message: 'Method not found' })
      return
    }
    this.#deliver(req)
  }

  #deliver(msg: JsonRpcMessage): void {
    if (!this.#closed) this.onMessage(msg)
  }

  /** Answers given here, not by the child, still arrive after `send()` returns, as the child's would. */
  #answerSoon(msg: JsonRpcMessage): void {
    queueMicrotask(() => this.#deliver(msg))
  }

  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    const entry = this.#entry
    for (const call of this.#calls.values()) call.cancel('session ended')
    this.#calls.clear()
    this.#early.clear()
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
export function sharedFactory(factory: UpstreamFactory, pool: UpstreamPool, maxTasks: number): SessionUpstreamFactory {
  return {
    ...factory,
    create(_attach?: UpstreamAttachment, owner?: UpstreamOwner): Upstream {
      if (owner === undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `target ${factory.target}: a shared upstream needs its owner`)
      return new SharedUpstream(pool, factory, owner, maxTasks)
    },
  }
}
