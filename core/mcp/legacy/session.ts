/**
 * One MCP session of the session era: its upstreams (one per target), the
 * JSON-RPC id mapping both ways (calls.ts toward the upstreams), the
 * client's SSE streams (one per POST with requests, plus the standalone GET
 * stream) and the routing of upstream messages onto them. Which target a
 * client request goes to is the router's answer (router.ts), shared with
 * the 2026-07-28 era. Knows nothing of HTTP status codes; endpoint.ts does
 * the HTTP side.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { Plugin } from '../../plugin.ts'
import type { JsonRpcId, JsonRpcMessage, Upstream } from '../../targets/types.ts'
import type { SessionUpstreamFactory } from './shared-upstream.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { Backlog, Replay, SseStream, SSE_HEADERS, frame, frameWithId, primingFrame, type StreamLimits } from '../sse.ts'
import { INIT_TIMEOUT_MIN_MS, isSessionRevision, type SessionRevision } from '../protocol.ts'
import { mergeCapabilities } from '../routing/naming.ts'
import { GATEWAY_INFO, NAMED, TASK_METHODS, Router, isListMethod, isNamedMethod, rpcError } from '../routing/router.ts'
import { UpstreamCalls } from '../upstreams/calls.ts'
import { TaskLedger, isTerminal } from '../upstreams/task-ledger.ts'
import type { TargetCallMeter } from '../upstreams/call-metrics.ts'
import { tracer } from '../../observability/tracing.ts'

/** What a session needs from its endpoint. */
export interface SessionEnv {
  readonly log: Logger
  /** Bounds of the session's SSE streams and backlog (sse.ts). */
  readonly streams: StreamLimits
  readonly requestTimeoutMs: number
  readonly failClosed: boolean
  /** Unfinished tasks a session may have (mcp.limits.maxTasksPerSession). */
  readonly maxTasks: number
  /** Plugins that have `allowMcpOperation`; empty means no filtering. */
  readonly checkers: readonly Plugin[]
  /** Call metrics per target name (call-metrics.ts); absent, calls are not measured. */
  readonly meters?: ReadonlyMap<string, TargetCallMeter>
  /** Called once when the session ends, for any reason. */
  readonly onEnd: (session: Session, reason: string) => void
}

/** One upstream request in flight; `done` gets its response (or a synthesized error). */
interface UpstreamCall {
  readonly link: Link
  readonly id: number
  readonly done: (msg: JsonRpcMessage) => void
  /** Epoch ms after which the call is cancelled (`Session.expireCalls`). */
  readonly deadline: number
}

/** One target's upstream within this session. */
interface Link {
  readonly target: string
  readonly upstream: Upstream
  up: boolean
  readonly pending: UpstreamCalls<UpstreamCall>
  /** Client requests currently forwarded to this link, oldest first. */
  readonly active: Set<Inflight>
  initResult: Record<string, unknown> | undefined
}

/** One client request awaiting its answer. */
interface Inflight {
  readonly clientId: JsonRpcId
  readonly exchange: Exchange
  readonly progressToken: unknown
  readonly calls: UpstreamCall[]
  link: Link | undefined
  finished: boolean
}

/**
 * One POST carrying requests: its SSE stream stays open until each request is
 * answered. The client may lose the stream and reconnect with `Last-Event-ID`
 * (a GET): `stream` is then the new response, and what it missed comes from `replay`.
 */
interface Exchange {
  readonly ctx: RequestContext
  stream: SseStream
  open: number
  /** Event ids are `<key>.<seq>`: unique in the session and naming their stream (MCP 2025-11-25 transports, Resumability). */
  readonly key: string
  seq: number
  readonly replay: Replay
}

/** A page of nothing: what a target that is down contributes to a merged list. */
const NO_PAGE: Promise<JsonRpcMessage> = Promise.resolve({ jsonrpc: '2.0', result: {} })

function isResponse (m: JsonRpcMessage): boolean {
  return m.method === undefined
}

