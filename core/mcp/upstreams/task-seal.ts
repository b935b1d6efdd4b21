/**
 * Task ids of the 2026-07-28 tasks extension (SEP-2663) as the client sees
 * them: the task itself, sealed. `base64url(iv || AES-256-GCM(expiry ||
 * target || tool || upstream task id) || tag)`, the creating subject bound as
 * additional authenticated data (not carried), under a key of its own derived
 * from the cluster/worker secret (another HKDF info than the session-id seals,
 * so no other sealed id opens as a task id), or a random per-process key
 * without one. So any worker or replica serves a tasks/* request from the id
 * alone; an id of another subject, an altered or forged one, or one past its
 * expiry does not open and is an unknown task.
 */
import { randomBytes } from 'node:crypto'
import { seal, sealKey, unseal } from '../cluster.ts'

/** Longest id that is opened at all: a bound on the work an attacker's id costs. */
const MAX_ID_CHARS = 2048
/** Longest upstream task id, target or tool sealed (each carries a 16-bit length). */
export const MAX_SEALED_FIELD = 512

/** What a sealed task id carries. */
export interface SealedTask {
  readonly target: string
  /** The tool as the upstream names it (the rules are checked against it on every tasks/* request). */
  readonly tool: string
  /** The upstream's own task id. */
  readonly taskId: string
  /** Epoch milliseconds past which the task is forgotten (its ttlMs); 0: none. */
  readonly expires: number
}

export interface TaskSeal {
  /** The client-facing id of `task`, bound to `subjectKey`; undefined when a field is too long to seal. */
  seal(subjectKey: string, task: SealedTask): string | undefined
  /** The task sealed in `id` for this subject, unexpired; undefined for any other id. */
  open(subjectKey: string, id: unknown, now?: number): SealedTask | undefined
}

export function createTaskSeal(secret: string | undefined): TaskSeal {
  const key = secret === undefined ? randomBytes(32) : sealKey(secret, 'task-id seal v1')
  return {
    seal(subjectKey, task) {
      const fields = [task.target, task.tool, task.taskId].map(f => Buffer.from(f, 'utf8'))
      if (fields.some(f => f.length > MAX_SEALED_FIELD)) return undefined
      const head = Buffer.alloc(8)
      head.writeDoubleBE(task.expires)
      const parts: Buffer[] = [head]
      for (const f of fields) {
        const len = Buffer.alloc(2)
        len.writeUInt16BE(f.length)
        parts.push(len, f)
      }
      return seal(key, parts, Buffer.from(subjectKey, 'utf8'))
    },

    open(subjectKey, id, now = Date.now()) {
      if (typeof id !== 'string') return undefined
      const plain = unseal(key, id, 8 + 6, MAX_ID_CHARS, Buffer.from(subjectKey, 'utf8'))
      if (plain === undefined) return undefined
      // Authenticated: the layout is ours, so only lengths past the end mean a bug, not an attack.
      const expires = plain.readDoubleBE(0)
      if (expires !== 0 && expires <= now) return undefined
      const fields: string[] = []
      let at = 8
      for (let i = 0; i < 3; i++) {
        if (at + 2 > plain.length) return undefined
        const len = plain.readUInt16BE(at)
        at += 2
        if (at + len > plain.length) return undefined
        fields.push(plain.subarray(at, at + len).toString('utf8'))
        at += len
      }
      return { target: fields[0]!, tool: fields[1]!, taskId: fields[2]!, expires }
    },
  }
}
