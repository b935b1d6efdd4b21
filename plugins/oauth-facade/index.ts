/**
 * oauthFacade: the opt-in mode in which, to MCP clients, the gateway is the
 * authorization server, and to the identity provider one client with one
 * redirect URI, the gateway's callback (switched on by
 * `mcp.policies.mcpAuthentication.facade`; without it the default bridge and
 * registration run instead, docs/identity-providers.md "Identity providers").
 *
 * One flow: client -> GET /oauth/authorize (client resolved: pre-registered,
 * sealed DCR client id, or client ID metadata document; redirect_uri must be
 * one it registered, else an error page and never a redirect) -> IdP
 * authorize with the gateway's own PKCE and the client's request sealed in
 * `state` -> IdP -> GET {callbackPath} (state opened, code redeemed at the
 * IdP with the gateway's verifier and, for cloud_idp, its secret) -> consent
 * page unless remembered or trusted -> client's redirect_uri with the
 * gateway's code (the IdP tokens sealed inside) and RFC 9207 `iss` -> POST
 * /oauth/token (code single-use, PKCE checked against the client's
 * challenge) -> the IdP's access token, so /mcp keeps validating IdP JWTs;
 * the refresh token is sealed and bound to the client.
 *
 * Nothing is stored between requests except the redeemed codes' ids and
 * the used refresh tokens' slots (to refuse a replay), so any replica with
 * the same keys and store continues any flow.
 */
import { createHash, randomUUID } from 'node:crypto'
import { definePlugin, ProxyError, type Plugin, type PluginEnv, type RouteDef, type Reply, type RequestContext } from '../../core/plugin-api.ts'
import { DiscoveryCache, boundedFetch, type BoundedResponse } from '../oauth-common/discovery.ts'
import { ROOT_METADATA_PATH, MCP_METADATA_PATHS, REGISTRATION_PATH } from '../oauth-common/metadata.ts'
import { parseOAuthParams } from '../oauth-common/params.ts'
import { authorizeRedirectProblem, privateSchemes } from '../oauth-common/redirect-uri.ts'
import { TOKEN_RESPONSE_MAX_BYTES } from '../oauth-common/idp-endpoints.ts'
import { Sealer, SealError, s256, randomToken } from './seal.ts'
import { CimdResolver, CimdError, looksLikeCimd } from './cimd.ts'
import { renderConsent, renderError, readCookie, cookie, cookieName, PAGE_HEADERS, CSRF_COOKIE } from './consent.ts'
import { ConsentMemory } from './remember.ts'
import { RefreshFamilies, familyOf } from './refresh-family.ts'
import { facadeRegistration } from './registration.ts'
import { targetProblem } from './resource.ts'
import { facadeIdpOf, type FacadeIdp } from './idp.ts'
import { FACADE_PATH, type FacadeOptions } from './options.ts'

export { facadeOptions, facadeBlock, FACADE_PATH, type FacadeOptions } from './options.ts'
import { MemoryUsedCodes, RedisUsedCodes, SharedUsedCodes, type UsedCodes } from './used-codes.ts'
import { CodeStoreUnavailable, oauthError, refuseCredentials } from './errors.ts'

export const AUTHORIZE_PATH = '/oauth/authorize'
export const TOKEN_PATH = '/oauth/token'
export const CONSENT_PATH = '/oauth/consent'

const PKCE_CHALLENGE_RE = /^[A-Za-z0-9._~-]{43,128}$/
const PKCE_VERIFIER_RE = /^[A-Za-z0-9._~-]{43,128}$/
const ERROR_CODE_RE = /^[a-z_]{1,64}$/

/** An error shown in the browser: never a redirect, since the redirect target is not trusted (RFC 6749 §4.1.2.1). */
function errorPage (status: number, title: string, message: string): Reply {
  return { status, headers: { ...PAGE_HEADERS }, body: renderError(title, message) }
}

/** A registered redirect URI matches exactly; a loopback one on any port (RFC 8252 §7.3). */
export function redirectMatches (registered: readonly string[], uri: string): boolean {
  if (registered.includes(uri)) return true
  let u: URL
  try { u = new URL(uri) } catch { return false }
  if (u.protocol !== 'http:' || !['127.0.0.1', '[::1]', 'localhost'].includes(u.hostname)) return false
  u.port = ''
  const portless = u.href
  return registered.some(r => {
    try {
      const v = new URL(r)
      if (v.protocol !== 'http:' || v.hostname !== u.hostname) return false
      v.port = ''
      return v.href === portless
    } catch { return false }
  })
}

