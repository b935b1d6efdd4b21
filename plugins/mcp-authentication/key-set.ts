/**
 * The identity provider's remote key set: fetched once at start-up, refreshed
 * in the background, refetched for an unknown `kid` at most once per
 * cooldown, never emptied by a failed refresh. Responses are size-capped,
 * time-limited and redirects are not followed (a key set that moves is an
 * operator decision, not something an attacker on the path should make).
 *
 * Not jose's createRemoteJWKSet: we need readiness before the first request,
 * a background timer, keep-last-good and these limits.
 */
import { importJWK, type CryptoKey, type JWK, type JWSHeaderParameters } from 'jose'
import type { KeySetSource } from './issuer.ts'
import { readCapped } from '../../core/read-capped.ts'

export interface KeySetOptions {
  readonly source: KeySetSource
  /** Background refresh interval. */
  readonly refreshMs: number
  /** Minimum time between two fetches caused by requests (unknown kid, or no keys yet). */
  readonly cooldownMs: number
  readonly timeoutMs: number
  readonly maxBytes: number
  /** Called after every fetch attempt. */
  readonly onFetch?: (result: 'ok' | 'error', error?: string) => void
}

/** Thrown when no key set was ever loaded. */
export class KeysUnavailableError extends Error {
  constructor (message: string) {
    super(message)
    this.name = 'KeysUnavailableError'
  }
}

