/**
 * The identity provider's OIDC discovery document, cached.
 *
 * First fetched in the background when the plugin is created (a failure is logged, never fatal:
 * a v1 cloud_idp config must start with discovery unreachable), refreshed in
 * the background every `ttl` by an unref'd timer, and served stale while the
 * IdP is down. A request that finds the cache expired triggers one refresh
 * without waiting for it; a request that finds it empty waits for one
 * single-flight fetch (at most one per `retryMs`) and otherwise gets 503.
 * Responses are size-capped, redirects are refused, fetches time out.
 */
import type { Logger } from 'pino'
import { IdpUnavailable } from './errors.ts'
import { readCapped, BodyTooLargeError } from '../../core/plugin-api.ts'

/** Discovery documents are a few KiB; anything near this is not one. */
export const DISCOVERY_MAX_BYTES = 512 * 1024

export type DiscoveryDocument = Readonly<Record<string, unknown>>

export interface BoundedFetchOptions {
  timeoutMs: number
  maxBytes: number
  method?: string
  headers?: Record<string, string>
  body?: string
}

export interface BoundedResponse {
  status: number
  headers: Headers
  body: Buffer
}

/**
 * fetch() with a timeout, no redirects (a 3xx is an error) and a cap on the
 * body size (read incrementally, so a huge body is never buffered).
 */
export async function boundedFetch(url: string, opts: BoundedFetchOptions): Promise<BoundedResponse> {
  const res = await fetch(url, {
    method: opts.method ?? 'GET',
    headers: opts.headers,
    body: opts.body,
    redirect: 'manual',
    signal: AbortSignal.timeout(opts.timeoutMs),
  })
  if (res.status >= 300 && res.status < 400) {
    await res.body?.cancel()
    throw new Error(`${url} answered ${res.status} (redirects are not followed)`)
  }
  try {
    return { status: res.status, headers: res.headers, body: await readCapped(res, opts.maxBytes) }
  } catch (err) {
    if (err instanceof BodyTooLargeError) throw new Error(`${url} answered with more than ${opts.maxBytes} bytes (the limit)`)
    throw err
  }
}

/** Checks the fields the bridge relies on; returns a reason when the document is unusable. */
export function checkDiscoveryDocument(doc: unknown): string | undefined {
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) return 'not a JSON object'
  const o = doc as Record<string, unknown>
  for (const f of ['issuer', 'authorization_endpoint', 'token_endpoint']) {
    if (typeof o[f] !== 'string' || !/^https?:\/\//.test(o[f] as string)) return `${f} is missing or not an http(s) URL`
  }
  return undefined
}

export interface DiscoveryCacheOptions {
  url: string
  ttlMs: number
  timeoutMs: number
  log: Logger
  maxBytes?: number
  /** Minimum time between fetches while the document is missing or stale. Default 5 s. */
  retryMs?: number
  /** Clock, for tests. */
  now?: () => number
  /** Called at each fetch attempt (the plugin counts them in its metrics). */
  onFetch?: () => void
  /** Called with each good document stored (the bridge checks its issuer). */
  onDocument?: (doc: DiscoveryDocument) => void
}

export interface DiscoveryState {
  readonly doc: DiscoveryDocument | undefined
  readonly fetchedAt: number | undefined
  readonly stale: boolean
  readonly lastError: string | undefined
  readonly fetches: number
}

export class DiscoveryCache {
  readonly url: string
  readonly #ttlMs: number
  readonly #timeoutMs: number
  readonly #maxBytes: number
  readonly #retryMs: number
  readonly #log: Logger
  readonly #now: () => number
  #doc: DiscoveryDocument | undefined
  #fetchedAt: number | undefined
  #lastAttempt = -Infinity
  #lastError: string | undefined
  #inFlight: Promise<boolean> | undefined
  #timer: NodeJS.Timeout | undefined
  #closed = false
  #fetches = 0
  readonly #onFetch: (() => void) | undefined
  readonly #onDocument: ((doc: DiscoveryDocument) => void) | undefined

