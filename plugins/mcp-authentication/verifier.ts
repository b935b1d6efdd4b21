/**
 * JWT access-token verification with jose, pinned to asymmetric algorithms.
 * Every failure becomes an AuthFailure with a short metric `reason` and a
 * generic description that never contains the token.
 */
import { jwtVerify, errors as joseErrors, type JWTPayload } from 'jose'
import { KeysUnavailableError, NoMatchingKeyError, type RemoteKeySet } from './key-set.ts'

/** Never `none`, never HMAC (RFC 8725 §3.1: the verifier, not the token, picks the algorithms). */
export const ALLOWED_ALGORITHMS: readonly string[] = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA']

/** Header parameters that point at keys the token chooses itself; refused without fetching anything. */
const KEY_BEARING_HEADERS = ['jwk', 'jku', 'x5u', 'x5c']

/** Every `reason` an AuthFailure can carry (mcp_proxy_auth_failures_total starts each at 0). */
export const TOKEN_FAILURE_REASONS = [
  'malformed',
  'too_large',
  'header',
  'algorithm',
  'signature',
  'unknown_key',
  'issuer',
  'audience',
  'expired',
  'not_yet_valid',
  'issued_in_future',
  'no_expiry',
  'lifetime',
  'claims',
  'no_subject',
  'not_access_token',
] as const
export type TokenFailureReason = (typeof TOKEN_FAILURE_REASONS)[number]

export class AuthFailure extends Error {
  /** Metric label, e.g. `expired`. */
  readonly reason: TokenFailureReason
  /**
   * For the operator's log line only, never the response: what was received
   * against what was expected (the token's `iss` and the configured issuer).
   */
  readonly detail: string | undefined
  constructor(reason: TokenFailureReason, description: string, detail?: string) {
    super(description)
    this.name = 'AuthFailure'
    this.reason = reason
    this.detail = detail
  }
}

/** A claim value for a log line: quoted, bounded (it comes from the token, so from anyone). */
function quoted(value: unknown): string {
  const s = typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value))
  return JSON.stringify(s.length > 120 ? s.slice(0, 120) + '…' : s)
}

/** How an access token is told from an ID token; `none` checks nothing. */
export type TokenKindCheck = 'cloud_idp' | 'oss_idp' | 'none'

export interface VerifierOptions {
  readonly issuer: string
  readonly audiences: readonly string[] | undefined
  readonly clockToleranceSeconds: number
  readonly keySet: RemoteKeySet
  /** Longest token, in characters, looked at. */
  readonly maxTokenBytes: number
  /** Deepest nesting of objects and arrays in the claims. */
  readonly maxClaimDepth: number
  /** Longest `exp - iat` (or `exp - now`), in seconds; undefined: no cap. */
  readonly maxLifetimeSeconds?: number | undefined
  readonly tokenKind: TokenKindCheck
}

export interface Verified {
  readonly payload: JWTPayload
  readonly kid: string | undefined
}

function decodeHeader(segment: string): Record<string, unknown> {
  let header: unknown
  try {
    header = JSON.parse(Buffer.from(segment, 'base64url').toString('utf8'))
  } catch {
    throw new AuthFailure('malformed', 'malformed token')
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) throw new AuthFailure('malformed', 'malformed token')
  return header as Record<string, unknown>
}

function mapJoseError(err: unknown, issuer: string): Error {
  if (err instanceof KeysUnavailableError || err instanceof AuthFailure) return err
  if (err instanceof NoMatchingKeyError) return new AuthFailure('unknown_key', 'token signing key not found')
  if (err instanceof joseErrors.JWTExpired) return new AuthFailure('expired', 'token expired')
  if (err instanceof joseErrors.JWTClaimValidationFailed) {
    switch (err.claim) {
      // The signature was good: the token's iss is what the IdP really issues, and
      // a mismatch is most often a trailing slash or a path in the configured issuer.
      case 'iss':
        return new AuthFailure('issuer', 'token issuer not accepted', `token iss ${quoted(err.payload.iss)}, expected ${quoted(issuer)}`)
      case 'aud':
        return new AuthFailure('audience', 'token audience not accepted')
      case 'nbf':
        return new AuthFailure('not_yet_valid', 'token not yet valid')
      case 'exp':
        return new AuthFailure('no_expiry', 'token has no valid expiry')
      case 'iat':
        return new AuthFailure('issued_in_future', 'token issue time not accepted')
      default:
        return new AuthFailure('claims', 'token claims not accepted')
    }
  }
  if (err instanceof joseErrors.JWSSignatureVerificationFailed) return new AuthFailure('signature', 'token signature invalid')
  if (err instanceof joseErrors.JOSEAlgNotAllowed) return new AuthFailure('algorithm', 'token algorithm not accepted')
  if (err instanceof joseErrors.JOSENotSupported) return new AuthFailure('algorithm', 'token algorithm not accepted')
  return new AuthFailure('malformed', 'malformed token')
}