/** Thrown when no key in the set matches the token's header. */
export class NoMatchingKeyError extends Error {
  constructor (message: string) {
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

function ktyFor (alg: string): string | undefined {
  if (alg.startsWith('RS') || alg.startsWith('PS')) return 'RSA'
  if (alg.startsWith('ES')) return 'EC'
  if (alg === 'EdDSA' || alg === 'Ed25519') return 'OKP'
  return undefined
}

/** GETs a JSON document with our limits: no redirects, timeout, size cap. */
export async function fetchJsonLimited (url: string, timeoutMs: number, maxBytes: number): Promise<unknown> {
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

function describeError (err: unknown): string {
  const e = err as Error & { cause?: { code?: string } }
  if (e.name === 'TimeoutError') return 'timed out'
  return e.cause?.code !== undefined ? `${e.message} (${e.cause.code})` : e.message
}

export class RemoteKeySet {
  readonly #opts: KeySetOptions
  #url: string | undefined
  #jwks: JWK[] = []
  readonly #imported = new Map<string, Promise<CryptoKey | Uint8Array>>()
  #loaded = false
  #inflight: Promise<void> | undefined
  #lastAttempt = 0
  #lastOnDemand = 0
  #lastSuccess = 0
  #lastError: string | undefined
  #fetches = 0
  #timer: NodeJS.Timeout | undefined
  #closed = false

  constructor (opts: KeySetOptions) {
    this.#opts = opts
    this.#url = opts.source.kind === 'url' ? opts.source.url : undefined
  }

  /** First fetch (awaited by the plugin's create()); never throws. Starts the background timer. */
  async start (): Promise<void> {
    await this.refresh()
    this.#schedule()
  }

  get loaded (): boolean { return this.#loaded }

  hasKid (kid: string | undefined): boolean {
    return this.#jwks.some(k => k.kid === kid)
  }

  state (): KeySetState {
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
  refresh (): Promise<void> {
    this.#inflight ??= this.#fetch().finally(() => { this.#inflight = undefined })
    return this.#inflight
  }

  /** The key for a JWS header; for jose's jwtVerify. */
  async getKey (header: JWSHeaderParameters): Promise<CryptoKey | Uint8Array> {
    if (!this.#loaded) {
      await this.#refetchIfCool()
      if (!this.#loaded) throw new KeysUnavailableError(`key set unavailable: ${this.#lastError ?? 'not fetched yet'}`)
    }
    let jwk = this.#select(header)
    if (jwk === undefined && header.kid !== undefined && !this.hasKid(header.kid)) {
      // Unknown kid: the provider may have rotated. One refetch per cooldown, shared by all callers.
      await this.#refetchIfCool()
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

  close (): void {
    this.#closed = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
  }

  #select (header: JWSHeaderParameters): JWK | undefined {
    const alg = header.alg ?? ''
    const kty = ktyFor(alg)
    const candidates = this.#jwks.filter(k =>
      k.kty === kty && (k.alg === undefined || k.alg === alg) && (header.kid === undefined || k.kid === header.kid))
    // Without a kid we only guess when there is exactly one candidate.
    return candidates.length === 1 || header.kid !== undefined ? candidates[0] : undefined
  }

  async #refetchIfCool (): Promise<void> {
    if (this.#inflight !== undefined) return this.#inflight
    // Only fetches caused by requests count: a scheduled refresh must not delay picking up a rotated key.
    if (Date.now() - this.#lastOnDemand < this.#opts.cooldownMs) return
    this.#lastOnDemand = Date.now()
    return this.refresh()
  }

  #schedule (): void {
    if (this.#closed) return
    // Until keys were loaded once, retry at the cooldown pace instead of the (long) refresh interval.
    const delay = this.#loaded ? this.#opts.refreshMs : this.#opts.cooldownMs
    this.#timer = setTimeout(() => { void this.refresh().finally(() => this.#schedule()) }, delay)
    this.#timer.unref()
  }

  async #fetch (): Promise<void> {
    this.#lastAttempt = Date.now()
    this.#fetches++
    try {
      if (this.#url === undefined && this.#opts.source.kind === 'discovery') {
        const doc = await fetchJsonLimited(this.#opts.source.discoveryUrl, this.#opts.timeoutMs, this.#opts.maxBytes) as { jwks_uri?: unknown }
        if (typeof doc?.jwks_uri !== 'string' || !/^https?:\/\//.test(doc.jwks_uri)) throw new Error('discovery document has no jwks_uri')
        this.#url = doc.jwks_uri
      }
      const body = await fetchJsonLimited(this.#url!, this.#opts.timeoutMs, this.#opts.maxBytes) as { keys?: unknown }
      if (body === null || typeof body !== 'object' || !Array.isArray(body.keys)) throw new Error('response is not a JWK set')
      const keys = (body.keys as unknown[]).filter((k): k is JWK => {
        const j = k as JWK
        // Public signature keys only: symmetric or private material is never used.
        return j !== null && typeof j === 'object' && typeof j.kty === 'string' && USABLE_KTY.has(j.kty) &&
          (j.use === undefined || j.use === 'sig') && j.d === undefined
      })
      if (keys.length === 0) throw new Error('key set has no usable signature keys')
      this.#jwks = keys
      this.#imported.clear()
      this.#loaded = true
      this.#lastSuccess = Date.now()
      this.#lastError = undefined
      this.#opts.onFetch?.('ok')
    } catch (err) {
      this.#lastError = describeError(err)
      this.#opts.onFetch?.('error', this.#lastError)
    }
  }
}

/** One shared key set per (source, limits), reference-counted, so plugins for the same issuer share fetches. */
const shared = new Map<string, { set: RemoteKeySet; refs: number; started: Promise<void> }>()

export async function acquireKeySet (opts: KeySetOptions): Promise<{ set: RemoteKeySet; release: () => void }> {
  const key = JSON.stringify([opts.source, opts.refreshMs, opts.cooldownMs, opts.timeoutMs, opts.maxBytes])
  let entry = shared.get(key)
  if (entry === undefined) {
    const set = new RemoteKeySet(opts)
    entry = { set, refs: 0, started: set.start() }
    shared.set(key, entry)
  }
  entry.refs++
  await entry.started
  const e = entry
  let released = false
  return {
    set: e.set,
    release () {
      if (released) return
      released = true
      if (--e.refs === 0) {
        e.set.close()
        shared.delete(key)
      }
    },
  }
}
