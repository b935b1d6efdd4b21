/**
 * What a failed credential becomes: the ProxyError the MCP layer answers as
 * is (status, `WWW-Authenticate`, `Retry-After`) and the reason counted in
 * `mcp_proxy_credential_failures_total`. Messages name the target and the
 * IdP's `error` code only: the IdP's body and `error_description` go to the
 * log, never to the client. The challenges follow the MCP authorization spec
 * (403 `insufficient_scope` with `scope` and `resource_metadata`) and
 * Microsoft's claims challenge (401 `insufficient_claims`, `claims` the
 * base64 of the IdP's JSON), quoted per RFC 7235 / RFC 9110 §5.6.4.
 */
import { ProxyError, RPC } from '../errors.ts'

/** The failure reasons, a fixed list (a metric label). */
export const FAILURE_REASONS = ['step_up', 'invalid_token', 'refused', 'audience', 'unavailable', 'claim'] as const
export type FailureReason = (typeof FAILURE_REASONS)[number]

/** A failed resolve: what the client gets and what is counted. */
export interface Failure {
  readonly reason: FailureReason
  readonly error: ProxyError
}

/** Seconds a client should wait before trying again after the IdP could not be reached. */
export const RETRY_AFTER_SECONDS = 5

/** Where step-up challenges send the client: the gateway's protected resource metadata, and the scopes to ask for. */
export interface ChallengeInfo {
  readonly resourceMetadataUrl: string
  readonly scope: string
}

/** An RFC 7235 quoted-string's content: `\` and `"` escaped; control characters never get here (config and base64). */
export function quoteParam(value: string): string {
  return value.replace(/[\\"]/g, '\\$&')
}

function challenge(params: ReadonlyArray<readonly [string, string]>): string {
  return 'Bearer ' + params.map(([k, v]) => `${k}="${quoteParam(v)}"`).join(', ')
}

/** 403: the user must consent (AADSTS65001, `consent_required`): the client asks again with these scopes. */
export function consentRequired(target: string, code: string, c: ChallengeInfo): Failure {
  const params: Array<[string, string]> = [['error', 'insufficient_scope']]
  if (c.scope !== '') params.push(['scope', c.scope])
  params.push(['resource_metadata', c.resourceMetadataUrl])
  const error = new ProxyError('MCPP_ERR_TARGET_STEP_UP', 403, `target ${target}: the identity provider needs the user's consent (${code})`, {
    oauthError: 'insufficient_scope',
    headers: { 'www-authenticate': challenge(params) },
  })
  return { reason: 'step_up', error }
}

/** 401: the user must authenticate again, with more (MFA, AADSTS50076/50079, `interaction_required`); `claims` is the IdP's challenge. */
export function interactionRequired(target: string, code: string, claims: string | undefined, c: ChallengeInfo): Failure {
  const params: Array<[string, string]> = [['error', 'insufficient_claims']]
  // Microsoft's claims challenge: the JSON the IdP sent, base64 in the header.
  if (claims !== undefined && claims !== '') params.push(['claims', Buffer.from(claims, 'utf8').toString('base64')])
  params.push(['resource_metadata', c.resourceMetadataUrl])
  const error = new ProxyError('MCPP_ERR_TARGET_STEP_UP', 401, `target ${target}: the identity provider needs the user to authenticate again (${code})`, {
    oauthError: 'insufficient_claims',
    headers: { 'www-authenticate': challenge(params) },
  })
  return { reason: 'step_up', error }
}

/** 401: the IdP refused the caller's own token (AADSTS50013/500133, `invalid_grant`): the client authenticates again. */
export function callerTokenRefused(target: string, code: string, c: ChallengeInfo): Failure {
  const error = new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, `target ${target}: the identity provider refused the caller's token (${code})`, {
    oauthError: 'invalid_token',
    headers: {
      'www-authenticate': challenge([
        ['error', 'invalid_token'],
        ['resource_metadata', c.resourceMetadataUrl],
      ]),
    },
  })
  return { reason: 'invalid_token', error }
}

/** 401: a caller without a token reached a target whose credential is made from it. */
export function noCallerToken(target: string, c: ChallengeInfo): Failure {
  const error = new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, `target ${target}: needs an authenticated caller`, {
    oauthError: 'invalid_token',
    headers: { 'www-authenticate': challenge([['resource_metadata', c.resourceMetadataUrl]]) },
  })
  return { reason: 'invalid_token', error }
}

/** 502: the IdP refused the exchange itself (the gateway's client, scope, audience): the operator's to fix. */
export function exchangeRefused(target: string, what: string, code: string): Failure {
  const error = new ProxyError('MCPP_ERR_TARGET_CREDENTIAL', 502, `target ${target}: the identity provider refused the ${what} (${code})`, {
    expose: true,
    rpcCode: RPC.SERVER_ERROR,
  })
  return { reason: 'refused', error }
}

/** 502: the IdP answered with a token this gateway cannot use (another token type). */
export function unusableToken(target: string, what: string): Failure {
  const error = new ProxyError('MCPP_ERR_TARGET_CREDENTIAL', 502, `target ${target}: the identity provider's ${what} answer holds no usable bearer token`, {
    expose: true,
    rpcCode: RPC.SERVER_ERROR,
  })
  return { reason: 'refused', error }
}

/** 502: the minted token is for someone else: it is never sent. */
export function wrongAudience(target: string): Failure {
  const error = new ProxyError('MCPP_ERR_TARGET_CREDENTIAL', 502, `target ${target}: the identity provider minted a token for another audience`, {
    expose: true,
    rpcCode: RPC.SERVER_ERROR,
  })
  return { reason: 'audience', error }
}

/** 503 + Retry-After: unreachable, timed out, a 5xx, an answer that cannot be read. */
export function idpUnavailable(target: string, why: string): Failure {
  const error = new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 503, `target ${target}: the identity provider ${why}; try again later`, {
    expose: true,
    rpcCode: RPC.SERVER_ERROR,
    headers: { 'retry-after': String(RETRY_AFTER_SECONDS) },
  })
  return { reason: 'unavailable', error }
}

/** 403: a claim the target's templates need is missing or unusable (named, never its value). */
export function claimRefused(target: string, problem: string): Failure {
  const error = new ProxyError('MCPP_ERR_TARGET_CREDENTIAL', 403, `target ${target}: ${problem}`, { rpcCode: RPC.SERVER_ERROR })
  return { reason: 'claim', error }
}
