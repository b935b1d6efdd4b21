/**
 * What travels between the facade's steps, sealed (the client's request in
 * the IdP `state`, the IdP tokens in the gateway's code), and the two ways a
 * step answers the browser: an error page where the redirect target is not
 * trusted yet, a redirect to the client once it is.
 */
import { createHash, randomUUID } from 'node:crypto'
import type { Reply } from '../../core/plugin-api.ts'
import { renderError, PAGE_HEADERS } from './consent.ts'
import type { FacadeContext } from './facade-context.ts'

export interface ResolvedClient {
  readonly clientId: string
  readonly kind: 'cimd' | 'dcr' | 'preregistered'
  readonly clientName: string | undefined
  readonly redirectUris: readonly string[]
  readonly verifiedHost: string | undefined
  readonly trusted: boolean
}

/** What the IdP's token endpoint answered, kept to the fields the facade passes on. */
export interface IdpTokens {
  at: string
  rt?: string
  exp?: number
  sc?: string
}

/** The client's authorization request, sealed into the IdP `state`. */
export interface FlowState extends Record<string, unknown> {
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

/** An error shown in the browser: never a redirect, since the redirect target is not trusted (RFC 6749 §4.1.2.1). */
export function errorPage(status: number, title: string, message: string): Reply {
  return { status, headers: { ...PAGE_HEADERS }, body: renderError(title, message) }
}

/** A redirect to the client's (registered, checked) redirect URI with `params` and RFC 9207 `iss`. */
export function clientRedirect(f: FacadeContext, redirectUri: string, params: Record<string, string | undefined>): Reply {
  const u = new URL(redirectUri)
  for (const [k, v] of Object.entries(params)) if (v !== undefined) u.searchParams.set(k, v)
  // RFC 9207: the client checks `iss` against the issuer it discovered.
  u.searchParams.set('iss', f.issuer)
  return { status: 302, headers: { location: u.href, 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' } }
}

/** The gateway's code (the IdP tokens sealed inside), sent to the client's redirect URI. */
export async function issueCode(f: FacadeContext, flow: FlowState, tokens: IdpTokens): Promise<Reply> {
  const code = await f.sealer.seal(
    'code',
    { j: randomUUID(), c: flow.c, r: flow.r, cc: flow.cc, sc: flow.sc, rs: flow.rs, t: tokens },
    f.options.codeTtlSeconds
  )
  return clientRedirect(f, flow.r, { code, state: flow.s })
}

/** A client id as logs show it: a sealed (long) one by a short hash. */
export function shortId(clientId: string): string {
  return clientId.length <= 80 ? clientId : `sealed:${createHash('sha256').update(clientId).digest('base64url').slice(0, 12)}`
}
