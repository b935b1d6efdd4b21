/**
 * The primary's view of its workers: one slot per worker number (1..N,
 * stable across replacements), what each holds (its process groups, its cap
 * slots in the store), and the questions the primary asks them (readiness,
 * metrics), answered over IPC or timed out.
 */
import type { Worker } from 'node:cluster'
import type { ProbeReadiness } from '../admin/probes.ts'
import { ASK_TIMEOUT_MS, type Question, type ToWorker } from './messages.ts'

export interface Slot {
  readonly n: number
  worker: Worker | undefined
  /** The worker finished start-up (its gateway serves). */
  up: boolean
  adminUrl: string | undefined
  /** Process groups of its stdio children. */
  readonly groups: Set<number>
  /** Cap slots it holds in the store, by `${key} ${member}` (keys may hold any character; members are session ids). */
  readonly joins: Map<string, { key: string; member: string }>
}

export class WorkerSlots {
  readonly all: readonly Slot[]
  readonly #asks = new Map<number, { resolve(v: unknown): void; timer: NodeJS.Timeout }>()
  #nextAsk = 1

  constructor(count: number) {
    this.all = Array.from({ length: count }, (_, i) => ({ n: i + 1, worker: undefined, up: false, adminUrl: undefined, groups: new Set(), joins: new Map() }))
  }

  get live(): number {
    return this.all.filter(s => s.worker !== undefined).length
  }

  /** The worker's answer; undefined when it is not running or does not answer in time. */
  ask(slot: Slot, what: Question): Promise<unknown> {
    const w = slot.worker
    if (w === undefined || !w.isConnected()) return Promise.resolve(undefined)
    const id = this.#nextAsk++
    return new Promise(resolve => {
      const timer = setTimeout(() => {
        this.#asks.delete(id)
        resolve(undefined)
      }, ASK_TIMEOUT_MS)
      this.#asks.set(id, { resolve, timer })
      w.send({ t: 'mcpp:ask', id, what } satisfies ToWorker)
    })
  }

  /** A worker's `mcpp:answer`. */
  answered(id: number, value: unknown): void {
    const p = this.#asks.get(id)
    if (p !== undefined) {
      this.#asks.delete(id)
      clearTimeout(p.timer)
      p.resolve(value)
    }
  }

  /** Ready when every worker is; each reason names its worker. */
  async readiness(): Promise<ProbeReadiness> {
    const answers = await Promise.all(this.all.map(async s => ({ s, r: s.up ? ((await this.ask(s, 'ready')) as ProbeReadiness | undefined) : undefined })))
    const reasons: string[] = []
    const codes: string[] = []
    for (const { s, r } of answers) {
      if (s.worker === undefined) {
        reasons.push(`worker ${s.n}: not running`)
        codes.push('worker_not_running')
      } else if (r === undefined) {
        reasons.push(`worker ${s.n}: starting`)
        codes.push('worker_starting')
      } else if (!r.ready) {
        reasons.push(...r.reasons.map(x => `worker ${s.n}: ${x}`))
        codes.push(...(r.codes ?? ['not_ready']))
      }
    }
    return { ready: reasons.length === 0, reasons, codes }
  }

  /** Every serving worker's metrics exposition (empty for the others). */
  metrics(): Promise<Array<{ worker: number; text: string }>> {
    return Promise.all(this.all.map(async s => ({ worker: s.n, text: s.up ? String((await this.ask(s, 'metrics')) ?? '') : '' })))
  }
}
