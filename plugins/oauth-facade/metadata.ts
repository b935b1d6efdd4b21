/**
 * The facade's authorization server metadata (RFC 8414), served at the root
 * and at the MCP paths with the issuer each names, readable cross-origin.
 */
import type { Reply, RequestContext } from '../../core/plugin-api.ts'
import { REGISTRATION_PATH } from '../oauth-common/metadata.ts'
import type { FacadeContext } from './facade-context.ts'
import { AUTHORIZE_PATH, TOKEN_PATH } from './paths.ts'

/** Browser-based clients read the metadata and call the token and registration endpoints cross-origin. */
export const CORS: Readonly<Record<string, string>> = {
  'access-control-allow-origin': '*',
  'access-control-allow-methods': 'GET, POST, OPTIONS',
  'access-control-allow-headers': '*',
}

/** The answer to a CORS preflight of a facade endpoint. */
export function preflight(): Reply {
  return { status: 204, headers: { ...CORS, 'access-control-max-age': '600' } }
}

function metadata(f: FacadeContext, iss: string): Record<string, unknown> {
  const { baseUrl, options } = f
  return {
    issuer: iss,
    authorization_endpoint: baseUrl + AUTHORIZE_PATH,
    token_endpoint: baseUrl + TOKEN_PATH,
    ...(options.registration.enabled ? { registration_endpoint: baseUrl + REGISTRATION_PATH } : {}),
    scopes_supported: [...new Set([...f.idp.scopesSupported, 'offline_access'])],
    response_types_supported: ['code'],
    response_modes_supported: ['query'],
    grant_types_supported: ['authorization_code', 'refresh_token'],
    token_endpoint_auth_methods_supported: ['none'],
    code_challenge_methods_supported: ['S256'],
    client_id_metadata_document_supported: options.cimd.enabled,
    authorization_response_iss_parameter_supported: true,
  }
}

export function metadataReply(f: FacadeContext, ctx: RequestContext, iss: string): Reply {
  if (ctx.method === 'OPTIONS') return preflight()
  return { status: 200, headers: { ...CORS, 'cache-control': 'public, max-age=300' }, body: metadata(f, iss) }
}