export class Session {
  readonly id: string
  readonly subject: string | undefined
  readonly subjectKey: string
  readonly createdAt = Date.now()
  lastActivityAt = Date.now()
  version: SessionRevision
  readonly links: Link[]
  /** More than one target configured: names and URIs are rewritten. */
  readonly multi: boolean
  ended = false
  readonly #env: SessionEnv
  readonly #log: Logger
  /** Client request id -> request, for notifications/cancelled from the client. */
  readonly #inflight = new Map<JsonRpcId, Inflight>()
  readonly #progress = new Map<unknown, Inflight>()
  /** Client-facing id of a server->client request -> where it came from. */
  readonly #serverRequests = new Map<number, { link: Link; id: JsonRpcId }>()
  #serverSeq = 0
  readonly #exchanges = new Set<Exchange>()
  #getStream: SseStream | undefined
  readonly #backlog: Backlog
  readonly #router: Router<Link>
  /** Event ids of the GET stream are `g.<seq>`; what it wrote is kept for a reconnection. */
  #getSeq = 0
  readonly #getReplay: Replay
  #streamSeq = 0
  readonly #undelivered = new Map<string, Exchange>()
  #starting = true
  /**
   * Tasks this session created (client-facing id -> target, tool, progress token), bounded
   * (task-ledger.ts). With per-operation rules a task is the caller's while the tool it runs is allowed.
   */
  readonly #tasks: TaskLedger<{ readonly target: string; readonly tool: string; readonly token: unknown }>
  /** Task-augmented calls not answered yet: each may create a task, so each holds a slot. */
  readonly #taskCalls = new Set<Inflight>()
  /** Progress tokens of task-augmented calls, valid for the task's lifetime (MCP 2025-11-25 tasks) -> client-facing task id. */
  readonly #taskTokens = new Map<unknown, string>()
  /**
   * With per-operation rules: status notifications of tasks the session does not know yet,
   * held while a task-augmented call is in flight (a server may announce a task before its
   * CreateTaskResult); at most the task limit, the oldest dropped first.
   */
  #earlyStatus: JsonRpcMessage[] = []

  constructor (opts: { id: string; subject: string | undefined; subjectKey: string; version: SessionRevision; factories: readonly SessionUpstreamFactory[]; env: SessionEnv }) {
    this.id = opts.id
    this.subject = opts.subject
    this.subjectKey = opts.subjectKey
    this.version = opts.version
    this.#env = opts.env
    this.#log = opts.env.log.child({ session: opts.id.slice(0, 8) })
    this.#backlog = new Backlog(opts.env.streams, this.#log)
    this.#getReplay = new Replay(opts.env.streams.maxBacklogBytes)
    this.#tasks = new TaskLedger(opts.env.maxTasks)
    this.links = opts.factories.map(f => {
      const link: Link = { target: f.target, upstream: f.create({ subjectKey: opts.subjectKey, subject: opts.subject }), up: false, pending: new UpstreamCalls(opts.env.meters?.get(f.target)), active: new Set(), initResult: undefined }
      link.upstream.onMessage = (msg) => this.#fromUpstream(link, msg)
      link.upstream.onClose = (err) => this.#upstreamClosed(link, err)
      return link
    })
    this.#router = new Router(this.links, opts.env.checkers)
    this.multi = this.#router.multi
  }

