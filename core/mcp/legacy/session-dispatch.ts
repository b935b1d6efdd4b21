/**
 * Where one client request of a session-era session goes (routing/namespace.ts,
 * routing/named-call.ts): named items to their target (refused ones under a
 * stand-in name), lists and tasks/list merged over the targets, task requests
 * to their task's target, completions by their reference, logging/setLevel to
 * every target. This module decides and shapes answers; the session owns the
 * request's life (in flight, answered, cancelled) and its upstream calls, and
 * hands them over as an explicit record (SessionRoutes), made once per session.
 * Deciding comes in two steps: `route` (the rules, once) before the POST's
 * answer begins, so the session can await the credential of the target a
 * request reaches (../credentials.ts) and answer a refusal with its status;
 * then `dispatch` once the answer's stream is open.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { NAMED, TASK_METHODS, isListMethod, isNamedMethod, rpcError, type NamedMethod } from '../protocol.ts'
import type { StandIn, TargetNamespace } from '../routing/namespace.ts'
import { markNamedAnswer, resolveNamedCall, type NamedCall } from '../routing/named-call.ts'
import { endsTask } from '../upstreams/task-ledger.ts'
import type { Inflight, SessionLink } from './session-link.ts'
import type { SessionTasks } from './session-tasks.ts'

/** What routing a client request needs of its session. */
export interface SessionRoutes {
  readonly links: readonly SessionLink[]
  readonly namespace: TargetNamespace<SessionLink>
  readonly tasks: SessionTasks<Inflight>
  readonly log: Logger
  readonly failClosed: boolean
  /** Answers the client request under its own id (once; later answers are dropped). */
  reply(inflight: Inflight, msg: JsonRpcMessage): void
  /** Sends the client request to `link`; `post` rewrites the answer: results only, unless `postErrors`. */
  forward(inflight: Inflight, link: SessionLink, msg: JsonRpcMessage, post: ((r: JsonRpcMessage) => JsonRpcMessage) | undefined, postErrors?: boolean): void
  /** A request of the gateway's own made for this client request (list pages, fan-outs). */
  request(link: SessionLink, method: string, params: Record<string, unknown>, inflight: Inflight): Promise<JsonRpcMessage>
  /** Whether a call the rules refused may go to `link` under its stand-in: only when it costs no new credential (../credentials.ts). */
  mayStandIn(link: SessionLink): boolean
}

/** Where a client request goes, decided (the rules run) before its POST's answer begins. */
export interface Route {
  /** tools/call, prompts/get, resources/*: the named-call step's outcome, and the name or URI as the client sent it. */
  readonly named?: NamedCall<SessionLink> | { readonly answer: JsonRpcMessage }
  readonly asked?: unknown
  /** completion/complete routed by its reference (several targets, or rules); null: no target has it. */
  readonly completion?: { readonly target: SessionLink; readonly standIn: StandIn | undefined } | null
  /** The link the request reaches as the caller (its credential is awaited first); none for fan-outs and the gateway's own answers. */
  readonly reaches?: SessionLink
}

/** A request answered by the gateway alone, or merged over several targets: nothing to decide ahead. */
const NOWHERE: Route = Object.freeze({})

/**
 * Decides where a client request goes and runs the rules on it (once: a named call's name is
 * rewritten here, routing/named-call.ts). One target: every request but ping and initialize reaches
 * it; several: named items, completions and task requests reach theirs, lists are merged.
 */
export function route(s: SessionRoutes, ctx: RequestContext, msg: JsonRpcMessage): Route {
  const method = msg.method!
  if (method === 'ping' || method === 'initialize') return NOWHERE
  const namespace = s.namespace
  if (isNamedMethod(method)) {
    const params = msg.params ?? {}
    const asked = params[NAMED[method].field]
    const named = resolveNamedCall(namespace, ctx, method, params)
    return { named, asked, reaches: 'answer' in named || named.standIn !== undefined ? undefined : named.target }
  }
  if (method === 'completion/complete' && (namespace.multi || namespace.checkers.length > 0)) {
    const c = namespace.completion(ctx, msg.params?.ref as { type?: string; name?: unknown; uri?: unknown } | undefined)
    return { completion: c ?? null, reaches: c === undefined || c.standIn !== undefined ? undefined : c.target }
  }
  if (TASK_METHODS.has(method)) {
    const taskId = msg.params?.taskId
    const r = namespace.resolveTask(taskId)
    return r === undefined || !s.tasks.mayUse(ctx, taskId) ? NOWHERE : { reaches: r.target }
  }
  // One target: it is reached (a target without `auth` has nothing to await, nor an object to make).
  return namespace.multi || s.links[0]!.auth === undefined ? NOWHERE : { reaches: s.links[0]! }
}