/** Where the consent page says the browser goes next: a web redirect's host, or an app's scheme (RFC 8252 §7.1). */
export function redirectShown (uri: string): string {
  const u = new URL(uri)
  if (u.protocol === 'https:' || u.protocol === 'http:') return u.host
  return `${u.protocol}${u.host === '' ? '' : `//${u.host}`} (an application on this device)`
}

export function domainTrusted (host: string, trusted: readonly string[]): boolean {
  const h = host.toLowerCase()
  return trusted.some(d => {
    const t = d.toLowerCase()
    return t.startsWith('*.') ? h.endsWith(t.slice(1)) && h.length > t.length - 1 : h === t
  })
}

interface ResolvedClient {
  readonly clientId: string
  readonly kind: 'cimd' | 'dcr' | 'preregistered'
  readonly clientName: string | undefined
  readonly redirectUris: readonly string[]
  readonly verifiedHost: string | undefined
  readonly trusted: boolean
}

/** What the IdP's token endpoint answered, kept to the fields the facade passes on. */
interface IdpTokens {
  at: string
  rt?: string
  exp?: number
  sc?: string
}

/** The client's authorization request, sealed into the IdP `state`. */
interface FlowState extends Record<string, unknown> {
  c: string
  k: ResolvedClient['kind']
  n?: string
  h?: string
  tr: boolean
  r: string
  s?: string
  cc: string
  sc: string
  v: string
  /** RFC 8707 resource the grant is for: always this gateway's (`idp.resource`). */
  rs: string
}

function claimsOf (jwt: string | undefined): Record<string, unknown> | undefined {
  if (typeof jwt !== 'string') return undefined
  const part = jwt.split('.')[1]
  if (part === undefined) return undefined
  try {
    const v = JSON.parse(Buffer.from(part, 'base64url').toString('utf8')) as unknown
    return v !== null && typeof v === 'object' ? v as Record<string, unknown> : undefined
  } catch { return undefined }
}

/** A client the authorize endpoint cannot accept; the reason is safe to show. */
class ClientRefused extends Error {}

function shortId (clientId: string): string {
  return clientId.length <= 80 ? clientId : `sealed:${createHash('sha256').update(clientId).digest('base64url').slice(0, 12)}`
}

