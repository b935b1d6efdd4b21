/**
 * The identity of the identity provider (issuer, family, client, where its
 * discovery document and keys live), derived once from mcpAuthentication's
 * options by the one issuer parser. mcpAuthentication provides it as `idp`
 * (and the protected resource as `protectedResource`); the provider bridge,
 * registration and authorization use it instead of reading the config.
 * Pure functions: no I/O, so `--check` and start-up give the same verdict.
 */
import { ProxyError } from '../../core/plugin-api.ts'

export type ProviderKind = 'oss_idp' | 'cloud_idp'

/** Tenant and login origin of a cloud_idp issuer. */
export interface CloudTenant {
  /** Login origin, e.g. `https://login.microsoftonline.com`. */
  readonly origin: string
  readonly tenant: string
  /** `v2` for `{origin}/{tenant}/v2.0`, `v1` for `https://sts.windows.net/{tenant}/`. */
  readonly version: 'v1' | 'v2'
}

export type KeySetSource = { readonly kind: 'url'; readonly url: string } | { readonly kind: 'discovery'; readonly discoveryUrl: string }

/** What `idp` provides. `clientSecret` is a credential: never log or show it. */
export interface IdpIdentity {
  readonly issuer: string
  /** The variant whose gaps the gateway bridges; undefined for a plain OIDC issuer. */
  readonly family: ProviderKind | undefined
  readonly clientId: string | undefined
  readonly clientSecret: string | undefined
  /** cloud_idp: the parsed issuer. */
  readonly cloud: CloudTenant | undefined
  /** The OIDC discovery document the bridge serves metadata from. */
  readonly discoveryUrl: string
  /** Where the signing keys live (docs/identity-providers.md "Authentication", key sets). */
  readonly keySet: KeySetSource
  readonly discovery: { readonly ttlSeconds: number; readonly timeoutMs: number }
}

/** What `protectedResource` provides: the RFC 9728 resource this gateway is. */
export interface ProtectedResource {
  readonly resource: string
  readonly scopesSupported: readonly string[] | undefined
}

/** The option fields the identity is derived from (mcpAuthentication's schema). */
export interface IdentityInput {
  readonly issuer: string
  readonly provider?: { readonly oss_idp?: unknown; readonly cloud_idp?: unknown }
  readonly clientId?: string
  readonly clientSecret?: string
  readonly jwks?: string
  readonly discovery?: { readonly ttlSeconds?: number; readonly timeoutMs?: number }
}

/**
 * v1 token issuer hosts and the login host that serves the same tenant
 * ("National clouds" in the Microsoft identity platform docs). A v1 issuer on
 * any other host is taken to be served by its own origin (this is what lets
 * the Entra emulator stand in for both forms).
 */
const V1_STS_TO_LOGIN: Readonly<Record<string, string>> = {
  'sts.windows.net': 'https://login.microsoftonline.com',
  'sts.chinacloudapi.cn': 'https://login.chinacloudapi.cn',
  'sts.microsoftonline.de': 'https://login.microsoftonline.de',
}

const TENANT_RE = /^[A-Za-z0-9][A-Za-z0-9.-]{0,253}$/

export function providerKind(input: Pick<IdentityInput, 'provider'> | undefined): ProviderKind | undefined {
  if (input?.provider?.oss_idp !== undefined) return 'oss_idp'
  if (input?.provider?.cloud_idp !== undefined) return 'cloud_idp'
  return undefined
}

/** `https://idp/x/` -> `https://idp/x` (the trailing slash is normalised before deriving paths: docs/identity-providers.md "Authentication", key sets). */
export function withoutTrailingSlash(url: string): string {
  return url.endsWith('/') ? url.slice(0, -1) : url
}

/**
 * The issuer parser for cloud_idp: v2 `{origin}/{tenant}/v2.0` (optionally
 * with a trailing slash) or v1 `https://sts.../{tenant}/`. Returns undefined
 * when the issuer has neither form.
 */
