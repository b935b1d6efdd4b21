/**
 * What the facade needs to know about the identity provider, from what
 * mcpAuthentication provides (`idp`, `protectedResource`): the one issuer
 * parser's verdict, the gateway's client there, the scopes clients may ask for.
 */
import { ProxyError, type PluginEnv } from '../../core/plugin-api.ts'
import type { IdpIdentity, ProtectedResource } from '../mcp-authentication/identity.ts'
import { BASE_SCOPES, cloudFallbackEndpoints } from '../oauth-common/idp-endpoints.ts'
import { FACADE_PATH } from './options.ts'

export interface FacadeIdp {
  readonly issuer: string
  readonly family: IdpIdentity['family']
  /** The gateway's one client at the IdP. */
  readonly clientId: string
  /** cloud_idp confidential app: added to token requests server-side; never logged or shown. */
  readonly clientSecret: string | undefined
  readonly discoveryUrl: string
  /** Endpoints used while discovery has never succeeded (cloud_idp). */
  readonly fallback: { readonly authorize: string; readonly token: string } | undefined
  readonly discovery: { readonly ttlSeconds: number; readonly timeoutMs: number }
  /**
   * The resource this gateway is, exactly as its protected resource metadata
   * advertises it (`resourceMetadata.resource`): the only RFC 8707 `resource`
   * the facade issues grants for.
   */
  readonly resource: string
  /** `resourceMetadata.scopesSupported`. */
  readonly scopesSupported: readonly string[]
  /** Scopes a client may request: the advertised ones plus OIDC's and offline_access. */
  readonly allowedScopes: ReadonlySet<string>
}

export function facadeIdpOf(env: Pick<PluginEnv, 'provided'>): FacadeIdp {
  const idp = env.provided.idp as IdpIdentity
  const resource = env.provided.protectedResource as ProtectedResource
  if (idp.clientId === undefined) {
    throw new ProxyError(
      'MCPP_ERR_CONFIG',
      500,
      `${FACADE_PATH.replace(/\.facade$/, '')}.clientId: is required with facade (the gateway's one client at the identity provider)`
    )
  }
  const scopesSupported = resource.scopesSupported ?? []
  return {
    issuer: idp.issuer,
    family: idp.family,
    clientId: idp.clientId,
    clientSecret: idp.clientSecret,
    discoveryUrl: idp.discoveryUrl,
    fallback: idp.cloud !== undefined ? cloudFallbackEndpoints(idp.cloud) : undefined,
    discovery: idp.discovery,
    resource: resource.resource,
    scopesSupported,
    allowedScopes: new Set([...BASE_SCOPES, ...scopesSupported]),
  }
}
