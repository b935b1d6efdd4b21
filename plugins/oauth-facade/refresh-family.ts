/**
 * Refresh token rotation with reuse detection (MCP authorization: refresh
 * tokens of public clients MUST be rotated; RFC 9700 §4.14.2). Every sealed
 * refresh token names its family (`f`: one per original grant) and its
 * generation (`g`: 0 for the grant's first, +1 per rotation). Redeeming
 * generation g records the slot `f:g` in the store of used codes (memory,
 * the primary's with workers, Redis with facade.redis or cluster.redis), so
 * each token is single-use across replicas and workers.
 *
 * A slot found taken is a reuse: either the client or a thief holds an older
 * token. The family is then revoked by taking the first free slot after it,
 * which is the newest token's (a family is a chain: slot k+1 exists only once
 * k was redeemed), so whichever party holds the newest token is refused too.
 * Only the store's put-if-absent is needed; a slot lives as long as the token
 * it guards can still open.
 */
import { createHash } from 'node:crypto'
import type { UsedCodes } from './used-codes.ts'

/** Rotations walked past a reused token to find the newest; a longer chain is logged, not revoked past it. */
export const MAX_REVOKE_WALK = 1000

export interface FamilyRef {
  readonly family: string
  readonly generation: number
}

/** Family and generation of a sealed refresh token; one sealed before families existed is a family of its own. */
export function familyOf(rt: { f?: unknown; g?: unknown }, sealed: string): FamilyRef {
  if (typeof rt.f === 'string' && typeof rt.g === 'number' && Number.isInteger(rt.g) && rt.g >= 0) return { family: rt.f, generation: rt.g }
  return { family: createHash('sha256').update(sealed).digest('base64url').slice(0, 22), generation: 0 }
}

const slot = (family: string, generation: number): string => `rt:${family}:${generation}`

export class RefreshFamilies {
  readonly #store: UsedCodes
  readonly #ttlSeconds: number

  constructor(store: UsedCodes, ttlSeconds: number) {
    this.#store = store
    this.#ttlSeconds = ttlSeconds
  }

  /** Records the token as used; false when it already was (a reuse). `exp`: the token's own expiry (seconds). */
  redeem(ref: FamilyRef, exp: number): Promise<boolean> {
    return this.#store.markUsed(slot(ref.family, ref.generation), exp)
  }

  /**
   * Revokes the family after a reuse of `ref`: takes the first free slot
   * after it, until the longest a token issued now could live. Returns the
   * generation revoked, or undefined past MAX_REVOKE_WALK.
   */
  async revoke(ref: FamilyRef): Promise<number | undefined> {
    const until = Math.floor(Date.now() / 1000) + this.#ttlSeconds
    for (let g = ref.generation + 1; g <= ref.generation + MAX_REVOKE_WALK; g++) {
      if (await this.#store.markUsed(slot(ref.family, g), until)) return g
    }
    return undefined
  }
}
