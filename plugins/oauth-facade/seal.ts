/**
 * Sealing: everything the facade must remember between two requests travels
 * with the request itself, encrypted and authenticated (JWE compact, `dir`
 * with A256GCM), so any replica holding the keys can continue a flow another
 * one started, with no shared store. Each sealed value names its purpose
 * (`p`) and expiry (`exp`), so a state can never be replayed as a code, a
 * client id as a refresh token, and so on.
 */
import { createHash, randomBytes } from 'node:crypto'
import { CompactEncrypt, compactDecrypt } from 'jose'

export type SealPurpose = 'state' | 'consent-tx' | 'code' | 'refresh' | 'client' | 'remember'

export interface SealKey {
  readonly kid: string
  readonly secret: string
}

interface Key {
  readonly kid: string
  readonly key: Uint8Array
}

export class SealError extends Error {}

const enc = new TextEncoder()
const dec = new TextDecoder()

export class Sealer {
  readonly #keys: readonly Key[]
  readonly #byKid: ReadonlyMap<string, Key>
  /** No `keys` configured. */
  readonly ephemeral: boolean
  /** Without `keys`: sealing with `derived`, the key every worker and replica derives alike (env.deriveKey), not one of this process's own. */
  readonly derived: boolean

  constructor(keys: readonly SealKey[] | undefined, derived?: Uint8Array) {
    this.ephemeral = keys === undefined || keys.length === 0
    this.derived = this.ephemeral && derived !== undefined
    const list = this.ephemeral
      ? [derived !== undefined ? { kid: 'derived', key: derived } : { kid: 'ephemeral', key: new Uint8Array(randomBytes(32)) }]
      : keys!.map(k => ({ kid: k.kid, key: new Uint8Array(createHash('sha256').update(k.secret, 'utf8').digest()) }))
    this.#keys = list
    this.#byKid = new Map(list.map(k => [k.kid, k]))
  }

  /** Seals `data` for `purpose`, valid for `ttlSeconds` (none: forever, used for client ids). */
  async seal(purpose: SealPurpose, data: Record<string, unknown>, ttlSeconds?: number): Promise<string> {
    const k = this.#keys[0]!
    const body: Record<string, unknown> = { ...data, p: purpose }
    if (ttlSeconds !== undefined) body.exp = Math.floor(Date.now() / 1000) + ttlSeconds
    return new CompactEncrypt(enc.encode(JSON.stringify(body))).setProtectedHeader({ alg: 'dir', enc: 'A256GCM', kid: k.kid }).encrypt(k.key)
  }

  /** Opens a sealed value of `purpose`; throws SealError when it is not one (tampered, expired, other purpose, unknown key). */
  async open<T extends Record<string, unknown>>(purpose: SealPurpose, sealed: string): Promise<T> {
    if (typeof sealed !== 'string' || sealed.length > 16384 || sealed.split('.').length !== 5) throw new SealError('not a sealed value')
    let kid: unknown
    try {
      kid = JSON.parse(Buffer.from(sealed.slice(0, sealed.indexOf('.')), 'base64url').toString('utf8')).kid
    } catch {
      throw new SealError('not a sealed value')
    }
    const key = typeof kid === 'string' ? this.#byKid.get(kid) : undefined
    if (key === undefined) throw new SealError('sealed with an unknown key')
    let body: Record<string, unknown>
    try {
      const { plaintext } = await compactDecrypt(sealed, key.key, { keyManagementAlgorithms: ['dir'], contentEncryptionAlgorithms: ['A256GCM'] })
      body = JSON.parse(dec.decode(plaintext)) as Record<string, unknown>
    } catch {
      throw new SealError('sealed value does not open')
    }
    if (body.p !== purpose) throw new SealError(`sealed value is not a ${purpose}`)
    if (typeof body.exp === 'number' && body.exp < Date.now() / 1000) throw new SealError(`${purpose} has expired`)
    return body as T
  }
}

/** RFC 7636 §4.2 S256. */
export function s256(verifier: string): string {
  return createHash('sha256').update(verifier, 'ascii').digest('base64url')
}

export function randomToken(bytes = 32): string {
  return randomBytes(bytes).toString('base64url')
}
