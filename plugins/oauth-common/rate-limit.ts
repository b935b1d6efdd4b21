/**
 * Per-client-address rate limit of client registration: a token bucket per
 * address, `requests` deep and refilled evenly over `windowSeconds`, so a
 * client may register a few times in a row but not flood the endpoint. The
 * table of addresses is bounded (`maxAddresses`, least recently seen dropped
 * first), so a flood from many addresses costs bounded memory.
 */

export interface RateLimitOptions {
  /** Registrations in a burst; 0 turns the limit off. */
  readonly requests: number
  /** Time over which `requests` are refilled. */
  readonly windowSeconds: number
  /** Addresses tracked at once. */
  readonly maxAddresses: number
}

interface Bucket {
  tokens: number
  /** When `tokens` was last brought up to date (ms, monotonic). */
  at: number
  /** Whether this address has been refused since it was last served (one log line per streak). */
  limited: boolean
}

export interface TakeResult {
  /** 0 when the request may go on, else the whole seconds until it would (Retry-After). */
  readonly retryAfter: number
  /** True on the first refusal of a streak, to log it once. */
  readonly firstRefusal: boolean
}

/**
 * The limit the OAuth facade's registration endpoint applies, which has no
 * option for it: the registration plugin's schema defaults (its test checks
 * that the two agree).
 */
export const REGISTRATION_RATE_LIMIT: RateLimitOptions = Object.freeze({ requests: 20, windowSeconds: 60, maxAddresses: 10000 })

const ALLOWED: TakeResult = { retryAfter: 0, firstRefusal: false }

/**
 * The key an address is limited under: IPv4 (also IPv4-mapped IPv6) as is,
 * other IPv6 by its /64 prefix, since one host or home network usually holds
 * a whole /64 (RFC 6177) and could otherwise take a new address per request.
 */
export function addressKey(address: string | undefined): string {
  if (address === undefined || address === '') return 'unknown'
  if (!address.includes(':')) return address
  const lower = address.toLowerCase()
  if (lower.startsWith('::ffff:') && lower.includes('.')) return lower.slice(7)
  const zone = lower.indexOf('%')
  const plain = zone === -1 ? lower : lower.slice(0, zone)
  const cut = plain.indexOf('::')
  let groups: string[]
  if (cut === -1) {
    groups = plain.split(':')
  } else {
    const head = cut === 0 ? [] : plain.slice(0, cut).split(':')
    const tail = cut + 2 === plain.length ? [] : plain.slice(cut + 2).split(':')
    groups = [...head, ...new Array<string>(Math.max(0, 8 - head.length - tail.length)).fill('0'), ...tail]
  }
  return (
    groups
      .slice(0, 4)
      .map(g => (Number.parseInt(g, 16) || 0).toString(16))
      .join(':') + '::/64'
  )
}

export class RateLimiter {
  readonly #buckets = new Map<string, Bucket>()
  readonly #capacity: number
  /** Tokens per millisecond. */
  readonly #rate: number
  readonly #maxAddresses: number
  readonly #now: () => number

  constructor(o: RateLimitOptions, now: () => number = () => performance.now()) {
    this.#capacity = o.requests
    this.#rate = o.requests / (o.windowSeconds * 1000)
    this.#maxAddresses = o.maxAddresses
    this.#now = now
  }

  /** Addresses currently tracked. */
  get size(): number {
    return this.#buckets.size
  }

  /** Counts one request from `key`. */
  take(key: string): TakeResult {
    if (this.#capacity === 0) return ALLOWED
    const now = this.#now()
    let b = this.#buckets.get(key)
    if (b === undefined) {
      b = { tokens: this.#capacity, at: now, limited: false }
    } else {
      // Re-inserted below so that the map's order is least recently seen first.
      this.#buckets.delete(key)
      b.tokens = Math.min(this.#capacity, b.tokens + (now - b.at) * this.#rate)
      b.at = now
    }
    this.#buckets.set(key, b)
    if (this.#buckets.size > this.#maxAddresses) {
      this.#buckets.delete(this.#buckets.keys().next().value!)
    }
    if (b.tokens >= 1) {
      b.tokens -= 1
      b.limited = false
      return ALLOWED
    }
    const firstRefusal = !b.limited
    b.limited = true
    return { retryAfter: Math.max(1, Math.ceil((1 - b.tokens) / this.#rate / 1000)), firstRefusal }
  }
}

/** What AddressLimiter needs of the gateway's shared state (`env.shared`: Redis with cluster.redis, the primary's with workers). */
export interface SharedBuckets {
  readonly kind: string
  take(key: string, capacity: number, windowMs: number): Promise<number>
}

/**
 * The registration limit as both registration endpoints apply it (the
 * registration plugin and the OAuth facade's): keyed by the resolved client
 * address (`ctx.clientAddress`, which `mcp.trustedProxies` resolves), one
 * bucket per address across replicas and workers when the gateway has shared
 * state, else this process's table.
 */
export class AddressLimiter {
  readonly #opts: RateLimitOptions
  readonly #local: RateLimiter
  readonly #shared: SharedBuckets | undefined
  readonly #prefix: string
  /** Addresses refused since last served, for one log line per streak (bounded like the local table). */
  readonly #refusing = new Set<string>()

  constructor(opts: RateLimitOptions, shared: SharedBuckets | undefined, prefix = 'registration', now?: () => number) {
    this.#opts = opts
    this.#local = new RateLimiter(opts, now)
    this.#shared = shared !== undefined && shared.kind !== 'memory' && opts.requests > 0 ? shared : undefined
    this.#prefix = prefix
  }

  /** Counts one request from a client address (not yet keyed: `addressKey` is applied here). */
  async take(clientAddress: string | undefined): Promise<TakeResult & { readonly address: string }> {
    const address = addressKey(clientAddress)
    if (this.#shared === undefined) return { ...this.#local.take(address), address }
    const waitMs = await this.#shared.take(`${this.#prefix}\u0000${address}`, this.#opts.requests, this.#opts.windowSeconds * 1000)
    if (waitMs === 0) {
      this.#refusing.delete(address)
      return { retryAfter: 0, firstRefusal: false, address }
    }
    const firstRefusal = !this.#refusing.has(address)
    if (firstRefusal) {
      this.#refusing.add(address)
      if (this.#refusing.size > this.#opts.maxAddresses) this.#refusing.delete(this.#refusing.values().next().value!)
    }
    return { retryAfter: Math.max(1, Math.ceil(waitMs / 1000)), firstRefusal, address }
  }
}
