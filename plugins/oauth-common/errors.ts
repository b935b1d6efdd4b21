/**
 * The error codes the provider bridge raises, each bound to its status.
 * IdpUnavailable's code is core's (ERROR_CODES: the credential layer raises
 * it too), so the bridge no longer declares it; the token proxy answers it
 * with 502 or 504 as well (unreachable, timed out), which docs/errors.md lists.
 */
import { createError } from '../../core/plugin-api.ts'

export const IdpUnavailable = createError('MCPP_ERR_IDP_UNAVAILABLE', 503, "The IdP's discovery document or token endpoint could not be reached", {
  oauthError: 'temporarily_unavailable',
  expose: true,
})

export const OAuthRequestInvalid = createError('MCPP_ERR_OAUTH_REQUEST', 400, 'A proxied authorize/token request is invalid', {
  oauthError: 'invalid_request',
})
