/**
 * The identity provider's remote key set: fetched once at start-up, refreshed
 * in the background, refetched for an unknown `kid` at most once per
 * cooldown (one fetch shared by every caller; a caller whose fetch is due
 * within the fetch timeout waits for it, so a rotated key is accepted at once
 * even while bogus kids keep the cooldown busy), backing off while fetches
 * fail, never emptied by a failed refresh. An unknown `kid` while the set
 * cannot be refreshed is "keys unavailable" (503), not "no such key" (401):
 * it may be a genuine rotation the gateway cannot see yet. Responses are size-capped,
 * time-limited and redirects are not followed (a key set that moves is an
 * operator decision, not something an attacker on the path should make).
 *
 * Not jose's createRemoteJWKSet: we need readiness before the first request,
 * a background timer, keep-last-good and these limits.
 */
import { importJWK, type CryptoKey, type JWK, type JWSHeaderParameters } from 'jose'
import type { KeySetSource } from './identity.ts'
import { readCapped } from '../../core/plugin-api.ts'

export interface KeySetOptions {
  readonly source: KeySetSource
  /** Background refresh interval. */
  readonly refreshMs: number
  /** Minimum time between two fetches caused by requests (unknown kid, or no keys yet). */
  readonly cooldownMs: number
  /** Longest interval between fetches while they fail (doubling from cooldownMs). Default 60 s. */
  readonly maxBackoffMs?: number
  readonly timeoutMs: number
  readonly maxBytes: number
  /** Called after every fetch attempt. */
  readonly onFetch?: (result: 'ok' | 'error', error?: string) => void
  /** The clock (epoch ms) for cooldowns, back-off and state times; tests pass their own. Default Date.now. */
  readonly now?: () => number
}

/** Thrown when no key set was ever loaded, or an unknown kid meets a key set that cannot be refreshed. */
export class KeysUnavailableError extends Error {
  /** Seconds until the next fetch is due (for Retry-After). */
  readonly retryAfterSeconds: number
  constructor(message: string, retryAfterSeconds = 1) {
    super(message)
    this.name = 'KeysUnavailableError'
    this.retryAfterSeconds = Math.max(1, Math.ceil(retryAfterSeconds))
  }
}

/** Thrown when no key in the set matches the token's header. */
export class NoMatchingKeyError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'NoMatchingKeyError'
  }
}

export interface KeySetState {
  readonly url: string | undefined
  readonly kids: readonly string[]
  readonly loaded: boolean
  readonly lastFetchAt: string | undefined
  readonly lastSuccessAt: string | undefined
  readonly lastError: string | undefined
  readonly fetches: number
}

const USABLE_KTY = new Set(['RSA', 'EC', 'OKP'])

function ktyFor(alg: string): string | undefined {
  if (alg.startsWith('RS') || alg.startsWith('PS')) return 'RSA'
  if (alg.startsWith('ES')) return 'EC'
  if (alg === 'EdDSA' || alg === 'Ed25519') return 'OKP'
  return undefined
}

/** GETs a JSON document with our limits: no redirects, timeout, size cap. */
export async function fetchJsonLimited(url: string, timeoutMs: number, maxBytes: number): Promise<unknown> {
  const res = await fetch(url, {
    redirect: 'manual',
    signal: AbortSignal.timeout(timeoutMs),
    headers: { accept: 'application/json' },
  })
  if (res.status >= 300 && res.status < 400) {
    await res.body?.cancel()
    throw new Error(`HTTP ${res.status}: redirects are not followed`)
  }
  if (!res.ok) {
    await res.body?.cancel()
    throw new Error(`HTTP ${res.status}`)
  }
  const text = (await readCapped(res, maxBytes)).toString('utf8')
  try {
    return JSON.parse(text)
  } catch {
    throw new Error('response is not JSON')
  }
}

function describeError(err: unknown): string {
  const e = err as Error & { cause?: { code?: string } }
  if (e.name === 'TimeoutError') return 'timed out'
  return e.cause?.code !== undefined ? `${e.message} (${e.cause.code})` : e.message
}