  get hasGetStream (): boolean { return this.#getStream?.open === true }
  get inFlight (): number { return this.#inflight.size }
  /** Starting, a request in flight, or a GET stream open: not idle. */
  get busy (): boolean { return this.#starting || this.#inflight.size > 0 || this.hasGetStream }

  /**
   * Starts every upstream and runs the initialize handshake with each.
   * Returns the initialize result for the client. Throws a ProxyError (502)
   * when no target (or, fail-closed, any target) could be initialized.
   * `ctx`: the client's initialize request, whose trace the handshakes join.
   */
  async start (params: Record<string, unknown>, ctx?: RequestContext): Promise<Record<string, unknown>> {
    const upParams = { ...params, protocolVersion: this.version }
    const results = await Promise.allSettled(this.links.map(async link => {
      await link.upstream.start()
      const res = await this.#request(link, 'initialize', upParams, undefined, Math.max(this.#env.requestTimeoutMs, INIT_TIMEOUT_MIN_MS), ctx)
      if (res.error !== undefined) throw new Error(res.error.message)
      link.initResult = res.result as Record<string, unknown>
      link.up = true
    }))
    this.#starting = false
    this.lastActivityAt = Date.now()
    const failed = results.flatMap((r, i) => r.status === 'rejected' ? [[this.links[i]!.target, (r.reason as Error).message] as const] : [])
    for (const [target, message] of failed) this.#log.warn({ target, err: message }, 'upstream failed to initialize')
    if (failed.length === this.links.length || (failed.length > 0 && this.#env.failClosed)) {
      await this.end('initialize failed')
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${failed.map(f => f[0]).join(', ')} failed to start`, { rpcCode: RPC.SERVER_ERROR, expose: true })
    }
    if (!this.multi) {
      const r = this.links[0]!.initResult!
      if (isSessionRevision(r.protocolVersion)) this.version = r.protocolVersion
      return { ...r, protocolVersion: this.version }
    }
    const live = this.links.filter(l => l.up)
    const result: Record<string, unknown> = {
      protocolVersion: this.version,
      capabilities: mergeCapabilities(live.map(l => (l.initResult!.capabilities ?? {}) as Record<string, unknown>)),
      serverInfo: GATEWAY_INFO,
    }
    const instructions = this.#router.instructions(live)
    if (instructions !== undefined) result.instructions = instructions
    return result
  }

  /**
   * Handles the messages of one POST. Without requests: forwards and answers
   * 202. With requests: answers 200 with an SSE stream that ends after the
   * last result.
   */
  async receive (ctx: RequestContext, body: JsonRpcMessage | JsonRpcMessage[]): Promise<void> {
    this.lastActivityAt = Date.now()
    const list = Array.isArray(body) ? body : undefined
    const single = Array.isArray(body) ? undefined : body
    let requests = 0
    if (single !== undefined) {
      if (single.method !== undefined && single.id !== undefined) requests = 1
      else this.#clientNotice(single)
    } else {
      for (const m of list!) {
        if (m.method !== undefined && m.id !== undefined) requests++
        else this.#clientNotice(m)
      }
    }
    if (requests === 0) {
      await ctx.writeHead(202, { 'content-length': 0 })
      ctx.res.end()
      return
    }
    await ctx.writeHead(200, { ...SSE_HEADERS, 'mcp-session-id': this.id })
    const stream = new SseStream(ctx.res, this.#env.streams)
    const exchange: Exchange = { ctx, stream, open: requests, key: `p${++this.#streamSeq}`, seq: 0, replay: new Replay(this.#env.streams.maxBacklogBytes) }
    this.#exchanges.add(exchange)
    stream.onClose(() => this.#exchangeClosed(exchange, stream))
    stream.sendFrame(primingFrame(`${exchange.key}.0`))
    if (this.#env.streams.pollAfterMs > 0) this.#pollLater(exchange, stream)
    if (single !== undefined) this.#clientRequest(exchange, single)
    else for (const m of list!) if (m.method !== undefined && m.id !== undefined) this.#clientRequest(exchange, m)
  }

  /**
   * Attaches the standalone GET stream; false when one is already open. With the id of
   * an event of an earlier GET stream, the events written after it are sent first.
   */
  attachGetStream (stream: SseStream, lastEventId?: string): boolean {
    if (this.#getStream?.open === true) return false
    this.#getStream = stream
    this.lastActivityAt = Date.now()
    stream.onClose(() => {
      if (this.#getStream === stream) this.#getStream = undefined
      this.lastActivityAt = Date.now()
    })
    const m = lastEventId === undefined ? null : /^g\.(\d+)$/.exec(lastEventId)
    if (m !== null) for (const event of this.#getReplay.after(Number(m[1]))) if (!stream.sendFrame(event)) return true
    this.#backlog.drain(event => this.#getWrite(event))
    return true
  }

  /** Whether `lastEventId` names an event of a POST stream this session still knows. */
  canResume (lastEventId: string): boolean {
    return this.#resumable(lastEventId) !== undefined
  }

  /**
   * Continues a POST stream the client lost (GET with `Last-Event-ID`, MCP 2025-11-25
   * transports, Resumability): the events after that id, then, while its requests
   * are in flight, the rest as it comes; ends once they are answered.
   */
  resume (lastEventId: string, stream: SseStream): void {
    const found = this.#resumable(lastEventId)
    if (found === undefined) { stream.end(); return }
    const [ex, seq] = found
    this.lastActivityAt = Date.now()
    for (const event of ex.replay.after(seq)) if (!stream.sendFrame(event)) return
    if (ex.open === 0) { stream.end(); return }
    const old = ex.stream
    ex.stream = stream
    stream.onClose(() => this.#exchangeClosed(ex, stream))
    old.end()
  }

  /**
   * Polling (mcp.streams.pollAfterMs, off by default): the stream of an exchange still
   * running after that long is closed, so that no stream outlives a balancer's idle
   * timeout; the client reconnects with Last-Event-ID after the `retry:` of the priming
   * event (MCP 2025-11-25 transports, SEP-1699: a server MAY close the connection after
   * an event with an id). Its requests go on, and their answers wait in the replay buffer.
   * Once: the stream that resumes it stays until the answers (a client resumes once, then
   * reads to the end, as the conformance suite's server-sse-polling does).
   */
  #pollLater (ex: Exchange, stream: SseStream): void {
    const after = this.#env.streams.pollAfterMs
    const timer = setTimeout(() => {
      if (ex.stream !== stream || ex.open === 0 || !stream.open) return
      this.#log.debug({ stream: ex.key, open: ex.open }, 'POST stream polled: closed before its answers (mcp.streams.pollAfterMs); the client resumes with Last-Event-ID')
      stream.end()
    }, after)
    timer.unref()
    stream.onClose(() => clearTimeout(timer))
  }

  #resumable (lastEventId: string): [Exchange, number] | undefined {
    const m = /^(p\d+)\.(\d+)$/.exec(lastEventId)
    if (m === null) return undefined
    for (const ex of this.#exchanges) if (ex.key === m[1]) return [ex, Number(m[2])]
    const done = this.#undelivered.get(m[1]!)
    return done === undefined ? undefined : [done, Number(m[2])]
  }

  keepAlive (): void {
    this.#getStream?.keepAlive()
  }

  /** Ends the session: pending requests get an error, streams end, upstreams close (children die). */
  async end (reason: string): Promise<void> {
    if (this.ended) return
    this.ended = true
    this.#log.info({ reason }, 'session ended')
    for (const link of this.links) this.#failPending(link, `session ended: ${reason}`)
    this.#getStream?.end()
    for (const ex of this.#exchanges) ex.stream.end()
    this.#exchanges.clear()
    this.#undelivered.clear()
    this.#env.onEnd(this, reason)
    await Promise.allSettled(this.links.map(l => { l.up = false; return l.upstream.close() }))
  }

  // ---- client -> upstream ------------------------------------------------

  #clientNotice (msg: JsonRpcMessage): void {
    if (isResponse(msg)) {
      const entry = typeof msg.id === 'number' ? this.#serverRequests.get(msg.id) : undefined
      if (entry === undefined) {
        this.#log.debug({ id: msg.id }, 'client answered an unknown server request')
        return
      }
      this.#serverRequests.delete(msg.id as number)
      msg.id = entry.id
      this.#router.unmarkTasks(msg)
      this.#sendQuietly(entry.link, msg)
      return
    }
    if (msg.method === 'notifications/cancelled') {
      const reqId = msg.params?.requestId as JsonRpcId | undefined
      const inflight = reqId === undefined ? undefined : this.#inflight.get(reqId)
      const reason = msg.params?.reason
      if (inflight !== undefined) this.#abandon(inflight, typeof reason === 'string' ? reason : undefined)
      return
    }
    for (const link of this.links) this.#sendQuietly(link, msg)
  }

  /** Fire-and-forget send: a closed upstream reports itself through onClose. */
  #sendQuietly (link: Link, msg: JsonRpcMessage): void {
    if (!link.up) return
    try {
      link.upstream.send(msg)
    } catch (err) {
      this.#log.debug({ target: link.target, err: (err as Error).message }, 'send to a closed upstream')
    }
  }

  #clientRequest (exchange: Exchange, msg: JsonRpcMessage): void {
    const meta = msg.params?._meta as Record<string, unknown> | undefined
    const inflight: Inflight = {
      clientId: msg.id as JsonRpcId, exchange, progressToken: meta?.progressToken, calls: [], link: undefined, finished: false,
    }
    this.#inflight.set(inflight.clientId, inflight)
    if (inflight.progressToken !== undefined) this.#progress.set(inflight.progressToken, inflight)
    try {
      this.#dispatch(inflight, msg)
    } catch (err) {
      this.#log.error({ err, method: msg.method }, 'failed to dispatch request')
      this.#reply(inflight, rpcError(RPC.INTERNAL_ERROR, 'internal error'))
    }
  }

  /**
   * Routes one client request (router.ts): named items to their target
   * (refused ones under a stand-in name), lists merged over every target,
   * completions by their reference. One target: every other method goes to
   * it unchanged; several: methods the gateway cannot route are unknown.
   */
  #dispatch (inflight: Inflight, msg: JsonRpcMessage): void {
    const method = msg.method!
    if (method === 'ping') {
      this.#reply(inflight, { jsonrpc: '2.0', result: {} })
      return
    }
    if (method === 'initialize') {
      this.#reply(inflight, rpcError(RPC.INVALID_REQUEST, 'session already initialized'))
      return
    }
    const named = isNamedMethod(method) ? NAMED[method] : undefined
    if (named !== undefined) {
      this.#named(inflight, msg, method, named.kind, named.field)
      return
    }
    if (TASK_METHODS.has(method)) {
      this.#task(inflight, msg, method)
      return
    }
    if (method === 'tasks/list') {
      this.#listTasks(inflight, msg)
      return
    }
    const router = this.#router
    if (isListMethod(method)) {
      if (router.multi) {
        void router.mergeLists(inflight.exchange.ctx, method, (link, params) => link.up || params.cursor !== undefined ? this.#request(link, method, params, inflight) : NO_PAGE, () => inflight.finished, this.#log, this.#env.failClosed)
          .then(r => this.#reply(inflight, r))
        return
      }
      const link = this.links[0]!
      this.#forward(inflight, link, msg, router.checkers.length === 0
        ? undefined
        : (r) => {
            const invalid = router.checkList(link.target, method, r.result)
            if (invalid === undefined) {
              router.filterResult(inflight.exchange.ctx, method, r.result, link.target)
              return r
            }
            this.#log.warn({ target: link.target, method, err: invalid.message }, 'invalid upstream list result')
            return rpcError(invalid.code, invalid.message)
          })
      return
    }
    if (method === 'completion/complete' && (router.multi || router.checkers.length > 0)) {
      this.#complete(inflight, msg)
      return
    }
    if (!router.multi) {
      this.#forward(inflight, this.links[0]!, msg, undefined)
      return
    }
    switch (method) {
      case 'logging/setLevel':
        void this.#fanOutSetLevel(inflight, msg)
        return
      default:
        this.#reply(inflight, rpcError(RPC.METHOD_NOT_FOUND, `Method not found: ${method}`))
    }
  }

  /** completion/complete: to the target of its reference; one the rules deny under a stand-in (router.ts). */
  #complete (inflight: Inflight, msg: JsonRpcMessage): void {
    const routed = this.#router.completion(inflight.exchange.ctx, msg.params?.ref as { type?: string; name?: unknown; uri?: unknown } | undefined)
    if (routed === undefined) this.#reply(inflight, rpcError(RPC.INVALID_PARAMS, 'Unknown completion reference'))
    else this.#forward(inflight, routed.target, msg, routed.standIn?.restore, routed.standIn !== undefined)
  }

  /** tools/call, prompts/get, resources/read and (un)subscribe: to the item's target, refused ones under a stand-in. */
  #named (inflight: Inflight, msg: JsonRpcMessage, method: string, kind: 'tool' | 'prompt' | 'resource', field: 'name' | 'uri'): void {
    const router = this.#router
    const params = msg.params ?? {}
    const routed = router.route(kind, params[field])
    if ('answer' in routed) {
      this.#reply(inflight, routed.answer)
      return
    }
    const { target: link, name } = routed
    const read = method === 'resources/read'
    // A subscription the rules deny goes on under a stand-in too: the upstream never hears of the
    // denied URI, and the answer is its answer for a URI it does not have.
    const ctx = inflight.exchange.ctx
    const refused = kind !== 'resource' || read
      ? router.refuse(ctx, method, kind, String(name), link.target)
      : router.refuseWatch(ctx, String(name), link.target)
    if (refused !== undefined) {
      params[field] = refused.value
      this.#forward(inflight, link, msg, read ? (r) => router.markContents(link.target, refused.restore(r)) : refused.restore, true)
      return
    }
    // The upstream's own name (several targets), or the URI the rules saw (resource-uri.ts).
    params[field] = name
    const augmented = kind === 'tool' && params.task !== undefined
    if (augmented) {
      if (this.#tasks.full(this.#taskCalls.size)) {
        const limit = this.#tasks.limit
        this.#log.warn({ target: link.target, tool: String(name), limit }, 'task-augmented call refused: too many unfinished tasks (mcp.limits.maxTasksPerSession)')
        this.#reply(inflight, rpcError(RPC.SERVER_ERROR, `Too many tasks: this session has ${limit} unfinished tasks (mcp.limits.maxTasksPerSession: ${limit}); wait for one to end`))
        return
      }
      this.#taskCalls.add(inflight)
    }
    // Several targets: URIs inside answers are the gateway's (resources/read contents; links and embedded resources of calls and prompts).
    let mark: ((r: JsonRpcMessage) => JsonRpcMessage) | undefined
    if (router.multi && read) mark = (r) => router.markContents(link.target, r)
    else if (augmented) mark = (r) => this.#taskCreated(inflight, link.target, String(name), router.markTasks(link.target, r))
    else if (router.multi && kind !== 'resource') mark = (r) => router.markUris(link.target, r)
    this.#forward(inflight, link, msg, mark)
  }

  /**
   * A task-augmented tools/call was answered (MCP 2025-11-25 tasks): with a task, the
   * session remembers it (which tool it runs, for the rules) and its progress token
   * stays valid while it runs. Without a task it was a plain result.
   */
  #taskCreated (inflight: Inflight, target: string, tool: string, r: JsonRpcMessage): JsonRpcMessage {
    const task = (r.result as { task?: { taskId?: unknown; status?: unknown } } | undefined)?.task
    const taskId = task?.taskId
    if (typeof taskId !== 'string') return this.#router.markUris(target, r)
    this.#tasks.add(taskId, { target, tool, token: inflight.progressToken })
    if (inflight.progressToken !== undefined) this.#taskTokens.set(inflight.progressToken, taskId)
    if (isTerminal(task?.status)) this.#taskEnded(taskId)
    const held = this.#earlyStatus.filter(m => m.params?.taskId === taskId)
    if (held.length > 0) {
      this.#earlyStatus = this.#earlyStatus.filter(m => m.params?.taskId !== taskId)
      // After the result, which is written once this returns.
      queueMicrotask(() => { for (const m of held) if (!this.ended) this.#taskStatus(m) })
    }
    return r
  }

  /** Whether the caller may use the task (client-facing id): always without per-operation rules. */
  #mayUseTask (ctx: RequestContext, taskId: unknown): boolean {
    if (this.#router.checkers.length === 0) return true
    const task = this.#tasks.get(taskId)
    return task !== undefined && this.#router.allows(ctx, 'tools/call', 'tool', task.tool, task.target)
  }

  /** tasks/get, tasks/result, tasks/cancel: to the task's target under its own id. */
  #task (inflight: Inflight, msg: JsonRpcMessage, method: string): void {
    const router = this.#router
    const taskId = msg.params?.taskId
    const r = router.resolveTask(taskId)
    if (r === undefined || !this.#mayUseTask(inflight.exchange.ctx, taskId)) {
      this.#reply(inflight, rpcError(RPC.INVALID_PARAMS, `Unknown task: ${String(taskId)}`))
      return
    }
    msg.params!.taskId = r.taskId
    const target = r.target.target
    // A result given, a cancellation answered or a terminal status seen: the task has ended.
    this.#forward(inflight, r.target, msg, (resp) => {
      if (method !== 'tasks/get' || isTerminal((resp.result as { status?: unknown } | undefined)?.status)) this.#taskEnded(taskId as string)
      router.markTasks(target, resp)
      return method === 'tasks/result' ? router.markUris(target, resp) : resp
    })
  }

  /** The task has ended: its slot is free (it stays known a while: task-ledger.ts) and its progress token is spent. */
  #taskEnded (taskId: string): void {
    const task = this.#tasks.get(taskId)
    this.#tasks.end(taskId)
    if (task?.token !== undefined && this.#taskTokens.get(task.token) === taskId) this.#taskTokens.delete(task.token)
  }

  /** tasks/list: one target's, or merged over the targets that list tasks; with rules, only the caller's tasks. */
  #listTasks (inflight: Inflight, msg: JsonRpcMessage): void {
    const router = this.#router
    const ctx = inflight.exchange.ctx
    const mine = router.checkers.length === 0
      ? undefined
      : (r: JsonRpcMessage): JsonRpcMessage => {
          const result = r.result as { tasks?: Array<{ taskId?: unknown }> } | undefined
          if (Array.isArray(result?.tasks)) result.tasks = result.tasks.filter(x => this.#mayUseTask(ctx, x.taskId))
          return r
        }
    if (!router.multi) {
      this.#forward(inflight, this.links[0]!, msg, mine)
      return
    }
    const listing = new Set(this.links.filter(l => l.up && (l.initResult?.capabilities as { tasks?: { list?: unknown } } | undefined)?.tasks?.list !== undefined))
    if (listing.size === 0) {
      this.#reply(inflight, rpcError(RPC.METHOD_NOT_FOUND, 'Method not found: tasks/list'))
      return
    }
    void router.mergeLists(ctx, 'tasks/list', (link, params) => listing.has(link) ? this.#request(link, 'tasks/list', params, inflight) : NO_PAGE, () => inflight.finished, this.#log, this.#env.failClosed)
      .then(r => this.#reply(inflight, mine === undefined ? r : mine(r)))
  }

  async #fanOutSetLevel (inflight: Inflight, msg: JsonRpcMessage): Promise<void> {
    const rs = await Promise.all(this.links.filter(l => l.up).map(l => this.#request(l, 'logging/setLevel', msg.params ?? {}, inflight)))
    const err = rs.find(r => r.error !== undefined)
    this.#reply(inflight, err !== undefined && (this.#env.failClosed || rs.every(r => r.error !== undefined)) ? rpcError(err.error!.code, err.error!.message) : { jsonrpc: '2.0', result: {} })
  }

  /** Sends a client request upstream under a fresh upstream id; the answer goes back under the client's id. */
  /** `post` rewrites the answer: results only, unless `postErrors` (stand-ins for refused calls rewrite errors too). */
  #forward (inflight: Inflight, link: Link, msg: JsonRpcMessage, post: ((r: JsonRpcMessage) => JsonRpcMessage) | undefined, postErrors = false): void {
    if (!link.up) {
      this.#reply(inflight, rpcError(RPC.SERVER_ERROR, `upstream ${link.target} unavailable`))
      return
    }
    inflight.link = link
    // The access log's target (the first one routed to, as the log's method is the first message's).
    inflight.exchange.ctx.target ??= link.target
    link.active.add(inflight)
    const traced = tracer?.upstreamCall(inflight.exchange.ctx, link.target, msg)
    const call = this.#send(link, msg, (r) => {
      traced?.(r)
      this.#reply(inflight, post === undefined || (r.error !== undefined && !postErrors) ? r : this.#rewrite(link, msg.method!, r, post))
    })
    if (call !== undefined) inflight.calls.push(call)
  }

  /**
   * An upstream answer rewritten for the client. A rewrite that fails on a malformed
   * answer fails this request only (-32603 naming the target), never the session: the
   * answer arrives in the upstream's message handler, where a throw would leave the
   * request unanswered and the session and its child pinned.
   */
  #rewrite (link: Link, method: string, r: JsonRpcMessage, post: (r: JsonRpcMessage) => JsonRpcMessage): JsonRpcMessage {
    try {
      return post(r)
    } catch (err) {
      this.#log.warn({ target: link.target, method, err: (err as Error).message }, 'invalid upstream answer')
      return rpcError(RPC.INTERNAL_ERROR, `upstream ${link.target} answered an invalid ${method} result`)
    }
  }

  /** A request of the gateway's own (initialize, list pages, fan-outs). */
  /** `ctx`: the client request this serves (for its trace), when there is no `inflight` (initialize). */
  #request (link: Link, method: string, params: Record<string, unknown>, inflight: Inflight | undefined, timeoutMs = this.#env.requestTimeoutMs, ctx = inflight?.exchange.ctx): Promise<JsonRpcMessage> {
    return new Promise(resolve => {
      const msg: JsonRpcMessage = { jsonrpc: '2.0', method, params }
      const traced = ctx === undefined ? undefined : tracer?.upstreamCall(ctx, link.target, msg)
      const call = this.#send(link, msg, traced === undefined ? resolve : (r) => { traced(r); resolve(r) }, timeoutMs)
      if (call !== undefined) inflight?.calls.push(call)
    })
  }

  #send (link: Link, msg: JsonRpcMessage, done: (r: JsonRpcMessage) => void, timeoutMs = this.#env.requestTimeoutMs): UpstreamCall | undefined {
    const id = link.pending.nextId()
    msg.id = id
    const call: UpstreamCall = { link, id, done, deadline: Date.now() + timeoutMs }
    link.pending.add(call, msg)
    try {
      link.upstream.send(msg)
    } catch {
      link.pending.remove(call)
      done(rpcError(RPC.CONNECTION_CLOSED, `upstream ${link.target} closed`))
      return undefined
    }
    return call
  }

  /**
   * Cancels the upstream calls past their deadline. The endpoint calls this
   * on one shared timer instead of a timer per request.
   */
  expireCalls (now: number): void {
    for (const link of this.links) {
      if (link.pending.size === 0) continue
      for (const call of link.pending.values()) if (call.deadline <= now) this.#timedOut(call)
    }
  }

  #timedOut (call: UpstreamCall): void {
    const { link, id } = call
    if (!link.pending.remove(call)) return
    this.#cancelUpstream(link, id, 'request timed out')
    call.done(rpcError(RPC.REQUEST_TIMEOUT, 'Request timed out'))
  }

  /** `reason` absent: none is sent (it is optional, MCP 2025-11-25 utilities, Cancellation). */
  #cancelUpstream (link: Link, id: number, reason: string | undefined): void {
    this.#sendQuietly(link, { jsonrpc: '2.0', method: 'notifications/cancelled', params: reason === undefined ? { requestId: id } : { requestId: id, reason } })
  }

