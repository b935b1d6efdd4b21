/**
 * The development IdP's RFC 8693 token-exchange grant: what Keycloak, Okta or
 * Authentik do when a gateway trades a user's access token for one minted for
 * a target. oidc-provider authenticates the client (client_secret_basic/post,
 * private_key_jwt) before this handler runs; the handler checks the subject
 * token (signed by this IdP, its issuer, not expired, an audience the client
 * may exchange), the requested audience/resource and scope against the
 * client's policy, and answers the §2.2.1 response with a JWT that names the
 * exchanging client in `act` (§4.1, delegation). Errors are §2.2.2's: the
 * subject token refused is `invalid_grant`, a target the client may not ask
 * for `invalid_target`, scope beyond the client's `invalid_scope`.
 *
 * Split from bin/dev-idp.ts (which owns the provider) and, like it, never
 * shipped.
 */
import { randomUUID } from 'node:crypto'
import { createLocalJWKSet, jwtVerify, type JWK, type JWTPayload } from 'jose'
import { errors as oidcErrors, type OidcCtx, type Provider } from 'oidc-provider'

export const TOKEN_EXCHANGE_GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange'
export const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token'

/** Parameters of the grant (RFC 8693 §2.1); `audience` and `resource` may repeat. */
const GRANT_PARAMS = ['subject_token', 'subject_token_type', 'actor_token', 'actor_token_type', 'requested_token_type', 'audience', 'resource', 'scope']
const REPEATABLE = ['audience', 'resource']

/** What one client may exchange, and for what. */
export interface DevIdpExchangeClient {
  /** Client secret (client_secret_basic or client_secret_post). Exactly one of `secret` and `jwks`. */
  readonly secret?: string
  /** Public JWKs of the client's keys: it authenticates with `private_key_jwt` (assertion `aud` = issuer or token endpoint). */
  readonly jwks?: readonly JWK[]
  /** Audiences and resources (`audience` / `resource` values) this client may ask a token for. */
  readonly audiences: readonly string[]
  /** Scopes it may ask for; no `scope` in the request means all of them. */
  readonly scopes: readonly string[]
  /** `aud` values a subject token must carry (one of). Default: the public client id, the audience of every token this IdP issues on login. */
  readonly subjectAudiences?: readonly string[]
}

/**
 * The token-exchange grant (`DevIdpOptions.tokenExchange`). Each client is
 * registered as a confidential client whose only grant is token exchange.
 */
export interface DevIdpTokenExchangeOptions {
  readonly clients: Readonly<Record<string, DevIdpExchangeClient>>
  /** Lifetime of an issued token. Default 300. */
  readonly ttlSeconds?: number
}

/** One request that reached the grant (client authenticated). No token is kept. */
export interface DevIdpExchangeRecord {
  readonly clientId: string
  /** The subject token's `sub`, when it was verified. */
  readonly sub?: string
  /** `aud` of the issued token (the requested audiences and resources). */
  readonly audience?: readonly string[]
  readonly scope?: string
  /** The OAuth error answered, when refused. */
  readonly error?: string
}

/** How the token endpoint misbehaves, for the gateway's outage paths (`setTokenEndpointFailure`). */
export type TokenEndpointFailure = 'unavailable' | 'malformed'

/** What the grant needs from the provider: its issuer and keys, and where it counts. */
export interface ExchangeDeps {
  readonly issuer: string
  /** Default `subjectAudiences`. */
  readonly loginAudience: string
  readonly ttl: number
  /** The current public key set (subject tokens are checked against it). */
  publicKeys(): JWK[]
  sign(payload: JWTPayload, typ: string): Promise<string>
  /** Per-client policy, mutable by tests (`setTokenExchangePolicy`). */
  readonly policies: Map<string, DevIdpExchangeClient>
  readonly log: DevIdpExchangeRecord[]
  issued: number
}

/** oidc-provider client metadata for each exchange client. */
export function exchangeClientMetadata(opts: DevIdpTokenExchangeOptions | undefined): Record<string, unknown>[] {
  return Object.entries(opts?.clients ?? {}).map(([clientId, c]) => {
    if ((c.secret === undefined) === (c.jwks === undefined)) {
      throw new Error(`dev-idp: token-exchange client ${clientId} needs exactly one of secret and jwks`)
    }
    const auth =
      c.secret !== undefined
        ? { token_endpoint_auth_method: 'client_secret_basic', client_secret: c.secret }
        : { token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: c.jwks?.map(publicPart) } }
    return { client_id: clientId, grant_types: [TOKEN_EXCHANGE_GRANT], response_types: [], redirect_uris: [], ...auth }
  })
}

/** Drops private members, so a test may pass a full key pair's JWK. */
function publicPart(jwk: JWK): JWK {
  const { d: _d, p: _p, q: _q, dp: _dp, dq: _dq, qi: _qi, k: _k, ...pub } = jwk
  return pub
}

/** Registers the grant on the provider. */
export function registerTokenExchange(provider: Provider, deps: ExchangeDeps): void {
  provider.registerGrantType(TOKEN_EXCHANGE_GRANT, tokenExchangeGrant(deps), GRANT_PARAMS, REPEATABLE)
}

