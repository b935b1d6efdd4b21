/**
 * An IdP's refusal of an exchange, sorted into what the MCP client can act
 * on. Entra states its reason as an AADSTS number (`error_codes`, or the
 * `AADSTSnnnn:` prefix of `error_description`), a `suberror` and, for
 * Conditional Access, a `claims` challenge ("Microsoft identity platform
 * and OAuth 2.0 On-Behalf-Of flow", error responses); an RFC 8693 IdP states
 * an RFC 6749 §5.2 / OIDC Core §3.1.2.6 `error`. Consent -> step-up 403,
 * more authentication -> step-up 401 with the claims, the caller's token
 * refused -> 401 invalid_token, the IdP down -> 503, anything else the
 * operator must fix -> 502.
 */
import { callerTokenRefused, consentRequired, exchangeRefused, idpUnavailable, interactionRequired, type ChallengeInfo, type Failure } from './failures.ts'

/** AADSTS65001: the user or an administrator has not consented to the gateway using the API. */
const CONSENT_CODES: ReadonlySet<number> = new Set([65001])
/** AADSTS50076/50079 (MFA required / MFA registration required), 50074 (strong authentication required). */
const INTERACTION_CODES: ReadonlySet<number> = new Set([50076, 50079, 50074])
/** AADSTS50013 (assertion failed signature validation), 500133 (assertion not within its valid time range). */
const CALLER_TOKEN_CODES: ReadonlySet<number> = new Set([50013, 500133])

const CONSENT_ERRORS: ReadonlySet<string> = new Set(['consent_required'])
/** OIDC Core §3.1.2.6, and RFC 9470's step-up error. */
const INTERACTION_ERRORS: ReadonlySet<string> = new Set(['interaction_required', 'login_required', 'insufficient_user_authentication'])
/** RFC 6749 §5.2 invalid_grant (the grant is the caller's token); some IdPs say invalid_token. */
const CALLER_TOKEN_ERRORS: ReadonlySet<string> = new Set(['invalid_grant', 'invalid_token'])
const UNAVAILABLE_ERRORS: ReadonlySet<string> = new Set(['temporarily_unavailable', 'server_error'])

/** RFC 6749 §5.2: an `error` is printable ASCII without `"` and `\`. Anything else is not repeated. */
const ERROR_CODE = /^[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}$/

/** What the IdP said, read once. */
export interface IdpRefusal {
  readonly error: string
  /** Entra's AADSTS number, when it gave one. */
  readonly aadsts: number | undefined
  readonly suberror: string | undefined
  readonly claims: string | undefined
  readonly description: string | undefined
}

function aadstsOf(body: Readonly<Record<string, unknown>>): number | undefined {
  const codes = body.error_codes
  if (Array.isArray(codes) && typeof codes[0] === 'number' && Number.isSafeInteger(codes[0])) return codes[0]
  const m = typeof body.error_description === 'string' ? /^AADSTS(\d{1,9})\b/.exec(body.error_description) : null
  return m === null ? undefined : Number(m[1])
}

const stringOf = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined)

export function readRefusal(body: Readonly<Record<string, unknown>>): IdpRefusal {
  const error = stringOf(body.error) ?? ''
  return {
    error: ERROR_CODE.test(error) ? error : 'unrecognised error',
    aadsts: aadstsOf(body),
    suberror: stringOf(body.suberror),
    claims: stringOf(body.claims),
    description: stringOf(body.error_description),
  }
}

/** How a refusal is named to the client: the AADSTS code when Entra gave one, else the `error`. */
export function refusalCode(r: IdpRefusal): string {
  return r.aadsts !== undefined ? `AADSTS${r.aadsts}` : r.error
}

/**
 * The failure a refusal means. `what` names the exchange in messages
 * (`token exchange`, `on-behalf-of exchange`).
 */
export function classifyRefusal(target: string, what: string, r: IdpRefusal, c: ChallengeInfo): Failure {
  const code = refusalCode(r)
  const n = r.aadsts
  if ((n !== undefined && CONSENT_CODES.has(n)) || CONSENT_ERRORS.has(r.error) || r.suberror === 'consent_required') return consentRequired(target, code, c)
  // A claims challenge (Conditional Access) is always something the user can satisfy by signing in again.
  if ((n !== undefined && INTERACTION_CODES.has(n)) || INTERACTION_ERRORS.has(r.error) || (r.claims !== undefined && r.claims !== '')) {
    return interactionRequired(target, code, r.claims, c)
  }
  if (n !== undefined && CALLER_TOKEN_CODES.has(n)) return callerTokenRefused(target, code, c)
  if (UNAVAILABLE_ERRORS.has(r.error)) return idpUnavailable(target, `is unavailable (${code})`)
  // Entra's other invalid_grant codes (AADSTS70000, ...) are about the grant, i.e. the caller's token, too.
  if (CALLER_TOKEN_ERRORS.has(r.error)) return callerTokenRefused(target, code, c)
  return exchangeRefused(target, what, code)
}
