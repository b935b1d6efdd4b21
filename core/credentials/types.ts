/**
 * The contract of the credential layer (core/credentials/): what a target
 * receives for each caller, computed from the caller's validated token, per
 * the target's `auth` block. The MCP layer asks for it (per caller, per
 * target) and hands the result to the transport as opaque headers or child
 * environment; the transports (core/targets/) never know what they carry.
 * The caller's own token is only ever sent to the identity provider's token
 * endpoint (as `subject_token` or `assertion`), never to a target.
 */
import type { RequestContext } from '../context.ts'

/** The caller as the credential layer sees them (built by the MCP layer from `ctx.auth`). */
export interface Caller {
  /** `subjectKeyOf(ctx)`: caches are keyed by it, so nothing is ever shared across subjects. */
  readonly key: string
  /** The token's subject; undefined for a caller without authentication. */
  readonly subject: string | undefined
  /** The verified claims (frozen); `{}` without authentication. */
  readonly claims: Readonly<Record<string, unknown>>
  /** The caller's validated access token: only ever sent to the IdP's token endpoint. */
  readonly token: string | undefined
  /** The token's `exp`, seconds since the epoch. */
  readonly expiresAt?: number
}

/** What one caller's requests to one target carry. */
export interface TargetCredential {
  /** Headers for every HTTP exchange with the target: `Authorization: Bearer <minted>`, claim headers, a static secret. */
  readonly headers: Readonly<Record<string, string>>
  /** Environment for a stdio child of this caller (claims, `{credential}`), beside the target's own `env`. */
  readonly env: Readonly<Record<string, string>>
  /**
   * Epoch ms (on the broker's clock, `CredentialBroker.now`) after which it must be resolved again (a
   * minted token's `exp` minus a margin); Infinity when it never expires. A stdio child's environment
   * is fixed at spawn, so the child goes stale with it (`UpstreamAttachment.staleAt`).
   */
  readonly freshUntil: number
}

/** The target's credential mode, as configured (one per target). */
export type CredentialMode = 'tokenExchange' | 'onBehalfOf' | 'bearer' | 'apiKey' | 'claims'

/** What the admin UI and API may show of a target's credentials: never a secret or a token. */
export interface TargetAuthSummary {
  readonly target: string
  readonly mode: CredentialMode
  /** Headers and env names it sets (names only). */
  readonly headerNames: readonly string[]
  readonly envNames: readonly string[]
  /** Cached minted credentials (tokenExchange, onBehalfOf). */
  readonly cached: number
  readonly lastFailure?: { readonly at: number; readonly reason: string }
}

/** One target's credential source. */
export interface TargetAuth {
  readonly target: string
  readonly mode: CredentialMode
  /** True when the credential depends on the caller (an exchange or a claim template): a caller without a token is refused. */
  readonly perCaller: boolean
  /**
   * The cached, still fresh credential of `caller`, or undefined: synchronous,
   * for the hot path (every exchange with an HTTP target asks).
   */
  peek(caller: Caller): TargetCredential | undefined
  /**
   * The pre-flight of one request: undefined when the caller's credential is
   * cached and fresh (a cache hit, counted in the metrics), else `resolve()`.
   */
  ready(caller: Caller, ctx?: RequestContext): Promise<TargetCredential> | undefined
  /**
   * The caller's credential: cached until shortly before it expires, one
   * exchange in flight per (caller, target) however many requests wait for it.
   * Rejects with a ProxyError the MCP layer answers as is: `MCPP_ERR_TARGET_STEP_UP`
   * (401/403 + `WWW-Authenticate`), `MCPP_ERR_UNAUTHORIZED` (the IdP refused the
   * caller's token), `MCPP_ERR_TARGET_CREDENTIAL` (403 missing/invalid claim,
   * 502 the IdP refused the exchange or minted for another audience),
   * `MCPP_ERR_IDP_UNAVAILABLE` (503 + `Retry-After`). Messages name the
   * target, never the IdP's raw answer. `ctx`, when given, is the request
   * the credential is resolved for: the `credential.exchange` span is a child
   * of its server span (tracing only; nothing else is read from it).
   */
  resolve(caller: Caller, ctx?: RequestContext): Promise<TargetCredential>
  describe(): TargetAuthSummary
}

/** Every target's credential source, built once at start-up from `mcp.targets[].auth`. */
export interface CredentialBroker {
  /** undefined for a target without an `auth` block (it gets its static headers only, as before). */
  forTarget(name: string): TargetAuth | undefined
  describe(): TargetAuthSummary[]
  /**
   * The clock (epoch ms) every `freshUntil` is on: whoever compares one later (the pool, with a stdio
   * child's `staleAt`) reads this clock, so a test that moves the broker's time moves theirs.
   */
  now(): number
  /** Drops cached credentials (shutdown). */
  close(): void
}