export class RemoteKeySet {
  readonly #opts: KeySetOptions
  readonly #now: () => number
  #url: string | undefined
  #jwks: JWK[] = []
  readonly #imported = new Map<string, Promise<CryptoKey | Uint8Array>>()
  #loaded = false
  #inflight: Promise<void> | undefined
  #lastAttempt = 0
  #lastOnDemand = 0
  #lastSuccess = 0
  #lastError: string | undefined
  /** Consecutive failed fetches; 0 after a success. */
  #failures = 0
  /** The pending wait for the next on-demand fetch slot, shared by every caller. */
  #slot: Promise<void> | undefined
  #fetches = 0
  #timer: NodeJS.Timeout | undefined
  #closed = false

  constructor(opts: KeySetOptions) {
    this.#opts = opts
    this.#now = opts.now ?? Date.now
    this.#url = opts.source.kind === 'url' ? opts.source.url : undefined
  }

  /** First fetch (in the background of start-up, see acquireKeySet); never throws. Starts the background timer. */
  async start(): Promise<void> {
    await this.refresh()
    this.#schedule()
  }

  get loaded(): boolean {
    return this.#loaded
  }

  hasKid(kid: string | undefined): boolean {
    return this.#jwks.some(k => k.kid === kid)
  }

  state(): KeySetState {
    return {
      url: this.#url,
      kids: this.#jwks.map(k => k.kid ?? '(none)'),
      loaded: this.#loaded,
      lastFetchAt: this.#lastAttempt === 0 ? undefined : new Date(this.#lastAttempt).toISOString(),
      lastSuccessAt: this.#lastSuccess === 0 ? undefined : new Date(this.#lastSuccess).toISOString(),
      lastError: this.#lastError,
      fetches: this.#fetches,
    }
  }

