/**
 * The one early task-status buffer of the session era (a session's own upstreams, session.ts, and
 * a session's lease on a shared child, shared-upstream.ts): a server may announce a task with
 * `notifications/tasks/status` before the CreateTaskResult that tells whose it is (MCP 2025-11-25
 * tasks), so while a task-augmented call is in flight such statuses are held, bounded (the task
 * limit, the oldest dropped first), and released after the result that names their task.
 */
import type { JsonRpcMessage } from '../../targets/types.ts'

export class EarlyTaskStatus {
  readonly #limit: number
  #held: JsonRpcMessage[] = []

  constructor(limit: number) {
    this.#limit = limit
  }

  /** Holds the status of a task not known yet, when a call that may create it is in flight (`creating`). */
  hold(msg: JsonRpcMessage, creating: boolean): void {
    if (!creating || typeof msg.params?.taskId !== 'string') return
    if (this.#held.length >= this.#limit) this.#held.shift()
    this.#held.push(msg)
  }

  /** The held statuses of `taskId`, in order, no longer held. */
  take(taskId: string): JsonRpcMessage[] {
    const held = this.#held.filter(m => m.params?.taskId === taskId)
    if (held.length > 0) this.#held = this.#held.filter(m => m.params?.taskId !== taskId)
    return held
  }

  /** No call that may create a task is in flight any more: nothing held can become known. */
  clear(): void {
    this.#held = []
  }
}
