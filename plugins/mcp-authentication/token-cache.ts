/**
 * Bounded cache of verified tokens so repeat requests skip signature
 * verification. Keyed by the SHA-256 of the whole token (a token that differs
 * by one byte is a different key); entries never outlive the token's `exp`.
 * Eviction is oldest-inserted first (Map insertion order), refreshed on hit.
 */
import { createHash } from 'node:crypto'
import type { AuthInfo } from '../../core/context.ts'

interface Entry { readonly auth: AuthInfo; readonly kid: string | undefined; readonly expiresAtMs: number }

export class TokenCache {
  readonly #max: number
  readonly #ttlMs: number
  readonly #map = new Map<string, Entry>()
  hits = 0
  misses = 0

  constructor (maxEntries: number, ttlSeconds: number) {
    this.#max = maxEntries
    this.#ttlMs = ttlSeconds * 1000
  }

  get size (): number { return this.#map.size }

  static keyOf (token: string): string {
    return createHash('sha256').update(token).digest('base64url')
  }

  get (token: string, stillValidKid: (kid: string | undefined) => boolean): AuthInfo | undefined {
    const key = TokenCache.keyOf(token)
    const e = this.#map.get(key)
    if (e === undefined) { this.misses++; return undefined }
    // A key removed from the key set takes its tokens with it.
    if (e.expiresAtMs <= Date.now() || !stillValidKid(e.kid)) {
      this.#map.delete(key)
      this.misses++
      return undefined
    }
    this.#map.delete(key)
    this.#map.set(key, e)
    this.hits++
    return e.auth
  }

  set (token: string, auth: AuthInfo, kid: string | undefined): void {
    const now = Date.now()
    const expMs = auth.expiresAt === undefined ? now : auth.expiresAt * 1000
    const expiresAtMs = Math.min(expMs, now + this.#ttlMs)
    if (expiresAtMs <= now) return
    const key = TokenCache.keyOf(token)
    this.#map.delete(key)
    this.#map.set(key, { auth, kid, expiresAtMs })
    while (this.#map.size > this.#max) {
      const oldest = this.#map.keys().next().value as string
      this.#map.delete(oldest)
    }
  }

  clear (): void { this.#map.clear() }
}
