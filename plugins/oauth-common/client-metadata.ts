/**
 * RFC 7591 client metadata validation and the registration response, shared
 * by the registration plugin and the OAuth facade (a plain module: no plugin).
 */
import { createError, type ProxyError } from '../../core/plugin-api.ts'
import { redirectUriProblem } from './redirect-uri.ts'

export const SUPPORTED_GRANTS = ['authorization_code', 'refresh_token'] as const

/** What one registration request may list. */
export interface ClientMetadataLimits {
  readonly maxRedirectUris: number
  readonly maxRedirectUriLength: number
}

export const InvalidClientMetadata = createError('MCPP_ERR_INVALID_CLIENT_METADATA', 400, 'Client registration request is invalid', {
  oauthError: 'invalid_client_metadata',
})

function invalid(message: string, oauthError = 'invalid_client_metadata'): ProxyError {
  return InvalidClientMetadata(message, { oauthError })
}

function stringList(v: unknown, field: string): string[] | undefined {
  if (v === undefined) return undefined
  if (!Array.isArray(v) || !v.every(x => typeof x === 'string')) throw invalid(`${field} must be an array of strings`)
  return v as string[]
}

function optionalString(v: unknown, field: string): string | undefined {
  if (v === undefined) return undefined
  if (typeof v !== 'string' || v.length > 1000 || /[\u0000-\u001f\u007f]/.test(v)) throw invalid(`${field} must be a string without control characters`)
  return v
}

/** Validates a registration request body and builds the RFC 7591 §3.2.1 response. */
export function buildRegistrationResponse(body: unknown, clientId: string, now: number, limits: ClientMetadataLimits): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw invalid('the request body must be a JSON object')
  const req = body as Record<string, unknown>
  const redirectUris = req.redirect_uris
  if (!Array.isArray(redirectUris) || redirectUris.length === 0) {
    throw invalid('redirect_uris must be a non-empty array', 'invalid_redirect_uri')
  }
  // RFC 7591 §3.2.2: a redirect URI the server will not take is invalid_redirect_uri.
  if (redirectUris.length > limits.maxRedirectUris) throw invalid(`at most ${limits.maxRedirectUris} redirect_uris`, 'invalid_redirect_uri')
  redirectUris.forEach((u, i) => {
    const problem = redirectUriProblem(u, limits.maxRedirectUriLength)
    if (problem !== undefined) throw invalid(`redirect_uris[${i}] ${problem}`, 'invalid_redirect_uri')
  })
  // RFC 7591 §3.2.1: the server may replace requested values with the ones it supports.
  const grants = stringList(req.grant_types, 'grant_types')
  const grantTypes = grants === undefined ? [...SUPPORTED_GRANTS] : SUPPORTED_GRANTS.filter(g => grants.includes(g))
  if (!grantTypes.includes('authorization_code')) throw invalid('grant_types must include authorization_code')
  const responses = stringList(req.response_types, 'response_types')
  if (responses !== undefined && !responses.includes('code')) throw invalid('response_types must include code')
  const clientName = optionalString(req.client_name, 'client_name')
  const scope = optionalString(req.scope, 'scope')
  const out: Record<string, unknown> = {
    client_id: clientId,
    client_id_issued_at: Math.floor(now / 1000),
    token_endpoint_auth_method: 'none',
    redirect_uris: [...redirectUris],
    grant_types: grantTypes,
    response_types: ['code'],
  }
  if (clientName !== undefined) out.client_name = clientName
  if (scope !== undefined) out.scope = scope
  return out
}
