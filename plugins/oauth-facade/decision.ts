/**
 * POST /oauth/consent: the user's answer on the consent page. The sealed
 * transaction and the CSRF token (form, cookie and transaction must agree)
 * are checked; a denial goes back to the client as access_denied, an
 * approval issues the client's code and may be remembered (remember.ts).
 */
import type { Reply, RequestContext } from '../../core/plugin-api.ts'
import { SealError } from './seal.ts'
import { readCookie, cookie, cookieName, CSRF_COOKIE } from './consent.ts'
import { clientRedirect, errorPage, issueCode, shortId, type FlowState, type IdpTokens } from './flow.ts'
import type { FacadeContext } from './facade-context.ts'
import { CONSENT_PATH } from './paths.ts'

export async function decision(f: FacadeContext, ctx: RequestContext): Promise<Reply> {
  const { secure } = f
  const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
  if (type !== 'application/x-www-form-urlencoded')
    return errorPage(415, 'Invalid consent', 'the consent form must be posted as application/x-www-form-urlencoded')
  const form = new URLSearchParams((await ctx.readBody(64 * 1024)).toString('utf8'))
  let tx: FlowState & { t: IdpTokens; u?: string; x: string }
  try {
    tx = await f.sealer.open('consent-tx', form.get('tx') ?? '')
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
  if (form.get('decision') !== 'approve') {
    ctx.log.info({ clientId: shortId(tx.c), decision: 'deny' }, 'oauth facade: consent denied')
    const r = clientRedirect(f, tx.r, { error: 'access_denied', error_description: 'the user denied access', state: tx.s })
    return { ...r, headers: { ...r.headers, 'set-cookie': clear } }
  }
  ctx.log.info({ clientId: shortId(tx.c), decision: 'approve' }, 'oauth facade: consent given')
  const r = await issueCode(f, tx, tx.t)
  const cookies = [clear]
  const remember = tx.u !== undefined ? await f.remembered.remember(ctx.req.headers.cookie, tx.u, tx.c, tx.sc, tx.rs ?? f.idp.resource) : undefined
  if (remember !== undefined) cookies.push(remember)
  return { ...r, headers: { ...r.headers, 'set-cookie': cookies } }
}
