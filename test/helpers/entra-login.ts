/**
 * The Entra emulator's headless sign-in (EntraEmulator.loginToken): the authorization-code + PKCE
 * flow a browser and a client run, with `login_hint` naming the user and `claims` when the client
 * follows a claims challenge.
 */
import { createHash, randomBytes } from 'node:crypto'

/** The authorization-code + PKCE flow a signed-in browser and a client run, headless (EntraEmulator.loginToken). */
export async function loginFlow(f: {
  authorizeUrl: string
  tokenUrl: string
  clientId: string
  clientSecret: string | undefined
  redirectUri: string
  login: string
  scope: string
  claims: string | undefined
}): Promise<string> {
  const verifier = randomBytes(32).toString('base64url')
  const authorize = new URL(f.authorizeUrl)
  const q = {
    client_id: f.clientId,
    response_type: 'code',
    redirect_uri: f.redirectUri,
    scope: f.scope,
    login_hint: f.login,
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
    ...(f.claims === undefined ? {} : { claims: f.claims }),
  }
  for (const [k, v] of Object.entries(q)) authorize.searchParams.set(k, v)
  const back = await fetch(authorize, { redirect: 'manual' })
  const location = new URL(back.headers.get('location') ?? 'about:blank')
  const code = location.searchParams.get('code')
  if (code === null) throw new Error(`loginToken: ${location.searchParams.get('error')} ${location.searchParams.get('error_description')}`)
  const form = new URLSearchParams({ grant_type: 'authorization_code', client_id: f.clientId, code, redirect_uri: f.redirectUri, code_verifier: verifier })
  if (f.clientSecret !== undefined) form.set('client_secret', f.clientSecret)
  const res = await fetch(f.tokenUrl, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: form })
  const body = (await res.json()) as { access_token?: string; error_description?: string }
  if (body.access_token === undefined) throw new Error(`loginToken: ${res.status} ${body.error_description ?? ''}`)
  return body.access_token
}
