/**
 * The one parser for the OAuth parameters the cloud_idp proxies forward: the
 * authorize query and the token form body go through `parseOAuthParams`, and
 * the request sent on is re-encoded from its entries, so the identity
 * provider receives exactly what was checked here.
 *
 * Servers disagree on which names mean the same parameter: ASP.NET (the cloud
 * IdP) matches names case-insensitively, PHP and Rails read `name[]` and
 * `name[0]` as `name`, some stacks percent-decode twice, trim names, or fold
 * Unicode compatibility forms (`ｒ`, `ſ`). `canonicalName` reads a name the
 * most generous of those ways; every name that reads as `resource` is
 * dropped, and two names that read the same are a repeated parameter.
 */
import { ProxyError } from '../../core/plugin-api.ts'

// CR, LF and the other C0 controls (and DEL) have no place in OAuth parameters.
const CONTROL_RE = /[\u0000-\u001f\u007f]/
/** Percent-decoding rounds applied to a name beyond the form decoding (`%2572` -> `%72` -> `r`). */
const EXTRA_DECODE_ROUNDS = 3

export function badRequest(message: string, oauthError = 'invalid_request'): ProxyError {
  return new ProxyError('MCPP_ERR_OAUTH_REQUEST', 400, message, { oauthError })
}

/** How the most lenient server would read an (already form-decoded) parameter name. */
export function canonicalName(name: string): string {
  let n = name
  for (let i = 0; i < EXTRA_DECODE_ROUNDS && n.includes('%'); i++) {
    let d: string
    try {
      d = decodeURIComponent(n)
    } catch {
      break
    }
    if (d === n) break
    n = d
  }
  n = n.normalize('NFKC').toLowerCase()
  const bracket = n.indexOf('[')
  if (bracket > 0) n = n.slice(0, bracket)
  return n.trim()
}

export interface OAuthParams {
  /** Decoded parameters in their order, without any `resource`: what is forwarded. */
  readonly entries: Array<[string, string]>
  /** Values by canonical name (`Client_Id` is `client_id`). */
  readonly byName: ReadonlyMap<string, string>
  /** Every `resource` value (RFC 8707 allows several), for the OAuth facade, which checks them itself. */
  readonly resources: readonly string[]
}

/**
 * Parses an `application/x-www-form-urlencoded` string (RFC 6749 §3.1 query,
 * §3.2 body). Rejects control characters and any parameter given twice under
 * any spelling (RFC 6749 §3.1, §3.2: parameters MUST NOT repeat); drops every
 * `resource` (RFC 8707 allows several), which the IdP refuses (AADSTS9010010).
 */
export function parseOAuthParams(raw: string): OAuthParams {
  const entries: Array<[string, string]> = []
  const byName = new Map<string, string>()
  const resources: string[] = []
  for (const [k, v] of new URLSearchParams(raw)) {
    if (CONTROL_RE.test(k) || CONTROL_RE.test(v)) throw badRequest('parameters must not contain control characters (CR, LF, ...)')
    const name = canonicalName(k)
    if (name === 'resource') {
      resources.push(v)
      continue
    }
    if (byName.has(name)) throw badRequest(`parameter ${name} is repeated`)
    byName.set(name, v)
    entries.push([k, v])
  }
  return { entries, byName, resources }
}