function tokenExchangeGrant(d: ExchangeDeps): (ctx: OidcCtx) => Promise<void> {
  return async function tokenExchangeGrant(ctx) {
    const clientId = ctx.oidc.client?.clientId ?? ''
    const record: { -readonly [K in keyof DevIdpExchangeRecord]: DevIdpExchangeRecord[K] } = { clientId }
    d.log.push(record)
    try {
      const policy = d.policies.get(clientId)
      if (policy === undefined) throw new oidcErrors.UnauthorizedClient('this client may not exchange tokens')
      const params = ctx.oidc.params ?? {}
      checkRequestShape(params)
      const subject = await verifySubject(d, policy, params.subject_token as string)
      record.sub = subject.sub
      const audience = requestedTargets(params, policy)
      const scope = requestedScope(params, policy)
      record.audience = audience
      record.scope = scope
      const now = Math.floor(Date.now() / 1000)
      const claims: JWTPayload = {
        iss: d.issuer,
        sub: subject.sub,
        aud: audience.length === 1 ? audience[0] : audience,
        scope,
        client_id: clientId,
        act: { sub: clientId },
        iat: now,
        exp: now + d.ttl,
        jti: randomUUID(),
      }
      for (const claim of ['groups', 'email', 'name']) if (subject[claim] !== undefined) claims[claim] = subject[claim]
      const accessToken = await d.sign(claims, 'at+jwt')
      d.issued++
      ctx.body = { access_token: accessToken, issued_token_type: ACCESS_TOKEN_TYPE, token_type: 'Bearer', expires_in: d.ttl, scope }
    } catch (err) {
      record.error = (err as { error?: string }).error ?? 'server_error'
      throw err
    }
  }
}

/** §2.1: subject_token and its type are required; only access tokens are exchanged, and no actor token. */
function checkRequestShape(params: Record<string, unknown>): void {
  if (typeof params.subject_token !== 'string') throw new oidcErrors.InvalidRequest('missing required parameter subject_token')
  if (typeof params.subject_token_type !== 'string') throw new oidcErrors.InvalidRequest('missing required parameter subject_token_type')
  if (params.subject_token_type !== ACCESS_TOKEN_TYPE) throw new oidcErrors.InvalidRequest('unsupported subject_token_type')
  if (params.requested_token_type !== undefined && params.requested_token_type !== ACCESS_TOKEN_TYPE) {
    throw new oidcErrors.InvalidRequest('unsupported requested_token_type')
  }
  if (params.actor_token !== undefined || params.actor_token_type !== undefined) {
    throw new oidcErrors.InvalidRequest('actor_token is not supported (delegation names the authenticated client)')
  }
}

/** The subject token must be an access token this IdP issued for an audience the client may exchange. */
async function verifySubject(d: ExchangeDeps, policy: DevIdpExchangeClient, token: string): Promise<JWTPayload & { sub: string }> {
  let payload: JWTPayload
  try {
    ;({ payload } = await jwtVerify(token, createLocalJWKSet({ keys: d.publicKeys() }), {
      issuer: d.issuer,
      audience: [...(policy.subjectAudiences ?? [d.loginAudience])],
      algorithms: ['RS256'],
    }))
  } catch (err) {
    throw new oidcErrors.InvalidGrant(`subject_token is invalid (${(err as { code?: string }).code ?? 'unverifiable'})`)
  }
  // An ID token carries these; it says who logged in, not what may be done.
  if (payload.nonce !== undefined || payload.at_hash !== undefined) throw new oidcErrors.InvalidGrant('subject_token is not an access token')
  if (typeof payload.sub !== 'string' || payload.sub === '') throw new oidcErrors.InvalidGrant('subject_token has no sub')
  return payload as JWTPayload & { sub: string }
}

/** `audience` and `resource` together name the targets (§2.1); none means the client's first. */
function requestedTargets(params: Record<string, unknown>, policy: DevIdpExchangeClient): string[] {
  const values = [params.audience, params.resource].flatMap(v => (v === undefined ? [] : Array.isArray(v) ? v : [v])) as string[]
  if (values.length === 0) {
    if (policy.audiences[0] === undefined) throw new oidcErrors.InvalidTarget('this client may not ask for any audience')
    return [policy.audiences[0]]
  }
  const denied = values.find(v => !policy.audiences.includes(v))
  if (denied !== undefined) throw new oidcErrors.InvalidTarget(`audience or resource not allowed for this client: ${denied}`)
  return [...new Set(values)]
}

function requestedScope(params: Record<string, unknown>, policy: DevIdpExchangeClient): string {
  const requested = typeof params.scope === 'string' ? params.scope.split(' ').filter(Boolean) : []
  const beyond = requested.find(sc => !policy.scopes.includes(sc))
  if (beyond !== undefined) throw new oidcErrors.InvalidScope('requested scope is not allowed for this client', beyond)
  return (requested.length > 0 ? [...new Set(requested)] : policy.scopes).join(' ')
}