/**
 * Deep-freezes the claims without recursion, refusing nesting deeper than
 * `maxDepth`: a signed token can hold a claim nested thousands deep, and a
 * recursive walk (structuredClone, a logger, a rule helper) would overflow
 * the stack on it.
 */
export function freezeClaims(payload: Record<string, unknown>, maxDepth: number): void {
  const stack: Array<[object, number]> = [[payload, 1]]
  while (stack.length > 0) {
    const [obj, depth] = stack.pop()!
    Object.freeze(obj)
    for (const v of Object.values(obj)) {
      if (v === null || typeof v !== 'object') continue
      if (depth + 1 > maxDepth) throw new AuthFailure('claims', 'token claims nested too deeply')
      stack.push([v as object, depth + 1])
    }
  }
}

/** RFC 7519 §2 NumericDate, held to what IdPs issue: a finite integer (1e400 parses to Infinity). */
function checkNumericDates(payload: JWTPayload): void {
  for (const claim of ['exp', 'nbf', 'iat'] as const) {
    const v = payload[claim]
    if (v !== undefined && !Number.isSafeInteger(v)) throw new AuthFailure('claims', `token ${claim} is not an integer`)
  }
}

/**
 * ID tokens are for the client, not for resource servers (OIDC Core §2,
 * RFC 9068 §1); an ID token for the gateway's own client id would otherwise
 * pass the aud check.
 */
function isAccessToken(kind: TokenKindCheck, header: Record<string, unknown>, payload: JWTPayload): boolean {
  if (kind === 'none') return true
  if (kind === 'cloud_idp') {
    // Entra access tokens for an API carry delegated scopes (scp) or app roles (roles); its ID tokens neither.
    const scp = payload.scp
    const roles = payload.roles
    return (typeof scp === 'string' && scp.trim() !== '') || (Array.isArray(scp) && scp.length > 0) || (Array.isArray(roles) && roles.length > 0)
  }
  // RFC 9068 §2.1: JWT access tokens say so in typ.
  if (typeof header.typ === 'string' && /^(application\/)?at\+jwt$/i.test(header.typ)) return true
  // Authentik's access token is its ID token plus azp and uid; oidc-provider's carry client_id and scope. Their ID tokens have none of these.
  return typeof payload.azp === 'string' || typeof payload.client_id === 'string' || typeof payload.scope === 'string'
}

export function createVerifier(opts: VerifierOptions): (token: string) => Promise<Verified> {
  const audience = opts.audiences === undefined ? undefined : [...opts.audiences]
  const getKey = opts.keySet.getKey.bind(opts.keySet)
  return async function verifyToken(token: string): Promise<Verified> {
    if (token.length > opts.maxTokenBytes) throw new AuthFailure('too_large', 'token too large')
    const parts = token.split('.')
    if (parts.length !== 3 || parts.some(p => p === '' || !/^[A-Za-z0-9_-]+$/.test(p))) {
      throw new AuthFailure('malformed', 'malformed token')
    }
    const header = decodeHeader(parts[0]!)
    if (typeof header.alg !== 'string' || !ALLOWED_ALGORITHMS.includes(header.alg)) {
      throw new AuthFailure('algorithm', 'token algorithm not accepted')
    }
    if (KEY_BEARING_HEADERS.some(h => h in header)) {
      throw new AuthFailure('header', 'token header not accepted')
    }
    const now = Math.floor(Date.now() / 1000)
    let payload: JWTPayload
    try {
      ;({ payload } = await jwtVerify(token, getKey, {
        algorithms: [...ALLOWED_ALGORITHMS],
        issuer: opts.issuer,
        audience,
        requiredClaims: ['exp'],
        clockTolerance: opts.clockToleranceSeconds,
        currentDate: new Date(now * 1000),
      }))
    } catch (err) {
      throw mapJoseError(err, opts.issuer)
    }
    // Before anything else walks the claims (jose's checks above read top-level fields only).
    freezeClaims(payload as Record<string, unknown>, opts.maxClaimDepth)
    checkNumericDates(payload)
    if (typeof payload.iat === 'number' && payload.iat > now + opts.clockToleranceSeconds) {
      throw new AuthFailure('issued_in_future', 'token issue time not accepted')
    }
    if (opts.maxLifetimeSeconds !== undefined && payload.exp! - (payload.iat ?? now) > opts.maxLifetimeSeconds) {
      throw new AuthFailure('lifetime', 'token lifetime too long')
    }
    if (!isAccessToken(opts.tokenKind, header, payload)) throw new AuthFailure('not_access_token', 'token is not an access token')
    return { payload, kid: typeof header.kid === 'string' ? header.kid : undefined }
  }
}
