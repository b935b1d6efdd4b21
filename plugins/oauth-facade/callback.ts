/**
 * GET {callbackPath}: the IdP sends the browser back. The sealed `state`
 * is opened (it carries the client's request), the IdP is checked to be the
 * one the user was sent to (RFC 9207), its code is redeemed with the
 * gateway's verifier, and the user is asked for consent unless the client
 * is trusted or the user approved it before (then the client gets its code).
 */
import type { Reply, RequestContext } from '../../core/plugin-api.ts'
import { parseOAuthParams } from '../oauth-common/params.ts'
import { SealError, randomToken } from './seal.ts'
import { renderConsent, cookie, PAGE_HEADERS, CSRF_COOKIE } from './consent.ts'
import { redirectShown } from './clients.ts'
import { clientRedirect, errorPage, issueCode, shortId, type FlowState, type IdpTokens } from './flow.ts'
import { idpToken, tokensOf } from './idp-token.ts'
import type { FacadeContext } from './facade-context.ts'
import { CONSENT_PATH } from './paths.ts'

const ERROR_CODE_RE = /^[a-z_]{1,64}$/

export async function callback(f: FacadeContext, ctx: RequestContext): Promise<Reply> {
  let params: ReadonlyMap<string, string>
  try {
    params = parseOAuthParams(ctx.query).byName
  } catch (err) {
    return errorPage(400, 'Invalid sign-in response', (err as Error).message)
  }
  let flow: FlowState
  try {
    flow = await f.sealer.open<FlowState>('state', params.get('state') ?? '')
  } catch (err) {
    if (!(err instanceof SealError)) throw err
    ctx.log.info({ reason: err.message }, 'oauth facade: callback refused: state')
    return errorPage(400, 'Invalid sign-in response', 'the sign-in state is invalid or has expired; start again from the application')
  }
  // RFC 9207 §2.4: an IdP that names itself must name the issuer we sent the user to (mix-up defence).
  const idpIss = params.get('iss')
  const expectedIss = f.discovery.peek()?.issuer
  if (idpIss !== undefined && idpIss !== (typeof expectedIss === 'string' ? expectedIss : f.idp.issuer)) {
    ctx.log.warn({ clientId: shortId(flow.c) }, "oauth facade: callback refused: iss is not the identity provider's")
    return clientRedirect(f, flow.r, { error: 'server_error', error_description: 'the sign-in response came from another issuer', state: flow.s })
  }
  const idpError = params.get('error')
  if (idpError !== undefined) {
    ctx.log.info({ clientId: shortId(flow.c), error: idpError }, 'oauth facade: the identity provider answered with an error')
    return clientRedirect(f, flow.r, {
      error: ERROR_CODE_RE.test(idpError) ? idpError : 'server_error',
      error_description: 'the identity provider did not sign the user in',
      state: flow.s,
    })
  }
  const code = params.get('code')
  if (code === undefined || code === '')
    return clientRedirect(f, flow.r, { error: 'server_error', error_description: 'the identity provider sent no code', state: flow.s })
  const res = await idpToken(f, ctx, { grant_type: 'authorization_code', code, redirect_uri: f.callbackUrl, code_verifier: flow.v })
  const tokens = res.status === 200 ? tokensOf(res.body) : undefined
  if (tokens === undefined) {
    return clientRedirect(f, flow.r, { error: 'server_error', error_description: 'the identity provider did not issue tokens', state: flow.s })
  }
  return consentOrCode(f, ctx, flow, tokens, claimsOf(typeof res.body.id_token === 'string' ? res.body.id_token : undefined) ?? claimsOf(tokens.at) ?? {})
}

/** The client's code when consent is not needed (trusted client, remembered approval), else the consent page. */
async function consentOrCode(f: FacadeContext, ctx: RequestContext, flow: FlowState, tokens: IdpTokens, claims: Record<string, unknown>): Promise<Reply> {
  const user = typeof claims.sub === 'string' ? claims.sub : typeof claims.oid === 'string' ? claims.oid : undefined
  const display = [claims.preferred_username, claims.email, claims.name, user].find((v): v is string => typeof v === 'string')
  if (flow.tr) {
    ctx.log.info({ clientId: shortId(flow.c), decision: 'trusted' }, 'oauth facade: consent not asked (trusted client)')
    return issueCode(f, flow, tokens)
  }
  // Remembered only for what was approved: these scopes (or fewer) at this resource.
  if (user !== undefined && (await f.remembered.covers(ctx.req.headers.cookie, user, flow.c, flow.sc, flow.rs ?? f.idp.resource))) {
    ctx.log.info({ clientId: shortId(flow.c), decision: 'remembered' }, 'oauth facade: consent remembered')
    return issueCode(f, flow, tokens)
  }
  const csrf = randomToken(24)
  const { v: _verifier, ...rest } = flow
  const { stateTtlSeconds } = f.options
  const tx = await f.sealer.seal('consent-tx', { ...rest, t: tokens, u: user, x: csrf }, stateTtlSeconds)
  const body = renderConsent({
    clientName: flow.n,
    clientId: flow.c,
    kind: flow.k,
    verifiedHost: flow.h,
    redirectHost: redirectShown(flow.r),
    scopes: flow.sc.split(' ').filter(s => s !== ''),
    user: display,
    action: CONSENT_PATH,
    tx,
    csrf,
  })
  return {
    status: 200,
    headers: { ...PAGE_HEADERS, 'set-cookie': cookie(CSRF_COOKIE, csrf, { path: CONSENT_PATH, maxAge: stateTtlSeconds, secure: f.secure }) },
    body,
  }
}

/** The payload of a JWT, unverified: only to name the user on the consent page and key the remembered consent. */
function claimsOf(jwt: string | undefined): Record<string, unknown> | undefined {
  if (typeof jwt !== 'string') return undefined
  const part = jwt.split('.')[1]
  if (part === undefined) return undefined
  try {
    const v = JSON.parse(Buffer.from(part, 'base64url').toString('utf8')) as unknown
    return v !== null && typeof v === 'object' ? (v as Record<string, unknown>) : undefined
  } catch {
    return undefined
  }
}