/** A page of nothing: what a target that is down contributes to a merged list. */
const NO_PAGE: Promise<JsonRpcMessage> = Promise.resolve({ jsonrpc: '2.0', result: {} })

/**
 * Routes one client request (routing/namespace.ts, routing/named-call.ts): named items to their target
 * (refused ones under a stand-in name), lists merged over every target,
 * completions by their reference. One target: every other method goes to
 * it unchanged; several: methods the gateway cannot route are unknown.
 */
export function dispatch(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage, r: Route): void {
  const method = msg.method!
  if (method === 'ping') {
    s.reply(inflight, { jsonrpc: '2.0', result: {} })
    return
  }
  if (method === 'initialize') {
    s.reply(inflight, rpcError(RPC.INVALID_REQUEST, 'session already initialized'))
    return
  }
  if (r.named !== undefined) {
    namedItem(s, inflight, msg, method as NamedMethod, r.named, r.asked)
    return
  }
  if (TASK_METHODS.has(method)) {
    taskRequest(s, inflight, msg, method)
    return
  }
  if (method === 'tasks/list') {
    listTasks(s, inflight, msg)
    return
  }
  const namespace = s.namespace
  if (isListMethod(method)) {
    if (namespace.multi) {
      void namespace
        .mergeLists(
          inflight.post.ctx,
          method,
          (link, params) => (link.up || params.cursor !== undefined ? s.request(link, method, params, inflight) : NO_PAGE),
          () => inflight.finished,
          s.log,
          s.failClosed
        )
        .then(r => s.reply(inflight, r))
      return
    }
    const link = s.links[0]!
    s.forward(
      inflight,
      link,
      msg,
      namespace.checkers.length === 0
        ? undefined
        : r => {
            const invalid = namespace.checkList(link.target, method, r.result)
            if (invalid === undefined) {
              namespace.filterResult(inflight.post.ctx, method, r.result, link.target)
              return r
            }
            s.log.warn({ target: link.target, method, err: invalid.message }, 'invalid upstream list result')
            return rpcError(invalid.code, invalid.message)
          }
    )
    return
  }
  if (r.completion !== undefined) {
    complete(s, inflight, msg, r.completion)
    return
  }
  if (!namespace.multi) {
    s.forward(inflight, s.links[0]!, msg, undefined)
    return
  }
  switch (method) {
    case 'logging/setLevel':
      void fanOutSetLevel(s, inflight, msg)
      return
    default:
      s.reply(inflight, rpcError(RPC.METHOD_NOT_FOUND, `Method not found: ${method}`))
  }
}

/**
 * completion/complete: to the target of its reference; one the rules deny under a stand-in (routing/namespace.ts),
 * unless that would cost a new credential: then the gateway's answer for a reference it does not know.
 */
function complete(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage, routed: NonNullable<Route['completion']> | null): void {
  if (routed === null || (routed.standIn !== undefined && !s.mayStandIn(routed.target)))
    s.reply(inflight, rpcError(RPC.INVALID_PARAMS, 'Unknown completion reference'))
  else s.forward(inflight, routed.target, msg, routed.standIn?.restore, routed.standIn !== undefined)
}

/**
 * tools/call, prompts/get, resources/read and (un)subscribe (`call`: routed and checked by `route`): to the
 * item's target, refused ones under a stand-in, unless that would cost a new credential: then answered
 * as an item no target has.
 */
