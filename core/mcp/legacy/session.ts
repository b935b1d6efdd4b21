/**
 * One MCP session of the session era: the life of its client requests (in
 * flight, forwarded to its upstreams, answered, cancelled; one link per
 * target: session-link.ts), the JSON-RPC id mapping both ways, and the routing
 * of upstream messages onto the client's SSE streams (session-streams.ts); its
 * tasks are session-tasks.ts. Which target a client request goes to is
 * session-dispatch.ts's, over the target namespace (routing/namespace.ts)
 * shared with the 2026-07-28 era. Knows nothing of HTTP status codes;
 * endpoint.ts does the HTTP side. A session owns its upstreams for one caller
 * key and keeps that key's latest Caller (../credentials.ts): a target with
 * `auth` gets its credential, awaited before a POST's answer begins.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { Plugin } from '../../plugin.ts'
import type { JsonRpcId, JsonRpcMessage } from '../../targets/types.ts'
import type { SessionUpstreamFactory, UpstreamOwner } from './shared-upstream.ts'
import { ProxyError, RPC } from '../../errors.ts'
import {
  authOf,
  callerOf,
  credentialReady,
  isCredentialRefusal,
  keyOnlyCaller,
  mayStandIn,
  refusalAmong,
  refusalText,
  upstreamFor,
  type Caller,
  type CredentialBroker,
} from '../credentials.ts'
import type { SseStream, StreamLimits } from '../sse.ts'
import { SessionStreams, type PostStream } from './session-streams.ts'
import { SessionTasks } from './session-tasks.ts'
import { GATEWAY_INFO, INIT_TIMEOUT_MIN_MS, isListMethod, isSessionRevision, rpcError, type SessionRevision } from '../protocol.ts'
import { mergeCapabilities } from '../routing/naming.ts'
import { TargetNamespace } from '../routing/namespace.ts'
import { SessionLink, type Inflight } from './session-link.ts'
import { dispatch, route, type Route, type SessionRoutes } from './session-dispatch.ts'
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
  /** The targets' credential sources (../credentials.ts); absent: no target has `auth`. */
  readonly credentials?: CredentialBroker
  /** Called once when the session ends, for any reason. */
  readonly onEnd: (session: Session, reason: string) => void
}

function isResponse(m: JsonRpcMessage): boolean {
  return m.method === undefined
}

/** The route of a request whose routing threw: answered with an internal error once its stream is open. */
const FAILED: Route = Object.freeze({})

export class Session implements UpstreamOwner {
  readonly id: string
  readonly subject: string | undefined
  readonly subjectKey: string
  /** The latest caller of this session (its subject key): updated by each POST when a target has `auth`. */
  caller: Caller
  readonly createdAt = Date.now()
  lastActivityAt = Date.now()
  version: SessionRevision
  readonly links: SessionLink[]
  /** More than one target configured: names and URIs are rewritten. */
  readonly multi: boolean
  ended = false
  readonly #env: SessionEnv
  readonly #log: Logger
  /** Client request id -> request, for notifications/cancelled from the client. */
  readonly #inflight = new Map<JsonRpcId, Inflight>()
  readonly #progress = new Map<unknown, Inflight>()
  /** Client-facing id of a server->client request -> where it came from. */
  readonly #serverRequests = new Map<number, { link: SessionLink; id: JsonRpcId }>()
  #serverSeq = 0
  readonly #namespace: TargetNamespace<SessionLink>
  #starting = true
  /** The initialize params the targets were started with (a target revived later gets the same). */
  #initParams: Record<string, unknown> = {}
  readonly #streams: SessionStreams
  readonly #tasks: SessionTasks<Inflight>
  /** What session-dispatch.ts routes a client request with. */
  readonly #routes: SessionRoutes
  /** Some target has `auth`: the caller is kept current and requests await their credential. */
  readonly #credentialed: boolean

