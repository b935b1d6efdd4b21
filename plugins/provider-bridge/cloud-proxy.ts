/**
 * The cloud_idp authorize and token endpoints the gateway advertises.
 *
 * The IdP rejects the RFC 8707 `resource` parameter that MCP clients send
 * (AADSTS9010010), so both endpoints strip it, in every spelling (oauth-common/params.ts).
 * The authorize endpoint sends browsers on only with a redirect URI that can
 * neither run script nor be read two ways: https, http on loopback
 * (RFC 8252 §7.3), or a private-use scheme the operator listed (§7.1). The token endpoint can also add the operator's client
 * secret for a confidential app registration (AADSTS7000218 otherwise), under
 * narrow rules: see `shouldInjectSecret`.
 */
import type { Logger } from 'pino'
import { ProxyError, type RequestContext, type Reply } from '../../core/plugin-api.ts'
import type { DiscoveryCache } from '../oauth-common/discovery.ts'
import { boundedFetch, type BoundedResponse } from '../oauth-common/discovery.ts'
import { badRequest, parseOAuthParams } from '../oauth-common/params.ts'
import { authorizeRedirectProblem } from '../oauth-common/redirect-uri.ts'
import { TOKEN_RESPONSE_MAX_BYTES } from '../oauth-common/idp-endpoints.ts'

/** Grants the gateway's token endpoint forwards; every other grant is refused. */
export const FORWARDED_GRANTS = ['authorization_code', 'refresh_token'] as const

const PKCE_CHALLENGE_RE = /^[A-Za-z0-9._~-]{43,128}$/

export interface CloudProxyOptions {
  clientId: string
  clientSecret: string | undefined
  /** Scopes a request that gets the secret may ask for. */
  allowedScopes: ReadonlySet<string>
  discovery: DiscoveryCache
  fallbackAuthorize: string
  fallbackToken: string
  timeoutMs: number
  log: Logger
  /** Private-use redirect schemes passed on besides https and loopback http (`privateSchemes`); default none. */
  redirectSchemes?: ReadonlySet<string>
}

/** Every scope of a space-delimited `scope` must be allowed. */
export function checkScopes(scope: string | undefined, allowed: ReadonlySet<string>): void {
  if (scope === undefined) return
  const bad = scope.split(' ').filter(s => s !== '' && !allowed.has(s))
  if (bad.length > 0) throw badRequest(`scope not allowed through this gateway: ${bad.join(' ')}`, 'invalid_scope')
}

/** Whether the request carries client authentication of its own. */
export function hasOwnClientCredentials(params: ReadonlyMap<string, string>, authorization: string | undefined): boolean {
  return params.has('client_secret') || params.has('client_assertion') || params.has('client_assertion_type') || authorization !== undefined
}

/**
 * docs/identity-providers.md "Identity providers" (cloud_idp): the secret is added only for `authorization_code`
 * and `refresh_token`, only for the configured client id, and only when the
 * request brings no client credentials of its own.
 */
export function shouldInjectSecret(o: {
  grantType: string | undefined
  clientId: string | undefined
  configuredClientId: string
  secret: string | undefined
  ownCredentials: boolean
}): boolean {
  return (
    o.secret !== undefined &&
    (o.grantType === 'authorization_code' || o.grantType === 'refresh_token') &&
    o.clientId === o.configuredClientId &&
    !o.ownCredentials
  )
}

