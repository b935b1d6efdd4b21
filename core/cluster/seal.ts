/**
 * Sealed identifiers: `base64url(iv || AES-256-GCM(plain) || tag)` under a key
 * derived from a shared secret. What the gateway hands a client so that any
 * worker or replica can trust it back (session owner ids, passthrough session
 * ids, task ids): unreadable, and anything altered or forged does not open.
 * Each use derives its own key (its own HKDF info), so one kind of id never
 * opens as another.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto'

const IV_BYTES = 12
const TAG_BYTES = 16

/** A 256-bit key for one use of `secret` (RFC 5869 HKDF-SHA256; `info` names the use). */
export function sealKey(secret: string, info: string): Buffer {
  return Buffer.from(hkdfSync('sha256', secret, 'mcp-proxy', info, 32))
}

/** AES-256-GCM with a random 96-bit IV (NIST SP 800-38D §8.2.2); `aad` is authenticated, not carried. */
export function seal(key: Buffer, plain: readonly Buffer[], aad?: Buffer): string {
  const iv = randomBytes(IV_BYTES)
  const c = createCipheriv('aes-256-gcm', key, iv)
  if (aad !== undefined) c.setAAD(aad)
  const parts = plain.map(p => c.update(p))
  parts.push(c.final())
  return Buffer.concat([iv, ...parts, c.getAuthTag()]).toString('base64url')
}

/**
 * The plain bytes of `id`, or undefined when it does not open (altered, forged, another key or
 * `aad`). Ids longer than `maxChars` or whose plain text would be shorter than `minPlain` bytes
 * are refused before any decryption: a bound on the work an attacker's id costs.
 */
export function unseal(key: Buffer, id: string, minPlain: number, maxChars: number, aad?: Buffer): Buffer | undefined {
  if (id.length > maxChars) return undefined
  const raw = Buffer.from(id, 'base64url')
  if (raw.length < IV_BYTES + minPlain + TAG_BYTES) return undefined
  try {
    const d = createDecipheriv('aes-256-gcm', key, raw.subarray(0, IV_BYTES))
    if (aad !== undefined) d.setAAD(aad)
    d.setAuthTag(raw.subarray(raw.length - TAG_BYTES))
    return Buffer.concat([d.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)), d.final()])
  } catch {
    return undefined
  }
}