export function parseCloudIssuer(issuer: string): CloudTenant | undefined {
  let u: URL
  try {
    u = new URL(issuer)
  } catch {
    return undefined
  }
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
export function cloudTenantOf(issuer: string, configPath = 'mcp.policies.mcpAuthentication'): CloudTenant {
  const t = parseCloudIssuer(issuer)
  if (t === undefined) {
    throw new ProxyError(
      'MCPP_ERR_CONFIG',
      500,
      `${configPath}.issuer: cloud_idp needs {login origin}/{tenant}/v2.0 or https://sts.windows.net/{tenant}/, got ${issuer}`
    )
  }
  return t
}

/** The OIDC discovery URL of an issuer. */
export function discoveryUrlFor(kind: ProviderKind | undefined, issuer: string): string {
  if (kind === 'cloud_idp') {
    const t = cloudTenantOf(issuer)
    return `${t.origin}/${t.tenant}/v2.0/.well-known/openid-configuration`
  }
  return `${withoutTrailingSlash(issuer)}/.well-known/openid-configuration`
}

/** oss_idp key set: `{issuer}/jwks/` after trailing-slash normalisation (docs/identity-providers.md "Authentication", key sets). */
export function ossJwksUri(issuer: string): string {
  return `${withoutTrailingSlash(issuer)}/jwks/`
}

/** cloud_idp key set: `{login origin}/{tenant}/discovery/v2.0/keys`. */
export function cloudKeySetUrl(issuer: string, configPath?: string): string {
  const t = cloudTenantOf(issuer, configPath)
  return `${t.origin}/${encodeURIComponent(t.tenant)}/discovery/v2.0/keys`
}

/** Derives the key set location from the configuration (docs/identity-providers.md "Authentication", key sets). */
export function deriveKeySetSource(input: IdentityInput, configPath = 'mcp.policies.mcpAuthentication'): KeySetSource {
  if (input.jwks !== undefined) return { kind: 'url', url: input.jwks }
  const kind = providerKind(input)
  if (kind === 'oss_idp') return { kind: 'url', url: ossJwksUri(input.issuer) }
  if (kind === 'cloud_idp') return { kind: 'url', url: cloudKeySetUrl(input.issuer, configPath) }
  return { kind: 'discovery', discoveryUrl: discoveryUrlFor(undefined, input.issuer) }
}

/**
 * The identity, with the cross-field checks of mcpAuthentication's options
 * (a ProxyError naming the path for each).
 */
export function identityOf(input: IdentityInput, configPath = 'mcp.policies.mcpAuthentication'): IdpIdentity {
  const family = providerKind(input)
  if (family === 'cloud_idp' && input.clientId === undefined) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${configPath}.clientId: is required for cloud_idp`)
  }
  if (input.clientSecret !== undefined && family !== 'cloud_idp') {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${configPath}.clientSecret: is only used with provider cloud_idp`)
  }
  const cloud = family === 'cloud_idp' ? cloudTenantOf(input.issuer, configPath) : undefined
  return {
    issuer: input.issuer,
    family,
    clientId: input.clientId,
    clientSecret: input.clientSecret,
    cloud,
    discoveryUrl: cloud !== undefined ? `${cloud.origin}/${cloud.tenant}/v2.0/.well-known/openid-configuration` : discoveryUrlFor(undefined, input.issuer),
    keySet: deriveKeySetSource(input, configPath),
    discovery: { ttlSeconds: input.discovery?.ttlSeconds ?? 3600, timeoutMs: input.discovery?.timeoutMs ?? 5000 },
  }
}

/** `{base_url}`: `resourceMetadata.resource` without its trailing `/mcp` (never the Host header). */
export function baseUrlOf(resource: string): string {
  const u = new URL(resource)
  const path = u.pathname.replace(/\/mcp$/, '')
  return u.origin + (path === '/' ? '' : path)
}