export function createCloudProxy(opts: CloudProxyOptions) {
  async function authorizeHandler(ctx: RequestContext): Promise<Reply> {
    const { entries: params, byName: map } = parseOAuthParams(ctx.query)
    const redirectProblem = authorizeRedirectProblem(map.get('redirect_uri'), opts.redirectSchemes)
    if (redirectProblem !== undefined) {
      ctx.log.info({ reason: redirectProblem }, 'authorize request refused: redirect_uri')
      throw badRequest(`redirect_uri ${redirectProblem}`)
    }
    const challenge = map.get('code_challenge')
    if (challenge === undefined || map.get('code_challenge_method') !== 'S256') {
      throw badRequest('PKCE is required: code_challenge with code_challenge_method=S256')
    }
    if (!PKCE_CHALLENGE_RE.test(challenge)) throw badRequest('code_challenge is malformed')
    if (opts.clientSecret !== undefined && map.get('client_id') === opts.clientId) {
      // Codes for the confidential client can only be redeemed here, with the
      // operator's secret: keep them to the configured scopes.
      checkScopes(map.get('scope'), opts.allowedScopes)
    }
    const endpoint = endpointOf(opts.discovery, 'authorization_endpoint', opts.fallbackAuthorize)
    const target = new URL(endpoint)
    for (const [k, v] of params) target.searchParams.append(k, v)
    return { status: 302, headers: { location: target.href, 'cache-control': 'no-store' } }
  }

  async function tokenHandler(ctx: RequestContext): Promise<Reply> {
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/x-www-form-urlencoded') {
      throw badRequest('the token request must be application/x-www-form-urlencoded')
    }
    const body = (await ctx.readBody()).toString('utf8')
    const { entries: params, byName: map } = parseOAuthParams(body)
    const grantType = map.get('grant_type')
    if (grantType === undefined) throw badRequest('grant_type is required')
    if (!(FORWARDED_GRANTS as readonly string[]).includes(grantType)) {
      // The gateway's token endpoint serves MCP clients' authorization code
      // flow only; client credentials go to the IdP directly.
      throw badRequest(`grant_type ${grantType} is not supported by this gateway`, 'unsupported_grant_type')
    }
    const authorization = ctx.req.headers.authorization
    if (authorization !== undefined && !/^basic\s/i.test(authorization)) {
      throw badRequest('only HTTP Basic client authentication is accepted at the token endpoint', 'invalid_client')
    }
    const own = hasOwnClientCredentials(map, authorization)
    const inject = shouldInjectSecret({
      grantType,
      clientId: map.get('client_id'),
      configuredClientId: opts.clientId,
      secret: opts.clientSecret,
      ownCredentials: own,
    })
    if (inject) {
      checkScopes(map.get('scope'), opts.allowedScopes)
      params.push(['client_secret', opts.clientSecret!])
    }
    const endpoint = endpointOf(opts.discovery, 'token_endpoint', opts.fallbackToken)
    const headers: Record<string, string> = {
      'content-type': 'application/x-www-form-urlencoded',
      accept: 'application/json',
    }
    // The client's own Basic credentials are for the IdP; nothing else is forwarded.
    if (authorization !== undefined) headers.authorization = authorization
    let res: BoundedResponse
    try {
      res = await boundedFetch(endpoint, {
        method: 'POST',
        headers,
        body: new URLSearchParams(params).toString(),
        timeoutMs: opts.timeoutMs,
        maxBytes: TOKEN_RESPONSE_MAX_BYTES,
      })
    } catch (err) {
      const timeout = (err as Error).name === 'TimeoutError'
      ctx.log.warn({ grantType, reason: timeout ? 'timeout' : (err as Error).message }, 'token request to the identity provider failed')
      throw new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', timeout ? 504 : 502, "the identity provider's token endpoint could not be reached", {
        oauthError: 'temporarily_unavailable',
        expose: true,
        cause: err,
      })
    }
    // grant_type, status and whether the secret was added: never codes, tokens or secrets.
    ctx.log.info({ grantType, status: res.status, secretAdded: inject }, 'proxied token request')
    const out: Record<string, string> = {
      'content-type': res.headers.get('content-type') ?? 'application/json',
      'cache-control': 'no-store',
      pragma: 'no-cache',
    }
    const challenge = res.headers.get('www-authenticate')
    if (challenge !== null) out['www-authenticate'] = challenge
    return { status: res.status, headers: out, body: res.body }
  }

  return { authorizeHandler, tokenHandler }
}

function endpointOf(discovery: DiscoveryCache, field: 'authorization_endpoint' | 'token_endpoint', fallback: string): string {
  const v = discovery.peek()?.[field]
  if (discovery.peek() === undefined) void discovery.get().catch(() => undefined)
  return typeof v === 'string' ? v : fallback
}
