/**
 * The tasks one session created (MCP 2025-11-25 basic/utilities/tasks), kept
 * bounded: a client cannot make the gateway remember tasks without end.
 * A task counts against the limit (mcp.limits.maxTasksPerSession) until the
 * gateway sees it reach a terminal status (a tasks/get or tasks/cancel
 * result, notifications/tasks/status, its tasks/result); it is then still
 * known, among the last `limit` ended ones, so its caller may fetch its
 * result, and the oldest ended ones are forgotten first.
 */

/** Terminal task statuses (MCP 2025-11-25 tasks, "Task Status"): a task in one never changes again. */
export function isTerminal(status: unknown): boolean {
  return status === 'completed' || status === 'failed' || status === 'cancelled'
}

/**
 * Whether the answer to a task request (tasks/get, tasks/update, tasks/result, tasks/cancel) shows
 * the task ended: a result given, a cancellation acknowledged, or a terminal status seen. The one
 * rule of both eras' task slots (legacy/session-tasks.ts, modern/tasks.ts).
 */
export function endsTask(method: string, result: unknown): boolean {
  return method === 'tasks/result' || method === 'tasks/cancel' || isTerminal((result as { status?: unknown } | undefined)?.status)
}

export class TaskLedger<V> {
  readonly limit: number
  readonly #working = new Map<string, V>()
  /** Ended tasks, oldest first, at most `limit`. */
  readonly #ended = new Map<string, V>()

  constructor(limit: number) {
    this.limit = limit
  }

  /** Whether `reserved` more tasks (calls that may create one, not answered yet) would pass the limit. */
  full(reserved: number): boolean {
    return this.#working.size + reserved >= this.limit
  }

  add(taskId: string, value: V): void {
    this.#ended.delete(taskId)
    this.#working.set(taskId, value)
  }

  get(taskId: unknown): V | undefined {
    if (typeof taskId !== 'string') return undefined
    return this.#working.get(taskId) ?? this.#ended.get(taskId)
  }

  has(taskId: unknown): boolean {
    return typeof taskId === 'string' && (this.#working.has(taskId) || this.#ended.has(taskId))
  }

  /** The task reached a terminal status: its slot is free. */
  end(taskId: unknown): void {
    if (typeof taskId !== 'string') return
    const v = this.#working.get(taskId)
    if (v === undefined) return
    this.#working.delete(taskId)
    this.#ended.set(taskId, v)
    if (this.#ended.size > this.limit) this.#ended.delete(this.#ended.keys().next().value!)
  }

  /** Forgets the task, ended or not (its server forgot it: its TTL passed). */
  delete(taskId: string): void {
    this.#working.delete(taskId)
    this.#ended.delete(taskId)
  }

  /** Tasks known, ended or not. */
  get size(): number {
    return this.#working.size + this.#ended.size
  }

  /** Tasks not seen ended yet. */
  get working(): number {
    return this.#working.size
  }
}