function namedItem(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage, method: NamedMethod, call: NonNullable<Route['named']>, asked: unknown): void {
  const namespace = s.namespace
  const params = msg.params ?? {}
  if ('answer' in call) {
    s.reply(inflight, call.answer)
    return
  }
  const { target: link, name, standIn: refused } = call
  const read = method === 'resources/read'
  if (refused !== undefined && !s.mayStandIn(link)) {
    s.reply(inflight, namespace.unknown(NAMED[method].kind, asked))
    return
  }
  if (refused !== undefined) {
    s.forward(inflight, link, msg, read ? r => namespace.markContents(link.target, refused.restore(r)) : refused.restore, true)
    return
  }
  const kind = NAMED[method].kind
  const augmented = kind === 'tool' && params.task !== undefined
  if (augmented) {
    if (!s.tasks.begin(inflight)) {
      const limit = s.tasks.limit
      s.log.warn({ target: link.target, tool: String(name), limit }, 'task-augmented call refused: too many unfinished tasks (mcp.limits.maxTasksPerSession)')
      s.reply(
        inflight,
        rpcError(RPC.SERVER_ERROR, `Too many tasks: this session has ${limit} unfinished tasks (mcp.limits.maxTasksPerSession: ${limit}); wait for one to end`)
      )
      return
    }
  }
  // Several targets: URIs inside answers are the gateway's (resources/read contents; links and embedded resources of calls and prompts).
  let mark: ((r: JsonRpcMessage) => JsonRpcMessage) | undefined
  if (augmented) mark = r => s.tasks.created(inflight, link.target, name, namespace.markTasks(link.target, r))
  else if (namespace.multi && (read || kind !== 'resource')) mark = r => markNamedAnswer(namespace, link.target, method, r)
  s.forward(inflight, link, msg, mark)
}

/** tasks/get, tasks/result, tasks/cancel: to the task's target under its own id. */
function taskRequest(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage, method: string): void {
  const namespace = s.namespace
  const taskId = msg.params?.taskId
  const r = namespace.resolveTask(taskId)
  if (r === undefined || !s.tasks.mayUse(inflight.post.ctx, taskId)) {
    s.reply(inflight, rpcError(RPC.INVALID_PARAMS, `Unknown task: ${String(taskId)}`))
    return
  }
  msg.params!.taskId = r.taskId
  const target = r.target.target
  // A result given, a cancellation answered or a terminal status seen: the task has ended.
  s.forward(inflight, r.target, msg, resp => {
    if (endsTask(method, resp.result)) s.tasks.ended(taskId as string)
    namespace.markTasks(target, resp)
    return method === 'tasks/result' ? namespace.markUris(target, resp) : resp
  })
}

/** tasks/list: one target's, or merged over the targets that list tasks; with rules, only the caller's tasks. */
function listTasks(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage): void {
  const namespace = s.namespace
  const ctx = inflight.post.ctx
  const mine =
    namespace.checkers.length === 0
      ? undefined
      : (r: JsonRpcMessage): JsonRpcMessage => {
          const result = r.result as { tasks?: Array<{ taskId?: unknown }> } | undefined
          if (Array.isArray(result?.tasks)) result.tasks = result.tasks.filter(x => s.tasks.mayUse(ctx, x.taskId))
          return r
        }
  if (!namespace.multi) {
    s.forward(inflight, s.links[0]!, msg, mine)
    return
  }
  const listing = new Set(s.links.filter(l => l.up && (l.initResult?.capabilities as { tasks?: { list?: unknown } } | undefined)?.tasks?.list !== undefined))
  if (listing.size === 0) {
    s.reply(inflight, rpcError(RPC.METHOD_NOT_FOUND, 'Method not found: tasks/list'))
    return
  }
  void namespace
    .mergeLists(
      ctx,
      'tasks/list',
      (link, params) => (listing.has(link) ? s.request(link, 'tasks/list', params, inflight) : NO_PAGE),
      () => inflight.finished,
      s.log,
      s.failClosed
    )
    .then(r => s.reply(inflight, mine === undefined ? r : mine(r)))
}

async function fanOutSetLevel(s: SessionRoutes, inflight: Inflight, msg: JsonRpcMessage): Promise<void> {
  const rs = await Promise.all(s.links.filter(l => l.up).map(l => s.request(l, 'logging/setLevel', msg.params ?? {}, inflight)))
  const err = rs.find(r => r.error !== undefined)
  s.reply(
    inflight,
    err !== undefined && (s.failClosed || rs.every(r => r.error !== undefined)) ? rpcError(err.error!.code, err.error!.message) : { jsonrpc: '2.0', result: {} }
  )
}
