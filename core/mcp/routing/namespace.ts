/**
 * The gateway's namespace over its targets, which both protocol eras share
 * (legacy/session.ts for the session era, modern/ for 2026-07-28): which
 * target a client-facing name, URI, task id or completion reference belongs
 * to and what the upstream calls it (naming.ts), whether the caller may use
 * it (policy.ts), the marking of names and URIs in answers, and how the list
 * results of several targets become one. It decides where a request goes;
 * sending it there is the era's (a session's own link, or a pooled upstream),
 * handed in as a function where the namespace needs pages of several targets.
 */
import { LIST_KEYS, RELATED_TASK, rpcError, type ListKey, type ListMethod } from '../protocol.ts'
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { Plugin } from '../../plugin.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { splitName, markUri, unmarkUri, prefixName, renameListItem } from './naming.ts'
import { allowOperation, deniedStandIn, filterListItems, type OperationKind } from './policy.ts'
import { normalizeResourceUri } from './resource-uri.ts'

/**
 * The string field that names each item of a list (MCP 2025-11-25 schema: Tool and Prompt
 * `name`, Resource `uri`, ResourceTemplate `uriTemplate`; tasks: Task `taskId`).
 */
const ITEM_NAME = { tools: 'name', prompts: 'name', resources: 'uri', resourceTemplates: 'uriTemplate', tasks: 'taskId' } as const

/**
 * Why one target's list result cannot be filtered or renamed, or undefined when it can. A
 * server that answers a result its schema forbids has failed (JSON-RPC 2.0 §5.1: -32603
 * Internal error), so the request gets that error naming the target rather than a list the
 * rules could not be applied to (dropping the item instead would hide the upstream's fault
 * and show a list that is not the upstream's).
 */
export function invalidList(target: string, method: string, key: ListKey | 'tasks', result: unknown): RpcError | undefined {
  let why: string | undefined
  if (result === null || typeof result !== 'object' || Array.isArray(result)) why = 'the result is not an object'
  else {
    const items = (result as Record<string, unknown>)[key]
    const field = ITEM_NAME[key]
    if (items !== undefined && !Array.isArray(items)) why = `"${key}" is not an array`
    else if (items !== undefined) {
      const i = items.findIndex(it => it === null || typeof it !== 'object' || typeof (it as Record<string, unknown>)[field] !== 'string')
      if (i >= 0) why = `${key}[${i}] is not an object with a string "${field}"`
    }
  }
  return why === undefined ? undefined : { code: RPC.INTERNAL_ERROR, message: `upstream ${target} answered an invalid ${method} result: ${why}` }
}

export type RpcError = { code: number; message: string; data?: unknown }

/** A refused call's stand-in name and how to put the caller's name back into the answer (policy.ts). */
export type StandIn = ReturnType<typeof deniedStandIn>

/** One page of a list, fetched from one target by the era's own means. */
export type PageFetch<T> = (target: T, params: Record<string, unknown>) => Promise<JsonRpcMessage>

export class TargetNamespace<T extends { readonly target: string }> {
  readonly targets: readonly T[]
  /** More than one target: names and URIs carry the target. */
  readonly multi: boolean
  /** Plugins with `allowMcpOperation`; empty means no filtering. */
  readonly checkers: readonly Plugin[]
  readonly #byTarget: ReadonlyMap<string, T>

  constructor(targets: readonly T[], checkers: readonly Plugin[]) {
    this.targets = targets
    this.multi = targets.length > 1
    this.checkers = checkers
    this.#byTarget = new Map(targets.map(t => [t.target, t]))
  }

  /**
   * The target of a client-facing tool or prompt name or resource URI, and
   * the upstream's own name for it. One target: everything is its, unrenamed.
   */
  resolve(kind: OperationKind, value: string): { target: T; name: string } | undefined {
    if (!this.multi) return { target: this.targets[0]!, name: value }
    const split = kind === 'resource' ? unmarkUri(value) : splitName(value)
    const target = split === undefined ? undefined : this.#byTarget.get(split[0])
    return target === undefined ? undefined : { target, name: split![1] }
  }