  constructor(opts: {
    id: string
    subject: string | undefined
    subjectKey: string
    version: SessionRevision
    factories: readonly SessionUpstreamFactory[]
    env: SessionEnv
    /** The caller of the initialize (default: the key alone, no token). */
    caller?: Caller
  }) {
    this.id = opts.id
    this.subject = opts.subject
    this.subjectKey = opts.subjectKey
    this.caller = opts.caller ?? keyOnlyCaller(opts.subjectKey, opts.subject)
    this.version = opts.version
    this.#env = opts.env
    this.#log = opts.env.log.child({ session: opts.id.slice(0, 8) })
    this.#streams = new SessionStreams(opts.env.streams, this.#log, () => {
      this.lastActivityAt = Date.now()
    })
    this.links = opts.factories.map(f => {
      const auth = authOf(opts.env.credentials, f.target)
      // A shared lease acquires a pooled child for this session's caller; any other upstream is this session's own.
      const upstream = f.share === 'subject' ? f.create(undefined, this) : upstreamFor(f, auth, this, this.#log)
      const link = new SessionLink(f.target, upstream, this.#log, opts.env.meters?.get(f.target), auth)
      link.upstream.onMessage = msg => this.#fromUpstream(link, msg)
      link.upstream.onClose = err => this.#upstreamClosed(link, err)
      return link
    })
    this.#credentialed = this.links.some(l => l.auth !== undefined)
    this.#namespace = new TargetNamespace(this.links, opts.env.checkers)
    this.multi = this.#namespace.multi
    this.#tasks = new SessionTasks(this.#namespace, opts.env.maxTasks, m => {
      if (!this.ended) this.#streams.deliver(m, undefined)
    })
    this.#routes = {
      links: this.links,
      namespace: this.#namespace,
      tasks: this.#tasks,
      log: this.#log,
      failClosed: opts.env.failClosed,
      reply: (inflight, msg) => this.#reply(inflight, msg),
      forward: (inflight, link, msg, post, postErrors) => this.#forward(inflight, link, msg, post, postErrors),
      request: (link, method, params, inflight) => this.#request(link, method, params, inflight),
      mayStandIn: link => mayStandIn(link.auth, this.caller),
    }
  }

  get hasGetStream(): boolean {
    return this.#streams.hasGetStream
  }
  get inFlight(): number {
    return this.#inflight.size
  }
  /** Starting, a request in flight, or a GET stream open: not idle. */
  get busy(): boolean {
    return this.#starting || this.#inflight.size > 0 || this.hasGetStream
  }

  /**
   * Starts every upstream and runs the initialize handshake with each.
   * Returns the initialize result for the client. Throws a ProxyError (502)
   * when no target (or, fail-closed, any target) could be initialized.
   * `ctx`: the client's initialize request, whose trace the handshakes join.
   */
  async start(params: Record<string, unknown>, ctx?: RequestContext): Promise<Record<string, unknown>> {
    const upParams = { ...params, protocolVersion: this.version }
    this.#initParams = upParams
    const results = await Promise.allSettled(
      this.links.map(async link => {
        try {
          await this.#startLink(link, ctx)
        } catch (err) {
          // A target whose credential is refused is left out like one that is down (logged with its
          // code), until a request that reaches it comes with a credential that resolves (#revive).
          link.refused = isCredentialRefusal(err)
          throw err
        }
      })
    )
    this.#starting = false
    this.lastActivityAt = Date.now()
    const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [[this.links[i]!.target, (r.reason as Error).message] as const] : []))
    for (const [target, message] of failed) this.#log.warn({ target, err: message }, 'upstream failed to initialize')
    if (failed.length === this.links.length || (failed.length > 0 && this.#env.failClosed)) {
      await this.end('initialize failed')
      // The session is refused: a refused credential among the causes is the answer (status, challenge).
      const refusal = refusalAmong(results.flatMap(r => (r.status === 'rejected' ? [r.reason] : [])))
      if (refusal !== undefined) throw refusal
      throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `upstream ${failed.map(f => f[0]).join(', ')} failed to start`, {
        rpcCode: RPC.SERVER_ERROR,
        expose: true,
      })
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
    const instructions = this.#namespace.instructions(live)
    if (instructions !== undefined) result.instructions = instructions
    return result
  }

  /**
   * Handles the messages of one POST. Without requests: forwards and answers
   * 202. With requests: answers 200 with an SSE stream that ends after the
   * last result.
   */
  async receive(ctx: RequestContext, body: JsonRpcMessage | JsonRpcMessage[]): Promise<void> {
    this.lastActivityAt = Date.now()
    // A refreshed client token replaces the old one for this session's next exchanges.
    if (this.#credentialed) this.caller = callerOf(ctx)
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
    // The rules run (route) and the credentials the requests need are awaited before the answer's
    // headers: a refused credential is answered as the broker's error, with its status and challenge.
    if (single !== undefined) {
      const r = this.#route(ctx, single)
      if (r.reaches?.auth !== undefined) await credentialReady(r.reaches.auth, this.caller, this.#log, ctx)
      if (this.#credentialed) await this.#revive(ctx, single, r)
      this.#clientRequest(await this.#streams.openPost(ctx, requests, this.id), single, r)
      return
    }
    const routed = list!.filter(m => m.method !== undefined && m.id !== undefined).map(m => [m, this.#route(ctx, m)] as const)
    if (this.#credentialed) {
      await Promise.all(routed.map(([, r]) => credentialReady(r.reaches?.auth, this.caller, this.#log, ctx)))
      await Promise.all(routed.map(([m, r]) => this.#revive(ctx, m, r)))
    }
    const post = await this.#streams.openPost(ctx, requests, this.id)
    for (const [m, r] of routed) this.#clientRequest(post, m, r)
  }

  /** Starts one target's upstream and runs its initialize handshake (the caller's credential awaited once, first). */
  async #startLink(link: SessionLink, ctx: RequestContext | undefined): Promise<void> {
    await credentialReady(link.auth, this.caller, this.#log, ctx)
    await link.upstream.start()
    const res = await this.#send(link, 'initialize', this.#initParams, undefined, Math.max(this.#env.requestTimeoutMs, INIT_TIMEOUT_MIN_MS), ctx)
    if (res.error !== undefined) throw new Error(res.error.message)
    link.initResult = res.result as Record<string, unknown>
    link.up = true
  }

  /**
   * Targets left out at initialize because the caller's credential was refused get another chance
   * when a request would reach them (a named call to one, a list to all) and the credential now
   * resolves: the client followed the step-up (consent, MFA) and the target joins this session, its
   * lists announced as changed. A named call's refusal stays its answer; a list leaves it out again.
   */
  async #revive(ctx: RequestContext, msg: JsonRpcMessage, r: Route): Promise<void> {
    const links = r.reaches !== undefined ? [r.reaches] : this.multi && isListMethod(String(msg.method)) ? this.links : []
    await Promise.all(links.filter(l => l.refused && !l.up).map(l => (l.revival ??= this.#rejoin(l, ctx).finally(() => (l.revival = undefined)))))
  }

  async #rejoin(link: SessionLink, ctx: RequestContext): Promise<void> {
    try {
      await this.#startLink(link, ctx)
    } catch (err) {
      // Refused again: revived by a later request. Down (or its handshake failed): left out like any target that is.
      link.refused = isCredentialRefusal(err)
      if (!link.refused) this.#log.warn({ target: link.target, err: (err as Error).message }, 'upstream failed to initialize')
      return
    }
    link.refused = false
    this.#log.info({ target: link.target }, 'upstream joined the session once its credential resolved')
    link.upstream.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
    const caps = (link.initResult?.capabilities ?? {}) as Record<string, unknown>
    for (const kind of ['tools', 'prompts', 'resources']) {
      if (caps[kind] !== undefined) this.#streams.deliver({ jsonrpc: '2.0', method: `notifications/${kind}/list_changed` }, undefined)
    }
  }

  /** Where a request goes (session-dispatch.ts); one whose routing threw is answered with an internal error. */
  #route(ctx: RequestContext, msg: JsonRpcMessage): Route {
    try {
      return route(this.#routes, ctx, msg)
    } catch (err) {
      this.#log.error({ err, method: msg.method }, 'failed to route request')
      return FAILED
    }
  }

  /**
   * Attaches the standalone GET stream; false when one is already open. With the id of
   * an event of an earlier GET stream, the events written after it are sent first.
   */
  attachGetStream(stream: SseStream, lastEventId?: string): boolean {
    return this.#streams.attachGetStream(stream, lastEventId)
  }

  /** Whether `lastEventId` names an event of a POST stream this session still knows. */
  canResume(lastEventId: string): boolean {
    return this.#streams.canResume(lastEventId)
  }

  /** Continues a POST stream the client lost (GET with `Last-Event-ID`): session-streams.ts. */
  resume(lastEventId: string, stream: SseStream): void {
    this.#streams.resume(lastEventId, stream)
  }

  keepAlive(): void {
    this.#streams.keepAlive()
  }

  /** Ends the session: pending requests get an error, streams end, upstreams close (children die). */
  async end(reason: string): Promise<void> {
    if (this.ended) return
    this.ended = true
    this.#log.info({ reason }, 'session ended')
    for (const link of this.links) link.failPending(`session ended: ${reason}`)
    this.#streams.endAll()
    this.#env.onEnd(this, reason)
    await Promise.allSettled(
      this.links.map(l => {
        l.up = false
        return l.upstream.close()
      })
    )
  }

  // ---- client -> upstream ------------------------------------------------

  #clientNotice(msg: JsonRpcMessage): void {
    if (isResponse(msg)) {
      const entry = typeof msg.id === 'number' ? this.#serverRequests.get(msg.id) : undefined
      if (entry === undefined) {
        this.#log.debug({ id: msg.id }, 'client answered an unknown server request')
        return
      }
      this.#serverRequests.delete(msg.id as number)
      msg.id = entry.id
      this.#namespace.unmarkTasks(msg)
      entry.link.sendQuietly(msg)
      return
    }
    if (msg.method === 'notifications/cancelled') {
      const reqId = msg.params?.requestId as JsonRpcId | undefined
      const inflight = reqId === undefined ? undefined : this.#inflight.get(reqId)
      const reason = msg.params?.reason
      if (inflight !== undefined) this.#abandon(inflight, typeof reason === 'string' ? reason : undefined)
      return
    }
    for (const link of this.links) link.sendQuietly(msg)
  }

  #clientRequest(post: PostStream, msg: JsonRpcMessage, r: Route): void {
    const meta = msg.params?._meta as Record<string, unknown> | undefined
    const inflight: Inflight = {
      clientId: msg.id as JsonRpcId,
      post,
      progressToken: meta?.progressToken,
      calls: [],
      link: undefined,
      finished: false,
    }
    this.#inflight.set(inflight.clientId, inflight)
    if (inflight.progressToken !== undefined) this.#progress.set(inflight.progressToken, inflight)
    try {
      if (r === FAILED) throw new Error('routing failed')
      dispatch(this.#routes, inflight, msg, r)
    } catch (err) {
      this.#log.error({ err, method: msg.method }, 'failed to dispatch request')
      this.#reply(inflight, rpcError(RPC.INTERNAL_ERROR, 'internal error'))
    }
  }

  /** Sends a client request upstream under a fresh upstream id; the answer goes back under the client's id. */
  /** `post` rewrites the answer: results only, unless `postErrors` (stand-ins for refused calls rewrite errors too). */
  #forward(inflight: Inflight, link: SessionLink, msg: JsonRpcMessage, post: ((r: JsonRpcMessage) => JsonRpcMessage) | undefined, postErrors = false): void {
    if (!link.up) {
      this.#reply(inflight, rpcError(RPC.SERVER_ERROR, `upstream ${link.target} unavailable`))
      return
    }
    inflight.link = link
    // The access log's target (the first one routed to, as the log's method is the first message's).
    inflight.post.ctx.target ??= link.target
    link.active.add(inflight)
    const traced = tracer?.upstreamCall(inflight.post.ctx, link.target, msg)
    const call = link.send(
      msg,
      r => {
        traced?.(r)
        this.#reply(inflight, post === undefined || (r.error !== undefined && !postErrors) ? r : this.#rewrite(link, msg.method!, r, post))
      },
      this.#env.requestTimeoutMs
    )
    if (call !== undefined) inflight.calls.push(call)
  }

  /**
   * An upstream answer rewritten for the client. A rewrite that fails on a malformed
   * answer fails this request only (-32603 naming the target), never the session: the
   * answer arrives in the upstream's message handler, where a throw would leave the
   * request unanswered and the session and its child pinned.
   */
  #rewrite(link: SessionLink, method: string, r: JsonRpcMessage, post: (r: JsonRpcMessage) => JsonRpcMessage): JsonRpcMessage {
    try {
      return post(r)
    } catch (err) {
      this.#log.warn({ target: link.target, method, err: (err as Error).message }, 'invalid upstream answer')
      return rpcError(RPC.INTERNAL_ERROR, `upstream ${link.target} answered an invalid ${method} result`)
    }
  }

  /** A request of the gateway's own (initialize, list pages, fan-outs). */
  /** `ctx`: the client request this serves (for its trace), when there is no `inflight` (initialize). */
  #request(
    link: SessionLink,
    method: string,
    params: Record<string, unknown>,
    inflight: Inflight | undefined,
    timeoutMs = this.#env.requestTimeoutMs,
    ctx = inflight?.post.ctx
  ): Promise<JsonRpcMessage> {
    // A fan-out page of a target whose credential is refused is an error page: left out like a target that is down.
    const ready = credentialReady(link.auth, this.caller, this.#log, ctx)
    if (ready !== undefined) {
      return ready.then(
        () => (inflight?.finished === true ? rpcError(RPC.REQUEST_TIMEOUT, 'Request cancelled') : this.#send(link, method, params, inflight, timeoutMs, ctx)),
        (err: unknown) => rpcError(RPC.SERVER_ERROR, refusalText(link.target, err))
      )
    }
    return this.#send(link, method, params, inflight, timeoutMs, ctx)
  }

  #send(
    link: SessionLink,
    method: string,
    params: Record<string, unknown>,
    inflight: Inflight | undefined,
    timeoutMs: number,
    ctx: RequestContext | undefined
  ): Promise<JsonRpcMessage> {
    return new Promise(resolve => {
      const msg: JsonRpcMessage = { jsonrpc: '2.0', method, params }
      const traced = ctx === undefined ? undefined : tracer?.upstreamCall(ctx, link.target, msg)
      const call = link.send(
        msg,
        traced === undefined
          ? resolve
          : r => {
              traced(r)
              resolve(r)
            },
        timeoutMs
      )
      if (call !== undefined) inflight?.calls.push(call)
    })
  }

  /**
   * Cancels the upstream calls past their deadline. The endpoint calls this
   * on one shared timer instead of a timer per request.
   */
  expireCalls(now: number): void {
    for (const link of this.links) link.expire(now)
  }

  /**
   * The client cancelled a request: its upstream calls are cancelled under their
   * upstream ids with the client's own reason (the gateway's reasons are only for
   * what the gateway cancels itself: timeouts, the session's end).
   */
  #abandon(inflight: Inflight, reason: string | undefined): void {
    if (inflight.finished) return
    for (const call of inflight.calls) {
      if (!call.link.pending.remove(call)) continue
      call.link.cancel(call.id, reason)
    }
    this.#finish(inflight)
    this.#streams.drop(inflight.post)
  }

  #finish(inflight: Inflight): void {
    inflight.finished = true
    this.#inflight.delete(inflight.clientId)
    this.#tasks.finished(inflight)
    if (inflight.progressToken !== undefined) this.#progress.delete(inflight.progressToken)
    inflight.link?.active.delete(inflight)
    this.lastActivityAt = Date.now()
  }

  #reply(inflight: Inflight, msg: JsonRpcMessage): void {
    if (inflight.finished) return
    this.#finish(inflight)
    msg.id = inflight.clientId
    this.#streams.answer(inflight.post, msg)
  }

  // ---- upstream -> client ------------------------------------------------

  #fromUpstream(link: SessionLink, msg: JsonRpcMessage): void {
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
      if (this.multi && msg.params?._meta !== undefined) this.#namespace.markTasks(link.target, msg)
      this.#streams.deliver(msg, this.#relatedStream(link))
      return
    }
    switch (msg.method) {
      case 'notifications/progress': {
        const inflight = this.#progress.get(msg.params?.progressToken)
        if (inflight !== undefined) {
          this.#streams.emit(inflight.post, msg)
          return
        }
        // A task's progress outlives the call that created it (MCP 2025-11-25 tasks).
        if (this.#tasks.ownsToken(msg.params?.progressToken)) break
        // Its request was answered or cancelled: the client no longer knows the token
        // (MCP 2025-11-25 utilities, Progress: tokens are valid only while the request is active).
        this.#log.debug({ target: link.target }, 'progress for a request no longer in flight dropped')
        return
      }
      case 'notifications/cancelled': {
        const rid = msg.params?.requestId
        let found: number | undefined
        for (const [cid, e] of this.#serverRequests)
          if (e.link === link && e.id === rid) {
            found = cid
            break
          }
        if (found === undefined) return
        this.#serverRequests.delete(found)
        msg.params!.requestId = found
        break
      }
      case 'notifications/resources/updated':
        if (typeof msg.params?.uri === 'string') msg.params.uri = this.#namespace.clientUri(link.target, msg.params.uri)
        break
      case 'notifications/tasks/status': {
        this.#namespace.markTasks(link.target, msg)
        this.#tasks.fromUpstream(msg)
        return
      }
    }
    if (this.multi && msg.params?._meta !== undefined) this.#namespace.markTasks(link.target, msg)
    this.#streams.deliver(msg, undefined)
  }

  /**
   * A server->client request over stdio carries no link to the client
   * request that caused it; the latest client request in flight on the same
   * target is the best guess (MCP: related messages SHOULD use that stream).
   */
  #relatedStream(link: SessionLink): PostStream | undefined {
    let found: PostStream | undefined
    for (const inflight of link.active) if (inflight.post.stream.open) found = inflight.post
    return found
  }

  #upstreamClosed(link: SessionLink, err: Error | undefined): void {
    const wasUp = link.up
    link.up = false
    if (this.ended) return
    this.#log.warn({ target: link.target, err: err?.message }, 'upstream closed')
    link.failPending(`upstream ${link.target} closed`)
    for (const [cid, e] of this.#serverRequests) if (e.link === link) this.#serverRequests.delete(cid)
    if (!wasUp) return // still starting: start() reports it
    if (!this.multi || this.#env.failClosed || !this.links.some(l => l.up)) void this.end(`upstream ${link.target} closed`)
  }
}
