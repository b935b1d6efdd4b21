/**
 * Bounded cache of verified tokens so repeat requests skip signature
 * verification. Keyed by the SHA-256 of the whole token (a token that differs
 * by one byte is a different key); entries never outlive the token's `exp`.
 * Eviction is oldest-inserted first (Map insertion order), refreshed on hit.
 *
 * Before hashing, the token is compared with the last one verified on the
 * same connection (a keep-alive client sends the same token every time), so
 * most requests skip SHA-256. That memo holds the same entry, so the same
 * expiry and key checks apply; any other token falls back to the hash.
 */
import { createHash } from 'node:crypto'
import type { AuthInfo } from '../../core/plugin-api.ts'

interface Entry {
  readonly auth: AuthInfo
  readonly kid: string | undefined
  readonly expiresAtMs: number
}

/**
 * The last verified token on one connection. Compared with `===`: it is a
 * token presented on that same connection, and the memcmp of a string of a
 * few hundred bytes leaves no timing a remote client can measure (a
 * Buffer.from + timingSafeEqual costs about as much as the SHA-256 it saves).
 */
interface LastOnConnection {
  readonly token: string
  readonly entry: Entry
}

export class TokenCache {
  readonly #max: number
  readonly #ttlMs: number
  readonly #map = new Map<string, Entry>()
  #byConnection = new WeakMap<object, LastOnConnection>()
  hits = 0
  misses = 0

  constructor(maxEntries: number, ttlSeconds: number) {
    this.#max = maxEntries
    this.#ttlMs = ttlSeconds * 1000
  }

  get size(): number {
    return this.#map.size
  }

  static keyOf(token: string): string {
    return createHash('sha256').update(token).digest('base64url')
  }

  /**
   * The cached verification of `token`, if still good. `connection` (the
   * request's socket) enables the per-connection memo.
   */
  get(token: string, stillValidKid: (kid: string | undefined) => boolean, connection?: object): AuthInfo | undefined {
    if (connection !== undefined) {
      const last = this.#byConnection.get(connection)
      if (last !== undefined && last.token === token) {
        if (last.entry.expiresAtMs > Date.now() && stillValidKid(last.entry.kid)) {
          this.hits++
          return last.entry.auth
        }
        this.#byConnection.delete(connection)
      }
    }
    const key = TokenCache.keyOf(token)
    const e = this.#map.get(key)
    if (e === undefined) {
      this.misses++
      return undefined
    }
    // A key removed from the key set takes its tokens with it.
    if (e.expiresAtMs <= Date.now() || !stillValidKid(e.kid)) {
      this.#map.delete(key)
      this.misses++
      return undefined
    }
    this.#map.delete(key)
    this.#map.set(key, e)
    this.hits++
    if (connection !== undefined) this.#byConnection.set(connection, { token, entry: e })
    return e.auth
  }

  set(token: string, auth: AuthInfo, kid: string | undefined, connection?: object): void {
    const now = Date.now()
    const expMs = auth.expiresAt === undefined ? now : auth.expiresAt * 1000
    const expiresAtMs = Math.min(expMs, now + this.#ttlMs)
    if (expiresAtMs <= now) return
    const key = TokenCache.keyOf(token)
    const entry = { auth, kid, expiresAtMs }
    this.#map.delete(key)
    this.#map.set(key, entry)
    while (this.#map.size > this.#max) {
      const oldest = this.#map.keys().next().value as string
      this.#map.delete(oldest)
    }
    if (connection !== undefined) this.#byConnection.set(connection, { token, entry })
  }

  clear(): void {
    this.#map.clear()
    this.#byConnection = new WeakMap()
  }
}
