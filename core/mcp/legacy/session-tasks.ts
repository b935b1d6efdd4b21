/**
 * The tasks of one session-era session (MCP 2025-11-25 tasks): which it created (bounded:
 * task-ledger.ts) and which tool each runs (for the rules), the slots its task-augmented calls in
 * flight hold, the progress tokens that stay valid while a task runs, and the statuses that arrive
 * before the result naming their task (early-task-status.ts). session.ts routes the requests.
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import type { TargetNamespace } from '../routing/namespace.ts'
import { EarlyTaskStatus } from '../upstreams/early-task-status.ts'
import { TaskLedger, isTerminal } from '../upstreams/task-ledger.ts'

/** What a task-augmented call is to the tasks: its progress token. */
interface Call {
  readonly progressToken: unknown
}

export class SessionTasks<C extends Call> {
  readonly #namespace: TargetNamespace<{ readonly target: string }>
  /** Writes a task status to the client (unless the session ended). */
  readonly #deliver: (msg: JsonRpcMessage) => void
  /**
   * Tasks this session created (client-facing id -> target, tool, progress token), bounded
   * (task-ledger.ts). With per-operation rules a task is the caller's while the tool it runs is allowed.
   */
  readonly #tasks: TaskLedger<{ readonly target: string; readonly tool: string; readonly token: unknown }>
  /** Task-augmented calls not answered yet: each may create a task, so each holds a slot. */
  readonly #calls = new Set<C>()
  /** Progress tokens of task-augmented calls, valid for the task's lifetime (MCP 2025-11-25 tasks) -> client-facing task id. */
  readonly #tokens = new Map<unknown, string>()
  /** With per-operation rules: status notifications of tasks the session does not know yet. */
  readonly #early: EarlyTaskStatus

  constructor(namespace: TargetNamespace<{ readonly target: string }>, maxTasks: number, deliver: (msg: JsonRpcMessage) => void) {
    this.#namespace = namespace
    this.#deliver = deliver
    this.#tasks = new TaskLedger(maxTasks)
    this.#early = new EarlyTaskStatus(maxTasks)
  }

  get limit(): number {
    return this.#tasks.limit
  }

  /** Takes a slot for a task-augmented call; false when the session is at its task limit. */
  begin(call: C): boolean {
    if (this.#tasks.full(this.#calls.size)) return false
    this.#calls.add(call)
    return true
  }

  /** A request ended: a task-augmented one frees its slot (and, the last one, what was held early). */
  finished(call: C): void {
    if (this.#calls.size > 0 && this.#calls.delete(call) && this.#calls.size === 0) this.#early.clear()
  }

  /** Whether `token` is the progress token of a task still running. */
  ownsToken(token: unknown): boolean {
    return this.#tokens.has(token)
  }

  /**
   * A task-augmented tools/call was answered (MCP 2025-11-25 tasks): with a task, the
   * session remembers it (which tool it runs, for the rules) and its progress token
   * stays valid while it runs. Without a task it was a plain result.
   */
  created(call: C, target: string, tool: string, r: JsonRpcMessage): JsonRpcMessage {
    const task = (r.result as { task?: { taskId?: unknown; status?: unknown } } | undefined)?.task
    const taskId = task?.taskId
    if (typeof taskId !== 'string') return this.#namespace.markUris(target, r)
    this.#tasks.add(taskId, { target, tool, token: call.progressToken })
    if (call.progressToken !== undefined) this.#tokens.set(call.progressToken, taskId)
    if (isTerminal(task?.status)) this.ended(taskId)
    const held = this.#early.take(taskId)
    // After the result, which is written once this returns.
    if (held.length > 0)
      queueMicrotask(() => {
        for (const m of held) this.#status(m)
      })
    return r
  }

  /** Whether the caller may use the task (client-facing id): always without per-operation rules. */
  mayUse(ctx: RequestContext, taskId: unknown): boolean {
    if (this.#namespace.checkers.length === 0) return true
    const task = this.#tasks.get(taskId)
    return task !== undefined && this.#namespace.allows(ctx, 'tools/call', 'tool', task.tool, task.target)
  }

  /** The task has ended: its slot is free (it stays known a while: task-ledger.ts) and its progress token is spent. */
  ended(taskId: string): void {
    const task = this.#tasks.get(taskId)
    this.#tasks.end(taskId)
    if (task?.token !== undefined && this.#tokens.get(task.token) === taskId) this.#tokens.delete(task.token)
  }

  /**
   * An upstream's `notifications/tasks/status` (its task id already as the client knows it).
   * With rules, only the session's own tasks (its children are its own, but a shared child is
   * its subject's); one not known yet is held while a task-augmented call is in flight.
   */
  fromUpstream(msg: JsonRpcMessage): void {
    if (this.#namespace.checkers.length > 0 && !this.#tasks.has(msg.params?.taskId)) {
      this.#early.hold(msg, this.#calls.size > 0)
      return
    }
    this.#status(msg)
  }

  /** A task's status for the client; a terminal one ends the task. */
  #status(msg: JsonRpcMessage): void {
    const taskId = msg.params?.taskId
    if (typeof taskId === 'string' && isTerminal(msg.params?.status)) this.ended(taskId)
    this.#deliver(msg)
  }
}
