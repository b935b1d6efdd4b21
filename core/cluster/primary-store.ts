/**
 * The shared state of `workers` without Redis: one memory store in the
 * primary, which every worker asks over IPC (same SharedState contract and
 * semantics as in one process). The primary remembers which worker holds
 * which cap slot, so a worker that dies frees its slots at once.
 */
import type { Worker } from 'node:cluster'
import type { Logger } from 'pino'
import { STATE_OPS, type StateOp, type ToWorker } from './messages.ts'
import type { SharedState } from './shared-state.ts'
import type { Slot } from './worker-slots.ts'

export class PrimaryStore {
  readonly #store: SharedState
  readonly #log: Logger

  constructor(store: SharedState, log: Logger) {
    this.#store = store
    this.#log = log
  }

  /** Runs a worker's operation and sends it the outcome. */
  async serve(slot: Slot, w: Worker, m: { id: number; op: StateOp; args: unknown[] }): Promise<void> {
    try {
      if (!STATE_OPS.has(m.op) || !Array.isArray(m.args)) throw new Error(`unknown operation ${String(m.op)}`)
      const value = await this.#run(slot, m.op, m.args)
      if (w.isConnected()) w.send({ t: 'mcpp:state', id: m.id, ok: true, value } satisfies ToWorker)
    } catch (err) {
      this.#log.error({ err, worker: slot.n }, 'shared state operation failed')
      if (w.isConnected()) w.send({ t: 'mcpp:state', id: m.id, ok: false, error: (err as Error).message } satisfies ToWorker)
    }
  }

  async #run(slot: Slot, op: StateOp, a: unknown[]): Promise<unknown> {
    const store = this.#store
    switch (op) {
      case 'take':
        return store.take(a[0] as string, a[1] as number, a[2] as number)
      case 'join': {
        const joined = await store.join(a[0] as string, a[1] as string, a[2] as number, a[3] as number)
        if (joined) slot.joins.set(`${a[0] as string} ${a[1] as string}`, { key: a[0] as string, member: a[1] as string })
        return joined
      }
      case 'renew':
        await store.renew(a[0] as Array<{ key: string; member: string }>, a[1] as number)
        return undefined
      case 'leave':
        await store.leave(a[0] as string, a[1] as string)
        slot.joins.delete(`${a[0] as string} ${a[1] as string}`)
        return undefined
      case 'putOnce':
        return store.putOnce(a[0] as string, a[1] as string, a[2] as number)
      case 'takeOnce':
        return store.takeOnce(a[0] as string)
    }
  }

  /** The cap slots of a worker that exited, freed at once. */
  freeJoins(slot: Slot): void {
    for (const { key, member } of slot.joins.values()) void this.#store.leave(key, member)
    slot.joins.clear()
  }

  close(): Promise<void> {
    return this.#store.close()
  }
}
