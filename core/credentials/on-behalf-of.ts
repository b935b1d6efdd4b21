/**
 * Entra on-behalf-of ("Microsoft identity platform and OAuth 2.0 On-Behalf-Of
 * flow"): the RFC 7523 jwt-bearer grant with `requested_token_use=on_behalf_of`,
 * the caller's token as `assertion` and the target API's `scope`
 * (`<app ID URI>/.default` or named scopes). The gateway authenticates as its
 * own application, with a secret (sent in the body, as Microsoft documents)
 * or a certificate assertion (private_key_jwt with `x5t`).
 */
import type { OnBehalfOfConfig } from '../config.ts'
import { onBehalfOfAudience } from './audience.ts'
import type { ExchangeSpec } from './exchange.ts'

export const JWT_BEARER_GRANT = 'urn:ietf:params:oauth:grant-type:jwt-bearer'

export function onBehalfOfSpec(cfg: OnBehalfOfConfig): ExchangeSpec {
  return {
    mode: 'onBehalfOf',
    what: 'on-behalf-of exchange',
    config: cfg,
    secretDefault: 'client_secret_post',
    expectedAudience: onBehalfOfAudience(cfg),
    params: assertion => ({ grant_type: JWT_BEARER_GRANT, requested_token_use: 'on_behalf_of', assertion, scope: cfg.scope }),
    tokenOf(body) {
      const type = typeof body.token_type === 'string' ? body.token_type.toLowerCase() : undefined
      if (typeof body.access_token !== 'string' || body.access_token === '' || type !== 'bearer') return undefined
      const expiresIn = typeof body.expires_in === 'number' ? body.expires_in : typeof body.expires_in === 'string' ? Number(body.expires_in) : undefined
      return { token: body.access_token, expiresIn: Number.isFinite(expiresIn) ? expiresIn : undefined }
    },
  }
}