export async function createFacade (options: FacadeOptions, env: PluginEnv): Promise<Plugin> {
  const idp: FacadeIdp = facadeIdpOf(env)
  const log = env.log
  const baseUrl = env.baseUrl.replace(/\/+$/, '')
  const issuer = `${baseUrl}/mcp`
  const callbackUrl = baseUrl + options.callbackPath
  const secure = baseUrl.startsWith('https:')
  // Without keys: one key for every worker and replica, derived from the secret they share (a random key of
  // each process's own would make a flow fail wherever its next step lands: "unknown client_id").
  const sealer = new Sealer(options.keys, options.keys === undefined || options.keys.length === 0 ? env.deriveKey?.('seal') : undefined)
  if (sealer.derived) {
    log.info(`${FACADE_PATH}.keys is not set: sealing with a key derived from the secret the gateway's processes share (cluster.secret, else this run's); flows cross workers and replicas, and do not survive a change of that secret`)
  } else if (sealer.ephemeral) {
    log.warn(`${FACADE_PATH}.keys is not set: sealing with an ephemeral key; flows, codes and refresh tokens do not survive a restart and do not cross replicas`)
  }
  const cimd = new CimdResolver(options.cimd)
  if (options.cimd.testOnlyAllowLoopback) {
    log.warn(`${FACADE_PATH}.cimd.testOnlyAllowLoopback is on: client metadata documents may be fetched from loopback addresses; never use this outside tests`)
  }
  const preregistered = new Map(options.clients.map(c => [c.clientId, c]))
  const redirectSchemes = privateSchemes(options.allowedRedirectSchemes)
  /** Redeemed codes by id, until they expire: a code is single-use (RFC 6749 §4.1.2). */
  // facade.redis wins; else the cluster's shared store when it is Redis (cluster.redis.url), so one setting
  // makes codes single-use across replicas (or, with workers, the primary's store); else this replica's memory.
  const clusterShared = env.shared !== undefined && env.shared.kind !== 'memory' ? env.shared : undefined
  const usedCodes: UsedCodes = options.redis !== undefined
    ? new RedisUsedCodes(options.redis.url, options.redis.timeoutMs)
    : clusterShared !== undefined ? new SharedUsedCodes(clusterShared) : new MemoryUsedCodes(options.maxUsedCodes)
  if (options.redis !== undefined) {
    const u = new URL(options.redis.url)
    log.info({ redis: `${u.hostname}:${u.port || 6379}` }, 'oauth facade: redeemed codes are remembered in redis (single-use across replicas)')
  } else if (clusterShared !== undefined) {
    log.info({ store: clusterShared.kind }, 'oauth facade: redeemed codes are remembered in the gateway\'s shared state (single-use across replicas and workers)')
  }

  const families = new RefreshFamilies(usedCodes, options.refreshTokenTtlSeconds)
  const remembered = new ConsentMemory(sealer, options.consent.rememberSeconds, secure)

  const discovery = new DiscoveryCache({
    url: idp.discoveryUrl, ttlMs: idp.discovery.ttlSeconds * 1000, timeoutMs: idp.discovery.timeoutMs, log,
  })
  log.info({ provider: idp.family ?? 'oidc', discovery: discovery.url, callback: callbackUrl }, 'oauth facade: the gateway is the authorization server; register only its callback at the identity provider')
  // In the background, as the bridge does: an unreachable IdP must not hold up
  // start-up; a request that needs the document waits for this fetch.
  void discovery.start()

  async function idpEndpoint (field: 'authorization_endpoint' | 'token_endpoint'): Promise<string> {
    const fb = field === 'authorization_endpoint' ? idp.fallback?.authorize : idp.fallback?.token
    const doc = fb !== undefined ? discovery.peek() : await discovery.get()
    const v = doc?.[field]
    if (typeof v === 'string') return v
    if (fb !== undefined) return fb
    throw new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 503, `the identity provider's discovery document has no ${field}`, { oauthError: 'temporarily_unavailable', expose: true })
  }

  async function resolveClient (clientId: string, clientAddress: string): Promise<ResolvedClient> {
    if (looksLikeCimd(clientId)) {
      if (!options.cimd.enabled) throw new ClientRefused('client ID metadata documents are not accepted here')
      const c = await cimd.resolve(clientId, clientAddress)
      return {
        clientId, kind: 'cimd', clientName: c.clientName, redirectUris: c.redirectUris, verifiedHost: c.host,
        trusted: domainTrusted(c.host, options.consent.trustedDomains),
      }
    }
    const pre = preregistered.get(clientId)
    if (pre !== undefined) {
      return { clientId, kind: 'preregistered', clientName: pre.clientName, redirectUris: pre.redirectUris, verifiedHost: undefined, trusted: pre.trusted }
    }
    if (options.registration.enabled) {
      try {
        const d = await sealer.open<{ u: string[]; n?: string }>('client', clientId)
        return { clientId, kind: 'dcr', clientName: d.n, redirectUris: d.u, verifiedHost: undefined, trusted: false }
      } catch (err) {
        if (!(err instanceof SealError)) throw err
      }
    }
    throw new ClientRefused('unknown client_id')
  }

  function clientRedirect (redirectUri: string, params: Record<string, string | undefined>): Reply {
    const u = new URL(redirectUri)
    for (const [k, v] of Object.entries(params)) if (v !== undefined) u.searchParams.set(k, v)
    // RFC 9207: the client checks `iss` against the issuer it discovered.
    u.searchParams.set('iss', issuer)
    return { status: 302, headers: { location: u.href, 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } }
  }

  // ---- metadata -----------------------------------------------------------

  function metadata (iss: string): Record<string, unknown> {
    return {
      issuer: iss,
      authorization_endpoint: baseUrl + AUTHORIZE_PATH,
      token_endpoint: baseUrl + TOKEN_PATH,
      ...(options.registration.enabled ? { registration_endpoint: baseUrl + REGISTRATION_PATH } : {}),
      scopes_supported: [...new Set([...idp.scopesSupported, 'offline_access'])],
      response_types_supported: ['code'],
      response_modes_supported: ['query'],
      grant_types_supported: ['authorization_code', 'refresh_token'],
      token_endpoint_auth_methods_supported: ['none'],
      code_challenge_methods_supported: ['S256'],
      client_id_metadata_document_supported: options.cimd.enabled,
      authorization_response_iss_parameter_supported: true,
    }
  }
  const CORS = { 'access-control-allow-origin': '*', 'access-control-allow-methods': 'GET, POST, OPTIONS', 'access-control-allow-headers': '*' }
  function metadataReply (ctx: RequestContext, iss: string): Reply {
    if (ctx.method === 'OPTIONS') return { status: 204, headers: { ...CORS, 'access-control-max-age': '600' } }
    return { status: 200, headers: { ...CORS, 'cache-control': 'public, max-age=300' }, body: metadata(iss) }
  }

  // ---- authorize ----------------------------------------------------------

  async function authorize (ctx: RequestContext): Promise<Reply> {
    let params: ReadonlyMap<string, string>
    let resources: readonly string[]
    try { ({ byName: params, resources } = parseOAuthParams(ctx.query)) } catch (err) {
      return errorPage(400, 'Invalid authorization request', (err as Error).message)
    }
    const clientId = params.get('client_id')
    if (clientId === undefined || clientId === '') return errorPage(400, 'Invalid authorization request', 'client_id is required')
    let client: ResolvedClient
    try {
      client = await resolveClient(clientId, ctx.clientAddress)
    } catch (err) {
      if (!(err instanceof CimdError) && !(err instanceof ClientRefused)) throw err
      ctx.log.info({ clientId: shortId(clientId), reason: err.message }, 'oauth facade: authorize refused: client')
      if (err instanceof CimdError && err.retryAfter !== undefined) {
        const page = errorPage(429, 'Try again later', err.shown)
        return { ...page, headers: { ...page.headers, 'retry-after': String(err.retryAfter) } }
      }
      return errorPage(400, 'Unknown application', err instanceof CimdError ? err.shown : err.message)
    }
    const redirectUri = params.get('redirect_uri')
    const problem = authorizeRedirectProblem(redirectUri, redirectSchemes)
    if (problem !== undefined || !redirectMatches(client.redirectUris, redirectUri!)) {
      ctx.log.info({ clientId: shortId(clientId), reason: problem ?? 'not registered' }, 'oauth facade: authorize refused: redirect_uri')
      return errorPage(400, 'Invalid redirect', problem !== undefined ? `redirect_uri ${problem}` : 'redirect_uri is not registered for this client')
    }
    // From here on the redirect URI is trusted: errors go back to the client (RFC 6749 §4.1.2.1).
    const state = params.get('state')
    const back = (error: string, description: string): Reply => clientRedirect(redirectUri!, { error, error_description: description, state })
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
      ctx.log.info({ clientId: shortId(clientId) }, 'oauth facade: authorize refused: resource is not this gateway\'s')
      return back('invalid_target', badTarget)
    }
    const scopes = requested.length > 0 ? requested : [...idp.scopesSupported]
    const verifier = randomToken(32)
    const flow: FlowState = {
      c: clientId, k: client.kind, n: client.clientName, h: client.verifiedHost, tr: client.trusted,
      r: redirectUri!, s: state, cc: challenge, sc: scopes.join(' '), v: verifier, rs: idp.resource,
    }
    const sealed = await sealer.seal('state', flow, options.stateTtlSeconds)
    // Refresh tokens come from the IdP only when asked for (Entra: offline_access).
    const idpScopes = new Set(scopes)
    if (idp.family === 'cloud_idp') idpScopes.add('offline_access')
    const target = new URL(await idpEndpoint('authorization_endpoint'))
    target.searchParams.set('response_type', 'code')
    target.searchParams.set('client_id', idp.clientId)
    target.searchParams.set('redirect_uri', callbackUrl)
    if (idpScopes.size > 0) target.searchParams.set('scope', [...idpScopes].join(' '))
    target.searchParams.set('state', sealed)
    target.searchParams.set('code_challenge', s256(verifier))
    target.searchParams.set('code_challenge_method', 'S256')
    ctx.log.info({ clientId: shortId(clientId), kind: client.kind }, 'oauth facade: authorize sent on to the identity provider')
    return { status: 302, headers: { location: target.href, 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } }
  }

  // ---- IdP token endpoint ---------------------------------------------------

  async function idpToken (ctx: RequestContext, form: Record<string, string>): Promise<{ status: number; body: Record<string, unknown> }> {
    const body = new URLSearchParams({ ...form, client_id: idp.clientId })
    // As the bridge does (docs/identity-providers.md "Identity providers"): the operator's secret is added server-side, never shown to clients.
    if (idp.clientSecret !== undefined) body.set('client_secret', idp.clientSecret)
    let res: BoundedResponse
    try {
      res = await boundedFetch(await idpEndpoint('token_endpoint'), {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
        body: body.toString(),
        timeoutMs: Math.max(idp.discovery.timeoutMs, 10_000),
        maxBytes: TOKEN_RESPONSE_MAX_BYTES,
      })
    } catch (err) {
      ctx.log.warn({ grantType: form.grant_type, reason: (err as Error).name === 'TimeoutError' ? 'timeout' : (err as Error).message }, 'oauth facade: token request to the identity provider failed')
      throw new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 502, 'the identity provider\'s token endpoint could not be reached', { oauthError: 'temporarily_unavailable', expose: true, cause: err })
    }
    let parsed: Record<string, unknown> = {}
    try { parsed = JSON.parse(res.body.toString('utf8')) as Record<string, unknown> } catch { /* answered below */ }
    ctx.log.info({ grantType: form.grant_type, status: res.status, error: typeof parsed.error === 'string' ? parsed.error : undefined }, 'oauth facade: identity provider token request')
    return { status: res.status, body: parsed }
  }

  function tokensOf (body: Record<string, unknown>): IdpTokens | undefined {
    if (typeof body.access_token !== 'string' || body.access_token === '') return undefined
    return {
      at: body.access_token,
      rt: typeof body.refresh_token === 'string' ? body.refresh_token : undefined,
      exp: typeof body.expires_in === 'number' ? body.expires_in : undefined,
      sc: typeof body.scope === 'string' ? body.scope : undefined,
    }
  }

  // ---- callback from the IdP ------------------------------------------------

  async function issueCode (flow: FlowState, tokens: IdpTokens): Promise<Reply> {
    const code = await sealer.seal('code', { j: randomUUID(), c: flow.c, r: flow.r, cc: flow.cc, sc: flow.sc, rs: flow.rs, t: tokens }, options.codeTtlSeconds)
    return clientRedirect(flow.r, { code, state: flow.s })
  }

  async function callback (ctx: RequestContext): Promise<Reply> {
    let params: ReadonlyMap<string, string>
    try { params = parseOAuthParams(ctx.query).byName } catch (err) {
      return errorPage(400, 'Invalid sign-in response', (err as Error).message)
    }
    let flow: FlowState
    try {
      flow = await sealer.open<FlowState>('state', params.get('state') ?? '')
    } catch (err) {
      if (!(err instanceof SealError)) throw err
      ctx.log.info({ reason: err.message }, 'oauth facade: callback refused: state')
      return errorPage(400, 'Invalid sign-in response', 'the sign-in state is invalid or has expired; start again from the application')
    }
    // RFC 9207 §2.4: an IdP that names itself must name the issuer we sent the user to (mix-up defence).
    const idpIss = params.get('iss')
    const expectedIss = discovery.peek()?.issuer
    if (idpIss !== undefined && idpIss !== (typeof expectedIss === 'string' ? expectedIss : idp.issuer)) {
      ctx.log.warn({ clientId: shortId(flow.c) }, 'oauth facade: callback refused: iss is not the identity provider\'s')
      return clientRedirect(flow.r, { error: 'server_error', error_description: 'the sign-in response came from another issuer', state: flow.s })
    }
    const idpError = params.get('error')
    if (idpError !== undefined) {
      ctx.log.info({ clientId: shortId(flow.c), error: idpError }, 'oauth facade: the identity provider answered with an error')
      return clientRedirect(flow.r, { error: ERROR_CODE_RE.test(idpError) ? idpError : 'server_error', error_description: 'the identity provider did not sign the user in', state: flow.s })
    }
    const code = params.get('code')
    if (code === undefined || code === '') return clientRedirect(flow.r, { error: 'server_error', error_description: 'the identity provider sent no code', state: flow.s })
    const res = await idpToken(ctx, { grant_type: 'authorization_code', code, redirect_uri: callbackUrl, code_verifier: flow.v })
    const tokens = res.status === 200 ? tokensOf(res.body) : undefined
    if (tokens === undefined) {
      return clientRedirect(flow.r, { error: 'server_error', error_description: 'the identity provider did not issue tokens', state: flow.s })
    }
    const claims = claimsOf(typeof res.body.id_token === 'string' ? res.body.id_token : undefined) ?? claimsOf(tokens.at) ?? {}
    const user = typeof claims.sub === 'string' ? claims.sub : typeof claims.oid === 'string' ? claims.oid : undefined
    const display = [claims.preferred_username, claims.email, claims.name, user].find((v): v is string => typeof v === 'string')
    if (flow.tr) {
      ctx.log.info({ clientId: shortId(flow.c), decision: 'trusted' }, 'oauth facade: consent not asked (trusted client)')
      return issueCode(flow, tokens)
    }
    // Remembered only for what was approved: these scopes (or fewer) at this resource.
    if (user !== undefined && await remembered.covers(ctx.req.headers.cookie, user, flow.c, flow.sc, flow.rs ?? idp.resource)) {
      ctx.log.info({ clientId: shortId(flow.c), decision: 'remembered' }, 'oauth facade: consent remembered')
      return issueCode(flow, tokens)
    }
    const csrf = randomToken(24)
    const { v: _verifier, ...rest } = flow
    const tx = await sealer.seal('consent-tx', { ...rest, t: tokens, u: user, x: csrf }, options.stateTtlSeconds)
    const body = renderConsent({
      clientName: flow.n, clientId: flow.c, kind: flow.k, verifiedHost: flow.h, redirectHost: redirectShown(flow.r),
      scopes: flow.sc.split(' ').filter(s => s !== ''), user: display, action: CONSENT_PATH, tx, csrf,
    })
    return {
      status: 200,
      headers: { ...PAGE_HEADERS, 'set-cookie': cookie(CSRF_COOKIE, csrf, { path: CONSENT_PATH, maxAge: options.stateTtlSeconds, secure }) },
      body,
    }
  }

  // ---- consent decision -----------------------------------------------------

  async function consent (ctx: RequestContext): Promise<Reply> {
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/x-www-form-urlencoded') return errorPage(415, 'Invalid consent', 'the consent form must be posted as application/x-www-form-urlencoded')
    const form = new URLSearchParams((await ctx.readBody(64 * 1024)).toString('utf8'))
    let tx: FlowState & { t: IdpTokens; u?: string; x: string }
    try {
      tx = await sealer.open('consent-tx', form.get('tx') ?? '')
    } catch (err) {
      if (!(err instanceof SealError)) throw err
      return errorPage(400, 'Invalid consent', 'the consent request is invalid or has expired; start again from the application')
    }
    const posted = form.get('csrf')
    const fromCookie = readCookie(ctx.req.headers.cookie, cookieName(CSRF_COOKIE, secure))
    if (posted === null || posted === '' || posted !== tx.x || fromCookie !== tx.x) {
      ctx.log.warn({ clientId: shortId(tx.c) }, 'oauth facade: consent refused: CSRF token missing or wrong')
      return errorPage(403, 'Invalid consent', 'the consent form could not be verified (CSRF); start again from the application')
    }
    const clear = cookie(CSRF_COOKIE, '', { path: CONSENT_PATH, maxAge: 0, secure })
    const decision = form.get('decision')
    if (decision !== 'approve') {
      ctx.log.info({ clientId: shortId(tx.c), decision: 'deny' }, 'oauth facade: consent denied')
      const r = clientRedirect(tx.r, { error: 'access_denied', error_description: 'the user denied access', state: tx.s })
      return { ...r, headers: { ...r.headers, 'set-cookie': clear } }
    }
    ctx.log.info({ clientId: shortId(tx.c), decision: 'approve' }, 'oauth facade: consent given')
    const r = await issueCode(tx, tx.t)
    const cookies = [clear]
    const remember = tx.u !== undefined ? await remembered.remember(ctx.req.headers.cookie, tx.u, tx.c, tx.sc, tx.rs ?? idp.resource) : undefined
    if (remember !== undefined) cookies.push(remember)
    return { ...r, headers: { ...r.headers, 'set-cookie': cookies } }
  }

  // ---- token ----------------------------------------------------------------

  type Refresh = { c: string; sc: string; rt: string; rs?: string; f?: string; g?: number; exp: number }

  /** The access token, and a refresh token sealed with its family and next generation (refresh-family.ts). */
  async function tokenReply (ctx: RequestContext, grant: { c: string; sc: string; rs: string }, tokens: IdpTokens, next?: { rt: string; f: string; g: number }): Promise<Reply> {
    const out: Record<string, unknown> = { access_token: tokens.at, token_type: 'Bearer', scope: tokens.sc ?? grant.sc }
    if (tokens.exp !== undefined) out.expires_in = tokens.exp
    const idpRefresh = tokens.rt ?? next?.rt
    if (idpRefresh !== undefined) {
      const family = { f: next?.f ?? randomUUID(), g: next?.g ?? 0 }
      out.refresh_token = await sealer.seal('refresh', { c: grant.c, sc: grant.sc, rs: grant.rs, rt: idpRefresh, ...family }, options.refreshTokenTtlSeconds)
    }
    ctx.log.info({ clientId: shortId(grant.c), refresh: idpRefresh !== undefined }, 'oauth facade: tokens issued')
    return { status: 200, headers: { 'cache-control': 'no-store', pragma: 'no-cache', 'access-control-allow-origin': '*' }, body: out }
  }

  /** RFC 8707 at the token endpoint: a named resource must be the one the grant was bound to (always this gateway's). */
  function checkTarget (resources: readonly string[], bound: string | undefined): void {
    const problem = targetProblem(resources, idp.resource)
    if (problem !== undefined) throw oauthError(400, 'invalid_target', problem)
    if (bound !== undefined && bound !== idp.resource) throw oauthError(400, 'invalid_grant', 'the grant was issued for another resource')
  }

  async function redeemCode (ctx: RequestContext, p: ReadonlyMap<string, string>, resources: readonly string[], clientId: string): Promise<Reply> {
    let code: { j: string; c: string; r: string; cc: string; sc: string; rs?: string; t: IdpTokens; exp: number }
    try { code = await sealer.open('code', p.get('code') ?? '') } catch (err) {
      if (!(err instanceof SealError)) throw err
      throw oauthError(400, 'invalid_grant', 'the code is invalid or has expired')
    }
    if (code.c !== clientId) throw oauthError(400, 'invalid_grant', 'the code was issued to another client')
    if (p.get('redirect_uri') !== code.r) throw oauthError(400, 'invalid_grant', 'redirect_uri does not match the authorization request')
    const verifier = p.get('code_verifier')
    if (verifier === undefined || !PKCE_VERIFIER_RE.test(verifier) || s256(verifier) !== code.cc) {
      throw oauthError(400, 'invalid_grant', 'code_verifier does not match the code_challenge (PKCE)')
    }
    checkTarget(resources, code.rs)
    if (!await usedCodes.markUsed(code.j, code.exp)) {
      ctx.log.warn({ clientId: shortId(clientId) }, 'oauth facade: a code was presented twice')
      throw oauthError(400, 'invalid_grant', 'the code has already been used')
    }
    return tokenReply(ctx, { c: clientId, sc: code.sc, rs: code.rs ?? idp.resource }, code.t)
  }

  async function redeemRefresh (ctx: RequestContext, p: ReadonlyMap<string, string>, resources: readonly string[], clientId: string): Promise<Reply> {
    const sealed = p.get('refresh_token') ?? ''
    let rt: Refresh
    try { rt = await sealer.open('refresh', sealed) } catch (err) {
      if (!(err instanceof SealError)) throw err
      throw oauthError(400, 'invalid_grant', 'the refresh token is invalid or has expired')
    }
    if (rt.c !== clientId) {
      ctx.log.warn({ clientId: shortId(clientId) }, 'oauth facade: a refresh token was presented by another client')
      throw oauthError(400, 'invalid_grant', 'the refresh token was issued to another client')
    }
    checkTarget(resources, rt.rs)
    // Single use before the IdP is asked (two concurrent uses cannot both pass); a reuse revokes the family.
    const ref = familyOf(rt, sealed)
    if (!await families.redeem(ref, rt.exp)) {
      const revoked = await families.revoke(ref)
      ctx.log.warn({ clientId: shortId(clientId), generation: ref.generation, revokedFrom: revoked ?? null }, 'oauth facade: a refresh token was used twice: its family is revoked (RFC 9700 §4.14)')
      throw oauthError(400, 'invalid_grant', 'the refresh token has already been used')
    }
    const res = await idpToken(ctx, { grant_type: 'refresh_token', refresh_token: rt.rt, scope: [...new Set([...rt.sc.split(' '), ...(idp.family === 'cloud_idp' ? ['offline_access'] : [])])].filter(s => s !== '').join(' ') })
    const tokens = res.status === 200 ? tokensOf(res.body) : undefined
    if (tokens === undefined) throw oauthError(400, 'invalid_grant', 'the identity provider refused the refresh token')
    return tokenReply(ctx, { c: clientId, sc: rt.sc, rs: rt.rs ?? idp.resource }, tokens, { rt: rt.rt, f: ref.family, g: ref.generation + 1 })
  }

  async function token (ctx: RequestContext): Promise<Reply> {
    if (ctx.method === 'OPTIONS') return { status: 204, headers: { ...CORS, 'access-control-max-age': '600' } }
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/x-www-form-urlencoded') throw oauthError(400, 'invalid_request', 'the token request must be application/x-www-form-urlencoded')
    const { byName: p, resources } = parseOAuthParams((await ctx.readBody(64 * 1024)).toString('utf8'))
    refuseCredentials(ctx, p)
    const clientId = p.get('client_id')
    if (clientId === undefined) throw oauthError(400, 'invalid_request', 'client_id is required')
    const grant = p.get('grant_type')
    if (grant === 'authorization_code') return redeemCode(ctx, p, resources, clientId)
    if (grant === 'refresh_token') return redeemRefresh(ctx, p, resources, clientId)
    throw oauthError(400, 'unsupported_grant_type', `grant_type ${grant ?? '(none)'} is not supported`)
  }

  const routes: RouteDef[] = [
    { methods: ['GET', 'HEAD', 'OPTIONS'], path: ROOT_METADATA_PATH, handler: function facadeRootMetadata (ctx) { return metadataReply(ctx, baseUrl) } },
    ...MCP_METADATA_PATHS.map((path): RouteDef => ({
      methods: ['GET', 'HEAD', 'OPTIONS'], path, handler: function facadeMcpMetadata (ctx) { return metadataReply(ctx, issuer) },
    })),
    { methods: ['GET'], path: AUTHORIZE_PATH, kind: 'other', handler: authorize },
    { methods: ['GET'], path: options.callbackPath, kind: 'other', handler: callback },
    { methods: ['POST'], path: CONSENT_PATH, kind: 'other', handler: consent },
    { methods: ['POST', 'OPTIONS'], path: TOKEN_PATH, handler: token },
  ]
  if (options.registration.enabled) {
    routes.push({ methods: ['POST', 'OPTIONS'], path: REGISTRATION_PATH, handler: facadeRegistration({ sealer, options, redirectSchemes, shared: env.shared, cors: CORS }) })
  }

  return {
    name: 'oauthFacade',
    routes,
    ready () {
      return discovery.state.doc !== undefined
        ? { ready: true }
        : { ready: false, reason: `identity provider discovery document not fetched (${discovery.state.lastError ?? 'pending'})`, code: 'idp_unreachable' }
    },
    describe () {
      return {
        issuer, callback: callbackUrl, provider: idp.family ?? null, ephemeralKeys: sealer.ephemeral,
        preregisteredClients: options.clients.map(c => c.clientId), registration: options.registration.enabled,
        cimd: options.cimd.enabled, trustedDomains: options.consent.trustedDomains,
        usedCodes: options.redis !== undefined || clusterShared !== undefined ? 'redis' : usedCodes.size,
      }
    },
    async close () { discovery.close(); usedCodes.close() },
  }
}

export default definePlugin<Record<string, never>>({
  name: 'oauthFacade',
  engine: '^1',
  // Its options are mcpAuthentication's `facade` block, validated there with this plugin's schema.json.
  optionsSchema: { type: 'object', additionalProperties: false, properties: {} },
  needs: ['idp', 'protectedResource', 'facade'],
  errors: [CodeStoreUnavailable],
  summary (_options, provided) {
    const keys = (provided.facade as FacadeOptions | undefined)?.keys ?? []
    return `the gateway is the authorization server (consent, codes, tokens) in front of ${(provided.idp as FacadeIdp).issuer}; ` +
      (keys.length > 0 ? `sealing keys: ${keys.map(k => k.kid).join(', ')}` : 'no sealing keys configured: derived from the secret the gateway\'s processes share, else ephemeral')
  },
  create (_options, env) {
    const options = env.provided.facade as FacadeOptions | undefined
    if (options === undefined) {
      throw new ProxyError('MCPP_ERR_CONFIG', 500, `${env.configPath}: oauthFacade is in the pipeline but ${FACADE_PATH} is not set`)
    }
    return createFacade(options, env)
  },
})
