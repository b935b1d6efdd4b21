/**
 * Where an identity provider lives, derived from the configured issuer:
 * the OIDC discovery URL, and for cloud_idp the tenant, the login origin and
 * the fallback authorize/token endpoints used while discovery is unavailable.
 */
import type { McpAuthenticationConfig } from '../../core/config.ts'
import { ProxyError } from '../../core/errors.ts'

export type ProviderKind = 'oss_idp' | 'cloud_idp'

/** Tenant and login origin of a cloud_idp issuer. */
export interface CloudTenant {
  /** Login origin, e.g. `https://login.microsoftonline.com`. */
  readonly origin: string
  readonly tenant: string
  /** `v2` for `{origin}/{tenant}/v2.0`, `v1` for `https://sts.windows.net/{tenant}/`. */
  readonly version: 'v1' | 'v2'
}

/**
 * v1 token issuer hosts and the login host that serves the same tenant.
 * A v1 issuer on any other host is taken to be served by its own origin
 * (this is what lets the Entra emulator stand in for both forms).
 */
const V1_STS_TO_LOGIN: Readonly<Record<string, string>> = {
  'sts.windows.net': 'https://login.microsoftonline.com',
  'sts.chinacloudapi.cn': 'https://login.chinacloudapi.cn',
  'sts.microsoftonline.de': 'https://login.microsoftonline.de',
}

const TENANT_RE = /^[A-Za-z0-9][A-Za-z0-9.-]{0,253}$/

export function providerKind (auth: McpAuthenticationConfig | undefined): ProviderKind | undefined {
  if (auth?.provider?.oss_idp !== undefined) return 'oss_idp'
  if (auth?.provider?.cloud_idp !== undefined) return 'cloud_idp'
  return undefined
}

/** `https://idp/x/` -> `https://idp/x` (SPEC: the trailing slash is normalised before deriving paths). */
export function withoutTrailingSlash (url: string): string {
  return url.endsWith('/') ? url.slice(0, -1) : url
}

/**
 * Parses a cloud_idp issuer: v2 `{origin}/{tenant}/v2.0` (optionally with a
 * trailing slash) or v1 `https://sts.windows.net/{tenant}/`. Returns
 * undefined when the issuer has neither form.
 */
export function parseCloudIssuer (issuer: string): CloudTenant | undefined {
  let u: URL
  try { u = new URL(issuer) } catch { return undefined }
  if (u.search !== '' || u.hash !== '') return undefined
  const segs = u.pathname.split('/').filter(s => s !== '')
  if (segs.length === 2 && segs[1] === 'v2.0' && TENANT_RE.test(segs[0]!)) {
    return { origin: u.origin, tenant: segs[0]!, version: 'v2' }
  }
  if (segs.length === 1 && TENANT_RE.test(segs[0]!)) {
    return { origin: V1_STS_TO_LOGIN[u.hostname] ?? u.origin, tenant: segs[0]!, version: 'v1' }
  }
  return undefined
}

/** Same as parseCloudIssuer but throws a config error naming the field. */
export function cloudTenantOf (issuer: string, configPath = 'mcp.policies.mcpAuthentication'): CloudTenant {
  const t = parseCloudIssuer(issuer)
  if (t === undefined) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500,
      `${configPath}.issuer: cloud_idp needs {login origin}/{tenant}/v2.0 or https://sts.windows.net/{tenant}/, got ${issuer}`)
  }
  return t
}

/** The OIDC discovery URL the bridge fetches. */
export function discoveryUrlFor (kind: ProviderKind, issuer: string): string {
  if (kind === 'cloud_idp') {
    const t = cloudTenantOf(issuer)
    return `${t.origin}/${t.tenant}/v2.0/.well-known/openid-configuration`
  }
  return `${withoutTrailingSlash(issuer)}/.well-known/openid-configuration`
}

/** oss_idp key set: `{issuer}/jwks/` after trailing-slash normalisation (SPEC Authentication 3). */
export function ossJwksUri (issuer: string): string {
  return `${withoutTrailingSlash(issuer)}/jwks/`
}

/** cloud_idp endpoints used when discovery has never succeeded. */
export function cloudFallbackEndpoints (t: CloudTenant): { authorize: string; token: string; jwks: string } {
  return {
    authorize: `${t.origin}/${t.tenant}/oauth2/v2.0/authorize`,
    token: `${t.origin}/${t.tenant}/oauth2/v2.0/token`,
    jwks: `${t.origin}/${t.tenant}/discovery/v2.0/keys`,
  }
}
