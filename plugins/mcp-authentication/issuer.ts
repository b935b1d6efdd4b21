/**
 * Where an issuer's signing keys live, per identity-provider variant, and the
 * gateway's `{base_url}`. Pure functions: no I/O.
 */

export type KeySetSource =
  | { readonly kind: 'url'; readonly url: string }
  | { readonly kind: 'discovery'; readonly discoveryUrl: string }

/**
 * v1 token issuer hosts (`https://sts.../{tenant}/`) and the login host that
 * serves the same tenant's keys. Microsoft documents these pairs per national
 * cloud ("National clouds" in the Microsoft identity platform docs).
 */
const V1_TO_LOGIN_HOST: Readonly<Record<string, string>> = {
  'sts.windows.net': 'login.microsoftonline.com',
  'sts.chinacloudapi.cn': 'login.chinacloudapi.cn',
}

export interface KeySetInput {
  readonly issuer: string
  readonly provider?: { readonly oss_idp?: unknown; readonly cloud_idp?: unknown }
  readonly jwks?: string
}

function withoutTrailingSlash (s: string): string {
  return s.endsWith('/') ? s.slice(0, -1) : s
}

/** Derives the key set location from the configuration (see SPEC "Authentication" point 3). */
export function deriveKeySetSource (input: KeySetInput): KeySetSource {
  if (input.jwks !== undefined) return { kind: 'url', url: input.jwks }
  const base = withoutTrailingSlash(input.issuer)
  if (input.provider?.oss_idp !== undefined) {
    // Authentik serves keys at {issuer}jwks/, not at a discovery-advertised standard path.
    return { kind: 'url', url: `${base}/jwks/` }
  }
  if (input.provider?.cloud_idp !== undefined) {
    return { kind: 'url', url: cloudKeySetUrl(input.issuer) }
  }
  return { kind: 'discovery', discoveryUrl: `${base}/.well-known/openid-configuration` }
}

/** The tenant id of a cloud_idp issuer (v2 `{origin}/{tenant}/v2.0`, or v1 `https://sts.../{tenant}/`). */
export function cloudTenantOf (issuer: string): { origin: string; tenant: string; version: 1 | 2 } {
  const u = new URL(issuer)
  const segs = u.pathname.split('/').filter(Boolean)
  if (segs.length === 2 && segs[1] === 'v2.0') return { origin: u.origin, tenant: segs[0]!, version: 2 }
  if (segs.length === 1) {
    const login = V1_TO_LOGIN_HOST[u.hostname.toLowerCase()]
    if (login === undefined) throw new Error(`cannot derive the key set from issuer ${issuer}: unknown v1 issuer host ${u.hostname}; set jwks`)
    return { origin: `https://${login}`, tenant: segs[0]!, version: 1 }
  }
  throw new Error(`cannot derive the tenant from issuer ${issuer}: expected {origin}/{tenant}/v2.0 or https://sts.windows.net/{tenant}/; set jwks`)
}

/** `{origin}/{tenant}/discovery/v2.0/keys`; v1 issuers use their cloud's login host. */
export function cloudKeySetUrl (issuer: string): string {
  const { origin, tenant } = cloudTenantOf(issuer)
  return `${origin}/${encodeURIComponent(tenant)}/discovery/v2.0/keys`
}

/** `{base_url}`: `resourceMetadata.resource` without its trailing `/mcp` (never the Host header). */
export function baseUrlOf (resource: string): string {
  const u = new URL(resource)
  const path = u.pathname.replace(/\/mcp$/, '')
  return u.origin + (path === '/' ? '' : path)
}
