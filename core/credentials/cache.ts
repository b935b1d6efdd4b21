/**
 * One target's minted credentials, per caller key (`subjectKeyOf`: one
 * subject), never shared across keys: fresh until the token's `exp` minus the
 * skew, bounded (least recently used out first), and one exchange in flight
 * per key however many requests wait for it. A failed exchange leaves
 * nothing behind: the next request tries again.
 */
import type { TargetCredential } from './types.ts'

export class CredentialCache {
  readonly #entries = new Map<string, TargetCredential>()
  readonly #inflight = new Map<string, Promise<TargetCredential>>()
  readonly #max: number
  readonly #now: () => number
  readonly #onSize: (n: number) => void

  constructor(max: number, now: () => number, onSize: (n: number) => void) {
    this.#max = max
    this.#now = now
    this.#onSize = onSize
  }

  get size(): number {
    return this.#entries.size
  }

  /** The fresh credential of `key`, made the most recently used; a stale one is dropped. */
  get(key: string): TargetCredential | undefined {
    const entry = this.#entries.get(key)
    if (entry === undefined) return undefined
    this.#entries.delete(key)
    if (entry.freshUntil <= this.#now()) {
      this.#onSize(this.#entries.size)
      return undefined
    }
    // Re-inserted: a Map iterates in insertion order, so the first key is the least recently used.
    this.#entries.set(key, entry)
    return entry
  }

  set(key: string, credential: TargetCredential): void {
    this.#entries.delete(key)
    this.#entries.set(key, credential)
    while (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next().value as string
      this.#entries.delete(oldest)
    }
    this.#onSize(this.#entries.size)
  }

  /**
   * The exchange in flight for `key`, or a new one started with `run`
   * (`shared` tells which). It is forgotten when it settles, whatever the outcome.
   */
  flight(key: string, run: () => Promise<TargetCredential>): { readonly promise: Promise<TargetCredential>; readonly shared: boolean } {
    const pending = this.#inflight.get(key)
    if (pending !== undefined) return { promise: pending, shared: true }
    const promise = run().finally(() => {
      if (this.#inflight.get(key) === promise) this.#inflight.delete(key)
    })
    this.#inflight.set(key, promise)
    return { promise, shared: false }
  }

  clear(): void {
    this.#entries.clear()
    this.#onSize(0)
  }
}
