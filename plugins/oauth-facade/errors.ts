/**
 * The error code the facade declares. Its other errors reuse the codes of
 * the plugins whose place it takes (MCPP_ERR_OAUTH_REQUEST,
 * MCPP_ERR_IDP_UNAVAILABLE, MCPP_ERR_INVALID_CLIENT_METADATA,
 * MCPP_ERR_RATE_LIMITED): the facade replaces providerBridge and
 * registration in a pipeline, never runs next to them.
 */
import { createError } from '../../core/plugin-api.ts'

/** A redeemed code could not be recorded: refusing it is the only safe answer (single use, RFC 6749 §4.1.2). */
export const CodeStoreUnavailable = createError('MCPP_ERR_CODE_STORE_UNAVAILABLE', 503, 'The store of redeemed authorization codes is full or does not answer', {
  oauthError: 'temporarily_unavailable', expose: true, headers: { 'retry-after': '5' },
})
