/**
 * GET /oauth/authorize: the client's authorization request. The client is
 * resolved and its redirect URI checked before anything is sent back to it
 * (until then errors are pages, never redirects); then PKCE, scopes and the
 * RFC 8707 resource are checked, and the browser goes on to the IdP with the
 * gateway's own PKCE and the client's request sealed into `state`.
 */
import type { Reply, RequestContext } from '../../core/plugin-api.ts'
import { parseOAuthParams } from '../oauth-common/params.ts'
import { authorizeRedirectProblem } from '../oauth-common/redirect-uri.ts'
import { s256, randomToken } from './seal.ts'
import { CimdError } from './cimd.ts'
import { targetProblem } from './resource.ts'
import { ClientRefused, redirectMatches, resolveClient } from './clients.ts'
import { clientRedirect, errorPage, shortId, type FlowState, type ResolvedClient } from './flow.ts'
import { idpEndpoint } from './idp-token.ts'
import type { FacadeContext } from './facade-context.ts'

const PKCE_CHALLENGE_RE = /^[A-Za-z0-9._~-]{43,128}$/

export async function authorize(f: FacadeContext, ctx: RequestContext): Promise<Reply> {
  const { idp } = f
  let params: ReadonlyMap<string, string>
  let resources: readonly string[]
  try {
    ;({ byName: params, resources } = parseOAuthParams(ctx.query))
  } catch (err) {
    return errorPage(400, 'Invalid authorization request', (err as Error).message)
  }
  const clientId = params.get('client_id')
  if (clientId === undefined || clientId === '') return errorPage(400, 'Invalid authorization request', 'client_id is required')
  const { client, page } = await clientOrPage(f, ctx, clientId)
  if (client === undefined) return page
  const redirectUri = params.get('redirect_uri')
  const problem = authorizeRedirectProblem(redirectUri, f.redirectSchemes)
  if (problem !== undefined || !redirectMatches(client.redirectUris, redirectUri!)) {
    ctx.log.info({ clientId: shortId(clientId), reason: problem ?? 'not registered' }, 'oauth facade: authorize refused: redirect_uri')
    return errorPage(400, 'Invalid redirect', problem !== undefined ? `redirect_uri ${problem}` : 'redirect_uri is not registered for this client')
  }
  // From here on the redirect URI is trusted: errors go back to the client (RFC 6749 §4.1.2.1).
  const state = params.get('state')
  const back = (error: string, description: string): Reply => clientRedirect(f, redirectUri!, { error, error_description: description, state })
  if (params.get('response_type') !== 'code') return back('unsupported_response_type', 'response_type must be code')
  const challenge = params.get('code_challenge')
  if (challenge === undefined || params.get('code_challenge_method') !== 'S256' || !PKCE_CHALLENGE_RE.test(challenge)) {
    return back('invalid_request', 'PKCE is required: code_challenge with code_challenge_method=S256')
  }
  const requested = (params.get('scope') ?? '').split(' ').filter(s => s !== '')
  const bad = requested.filter(s => !idp.allowedScopes.has(s))
  if (bad.length > 0) return back('invalid_scope', `scope not offered by this gateway: ${bad.join(' ')}`)
  const badTarget = targetProblem(resources, idp.resource)
  if (badTarget !== undefined) {
    ctx.log.info({ clientId: shortId(clientId) }, "oauth facade: authorize refused: resource is not this gateway's")
    return back('invalid_target', badTarget)
  }
  const scopes = requested.length > 0 ? requested : [...idp.scopesSupported]
  const verifier = randomToken(32)
  const flow: FlowState = {
    c: clientId,
    k: client.kind,
    n: client.clientName,
    h: client.verifiedHost,
    tr: client.trusted,
    r: redirectUri!,
    s: state,
    cc: challenge,
    sc: scopes.join(' '),
    v: verifier,
    rs: idp.resource,
  }
  return toIdp(f, ctx, flow, scopes, verifier)
}

/** The resolved client, or the page that says why it is refused (429 while its metadata document is throttled). */
async function clientOrPage(
  f: FacadeContext,
  ctx: RequestContext,
  clientId: string
): Promise<{ client: ResolvedClient; page?: undefined } | { client?: undefined; page: Reply }> {
  try {
    return { client: await resolveClient(f, clientId, ctx.clientAddress) }
  } catch (err) {
    if (!(err instanceof CimdError) && !(err instanceof ClientRefused)) throw err
    ctx.log.info({ clientId: shortId(clientId), reason: err.message }, 'oauth facade: authorize refused: client')
    if (err instanceof CimdError && err.retryAfter !== undefined) {
      const page = errorPage(429, 'Try again later', err.shown)
      return { page: { ...page, headers: { ...page.headers, 'retry-after': String(err.retryAfter) } } }
    }
    return { page: errorPage(400, 'Unknown application', err instanceof CimdError ? err.shown : err.message) }
  }
}

/** The redirect to the IdP's authorization endpoint: the gateway's client, callback and PKCE, the flow sealed in `state`. */
async function toIdp(f: FacadeContext, ctx: RequestContext, flow: FlowState, scopes: readonly string[], verifier: string): Promise<Reply> {
  const { idp } = f
  const sealed = await f.sealer.seal('state', flow, f.options.stateTtlSeconds)
  // Refresh tokens come from the IdP only when asked for (Entra: offline_access).
  const idpScopes = new Set(scopes)
  if (idp.family === 'cloud_idp') idpScopes.add('offline_access')
  const target = new URL(await idpEndpoint(f, 'authorization_endpoint'))
  target.searchParams.set('response_type', 'code')
  target.searchParams.set('client_id', idp.clientId)
  target.searchParams.set('redirect_uri', f.callbackUrl)
  if (idpScopes.size > 0) target.searchParams.set('scope', [...idpScopes].join(' '))
  target.searchParams.set('state', sealed)
  target.searchParams.set('code_challenge', s256(verifier))
  target.searchParams.set('code_challenge_method', 'S256')
  ctx.log.info({ clientId: shortId(flow.c), kind: flow.k }, 'oauth facade: authorize sent on to the identity provider')
  return { status: 302, headers: { location: target.href, 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } }
}