  constructor(opts: DiscoveryCacheOptions) {
    this.url = opts.url
    this.#ttlMs = opts.ttlMs
    this.#timeoutMs = opts.timeoutMs
    this.#maxBytes = opts.maxBytes ?? DISCOVERY_MAX_BYTES
    this.#retryMs = opts.retryMs ?? 5000
    this.#log = opts.log
    this.#now = opts.now ?? Date.now
    this.#onFetch = opts.onFetch
    this.#onDocument = opts.onDocument
  }

  /** First fetch plus the background refresh timer. Never throws. */
  async start(): Promise<void> {
    await this.refresh()
    this.#schedule()
  }

  get state(): DiscoveryState {
    return {
      doc: this.#doc,
      fetchedAt: this.#fetchedAt,
      stale: this.#fetchedAt !== undefined && this.#now() - this.#fetchedAt > this.#ttlMs,
      lastError: this.#lastError,
      fetches: this.#fetches,
    }
  }

  /** The document if one was ever fetched (possibly stale), else undefined. */
  peek(): DiscoveryDocument | undefined {
    return this.#doc
  }

  /**
   * The document for a request. Expired: served stale, refreshed in the
   * background. Never fetched: one bounded fetch attempt, else a 503
   * `temporarily_unavailable`.
   */
  async get(): Promise<DiscoveryDocument> {
    if (this.#doc !== undefined) {
      if (this.#now() - (this.#fetchedAt ?? 0) > this.#ttlMs && this.#now() - this.#lastAttempt >= this.#retryMs) {
        void this.refresh()
      }
      return this.#doc
    }
    if (this.#inFlight !== undefined || this.#now() - this.#lastAttempt >= this.#retryMs) await this.refresh()
    if (this.#doc !== undefined) return this.#doc
    const retryAfter = Math.max(1, Math.ceil(this.#retryMs / 1000))
    throw IdpUnavailable("the identity provider's discovery document could not be fetched yet; try again later", {
      headers: { 'retry-after': String(retryAfter), 'access-control-allow-origin': '*' },
      cause: new Error(`discovery ${this.url}: ${this.#lastError ?? 'not fetched yet'}`),
    })
  }

  /** Fetches now (single-flight). Resolves true when a good document was stored. */
  refresh(): Promise<boolean> {
    this.#inFlight ??= this.#fetchOnce().finally(() => {
      this.#inFlight = undefined
    })
    return this.#inFlight
  }

  async #fetchOnce(): Promise<boolean> {
    this.#lastAttempt = this.#now()
    this.#fetches++
    this.#onFetch?.()
    try {
      const res = await boundedFetch(this.url, { timeoutMs: this.#timeoutMs, maxBytes: this.#maxBytes, headers: { accept: 'application/json' } })
      if (res.status !== 200) throw new Error(`answered HTTP ${res.status}`)
      let doc: unknown
      try {
        doc = JSON.parse(res.body.toString('utf8'))
      } catch {
        throw new Error('answered with invalid JSON')
      }
      const bad = checkDiscoveryDocument(doc)
      if (bad !== undefined) throw new Error(`document rejected: ${bad}`)
      this.#doc = Object.freeze({ ...(doc as Record<string, unknown>) })
      this.#fetchedAt = this.#now()
      if (this.#lastError !== undefined) this.#log.info({ url: this.url }, 'identity provider discovery document fetched again')
      this.#lastError = undefined
      this.#onDocument?.(this.#doc)
      return true
    } catch (err) {
      const e = err as Error
      this.#lastError = e.name === 'TimeoutError' ? `timed out after ${this.#timeoutMs} ms` : ((e.cause as Error | undefined)?.message ?? e.message)
      this.#log.warn(
        { url: this.url, reason: this.#lastError, stale: this.#doc !== undefined },
        this.#doc === undefined
          ? 'identity provider discovery document unavailable: authorization server metadata answers 503 until it can be fetched'
          : 'identity provider discovery refresh failed: serving the cached document'
      )
      return false
    }
  }

  #schedule(): void {
    if (this.#closed) return
    // Refresh at the TTL; while failing, retry sooner (bounded below by retryMs).
    const delay = this.#lastError === undefined ? this.#ttlMs : Math.min(this.#ttlMs, Math.max(this.#retryMs, 30_000))
    this.#timer = setTimeout(() => {
      void this.refresh().finally(() => this.#schedule())
    }, delay)
    this.#timer.unref()
  }

  close(): void {
    this.#closed = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
  }
}
