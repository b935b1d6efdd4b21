/**
 * POST /oauth/token: the gateway's code (single-use, PKCE checked against
 * the client's challenge) or a sealed refresh token (single-use, bound to
 * its client; a reuse revokes its family, RFC 9700 §4.14) becomes the IdP's
 * access token, so /mcp keeps validating IdP JWTs.
 */
import { randomUUID } from 'node:crypto'
import type { Reply, RequestContext } from '../../core/plugin-api.ts'
import { parseOAuthParams } from '../oauth-common/params.ts'
import { SealError, s256 } from './seal.ts'
import { familyOf } from './refresh-family.ts'
import { targetProblem } from './resource.ts'
import { oauthError, refuseCredentials } from './errors.ts'
import { shortId, type IdpTokens } from './flow.ts'
import { idpToken, tokensOf } from './idp-token.ts'
import { preflight } from './metadata.ts'
import type { FacadeContext } from './facade-context.ts'

const PKCE_VERIFIER_RE = /^[A-Za-z0-9._~-]{43,128}$/

type Refresh = { c: string; sc: string; rt: string; rs?: string; f?: string; g?: number; exp: number }

export async function token(f: FacadeContext, ctx: RequestContext): Promise<Reply> {
  if (ctx.method === 'OPTIONS') return preflight()
  const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
  if (type !== 'application/x-www-form-urlencoded') throw oauthError(400, 'invalid_request', 'the token request must be application/x-www-form-urlencoded')
  const { byName: p, resources } = parseOAuthParams((await ctx.readBody(64 * 1024)).toString('utf8'))
  refuseCredentials(ctx, p)
  const clientId = p.get('client_id')
  if (clientId === undefined) throw oauthError(400, 'invalid_request', 'client_id is required')
  const grant = p.get('grant_type')
  if (grant === 'authorization_code') return redeemCode(f, ctx, p, resources, clientId)
  if (grant === 'refresh_token') return redeemRefresh(f, ctx, p, resources, clientId)
  throw oauthError(400, 'unsupported_grant_type', `grant_type ${grant ?? '(none)'} is not supported`)
}

/** The access token, and a refresh token sealed with its family and next generation (refresh-family.ts). */
async function tokenReply(
  f: FacadeContext,
  ctx: RequestContext,
  grant: { c: string; sc: string; rs: string },
  tokens: IdpTokens,
  next?: { rt: string; f: string; g: number }
): Promise<Reply> {
  const out: Record<string, unknown> = { access_token: tokens.at, token_type: 'Bearer', scope: tokens.sc ?? grant.sc }
  if (tokens.exp !== undefined) out.expires_in = tokens.exp
  const idpRefresh = tokens.rt ?? next?.rt
  if (idpRefresh !== undefined) {
    const family = { f: next?.f ?? randomUUID(), g: next?.g ?? 0 }
    out.refresh_token = await f.sealer.seal('refresh', { c: grant.c, sc: grant.sc, rs: grant.rs, rt: idpRefresh, ...family }, f.options.refreshTokenTtlSeconds)
  }
  ctx.log.info({ clientId: shortId(grant.c), refresh: idpRefresh !== undefined }, 'oauth facade: tokens issued')
  return { status: 200, headers: { 'cache-control': 'no-store', pragma: 'no-cache', 'access-control-allow-origin': '*' }, body: out }
}

/** RFC 8707 at the token endpoint: a named resource must be the one the grant was bound to (always this gateway's). */
function checkTarget(f: FacadeContext, resources: readonly string[], bound: string | undefined): void {
  const problem = targetProblem(resources, f.idp.resource)
  if (problem !== undefined) throw oauthError(400, 'invalid_target', problem)
  if (bound !== undefined && bound !== f.idp.resource) throw oauthError(400, 'invalid_grant', 'the grant was issued for another resource')
}

async function redeemCode(
  f: FacadeContext,
  ctx: RequestContext,
  p: ReadonlyMap<string, string>,
  resources: readonly string[],
  clientId: string
): Promise<Reply> {
  let code: { j: string; c: string; r: string; cc: string; sc: string; rs?: string; t: IdpTokens; exp: number }
  try {
    code = await f.sealer.open('code', p.get('code') ?? '')
  } catch (err) {
    if (!(err instanceof SealError)) throw err
    throw oauthError(400, 'invalid_grant', 'the code is invalid or has expired')
  }
  if (code.c !== clientId) throw oauthError(400, 'invalid_grant', 'the code was issued to another client')
  if (p.get('redirect_uri') !== code.r) throw oauthError(400, 'invalid_grant', 'redirect_uri does not match the authorization request')
  const verifier = p.get('code_verifier')
  if (verifier === undefined || !PKCE_VERIFIER_RE.test(verifier) || s256(verifier) !== code.cc) {
    throw oauthError(400, 'invalid_grant', 'code_verifier does not match the code_challenge (PKCE)')
  }
  checkTarget(f, resources, code.rs)
  if (!(await f.usedCodes.markUsed(code.j, code.exp))) {
    ctx.log.warn({ clientId: shortId(clientId) }, 'oauth facade: a code was presented twice')
    throw oauthError(400, 'invalid_grant', 'the code has already been used')
  }
  return tokenReply(f, ctx, { c: clientId, sc: code.sc, rs: code.rs ?? f.idp.resource }, code.t)
}

async function redeemRefresh(
  f: FacadeContext,
  ctx: RequestContext,
  p: ReadonlyMap<string, string>,
  resources: readonly string[],
  clientId: string
): Promise<Reply> {
  const { idp } = f
  const sealed = p.get('refresh_token') ?? ''
  let rt: Refresh
  try {
    rt = await f.sealer.open('refresh', sealed)
  } catch (err) {
    if (!(err instanceof SealError)) throw err
    throw oauthError(400, 'invalid_grant', 'the refresh token is invalid or has expired')
  }
  if (rt.c !== clientId) {
    ctx.log.warn({ clientId: shortId(clientId) }, 'oauth facade: a refresh token was presented by another client')
    throw oauthError(400, 'invalid_grant', 'the refresh token was issued to another client')
  }
  checkTarget(f, resources, rt.rs)
  // Single use before the IdP is asked (two concurrent uses cannot both pass); a reuse revokes the family.
  const ref = familyOf(rt, sealed)
  if (!(await f.families.redeem(ref, rt.exp))) {
    const revoked = await f.families.revoke(ref)
    ctx.log.warn(
      { clientId: shortId(clientId), generation: ref.generation, revokedFrom: revoked ?? null },
      'oauth facade: a refresh token was used twice: its family is revoked (RFC 9700 §4.14)'
    )
    throw oauthError(400, 'invalid_grant', 'the refresh token has already been used')
  }
  const res = await idpToken(f, ctx, {
    grant_type: 'refresh_token',
    refresh_token: rt.rt,
    scope: [...new Set([...rt.sc.split(' '), ...(idp.family === 'cloud_idp' ? ['offline_access'] : [])])].filter(s => s !== '').join(' '),
  })
  const tokens = res.status === 200 ? tokensOf(res.body) : undefined
  if (tokens === undefined) throw oauthError(400, 'invalid_grant', 'the identity provider refused the refresh token')
  return tokenReply(f, ctx, { c: clientId, sc: rt.sc, rs: rt.rs ?? idp.resource }, tokens, { rt: rt.rt, f: ref.family, g: ref.generation + 1 })
}