  /**
   * A named request's target and the upstream's name for the item (resolve), or the
   * answer to give instead: an unknown target prefix, or, with rules, a resource URI
   * that does not parse or is ambiguous. With rules a resource URI is the normalized
   * one (resource-uri.ts): the rules see it and the upstream is sent it.
   */
  route(kind: OperationKind, value: unknown): { target: T; name: unknown } | { answer: JsonRpcMessage } {
    let target = this.targets[0]!
    let name = value
    if (this.multi) {
      const r = typeof value === 'string' ? this.resolve(kind, value) : undefined
      if (r === undefined) return { answer: this.unknown(kind, value) }
      target = r.target
      name = r.name
    }
    if (kind !== 'resource' || this.checkers.length === 0) return { target, name }
    const uri = typeof name === 'string' ? normalizeResourceUri(name) : { invalid: 'not a string' }
    if ('uri' in uri) return { target, name: uri.uri }
    return { answer: rpcError(RPC.INVALID_PARAMS, `Invalid resource URI: ${uri.invalid}`) }
  }

  /** The answer for a name or URI that no target has (the gateway's own namespace). */
  unknown(kind: OperationKind, value: unknown): JsonRpcMessage {
    return kind === 'resource'
      ? rpcError(RPC.RESOURCE_NOT_FOUND, `Resource not found: ${String(value)}`)
      : rpcError(RPC.INVALID_PARAMS, `Unknown ${kind}: ${String(value)}`)
  }

  /** completion/complete: the target of `ref`, whose name or URI is rewritten to the upstream's in place. */
  completionTarget(ref: { type?: string; name?: unknown; uri?: unknown } | undefined): T | undefined {
    if (!this.multi) return this.targets[0]
    if (ref?.type === 'ref/prompt' && typeof ref.name === 'string') {
      const r = this.resolve('prompt', ref.name)
      if (r !== undefined) ref.name = r.name
      return r?.target
    }
    if (ref?.type === 'ref/resource' && typeof ref.uri === 'string') {
      const r = this.resolve('resource', ref.uri)
      if (r !== undefined) ref.uri = r.name
      return r?.target
    }
    return undefined
  }

  /**
   * completion/complete: the target of `ref` (rewritten in place, completionTarget) and, when
   * the rules deny the prompt or resource template it completes, the stand-in it goes on with:
   * a refused completion reads exactly as one for a reference the upstream does not have, as
   * a refused call does. The rules see the completion as the use of its prompt (`prompts/get`)
   * or template (`resources/read` with the template as `mcp.resource.uri`, as when filtering
   * `resources/templates/list`); templates are compared as the upstream compares them, as
   * strings (RFC 6570 templates are not URIs: no URI normalization).
   */
  completion(ctx: RequestContext, ref: { type?: string; name?: unknown; uri?: unknown } | undefined): { target: T; standIn: StandIn | undefined } | undefined {
    const target = this.completionTarget(ref)
    if (target === undefined) return undefined
    let standIn: StandIn | undefined
    if (this.checkers.length === 0) return { target, standIn }
    if (ref?.type === 'ref/prompt' && typeof ref.name === 'string') {
      standIn = this.refuse(ctx, 'prompts/get', 'prompt', ref.name, target.target)
      if (standIn !== undefined) ref.name = standIn.value
    } else if (ref?.type === 'ref/resource' && typeof ref.uri === 'string') {
      standIn = this.refuse(ctx, 'resources/read', 'resource', ref.uri, target.target)
      if (standIn !== undefined) ref.uri = standIn.value
    }
    return { target, standIn }
  }

  /**
   * Undefined when the caller may use the item; otherwise the stand-in the
   * call goes on with, so that a refusal reads exactly as the upstream's
   * answer for an item it does not have (policy.ts).
   */
  refuse(ctx: RequestContext, method: string, kind: OperationKind, name: string, target: string): StandIn | undefined {
    return allowOperation(this.checkers, ctx, method, kind, name, target) ? undefined : deniedStandIn(name, kind)
  }

