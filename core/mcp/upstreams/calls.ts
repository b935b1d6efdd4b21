/**
 * The id mapping both eras use toward an upstream: every request the
 * gateway sends on one upstream connection gets a fresh numeric id there,
 * and the upstream's response finds its call by that id. Client ids never
 * reach an upstream: JSON-RPC ids are unique per connection (JSON-RPC 2.0
 * §4), and one upstream serves several client requests (a session's, or a
 * pool's many callers). session-link.ts keeps one table per link, pool.ts
 * one per pooled upstream. The same table times each call for the
 * target's metrics (call-metrics.ts), so measuring adds nothing to the
 * upstream's own message path.
 */
import type { JsonRpcMessage } from '../../targets/types.ts'
import type { CallOutcome, CallTiming, TargetCallMeter } from './call-metrics.ts'

export class UpstreamCalls<C extends { readonly id: number }> {
  #seq = 0
  readonly #byId = new Map<number, C>()
  readonly #meter: TargetCallMeter | undefined
  readonly #timings = new Map<number, CallTiming>()

  constructor(meter?: TargetCallMeter) {
    this.#meter = meter
  }

  /** A fresh id on this upstream. */
  nextId(): number {
    return ++this.#seq
  }

  /** `call` goes upstream as `request` (timed when the table has a meter). */
  add(call: C, request: JsonRpcMessage): void {
    this.#byId.set(call.id, call)
    if (this.#meter !== undefined) this.#timings.set(call.id, this.#meter.sent(request))
  }

  /** The call `response` answers, taken out; undefined for an id that is not in flight. */
  answered(response: JsonRpcMessage): C | undefined {
    const { id } = response
    if (typeof id !== 'number') return undefined
    const call = this.#byId.get(id)
    if (call !== undefined) {
      this.#byId.delete(id)
      this.#settled(id, response.error === undefined ? 'ok' : 'error', response)
    }
    return call
  }

  /** Takes `call` out unanswered (send failed, timed out, cancelled); false when it was settled already. */
  remove(call: C): boolean {
    if (this.#byId.get(call.id) !== call) return false
    this.#byId.delete(call.id)
    this.#settled(call.id, 'closed')
    return true
  }

  /** Every call in flight, taken out (the upstream closed). */
  drain(): C[] {
    const all = [...this.#byId.values()]
    this.#byId.clear()
    for (const c of all) this.#settled(c.id, 'closed')
    return all
  }

  #settled(id: number, outcome: CallOutcome, response?: JsonRpcMessage): void {
    if (this.#meter === undefined) return
    const t = this.#timings.get(id)
    if (t === undefined) return
    this.#timings.delete(id)
    this.#meter.settled(t, outcome, response)
  }

  get size(): number {
    return this.#byId.size
  }

  values(): IterableIterator<C> {
    return this.#byId.values()
  }
}
