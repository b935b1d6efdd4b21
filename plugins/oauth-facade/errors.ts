/**
 * The error code the facade declares. Its other errors reuse the codes of
 * the plugins whose place it takes (MCPP_ERR_OAUTH_REQUEST,
 * MCPP_ERR_IDP_UNAVAILABLE, MCPP_ERR_INVALID_CLIENT_METADATA,
 * MCPP_ERR_RATE_LIMITED): the facade replaces providerBridge and
 * registration in a pipeline, never runs next to them.
 */
import { createError, ProxyError, type RequestContext } from '../../core/plugin-api.ts'

/** A redeemed code could not be recorded: refusing it is the only safe answer (single use, RFC 6749 §4.1.2). */
export const CodeStoreUnavailable = createError(
  'MCPP_ERR_CODE_STORE_UNAVAILABLE',
  503,
  'The store of redeemed authorization codes is full or does not answer',
  {
    oauthError: 'temporarily_unavailable',
    expose: true,
    headers: { 'retry-after': '5' },
  }
)

export function oauthError(status: number, error: string, message: string, headers?: Record<string, string>): ProxyError {
  return new ProxyError('MCPP_ERR_OAUTH_REQUEST', status, message, { oauthError: error, ...(headers !== undefined ? { headers } : {}) })
}

const AUTH_SCHEME_RE = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/

/**
 * Clients of the facade are public (token_endpoint_auth_method none): any
 * credential is refused with invalid_client. RFC 6749 §5.2: a client that
 * authenticated through the Authorization header gets 401 with a
 * WWW-Authenticate for the scheme it used; credentials in the body get 400
 * (a 401 would need a challenge for a scheme the client did not use).
 */
export function refuseCredentials(ctx: RequestContext, p: ReadonlyMap<string, string>): void {
  const message = 'clients of this gateway are public (token_endpoint_auth_method none): send client_id, no credentials'
  const authorization = ctx.req.headers.authorization
  if (authorization !== undefined) {
    const scheme = authorization.trim().split(/\s+/)[0] ?? ''
    const challenge = AUTH_SCHEME_RE.test(scheme) && scheme.length <= 32 ? scheme : 'Basic'
    throw oauthError(401, 'invalid_client', message, { 'www-authenticate': `${challenge} realm="oauth", error="invalid_client"` })
  }
  if (p.has('client_secret') || p.has('client_assertion')) throw oauthError(400, 'invalid_client', message)
}