  /**
   * The client cancelled a request: its upstream calls are cancelled under their
   * upstream ids with the client's own reason (the gateway's reasons are only for
   * what the gateway cancels itself: timeouts, the session's end).
   */
  #abandon (inflight: Inflight, reason: string | undefined): void {
    if (inflight.finished) return
    for (const call of inflight.calls) {
      if (!call.link.pending.remove(call)) continue
      this.#cancelUpstream(call.link, call.id, reason)
    }
    this.#finish(inflight)
    const ex = inflight.exchange
    if (--ex.open === 0) this.#closeExchange(ex)
  }

  #finish (inflight: Inflight): void {
    inflight.finished = true
    this.#inflight.delete(inflight.clientId)
    if (this.#taskCalls.size > 0 && this.#taskCalls.delete(inflight) && this.#taskCalls.size === 0) this.#earlyStatus = []
    if (inflight.progressToken !== undefined) this.#progress.delete(inflight.progressToken)
    inflight.link?.active.delete(inflight)
    this.lastActivityAt = Date.now()
  }

  #reply (inflight: Inflight, msg: JsonRpcMessage): void {
    if (inflight.finished) return
    this.#finish(inflight)
    msg.id = inflight.clientId
    const ex = inflight.exchange
    if (--ex.open > 0) {
      this.#emit(ex, msg)
      return
    }
    const delivered = ex.stream.open
    this.#emit(ex, msg, true)
    this.#exchanges.delete(ex)
    if (delivered) return
    // Nobody holds the stream: its answers wait for a GET with Last-Event-ID.
    this.#undelivered.set(ex.key, ex)
    if (this.#undelivered.size > this.#env.streams.maxResumableStreams) this.#undelivered.delete(this.#undelivered.keys().next().value!)
  }

  /** Writes one message on an exchange's stream, with its id, and keeps it for a reconnection. */
  #emit (ex: Exchange, msg: JsonRpcMessage, last = false): void {
    const seq = ++ex.seq
    const event = frameWithId(`${ex.key}.${seq}`, frame(msg))
    ex.replay.push(seq, event)
    if (last) ex.stream.endFrame(event)
    else ex.stream.sendFrame(event)
  }

  /** Writes one event on the GET stream with the next id; false when there is none. */
  #getWrite (event: string): boolean {
    if (this.#getStream?.open !== true) return false
    const seq = ++this.#getSeq
    const withId = frameWithId(`g.${seq}`, event)
    this.#getReplay.push(seq, withId)
    return this.#getStream.sendFrame(withId)
  }

  #closeExchange (ex: Exchange): void {
    this.#exchanges.delete(ex)
    ex.stream.end()
  }

  /**
   * The client went away from a POST stream. Its requests go on: a disconnect is not a
   * cancellation (MCP 2025-11-25 transports, "Sending Messages to the Server"); only
   * notifications/cancelled, the request timeout or the session's end stop them.
   */
  #exchangeClosed (ex: Exchange, stream: SseStream): void {
    if (ex.stream !== stream) return
    if (ex.open === 0) { this.#exchanges.delete(ex); return }
    this.#log.debug({ stream: ex.key, open: ex.open }, 'POST stream closed before its answers; requests go on (resumable with Last-Event-ID)')
  }

  // ---- upstream -> client ------------------------------------------------

  #fromUpstream (link: Link, msg: JsonRpcMessage): void {
    if (this.ended) return
    if (msg.method === undefined) {
      const call = link.pending.answered(msg)
      if (call === undefined) {
        this.#log.debug({ target: link.target, id: msg.id }, 'upstream answered an unknown request')
        return
      }
      call.done(msg)
      return
    }
    if (msg.id !== undefined && msg.id !== null) {
      const cid = ++this.#serverSeq
      this.#serverRequests.set(cid, { link, id: msg.id })
      msg.id = cid
      if (this.multi && msg.params?._meta !== undefined) this.#router.markTasks(link.target, msg)
      this.#deliver(msg, this.#relatedStream(link))
      return
    }
    switch (msg.method) {
      case 'notifications/progress': {
        const inflight = this.#progress.get(msg.params?.progressToken)
        if (inflight !== undefined) { this.#emit(inflight.exchange, msg); return }
        // A task's progress outlives the call that created it (MCP 2025-11-25 tasks).
        if (this.#taskTokens.has(msg.params?.progressToken)) break
        // Its request was answered or cancelled: the client no longer knows the token
        // (MCP 2025-11-25 utilities, Progress: tokens are valid only while the request is active).
        this.#log.debug({ target: link.target }, 'progress for a request no longer in flight dropped')
        return
      }
      case 'notifications/cancelled': {
        const rid = msg.params?.requestId
        let found: number | undefined
        for (const [cid, e] of this.#serverRequests) if (e.link === link && e.id === rid) { found = cid; break }
        if (found === undefined) return
        this.#serverRequests.delete(found)
        msg.params!.requestId = found
        break
      }
      case 'notifications/resources/updated':
        if (typeof msg.params?.uri === 'string') msg.params.uri = this.#router.clientUri(link.target, msg.params.uri)
        break
      case 'notifications/tasks/status': {
        this.#router.markTasks(link.target, msg)
        const taskId = msg.params?.taskId
        // With rules, only the session's own tasks (its children are its own, but a shared child is its subject's).
        if (this.#router.checkers.length > 0 && !this.#tasks.has(taskId)) {
          if (this.#taskCalls.size > 0 && typeof taskId === 'string') {
            if (this.#earlyStatus.length >= this.#tasks.limit) this.#earlyStatus.shift()
            this.#earlyStatus.push(msg)
          }
          return
        }
        this.#taskStatus(msg)
        return
      }
    }
    if (this.multi && msg.params?._meta !== undefined) this.#router.markTasks(link.target, msg)
    this.#deliver(msg, undefined)
  }

  /** A task's status for the client (task id as the client knows it); a terminal one ends the task. */
  #taskStatus (msg: JsonRpcMessage): void {
    const taskId = msg.params?.taskId
    if (typeof taskId === 'string' && isTerminal(msg.params?.status)) this.#taskEnded(taskId)
    this.#deliver(msg, undefined)
  }

  /**
   * A server->client request over stdio carries no link to the client
   * request that caused it; the latest client request in flight on the same
   * target is the best guess (MCP: related messages SHOULD use that stream).
   */
  #relatedStream (link: Link): Exchange | undefined {
    let found: Exchange | undefined
    for (const inflight of link.active) if (inflight.exchange.stream.open) found = inflight.exchange
    return found
  }

  /** Preferred stream, else the GET stream, else the newest open POST stream, else the backlog. */
  #deliver (msg: JsonRpcMessage, preferred: Exchange | undefined): void {
    if (preferred?.stream.open === true) { this.#emit(preferred, msg); return }
    if (this.#getStream?.open === true && this.#getWrite(frame(msg))) return
    let last: Exchange | undefined
    for (const ex of this.#exchanges) if (ex.stream.open) last = ex
    if (last !== undefined) { this.#emit(last, msg); return }
    this.#backlog.push(msg)
  }

  #failPending (link: Link, message: string): void {
    for (const call of link.pending.drain()) {
      call.done(rpcError(RPC.CONNECTION_CLOSED, message))
    }
  }

  #upstreamClosed (link: Link, err: Error | undefined): void {
    const wasUp = link.up
    link.up = false
    if (this.ended) return
    this.#log.warn({ target: link.target, err: err?.message }, 'upstream closed')
    this.#failPending(link, `upstream ${link.target} closed`)
    for (const [cid, e] of this.#serverRequests) if (e.link === link) this.#serverRequests.delete(cid)
    if (!wasUp) return // still starting: start() reports it
    if (!this.multi || this.#env.failClosed || !this.links.some(l => l.up)) void this.end(`upstream ${link.target} closed`)
  }
}