  /** Whether the caller may see `name` of `target` (resource subscriptions). */
  allows(ctx: RequestContext, method: string, kind: OperationKind, name: string, target: string): boolean {
    return allowOperation(this.checkers, ctx, method, kind, name, target)
  }

  /**
   * Whether the caller may hear of changes to resource `uri` (upstream URI) of `target`: a
   * caller may watch what it may read. Both eras' subscriptions ask this: `resources/subscribe`
   * and `unsubscribe` (session era) and `subscriptions/listen` (2026-07-28).
   */
  allowsWatch(ctx: RequestContext, uri: string, target: string): boolean {
    return allowOperation(this.checkers, ctx, 'resources/read', 'resource', uri, target)
  }

  /** As refuse, for a subscription: undefined when allowsWatch, else the stand-in it goes on with. */
  refuseWatch(ctx: RequestContext, uri: string, target: string): StandIn | undefined {
    return this.allowsWatch(ctx, uri, target) ? undefined : deniedStandIn(uri, 'resource')
  }

  /**
   * Why one target's list result cannot be filtered (invalidList), or undefined. Without
   * rules the gateway does not read the items of one target's list, so nothing is checked.
   */
  checkList(target: string, method: ListMethod, result: unknown): RpcError | undefined {
    return this.checkers.length === 0 ? undefined : invalidList(target, method, LIST_KEYS[method], result)
  }

  /** One target's list result (checked by checkList), in place: only the items the caller may see. */
  filterResult(ctx: RequestContext, method: ListMethod, result: unknown, target: string): void {
    if (this.checkers.length === 0) return
    const key = LIST_KEYS[method]
    const r = result as Record<string, unknown> | undefined
    if (Array.isArray(r?.[key])) r[key] = filterListItems(this.checkers, ctx, method, r[key], target)
  }

  /** A URI of `target` as the client sees it (resources/read contents, resources/updated). */
  clientUri(target: string, uri: string): string {
    return this.multi ? markUri(target, uri) : uri
  }

  /** A resources/read result of `target`, in place: its contents' URIs as the client sees them. */
  markContents(target: string, r: JsonRpcMessage): JsonRpcMessage {
    if (!this.multi) return r
    const contents = (r.result as { contents?: Array<{ uri?: unknown }> } | undefined)?.contents
    if (Array.isArray(contents)) for (const c of contents) if (typeof c.uri === 'string') c.uri = markUri(target, c.uri)
    return r
  }

  /**
   * A tools/call or prompts/get result of `target`, in place: the URIs of its
   * resource links and embedded resources as the client sees them, so that the
   * gateway's resources/read takes them (MCP 2025-11-25 server/tools, "Resource
   * Links" and "Embedded Resources"; server/prompts, "Embedded Resources").
   */
  markUris(target: string, r: JsonRpcMessage): JsonRpcMessage {
    if (!this.multi) return r
    const result = r.result as { content?: unknown; messages?: unknown } | undefined
    if (Array.isArray(result?.content)) for (const c of result.content) markBlock(target, c)
    if (Array.isArray(result?.messages)) for (const m of result.messages) markBlock(target, (m as { content?: unknown } | null)?.content)
    return r
  }

  /** The target a client-facing task id names, and the upstream's own id. One target: its, unrenamed. */
  resolveTask(taskId: unknown): { target: T; taskId: string } | undefined {
    if (typeof taskId !== 'string') return undefined
    const r = this.resolve('tool', taskId)
    return r === undefined ? undefined : { target: r.target, taskId: r.name }
  }

  /**
   * A message of `target`, in place: the task ids it carries as the client
   * sees them (a task-augmented call's `task`, tasks/get and tasks/cancel
   * results, notifications/tasks/status, related-task `_meta`).
   */
  markTasks(target: string, m: JsonRpcMessage): JsonRpcMessage {
    if (!this.multi) return m
    const mark = (o: { taskId?: unknown } | undefined | null): void => {
      if (typeof o?.taskId === 'string') o.taskId = prefixName(target, o.taskId)
    }
    const result = m.result as { taskId?: unknown; task?: { taskId?: unknown }; _meta?: Record<string, { taskId?: unknown }> } | undefined
    if (result !== undefined && result !== null && typeof result === 'object') {
      mark(result)
      mark(result.task)
      mark(result._meta?.[RELATED_TASK])
    }
    if (m.params !== undefined) {
      if (m.method === 'notifications/tasks/status') mark(m.params)
      mark((m.params._meta as Record<string, { taskId?: unknown }> | undefined)?.[RELATED_TASK])
    }
    return m
  }

