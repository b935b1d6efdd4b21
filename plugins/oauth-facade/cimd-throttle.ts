/**
 * Bounds on client ID metadata document fetches: anyone who can open the
 * authorize endpoint makes the gateway fetch an https URL of their choice,
 * one fetch per distinct URL. Bounded per client address (resolved through
 * mcp.trustedProxies) and over all clients, both in flight and per minute,
 * so the gateway can neither be made a scanner nor tie up its sockets.
 * Per process: each process bounds the fetches it makes itself. Cache hits
 * and a fetch already in flight for the same URL cost nothing.
 */
import { RateLimiter, addressKey } from '../oauth-common/rate-limit.ts'

export interface CimdFetchLimits {
  readonly maxFetchesPerAddress: number
  readonly maxFetchesPerMinute: number
  readonly maxConcurrentFetches: number
  readonly maxConcurrentFetchesPerAddress: number
}

/** A fetch refused by these bounds: `retryAfter` seconds (Retry-After). */
export interface Throttled {
  readonly retryAfter: number
  readonly reason: string
}

export class CimdThrottle {
  readonly #limits: CimdFetchLimits
  readonly #perAddress: RateLimiter
  readonly #overall: RateLimiter
  readonly #inFlight = new Map<string, number>()
  #total = 0

  constructor(limits: CimdFetchLimits) {
    this.#limits = limits
    this.#perAddress = new RateLimiter({ requests: limits.maxFetchesPerAddress, windowSeconds: 60, maxAddresses: 10000 })
    this.#overall = new RateLimiter({ requests: limits.maxFetchesPerMinute, windowSeconds: 60, maxAddresses: 1 })
  }

  /** Starts a fetch for `clientAddress`: a release function, or why not. */
  acquire(clientAddress: string | undefined): (() => void) | Throttled {
    const key = addressKey(clientAddress)
    const mine = this.#inFlight.get(key) ?? 0
    if (this.#total >= this.#limits.maxConcurrentFetches) return { retryAfter: 1, reason: 'concurrent fetches (all clients)' }
    if (mine >= this.#limits.maxConcurrentFetchesPerAddress) return { retryAfter: 1, reason: 'concurrent fetches (this address)' }
    const addressTurn = this.#perAddress.take(key)
    if (addressTurn.retryAfter > 0) return { retryAfter: addressTurn.retryAfter, reason: 'fetches per minute (this address)' }
    const overallTurn = this.#overall.take('all')
    if (overallTurn.retryAfter > 0) return { retryAfter: overallTurn.retryAfter, reason: 'fetches per minute (all clients)' }
    this.#total++
    this.#inFlight.set(key, mine + 1)
    let released = false
    return () => {
      if (released) return
      released = true
      this.#total--
      const n = (this.#inFlight.get(key) ?? 1) - 1
      if (n <= 0) this.#inFlight.delete(key)
      else this.#inFlight.set(key, n)
    }
  }
}
