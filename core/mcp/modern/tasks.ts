/**
 * Tasks of native targets (SEP-2663): a CreateTaskResult adopted as the calling subject's (its id
 * sealed to the subject, a slot in the subject's shared count), and tasks/get, tasks/update,
 * tasks/cancel answered only for an id that opens for the caller.
 */
import type { JsonRpcMessage, UpstreamFactory } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { MODERN_RPC, TASKS_EXTENSION } from '../protocol.ts'
import type { PooledUpstream } from '../upstreams/pool.ts'
import { endsTask } from '../upstreams/task-ledger.ts'
import type { ModernContext } from './context.ts'
import { decorate, errorStatus, serverInfoOf } from './answer.ts'
import type { ModernRequest } from './request.ts'
import { forward } from './upstream-call.ts'

/** A task's slot lasts its ttlMs; without one, setTimeout's bound (about 24 days), as it was in memory. */
const TASK_LEASE_MAX_MS = 2 ** 31 - 1

/** Where a subject's unfinished tasks are counted in shared state. */
function taskSlotKey(subjectKey: string): string {
  return 'tasks\u0000' + subjectKey
}

/**
 * A CreateTaskResult (SEP-2663): the task recorded as the calling subject's, its id as the client
 * sees it. Past the subject's limit the upstream's task is cancelled and the call refused: whether
 * a call becomes a task is the server's decision, known only from its answer.
 */
export async function adoptTask(
  cx: ModernContext,
  ex: ModernRequest,
  factory: UpstreamFactory,
  tool: string,
  res: JsonRpcMessage,
  entry: PooledUpstream
): Promise<void> {
  const result = res.result as Record<string, unknown>
  const upstreamId = result.taskId
  if (typeof upstreamId !== 'string') {
    await ex.fail(RPC.INTERNAL_ERROR, `upstream ${factory.target} answered a task without a taskId`)
    return
  }
  const cancelUpstream = (): void => {
    forward(cx, ex, factory, 'tasks/cancel', { taskId: upstreamId }).catch((err: unknown) => {
      cx.log.debug({ target: factory.target, err: (err as Error).message }, 'cancelling a refused task failed')
    })
  }
  const ttlMs = typeof result.ttlMs === 'number' && result.ttlMs > 0 ? result.ttlMs : undefined
  // Past its ttlMs the server may forget the task (SEP-2663): so does its id, and its slot's lease ends.
  const sealed = cx.tasks.seal.seal(ex.subjectKey, { target: factory.target, tool, taskId: upstreamId, expires: ttlMs === undefined ? 0 : Date.now() + ttlMs })
  if (sealed === undefined) {
    cancelUpstream()
    await ex.fail(RPC.INTERNAL_ERROR, `upstream ${factory.target} answered a task id too long to keep`)
    return
  }
  let joined: boolean
  try {
    joined = await cx.tasks.slots.join(
      taskSlotKey(ex.subjectKey),
      factory.target + '\n' + upstreamId,
      cx.tasks.max,
      Math.min(ttlMs ?? TASK_LEASE_MAX_MS, TASK_LEASE_MAX_MS)
    )
  } catch (err) {
    cancelUpstream()
    throw err
  }
  if (!joined) {
    cx.log.warn({ target: factory.target, tool, limit: cx.tasks.max }, 'task refused: too many unfinished tasks (mcp.limits.maxTasksPerSession)')
    cancelUpstream()
    await ex.fail(RPC.SERVER_ERROR, `Too many tasks: ${cx.tasks.max} unfinished (mcp.limits.maxTasksPerSession: ${cx.tasks.max}); wait for one to end`)
    return
  }
  result.taskId = sealed
  // With several targets the id is named <target>_<sealed id>, as every other name of a target.
  cx.namespace.markTasks(factory.target, res)
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, 'tools/call', result, serverInfoOf(cx, entry)) })
}

/**
 * tasks/get, tasks/update, tasks/cancel (SEP-2663): only a task the calling subject created, whose
 * tool the rules still allow; anything else is an unknown task (-32602), as the extension answers
 * an id it does not recognize. Forwarded to the task's target under its own id.
 */
export async function taskRequest(cx: ModernContext, ex: ModernRequest, method: string, params: Record<string, unknown>): Promise<void> {
  const ext = (ex.clientCapabilities.extensions as Record<string, unknown> | undefined)?.[TASKS_EXTENSION]
  if (ext === undefined || ext === null) {
    // SEP-2663: the task methods need the extension negotiated (SEP-2575 Missing Required Capabilities).
    await ex.fail(MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY, 'Missing required client capability', 400, {
      requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } },
    })
    return
  }
  const clientId = params.taskId
  const named = cx.multi ? cx.namespace.resolveTask(clientId) : undefined
  const task = cx.tasks.seal.open(ex.subjectKey, cx.multi ? named?.taskId : clientId)
  const factory = task === undefined || (cx.multi && named?.target.target !== task.target) ? undefined : cx.opts.targets.find(f => f.target === task.target)
  if (task === undefined || factory === undefined || !cx.namespace.allows(ex.ctx, 'tools/call', 'tool', task.tool, factory.target)) {
    await ex.fail(RPC.INVALID_PARAMS, `Unknown task: ${String(clientId)}`)
    return
  }
  ex.ctx.target = factory.target
  const { res, entry } = await forward(cx, ex, factory, method, { ...params, taskId: task.taskId })
  if (res.error !== undefined) {
    await ex.answer(res, errorStatus(res))
    return
  }
  const result = (res.result ?? {}) as Record<string, unknown>
  // The slot is free once the task is seen ended (a terminal status, or the cancel acknowledged).
  if (endsTask(method, result)) {
    cx.tasks.slots.leave(taskSlotKey(ex.subjectKey), factory.target + '\n' + task.taskId).catch((err: unknown) => {
      cx.log.warn({ err: (err as Error).message }, 'freeing a task slot in shared state failed (its lease expires)')
    })
  }
  cx.namespace.markTasks(factory.target, res)
  if (typeof result.taskId === 'string') result.taskId = clientId
  // A finished task's inlined result: its URIs as the client sees them, as a tools/call result's.
  if (result.result !== null && typeof result.result === 'object') cx.namespace.markUris(factory.target, { jsonrpc: '2.0', result: result.result })
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, method, result, serverInfoOf(cx, entry)) })
}
