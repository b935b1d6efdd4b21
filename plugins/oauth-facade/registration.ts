/**
 * The facade's stateless dynamic client registration (RFC 7591): the
 * client_id returned is the registered metadata, sealed. Limited per
 * resolved client address with the registration plugin's limiter (shared
 * across replicas and workers when the gateway has shared state), and the
 * sealed id checked to fit the flow it must travel through.
 */
import { ProxyError, type Reply, type RequestContext } from '../../core/plugin-api.ts'
import { buildRegistrationResponse } from '../oauth-common/client-metadata.ts'
import { authorizeRedirectProblem } from '../oauth-common/redirect-uri.ts'
import { AddressLimiter, REGISTRATION_RATE_LIMIT, type SharedBuckets } from '../oauth-common/rate-limit.ts'
import type { Sealer } from './seal.ts'
import type { FacadeOptions } from './options.ts'

/**
 * Longest sealed client id the facade hands out. The id travels sealed again
 * inside the IdP `state` (a URL), the consent form, the code (a URL to the
 * client) and the refresh token, and a sealed value over 16 KiB never opens
 * (seal.ts): 4096 leaves room for the redirect URI, the client's own `state`
 * and the IdP's tokens beside it. A registration whose id would be longer is
 * refused, naming this limit, instead of yielding a client that cannot finish
 * a flow.
 */
export const MAX_CLIENT_ID_LENGTH = 4096

function invalidMetadata(message: string, oauthError = 'invalid_client_metadata'): ProxyError {
  return new ProxyError('MCPP_ERR_INVALID_CLIENT_METADATA', 400, message, { oauthError })
}

export interface RegistrationDeps {
  readonly sealer: Sealer
  readonly options: FacadeOptions
  readonly redirectSchemes: ReadonlySet<string>
  readonly shared: SharedBuckets | undefined
  readonly cors: Readonly<Record<string, string>>
}

export function facadeRegistration(d: RegistrationDeps): (ctx: RequestContext) => Promise<Reply> {
  const limiter = new AddressLimiter(REGISTRATION_RATE_LIMIT, d.shared)
  return async function facadeRegister(ctx: RequestContext): Promise<Reply> {
    if (ctx.method === 'OPTIONS') return { status: 204, headers: { ...d.cors, 'access-control-max-age': '600' } }
    // The resolved client address (mcp.trustedProxies), not the TCP peer: behind a proxy every client is the proxy.
    const limited = await limiter.take(ctx.clientAddress)
    if (limited.retryAfter > 0) {
      if (limited.firstRefusal)
        ctx.log.warn({ address: limited.address, retryAfter: limited.retryAfter }, 'client registration rate limit reached for this address')
      throw new ProxyError('MCPP_ERR_RATE_LIMITED', 429, 'too many client registrations from this address; retry later', {
        oauthError: 'temporarily_unavailable',
        headers: { 'retry-after': String(limited.retryAfter) },
      })
    }
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/json') throw invalidMetadata('the request must be application/json')
    let body: unknown
    try {
      body = JSON.parse((await ctx.readBody(d.options.registration.maxBodyBytes)).toString('utf8'))
    } catch (err) {
      if (ProxyError.is(err)) throw err
      throw invalidMetadata('the request body is not valid JSON')
    }
    const out = buildRegistrationResponse(body, '', Date.now(), d.options.registration)
    const uris = out.redirect_uris as string[]
    uris.forEach((u, i) => {
      const problem = authorizeRedirectProblem(u, d.redirectSchemes)
      if (problem !== undefined) throw invalidMetadata(`redirect_uris[${i}] ${problem}`, 'invalid_redirect_uri')
    })
    const name = typeof out.client_name === 'string' ? out.client_name : undefined
    const clientId = await d.sealer.seal('client', { u: uris, ...(name !== undefined ? { n: name } : {}) })
    if (clientId.length > MAX_CLIENT_ID_LENGTH) {
      ctx.log.info({ clientName: name, redirectUris: uris.length, length: clientId.length }, 'oauth facade: registration refused: client id too long')
      throw invalidMetadata(
        `the client id would be ${clientId.length} characters; at most ${MAX_CLIENT_ID_LENGTH} fit the authorization flow: register fewer or shorter redirect_uris or a shorter client_name`
      )
    }
    out.client_id = clientId
    ctx.log.info({ clientName: name, redirectUris: uris.length }, 'oauth facade: client registered (stateless)')
    return { status: 201, headers: { 'cache-control': 'no-store', pragma: 'no-cache', 'access-control-allow-origin': '*' }, body: out }
  }
}
