/**
 * What the gateway's OAuth endpoints (the provider bridge's cloud_idp proxy,
 * the OAuth facade) assume of the identity provider's endpoints.
 */
import type { CloudTenant } from '../mcp-authentication/identity.ts'

/** Scopes always allowed next to `scopesSupported` (OIDC and refresh tokens). */
export const BASE_SCOPES = ['openid', 'profile', 'offline_access', 'email'] as const
/** A token response with tokens is a few KiB. */
export const TOKEN_RESPONSE_MAX_BYTES = 256 * 1024

/** cloud_idp endpoints used when discovery has never succeeded. */
export function cloudFallbackEndpoints(t: CloudTenant): { authorize: string; token: string } {
  return {
    authorize: `${t.origin}/${t.tenant}/oauth2/v2.0/authorize`,
    token: `${t.origin}/${t.tenant}/oauth2/v2.0/token`,
  }
}
