/**
 * What the facade asks of the identity provider: its endpoints (from the
 * discovery document, or the cloud_idp fallbacks while it was never
 * fetched) and token requests with the gateway's own client.
 */
import { ProxyError, type RequestContext } from '../../core/plugin-api.ts'
import { boundedFetch, type BoundedResponse } from '../oauth-common/discovery.ts'
import { TOKEN_RESPONSE_MAX_BYTES } from '../oauth-common/idp-endpoints.ts'
import type { FacadeContext } from './facade-context.ts'
import type { IdpTokens } from './flow.ts'

export async function idpEndpoint(f: FacadeContext, field: 'authorization_endpoint' | 'token_endpoint'): Promise<string> {
  const fb = field === 'authorization_endpoint' ? f.idp.fallback?.authorize : f.idp.fallback?.token
  const doc = fb !== undefined ? f.discovery.peek() : await f.discovery.get()
  const v = doc?.[field]
  if (typeof v === 'string') return v
  if (fb !== undefined) return fb
  throw new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 503, `the identity provider's discovery document has no ${field}`, {
    oauthError: 'temporarily_unavailable',
    expose: true,
  })
}

export async function idpToken(
  f: FacadeContext,
  ctx: RequestContext,
  form: Record<string, string>
): Promise<{ status: number; body: Record<string, unknown> }> {
  const { idp } = f
  const body = new URLSearchParams({ ...form, client_id: idp.clientId })
  // As the bridge does (docs/identity-providers.md "Identity providers"): the operator's secret is added server-side, never shown to clients.
  if (idp.clientSecret !== undefined) body.set('client_secret', idp.clientSecret)
  let res: BoundedResponse
  try {
    res = await boundedFetch(await idpEndpoint(f, 'token_endpoint'), {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
      body: body.toString(),
      timeoutMs: Math.max(idp.discovery.timeoutMs, 10_000),
      maxBytes: TOKEN_RESPONSE_MAX_BYTES,
    })
  } catch (err) {
    ctx.log.warn(
      { grantType: form.grant_type, reason: (err as Error).name === 'TimeoutError' ? 'timeout' : (err as Error).message },
      'oauth facade: token request to the identity provider failed'
    )
    throw new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 502, "the identity provider's token endpoint could not be reached", {
      oauthError: 'temporarily_unavailable',
      expose: true,
      cause: err,
    })
  }
  let parsed: Record<string, unknown> = {}
  try {
    parsed = JSON.parse(res.body.toString('utf8')) as Record<string, unknown>
  } catch {
    /* answered below */
  }
  ctx.log.info(
    { grantType: form.grant_type, status: res.status, error: typeof parsed.error === 'string' ? parsed.error : undefined },
    'oauth facade: identity provider token request'
  )
  return { status: res.status, body: parsed }
}

export function tokensOf(body: Record<string, unknown>): IdpTokens | undefined {
  if (typeof body.access_token !== 'string' || body.access_token === '') return undefined
  return {
    at: body.access_token,
    rt: typeof body.refresh_token === 'string' ? body.refresh_token : undefined,
    exp: typeof body.expires_in === 'number' ? body.expires_in : undefined,
    sc: typeof body.scope === 'string' ? body.scope : undefined,
  }
}
