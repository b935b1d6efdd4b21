/**
 * Remembered consent: a sealed cookie listing, per user and client (hashed),
 * the scopes and the resource the user approved and until when. A flow is
 * let through without the consent page only when what it asks for is covered:
 * the same resource, and no scope beyond those approved (MCP security best
 * practices, "Confused deputy problem": consent is per client and per what
 * it may do). Approving more adds to the entry. Entries of the earlier
 * format (no scopes) cover nothing.
 */
import { createHash } from 'node:crypto'
import type { Sealer } from './seal.ts'
import { cookie, cookieName, readCookie, REMEMBER_COOKIE } from './consent.ts'

const MAX_ENTRIES = 20

/** [user and client hashed, expiry (seconds), approved scopes space-separated, resource]. */
type Entry = [string, number, string, string]

function isEntry(e: unknown, now: number): e is Entry {
  return (
    Array.isArray(e) &&
    e.length === 4 &&
    typeof e[0] === 'string' &&
    typeof e[1] === 'number' &&
    e[1] > now &&
    typeof e[2] === 'string' &&
    typeof e[3] === 'string'
  )
}

function keyOf(user: string, clientId: string): string {
  return createHash('sha256').update(`${user}\n${clientId}`).digest('base64url').slice(0, 22)
}

const scopeSet = (scopes: string): Set<string> => new Set(scopes.split(' ').filter(s => s !== ''))

export class ConsentMemory {
  readonly #sealer: Sealer
  readonly #seconds: number
  readonly #secure: boolean

  constructor(sealer: Sealer, rememberSeconds: number, secure: boolean) {
    this.#sealer = sealer
    this.#seconds = rememberSeconds
    this.#secure = secure
  }

  get enabled(): boolean {
    return this.#seconds > 0
  }

  async #entries(cookieHeader: string | undefined): Promise<Entry[]> {
    const raw = readCookie(cookieHeader, cookieName(REMEMBER_COOKIE, this.#secure))
    if (raw === undefined) return []
    try {
      const d = await this.#sealer.open<{ e: unknown }>('remember', raw)
      const now = Date.now() / 1000
      return Array.isArray(d.e) ? d.e.filter((e): e is Entry => isEntry(e, now)) : []
    } catch {
      return []
    }
  }

  /** Whether the user approved this client for at least `scopes` at `resource`, and the approval is still remembered. */
  async covers(cookieHeader: string | undefined, user: string, clientId: string, scopes: string, resource: string): Promise<boolean> {
    if (!this.enabled) return false
    const key = keyOf(user, clientId)
    const entry = (await this.#entries(cookieHeader)).find(e => e[0] === key)
    if (entry === undefined || entry[3] !== resource) return false
    const approved = scopeSet(entry[2])
    return [...scopeSet(scopes)].every(s => approved.has(s))
  }

  /** The Set-Cookie remembering this approval (added to what the same resource had), or undefined when remembering is off. */
  async remember(cookieHeader: string | undefined, user: string, clientId: string, scopes: string, resource: string): Promise<string | undefined> {
    if (!this.enabled) return undefined
    const key = keyOf(user, clientId)
    const entries = await this.#entries(cookieHeader)
    const before = entries.find(e => e[0] === key && e[3] === resource)
    const union = new Set([...(before !== undefined ? scopeSet(before[2]) : []), ...scopeSet(scopes)])
    const kept = entries.filter(e => e[0] !== key)
    kept.push([key, Math.floor(Date.now() / 1000) + this.#seconds, [...union].join(' '), resource])
    const sealed = await this.#sealer.seal('remember', { e: kept.slice(-MAX_ENTRIES) }, this.#seconds)
    return cookie(REMEMBER_COOKIE, sealed, { path: '/', maxAge: this.#seconds, secure: this.#secure })
  }
}
