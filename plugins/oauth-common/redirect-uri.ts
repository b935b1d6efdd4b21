/**
 * Redirect URI checks the OAuth plugins share (a plain module: no plugin).
 * `authorizeRedirectProblem` is what may be sent on to an identity provider
 * or redirected to from an authorize endpoint (https, loopback http, and the
 * private-use schemes the operator lists); `redirectUriProblem` what a
 * registering client may list (RFC 7591, RFC 8252 native apps).
 */

const SCHEME_AUTHORITY_RE = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)/
// RFC 8252 §7.3 loopback redirects, any port; spelled as the browser will read them.
const LOOPBACK_AUTHORITY_RE = /^(?:127\.0\.0\.1|\[::1\]|localhost)(?::\d{1,5})?$/i
// Schemes that must never be a redirect target (RFC 8252 §8.1 private-use schemes are fine).
const FORBIDDEN_SCHEMES = new Set(['javascript:', 'data:', 'file:', 'vbscript:', 'blob:', 'about:', 'ftp:', 'ws:', 'wss:'])
const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]'])
const SCHEME_RE = /^[A-Za-z][A-Za-z0-9+.-]*:/
// Any C0 control, DEL, whitespace.
const BAD_CHARS_RE = /[\u0000-\u0020\u007f]/
const NO_SCHEMES: ReadonlySet<string> = new Set()

/**
 * Schemes an allow-list of private-use schemes may never name: the web's own
 * (they have their own rules above) and those that run or read something
 * where they are opened. The options' schemas refuse the same names.
 */
export const NEVER_PRIVATE_SCHEMES: readonly string[] = ['http', 'https', ...[...FORBIDDEN_SCHEMES].map(s => s.slice(0, -1))]
const NEVER_PRIVATE = new Set(NEVER_PRIVATE_SCHEMES)

/** An operator's list of private-use schemes as `authorizeRedirectProblem` takes it (schemes are case-insensitive, RFC 3986 §3.1). */
export function privateSchemes(list: readonly string[] | undefined): ReadonlySet<string> {
  const set = new Set((list ?? []).map(s => s.toLowerCase()).filter(s => !NEVER_PRIVATE.has(s)))
  return set.size === 0 ? NO_SCHEMES : set
}

/**
 * Why a redirect_uri may not be sent on to the IdP, or undefined. An error
 * here is answered 400 and never redirected (RFC 6749 §4.1.2.1). The checks
 * are textual as well as parsed so that the IdP and the browser cannot read
 * the URI differently (`http://2130706433/`, `https:\\host`, `user@host`).
 * `allowed` holds the private-use schemes (RFC 8252 §7.1) the operator
 * opted into, lower case (`privateSchemes`); none by default.
 */
export function authorizeRedirectProblem(uri: string | undefined, allowed: ReadonlySet<string> = NO_SCHEMES): string | undefined {
  if (uri === undefined || uri === '') return 'is required'
  if (/[\s\\]/.test(uri)) return 'must not contain whitespace or backslashes'
  if (uri.includes('#')) return 'must not contain a fragment (RFC 6749 §3.1.2)'
  if (allowed.size > 0) {
    const scheme = SCHEME_RE.exec(uri)?.[0].slice(0, -1).toLowerCase()
    // Never `javascript` and the like, even from a list that skipped the options' schema.
    if (scheme !== undefined && allowed.has(scheme) && !NEVER_PRIVATE.has(scheme)) return privateUseProblem(uri)
  }
  const m = SCHEME_AUTHORITY_RE.exec(uri)
  if (m === null)
    return allowed.size === 0
      ? 'must be an absolute https URI, or http on a loopback address'
      : `must be an absolute https URI, http on a loopback address, or use one of the allowed schemes ${[...allowed].join(', ')}`
  const scheme = m[1]!.toLowerCase()
  const authority = m[2]!
  if (authority.includes('@')) return 'must not contain user information'
  if (scheme === 'http') {
    if (!LOOPBACK_AUTHORITY_RE.test(authority)) return 'may use http only on a loopback address (127.0.0.1, [::1], localhost; RFC 8252 §7.3); use https'
  } else if (scheme !== 'https') {
    return allowed.size === 0
      ? `must use https, or http on a loopback address (not ${scheme})`
      : `must use https, http on a loopback address, or one of the allowed schemes ${[...allowed].join(', ')} (not ${scheme})`
  }
  let u: URL
  try {
    u = new URL(uri)
  } catch {
    return 'must be an absolute https URI, or http on a loopback address'
  }
  if (u.hostname === '') return 'must name a host'
  return undefined
}

/**
 * A redirect URI with an allowed private-use scheme (RFC 8252 §7.1:
 * `com.example.app:/cb`, or `cursor://host/path`): no control characters, no
 * user information, parsed alike by the URL parser. Whitespace, backslashes
 * and fragments were refused before.
 */
function privateUseProblem(uri: string): string | undefined {
  if (BAD_CHARS_RE.test(uri)) return 'must not contain control characters'
  const authority = SCHEME_AUTHORITY_RE.exec(uri)?.[2]
  if (authority?.includes('@') === true) return 'must not contain user information'
  let u: URL
  try {
    u = new URL(uri)
  } catch {
    return 'must be an absolute URI'
  }
  if (u.username !== '' || u.password !== '') return 'must not contain user information'
  const rest = uri.slice(u.protocol.length)
  if (rest === '' || rest === '/' || rest === '//') return 'must have a path after its scheme'
  return undefined
}

/**
 * A redirect URI a registering client may use: absolute, no fragment
 * (RFC 6749 §3.1.2), no user info, no whitespace or control characters;
 * https, http on a loopback host (RFC 8252 §7.3), or a private-use scheme for
 * native apps (RFC 8252 §7.1). Returns the reason it is not, or undefined.
 */
export function redirectUriProblem(uri: unknown, maxLength: number): string | undefined {
  if (typeof uri !== 'string' || uri === '') return 'must be a non-empty string'
  if (uri.length > maxLength) return `must be at most ${maxLength} characters`
  if (BAD_CHARS_RE.test(uri)) return 'must not contain whitespace or control characters'
  if (uri.includes('#')) return 'must not contain a fragment'
  if (!SCHEME_RE.test(uri)) return 'must be an absolute URI'
  let u: URL
  try {
    u = new URL(uri)
  } catch {
    return 'must be an absolute URI'
  }
  if (FORBIDDEN_SCHEMES.has(u.protocol)) return `scheme ${u.protocol} is not allowed`
  if (u.username !== '' || u.password !== '') return 'must not contain user information'
  if (u.protocol === 'http:' && !LOOPBACK_HOSTS.has(u.hostname)) return 'http is only allowed for loopback hosts; use https'
  if ((u.protocol === 'http:' || u.protocol === 'https:') && u.hostname === '') return 'must name a host'
  return undefined
}
