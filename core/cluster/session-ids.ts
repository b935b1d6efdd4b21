/**
 * The two kinds of session id a replica hands out with `cluster`, and the keys
 * they are sealed under (seal.ts): an owner id, which names the replica that
 * holds the session in memory (forward.ts relays to it), and a passthrough
 * id, which carries the upstream's own Mcp-Session-Id bound to the target and
 * the caller's subject, so that any replica serves it. Each kind has its own
 * key (its own HKDF info): an owner id never opens as a passthrough id, nor
 * the reverse.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import { seal, sealKey, unseal } from './seal.ts'

/** Longest session id that is opened at all. */
const MAX_ID_CHARS = 512
const NONCE_BYTES = 16
/** Bytes of SHA-256 over the subject kept in a sealed passthrough id (binds it; the subject itself is not carried). */
const SUBJECT_BYTES = 16
/** Longest upstream session id that is sealed (the id stays well under the 512 characters `open` accepts). */
export const MAX_SEALED_UPSTREAM_ID = 256

/** The caller's subject as sealed: a digest, so a long subject does not lengthen the id (undefined: no token). */
function subjectDigest(subject: string | undefined): Buffer {
  return createHash('sha256')
    .update(subject === undefined ? '\0' : `s:${subject}`)
    .digest()
    .subarray(0, SUBJECT_BYTES)
}

export class SessionIds {
  /** This replica's origin (`cluster.advertiseUrl`), as owner ids carry it. */
  readonly self: string
  readonly #ownerKey: Buffer
  readonly #upstreamKey: Buffer
  readonly #selfBytes: Buffer

  constructor(secret: string, advertiseUrl: string) {
    this.self = new URL(advertiseUrl).origin
    this.#selfBytes = Buffer.from(this.self, 'utf8')
    this.#ownerKey = sealKey(secret, 'session-id owner seal v1')
    this.#upstreamKey = sealKey(secret, 'session-id passthrough seal v1')
  }

  /** A new session id naming this replica as the owner. */
  newOwnerId(): string {
    return seal(this.#ownerKey, [randomBytes(NONCE_BYTES), this.#selfBytes])
  }

  /** The owner origin sealed in `id`; undefined for a forged, altered or foreign id. */
  ownerOf(id: string): string | undefined {
    return unseal(this.#ownerKey, id, NONCE_BYTES + 1, MAX_ID_CHARS)
      ?.subarray(NONCE_BYTES)
      .toString('utf8')
  }

  sealUpstream(target: string, subject: string | undefined, upstreamId: string): string | undefined {
    const up = Buffer.from(upstreamId, 'utf8')
    if (up.length === 0 || up.length > MAX_SEALED_UPSTREAM_ID) return undefined
    return seal(this.#upstreamKey, [subjectDigest(subject), up], Buffer.from(target, 'utf8'))
  }

  openUpstream(target: string, subject: string | undefined, id: string): string | undefined {
    const plain = unseal(this.#upstreamKey, id, SUBJECT_BYTES + 1, MAX_ID_CHARS, Buffer.from(target, 'utf8'))
    // Another subject's id is as unknown as a forged one.
    if (plain === undefined || !timingSafeEqual(plain.subarray(0, SUBJECT_BYTES), subjectDigest(subject))) return undefined
    return plain.subarray(SUBJECT_BYTES).toString('utf8')
  }
}
