/**
 * The id mapping both eras use toward an upstream: every request the
 * gateway sends on one upstream connection gets a fresh numeric id there,
 * and the upstream's response finds its call by that id. Client ids never
 * reach an upstream: JSON-RPC ids are unique per connection (JSON-RPC 2.0
 * §4), and one upstream serves several client requests (a session's, or a
 * pool's many callers). session.ts keeps one table per link, modern-pool.ts
 * one per pooled upstream.
 */

export class UpstreamCalls<C extends { readonly id: number }> {
  #seq = 0
  readonly #byId = new Map<number, C>()

  /** A fresh id on this upstream. */
  nextId (): number {
    return ++this.#seq
  }

  add (call: C): void {
    this.#byId.set(call.id, call)
  }

  /** The call a response answers, taken out; undefined for an id that is not in flight. */
  answered (id: unknown): C | undefined {
    if (typeof id !== 'number') return undefined
    const call = this.#byId.get(id)
    if (call !== undefined) this.#byId.delete(id)
    return call
  }

  /** Takes `call` out; false when it was settled already (answered, timed out, cancelled). */
  remove (call: C): boolean {
    if (this.#byId.get(call.id) !== call) return false
    this.#byId.delete(call.id)
    return true
  }

  /** Every call in flight, taken out (the upstream closed). */
  drain (): C[] {
    const all = [...this.#byId.values()]
    this.#byId.clear()
    return all
  }

  get size (): number {
    return this.#byId.size
  }

  values (): IterableIterator<C> {
    return this.#byId.values()
  }
}