  /** A client message to `target`, in place: a related-task `_meta` id back to the upstream's. */
  unmarkTasks(m: JsonRpcMessage): void {
    if (!this.multi) return
    for (const holder of [m.params, m.result as Record<string, unknown> | undefined]) {
      const related = (holder?._meta as Record<string, { taskId?: unknown }> | undefined)?.[RELATED_TASK]
      const r = related === undefined ? undefined : this.resolveTask(related.taskId)
      if (r !== undefined) related!.taskId = r.taskId
    }
  }

  /**
   * A list over every target: each target's pages followed to the end (a
   * cursor seen before ends it), filtered, renamed, merged in config order.
   * A failing target is left out and logged, or, fail-closed, fails the
   * whole list. `stopped` ends the paging when the client went away.
   */
  async mergeLists(
    ctx: RequestContext,
    method: ListMethod | 'tasks/list',
    fetch: PageFetch<T>,
    stopped: () => boolean,
    log: Logger,
    failClosed: boolean
  ): Promise<JsonRpcMessage> {
    // tasks/list: every task is listed here; which are the caller's is the era's to say (legacy/session.ts).
    const key = method === 'tasks/list' ? 'tasks' : LIST_KEYS[method]
    const parts = await Promise.all(
      this.targets.map(async (t): Promise<unknown[] | RpcError> => {
        const out: unknown[] = []
        const seen = new Set<unknown>()
        let cursor: unknown
        try {
          do {
            const r = await fetch(t, cursor === undefined ? {} : { cursor })
            if (r.error !== undefined) return r.error
            const invalid = invalidList(t.target, method, key, r.result)
            if (invalid !== undefined) return invalid
            const result = r.result as Record<string, unknown>
            const items = result[key]
            if (Array.isArray(items))
              for (const it of key === 'tasks' ? items : filterListItems(this.checkers, ctx, method, items, t.target))
                out.push(renameListItem(t.target, key, it))
            seen.add(cursor)
            cursor = result.nextCursor
          } while (typeof cursor === 'string' && !seen.has(cursor) && !stopped())
        } catch (err) {
          return { code: RPC.SERVER_ERROR, message: (err as Error).message }
        }
        return out
      })
    )
    const merged: unknown[] = []
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i]!
      if (Array.isArray(p)) {
        for (const it of p) merged.push(it)
        continue
      }
      const target = this.targets[i]!.target
      log.warn({ target, method, err: p.message }, 'target failed during list')
      if (failClosed) return rpcError(p.code, `target ${target}: ${p.message}`)
    }
    return { jsonrpc: '2.0', result: { [key]: merged } }
  }

  /** Several targets' `instructions`, each marked with its target; one target's as they are. */
  instructions(live: ReadonlyArray<{ readonly target: string; readonly initResult?: Record<string, unknown> | undefined }>): string | undefined {
    const parts = live.flatMap(l =>
      typeof l.initResult?.instructions === 'string' ? [this.multi ? `[${l.target}] ${l.initResult.instructions}` : l.initResult.instructions] : []
    )
    return parts.length > 0 ? parts.join('\n\n') : undefined
  }
}

/** One content block, in place: a resource link's or an embedded resource's URI marked with its target. */
function markBlock(target: string, block: unknown): void {
  if (block === null || typeof block !== 'object') return
  const b = block as { type?: unknown; uri?: unknown; resource?: { uri?: unknown } | null }
  if (b.type === 'resource_link' && typeof b.uri === 'string') b.uri = markUri(target, b.uri)
  else if (b.type === 'resource' && typeof b.resource?.uri === 'string') b.resource.uri = markUri(target, b.resource.uri)
}
