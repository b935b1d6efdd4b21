/**
 * RFC 8693 token exchange: the caller's access token (`subject_token`,
 * §2.1) for a token the target accepts, asked for by `audience` and/or
 * `resource` (each repeatable) and `scope`. The answer (§2.2.1) must carry an
 * `access_token` with `token_type` Bearer, or N_A when the issued token is
 * not an OAuth access token (§2.2.1: it is still what the target takes, sent
 * as a bearer token); `issued_token_type` says which it is.
 */
import type { TokenExchangeConfig } from '../config.ts'
import { tokenExchangeAudience } from './audience.ts'
import type { ExchangeSpec } from './exchange.ts'

export const TOKEN_EXCHANGE_GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange'
export const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token'

export function tokenExchangeSpec(cfg: TokenExchangeConfig): ExchangeSpec {
  const fixed = {
    grant_type: TOKEN_EXCHANGE_GRANT,
    subject_token_type: ACCESS_TOKEN_TYPE,
    audience: cfg.audience,
    resource: cfg.resource,
    scope: cfg.scope,
    requested_token_type: cfg.requestedTokenType,
  }
  return {
    mode: 'tokenExchange',
    what: 'token exchange',
    config: cfg,
    // RFC 6749 §2.3.1: every authorization server supports HTTP Basic.
    secretDefault: 'client_secret_basic',
    expectedAudience: tokenExchangeAudience(cfg),
    params: subjectToken => ({ ...fixed, subject_token: subjectToken }),
    tokenOf(body) {
      const type = typeof body.token_type === 'string' ? body.token_type.toLowerCase() : undefined
      if (typeof body.access_token !== 'string' || body.access_token === '' || (type !== 'bearer' && type !== 'n_a')) return undefined
      return { token: body.access_token, expiresIn: typeof body.expires_in === 'number' ? body.expires_in : undefined }
    },
  }
}
