/**
 * RFC 8414 authorization server metadata derived from the IdP's OIDC
 * discovery document, with the gaps of each provider bridged.
 */
import type { DiscoveryDocument } from './discovery.ts'
import type { ProviderKind } from '../mcp-authentication/identity.ts'

export const REGISTRATION_PATH = '/.well-known/oauth-authorization-server/client-registration'
/** Gateway-proxied cloud_idp endpoints. */
export const AUTHORIZE_PATH = '/oauth2/authorize'
export const TOKEN_PATH = '/oauth2/token'

/** Root form: issuer as the IdP reports it (docs/identity-providers.md "Identity providers"). */
export const ROOT_METADATA_PATH = '/.well-known/oauth-authorization-server'
/**
 * Where the SDK looks for the metadata of the authorization server
 * `{base_url}/mcp` (RFC 8414 §3.1 path insertion, then OIDC forms, in the
 * SDK's order). Served with issuer `{base_url}/mcp` (RFC 8414 §3.3).
 */
export const MCP_METADATA_PATHS = [
  '/.well-known/oauth-authorization-server/mcp',
  '/.well-known/openid-configuration/mcp',
  '/mcp/.well-known/openid-configuration',
] as const

export interface MetadataInput {
  kind: ProviderKind
  doc: DiscoveryDocument
  baseUrl: string
  /** `issuer` to publish. */
  issuer: string
  /** oss_idp: the key set URL (`{issuer}/jwks/` or the configured `jwks`). */
  jwksUri?: string
}

/** Builds the metadata document; never contains `registration_endpoint: null`. */
export function buildAuthorizationServerMetadata(input: MetadataInput): Record<string, unknown> {
  const out: Record<string, unknown> = { ...input.doc }
  // The IdP's redirect does not pass through the gateway, so its `iss` can
  // never equal the published issuer (RFC 9207); clients that see this flag
  // would reject every callback.
  delete out.authorization_response_iss_parameter_supported
  out.issuer = input.issuer
  out.registration_endpoint = input.baseUrl + REGISTRATION_PATH
  if (input.kind === 'oss_idp') {
    if (input.jwksUri !== undefined) out.jwks_uri = input.jwksUri
    const methods = Array.isArray(out.code_challenge_methods_supported)
      ? (out.code_challenge_methods_supported as unknown[]).filter((m): m is string => typeof m === 'string')
      : []
    out.code_challenge_methods_supported = methods.includes('S256') ? methods : [...methods, 'S256']
  } else {
    out.authorization_endpoint = input.baseUrl + AUTHORIZE_PATH
    out.token_endpoint = input.baseUrl + TOKEN_PATH
    out.code_challenge_methods_supported = ['S256']
    // The gateway's token endpoint serves public clients (PKCE) and forwards
    // a client's own credentials; see docs/identity-providers.md "Identity providers" (POST /oauth2/token).
    out.token_endpoint_auth_methods_supported = ['none', 'client_secret_post', 'client_secret_basic']
    out.grant_types_supported = ['authorization_code', 'refresh_token']
    if (!Array.isArray(out.response_types_supported) || !(out.response_types_supported as unknown[]).includes('code')) {
      out.response_types_supported = ['code']
    }
  }
  return out
}
