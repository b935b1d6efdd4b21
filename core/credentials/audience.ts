/**
 * The minted token is only ever sent to the target it was minted for: a JWT
 * whose `aud` names none of the audiences expected of the target is refused
 * before it is used. Decoded, not verified: the IdP signed it for the target,
 * which verifies it; the gateway only refuses to hand a token meant for
 * someone else to this target. An opaque token is the IdP's word (nothing to
 * read). Also the token's `exp`, which bounds how long it is cached.
 */
import { decodeJwt } from 'jose'
import type { OnBehalfOfConfig, TokenExchangeConfig } from '../config.ts'

/** Entra application (client) ids are GUIDs; `api://<GUID>` is the default app ID URI. */
const GUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

/** RFC 8693: the audiences and resources asked for, unless `expectedAudience` says otherwise. */
export function tokenExchangeAudience(cfg: TokenExchangeConfig): readonly string[] {
  return cfg.expectedAudience ?? [...(cfg.audience ?? []), ...(cfg.resource ?? [])]
}

/**
 * Entra OBO: the resource part of each scope (`api://x` of `api://x/.default`
 * or `api://x/read`; a v1 token's `aud`), and for `api://<GUID>` the GUID
 * itself (a v2 token's `aud` is the API's application id). Scopes without a
 * resource (`openid`, `offline_access`) add nothing.
 */
export function onBehalfOfAudience(cfg: OnBehalfOfConfig): readonly string[] {
  if (cfg.expectedAudience !== undefined) return cfg.expectedAudience
  const out = new Set<string>()
  for (const scope of cfg.scope.split(/\s+/)) {
    const cut = scope.lastIndexOf('/')
    if (cut <= 0) continue
    const resource = scope.slice(0, cut)
    out.add(resource)
    if (resource.startsWith('api://') && GUID.test(resource.slice(6))) out.add(resource.slice(6))
  }
  return [...out]
}

/** What the gateway reads of a minted token. */
export interface MintedClaims {
  /** False when the token is a JWT whose `aud` names none of the expected audiences. */
  readonly audienceOk: boolean
  /** `exp` in seconds, when the token is a JWT that has one. */
  readonly exp: number | undefined
  /** Its `aud` values (for the log when refused; not a secret). */
  readonly aud: readonly string[]
}

/** Reads `aud` and `exp` of a JWT; an opaque token passes with no `exp`. An empty `expected` checks nothing. */
export function readMinted(token: string, expected: readonly string[]): MintedClaims {
  let claims: { aud?: unknown; exp?: unknown }
  try {
    claims = decodeJwt(token)
  } catch {
    return { audienceOk: true, exp: undefined, aud: [] }
  }
  const exp = typeof claims.exp === 'number' && Number.isFinite(claims.exp) ? claims.exp : undefined
  const aud = typeof claims.aud === 'string' ? [claims.aud] : Array.isArray(claims.aud) ? claims.aud.filter(a => typeof a === 'string') : []
  return { audienceOk: expected.length === 0 || aud.some(a => expected.includes(a)), exp, aud }
}