  /** Fetches now; concurrent callers share one fetch. A failure keeps the last good keys. */
  refresh(): Promise<void> {
    this.#inflight ??= this.#fetch().finally(() => {
      this.#inflight = undefined
    })
    return this.#inflight
  }

  /** The key for a JWS header; for jose's jwtVerify. */
  async getKey(header: JWSHeaderParameters): Promise<CryptoKey | Uint8Array> {
    if (!this.#loaded) await this.#refetchOnDemand()
    let jwk = this.#select(header)
    if (jwk === undefined && header.kid !== undefined && !this.hasKid(header.kid)) {
      // Unknown kid: the provider may have rotated. One refetch per cooldown, shared by all callers.
      await this.#refetchOnDemand()
      jwk = this.#select(header)
    }
    if (jwk === undefined) throw new NoMatchingKeyError('no key in the key set matches the token')
    const cacheKey = `${jwk.kid ?? ''}|${header.alg}|${jwk.x ?? jwk.n ?? ''}`
    let key = this.#imported.get(cacheKey)
    if (key === undefined) {
      key = importJWK(jwk, header.alg)
      this.#imported.set(cacheKey, key)
      key.catch(() => this.#imported.delete(cacheKey))
    }
    try {
      return await key
    } catch {
      throw new NoMatchingKeyError('the matching key cannot be used with the token algorithm')
    }
  }

  close(): void {
    this.#closed = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
  }

  #select(header: JWSHeaderParameters): JWK | undefined {
    const alg = header.alg ?? ''
    const kty = ktyFor(alg)
    const candidates = this.#jwks.filter(k => k.kty === kty && (k.alg === undefined || k.alg === alg) && (header.kid === undefined || k.kid === header.kid))
    // Without a kid we only guess when there is exactly one candidate.
    return candidates.length === 1 || header.kid !== undefined ? candidates[0] : undefined
  }

  /** The interval between fetches: the cooldown, doubled per consecutive failure up to maxBackoffMs. */
  #interval(): number {
    if (this.#failures === 0) return this.#opts.cooldownMs
    const max = Math.max(this.#opts.maxBackoffMs ?? 60_000, this.#opts.cooldownMs)
    return Math.min(this.#opts.cooldownMs * 2 ** Math.min(this.#failures - 1, 20), max)
  }

  /** When the next fetch caused by a request may start. */
  #dueAt(): number {
    // While fetches fail every attempt counts (backoff); otherwise only fetches caused by
    // requests do, so a scheduled refresh never delays picking up a rotated key.
    return (this.#failures > 0 ? Math.max(this.#lastAttempt, this.#lastOnDemand) : this.#lastOnDemand) + this.#interval()
  }

  #unavailable(): KeysUnavailableError {
    return new KeysUnavailableError(`key set unavailable: ${this.#lastError ?? 'not fetched yet'}`, (this.#dueAt() - this.#now()) / 1000)
  }

  /**
   * A fetch for a request that needs a key the set does not hold: joins the
   * one in flight, or starts one when due, or waits for the next slot when it
   * is due within the fetch timeout. Returns with the set refreshed, or
   * without fetching when the slot is too far off (the key is then "not
   * found"); throws KeysUnavailableError when the set cannot be refreshed.
   */
  async #refetchOnDemand(): Promise<void> {
    if (this.#inflight === undefined) {
      const wait = this.#dueAt() - this.#now()
      if (wait > 0) {
        if (this.#failures > 0) throw this.#unavailable()
        if (wait > this.#opts.timeoutMs) return
        this.#slot ??= new Promise<void>(resolve => setTimeout(resolve, wait)).then(() => {
          this.#slot = undefined
          if (this.#inflight === undefined) this.#lastOnDemand = this.#now()
          return this.refresh()
        })
        await this.#slot
      } else {
        this.#lastOnDemand = this.#now()
        await this.refresh()
      }
    } else {
      await this.#inflight
    }
    if (this.#failures > 0 || !this.#loaded) throw this.#unavailable()
  }

  #schedule(): void {
    if (this.#closed) return
    // Until keys were loaded once, or while fetches fail, retry at the backoff pace instead of the (long) refresh interval.
    const delay = this.#loaded && this.#failures === 0 ? this.#opts.refreshMs : this.#interval()
    this.#timer = setTimeout(() => {
      void this.refresh().finally(() => this.#schedule())
    }, delay)
    this.#timer.unref()
  }

  async #fetch(): Promise<void> {
    this.#lastAttempt = this.#now()
    this.#fetches++
    try {
      if (this.#url === undefined && this.#opts.source.kind === 'discovery') {
        const doc = (await fetchJsonLimited(this.#opts.source.discoveryUrl, this.#opts.timeoutMs, this.#opts.maxBytes)) as { jwks_uri?: unknown }
        if (typeof doc?.jwks_uri !== 'string' || !/^https?:\/\//.test(doc.jwks_uri)) throw new Error('discovery document has no jwks_uri')
        this.#url = doc.jwks_uri
      }
      const body = (await fetchJsonLimited(this.#url!, this.#opts.timeoutMs, this.#opts.maxBytes)) as { keys?: unknown }
      if (body === null || typeof body !== 'object' || !Array.isArray(body.keys)) throw new Error('response is not a JWK set')
      const keys = (body.keys as unknown[]).filter((k): k is JWK => {
        const j = k as JWK
        // Public signature keys only: symmetric or private material is never used.
        return (
          j !== null &&
          typeof j === 'object' &&
          typeof j.kty === 'string' &&
          USABLE_KTY.has(j.kty) &&
          (j.use === undefined || j.use === 'sig') &&
          j.d === undefined
        )
      })
      if (keys.length === 0) throw new Error('key set has no usable signature keys')
      this.#jwks = keys
      this.#imported.clear()
      this.#loaded = true
      this.#lastSuccess = this.#now()
      this.#lastError = undefined
      this.#failures = 0
      this.#opts.onFetch?.('ok')
    } catch (err) {
      this.#failures++
      this.#lastError = describeError(err)
      this.#opts.onFetch?.('error', this.#lastError)
    }
  }
}

/**
 * One shared key set per (source, limits), reference-counted, so plugins for
 * the same issuer share fetches. The first fetch runs in the background: an
 * unreachable IdP must not hold up start-up (docs/configuration.md "Running"); a request
 * that needs keys before it finishes waits for that fetch (getKey), and
 * readiness says "not fetched yet" meanwhile.
 */
const shared = new Map<string, { set: RemoteKeySet; refs: number; started: Promise<void> }>()

export async function acquireKeySet(opts: KeySetOptions): Promise<{ set: RemoteKeySet; release: () => void }> {
  const key = JSON.stringify([opts.source, opts.refreshMs, opts.cooldownMs, opts.maxBackoffMs, opts.timeoutMs, opts.maxBytes])
  let entry = shared.get(key)
  if (entry === undefined) {
    const set = new RemoteKeySet(opts)
    entry = { set, refs: 0, started: set.start() }
    shared.set(key, entry)
  }
  entry.refs++
  const e = entry
  let released = false
  return {
    set: e.set,
    release() {
      if (released) return
      released = true
      if (--e.refs === 0) {
        e.set.close()
        shared.delete(key)
      }
    },
  }
}
