/**
 * The OAuth facade (mcp.policies.mcpAuthentication.facade): the gateway is
 * the authorization server its clients see; the IdP knows one client and one
 * redirect URI, the gateway's callback (the dev IdP and the Entra emulator
 * are started with that callback as their only redirect URI).
 * SDK 1.x and 2.x clients through the whole flow with DCR, a pre-registered
 * client and a client ID metadata document (the attacks: oauth-facade-attacks.test.ts).
 */
import t from 'tap'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import {
  Client as Client2,
  StreamableHTTPClientTransport as Transport2,
  UnauthorizedError as Unauthorized2,
  type OAuthClientProvider as Provider2,
} from '@modelcontextprotocol/client'
import { startEntraEmulator } from './helpers/entra-emulator.ts'
import { freePort } from './helpers/cli.ts'
import { Sealer } from '../plugins/oauth-facade/seal.ts'
import { addressAllowed, cacheSeconds, cimdUrlProblem } from '../plugins/oauth-facade/cimd.ts'
import { redirectMatches, domainTrusted } from '../plugins/oauth-facade/index.ts'
import {
  facadeGateway,
  ossSetup,
  FacadeProvider,
  Agent,
  cimdServer,
  FACADE_KEY,
  CALLBACK,
  redeem,
  pkce,
  authorizeUrl,
  devIdpFor,
  ossAuth,
  register,
  FACADE_COOKIE,
  cookieProblems,
} from './helpers/facade.ts'

const SECRET = 'entra-app-secret-value'

interface Flow {
  tools: string[]
  echo: string
}

async function sdk1(url: URL, provider: FacadeProvider): Promise<Flow> {
  let unauthorized = false
  try {
    await new Client1({ name: 'sdk1', version: '1.0.0' }).connect(new Transport1(url, { authProvider: provider as unknown as Provider1 }))
  } catch (err) {
    if (!(err instanceof Unauthorized1)) throw err
    unauthorized = true
  }
  if (!unauthorized) throw new Error('expected the first connect to need authorization')
  const transport = new Transport1(url, { authProvider: provider as unknown as Provider1 })
  await transport.finishAuth(provider.code())
  const client = new Client1({ name: 'sdk1', version: '1.0.0' })
  await client.connect(transport)
  try {
    const tools = (await client.listTools()).tools.map(x => x.name)
    const res = await client.callTool({ name: 'echo', arguments: { message: 'hello sdk1' } })
    return { tools, echo: (res.content as Array<{ text?: string }>)[0]?.text ?? '' }
  } finally {
    await client.close()
  }
}

/** finishAuth with the callback's parameters: the 2.x SDK checks RFC 9207 `iss` against the discovered issuer. */
async function sdk2(url: URL, provider: FacadeProvider): Promise<Flow> {
  let unauthorized = false
  try {
    await new Client2({ name: 'sdk2', version: '2.0.0' }).connect(new Transport2(url, { authProvider: provider as unknown as Provider2 }))
  } catch (err) {
    if (!(err instanceof Unauthorized2)) throw err
    unauthorized = true
  }
  if (!unauthorized) throw new Error('expected the first connect to need authorization')
  const transport = new Transport2(url, { authProvider: provider as unknown as Provider2 })
  await transport.finishAuth(provider.callback!.searchParams)
  const client = new Client2({ name: 'sdk2', version: '2.0.0' })
  await client.connect(transport)
  try {
    const tools = (await client.listTools()).tools.map(x => x.name)
    const res = await client.callTool({ name: 'echo', arguments: { message: 'hello sdk2' } })
    return { tools, echo: (res.content as Array<{ text?: string }>)[0]?.text ?? '' }
  } finally {
    await client.close()
  }
}

function claimsOf(jwt: string): Record<string, unknown> {
  return JSON.parse(Buffer.from(jwt.split('.')[1]!, 'base64url').toString()) as Record<string, unknown>
}

t.test('sealing: purposes, expiry, tampering, key rotation', async t => {
  const k1 = { kid: 'k1', secret: 'a'.repeat(40) }
  const k2 = { kid: 'k2', secret: 'b'.repeat(40) }
  const old = new Sealer([k1])
  const rotated = new Sealer([k2, k1])
  const sealed = await old.seal('code', { x: 1 }, 60)
  t.same((await rotated.open('code', sealed)).x, 1, 'a value sealed with the old key opens after rotation')
  const fresh = await rotated.seal('refresh', { y: 2 }, 60)
  t.equal(JSON.parse(Buffer.from(fresh.split('.')[0]!, 'base64url').toString()).kid, 'k2', 'the first key seals')
  await t.rejects(old.open('refresh', fresh), /unknown key/, 'a dropped key no longer opens')
  await t.rejects(rotated.open('state', sealed), /not a state/, 'a code is not a state')
  await t.rejects(rotated.open('code', await rotated.seal('code', {}, -1)), /expired/)
  const parts = sealed.split('.')
  parts[3] = parts[3]!.slice(0, -2) + (parts[3]!.endsWith('AA') ? 'BB' : 'AA')
  await t.rejects(rotated.open('code', parts.join('.')), /does not open/)
  t.ok(new Sealer(undefined).ephemeral)
})

t.test('CIMD and redirect checks', async t => {
  for (const a of [
    '10.1.2.3',
    '172.16.0.1',
    '192.168.1.1',
    '127.0.0.1',
    '169.254.169.254',
    '100.64.0.1',
    '0.0.0.0',
    '::1',
    'fd00::1',
    'fe80::1',
    '::ffff:10.0.0.1',
    '::ffff:127.0.0.1',
    '::ffff:a00:1',
    '::ffff:7f00:1',
    '224.0.0.1',
  ]) {
    t.notOk(addressAllowed(a, false), `${a} refused`)
  }
  for (const a of ['93.184.216.34', '2606:4700::1111']) t.ok(addressAllowed(a, false), `${a} allowed`)
  t.ok(addressAllowed('127.0.0.1', true), 'the test-only override reaches loopback')
  t.notOk(addressAllowed('10.0.0.1', true), '... and nothing else private')
  t.equal(cacheSeconds('public, max-age=120', { maxCacheSeconds: 3600, defaultCacheSeconds: 300 }), 120)
  t.equal(cacheSeconds('max-age=99999', { maxCacheSeconds: 3600, defaultCacheSeconds: 300 }), 3600)
  t.equal(cacheSeconds('no-store', { maxCacheSeconds: 3600, defaultCacheSeconds: 300 }), 0)
  t.equal(cacheSeconds(undefined, { maxCacheSeconds: 3600, defaultCacheSeconds: 300 }), 300)
  t.match(cimdUrlProblem('https://example.com/'), /path/)
  t.match(cimdUrlProblem('https://user@example.com/c.json'), /user information/)
  t.match(cimdUrlProblem('https://example.com/a/../c.json'), /dot segments|normal form/)
  t.equal(cimdUrlProblem('https://example.com/c.json'), undefined)
  t.ok(redirectMatches(['http://127.0.0.1/callback'], 'http://127.0.0.1:5555/callback'), 'loopback: any port (RFC 8252 §7.3)')
  t.notOk(redirectMatches(['http://127.0.0.1/callback'], 'http://127.0.0.1:5555/callback2'))
  t.notOk(redirectMatches(['https://app.example/cb'], 'https://app.example/cb/'))
  t.ok(domainTrusted('a.example.com', ['*.example.com']))
  t.notOk(domainTrusted('example.com.evil', ['*.example.com']))
  t.notOk(domainTrusted('evilexample.com', ['*.example.com']))
})

t.test('metadata: the gateway is the authorization server (root and path-aware, RFC 9207)', async t => {
  const { g } = await ossSetup(t)
  const root = (await (await fetch(`${g.base}/.well-known/oauth-authorization-server`)).json()) as Record<string, unknown>
  const mcp = (await (await fetch(`${g.base}/.well-known/oauth-authorization-server/mcp`)).json()) as Record<string, unknown>
  t.equal(root.issuer, g.base)
  t.equal(mcp.issuer, `${g.base}/mcp`)
  for (const doc of [root, mcp]) {
    t.equal(doc.authorization_endpoint, `${g.base}/oauth/authorize`)
    t.equal(doc.token_endpoint, `${g.base}/oauth/token`)
    t.equal(doc.registration_endpoint, `${g.base}/.well-known/oauth-authorization-server/client-registration`)
    t.equal(doc.client_id_metadata_document_supported, true)
    t.ok((doc.token_endpoint_auth_methods_supported as string[]).includes('none'))
    t.same(doc.code_challenge_methods_supported, ['S256'])
    t.equal(doc.authorization_response_iss_parameter_supported, true)
  }
  const prm = (await (await fetch(`${g.base}/.well-known/oauth-protected-resource/mcp`)).json()) as Record<string, unknown>
  t.same(prm.authorization_servers, [`${g.base}/mcp`])
})

t.test('oss_idp: SDK 1.x and 2.x, each with DCR and with a pre-registered client, after consent', async t => {
  const { idp, g } = await ossSetup(t, {
    keys: [FACADE_KEY],
    clients: [{ clientId: 'vscode-like', clientName: 'Pre-registered editor', redirectUris: ['http://127.0.0.1/callback'] }],
  })
  const agent = new Agent()
  const p1 = new FacadeProvider({ agent })
  const f1 = await sdk1(g.url, p1)
  t.ok(f1.tools.includes('echo'), 'sdk1: tools listed')
  t.match(f1.echo, /hello sdk1/)
  t.ok(p1.registered!.client_id.split('.').length === 5, 'sdk1: the client id is a sealed registration')
  t.equal(agent.consentPages, 1, 'sdk1: consent asked once')
  t.match(agent.lastConsent!.html, /facade test client/)
  t.match(agent.lastConsent!.html, /registered itself/)
  t.equal(p1.callback!.searchParams.get('iss'), `${g.base}/mcp`, 'RFC 9207 iss sent')
  t.ok(
    p1.agent.hops.some(h => h.startsWith(idp.authorizationEndpoint)),
    'went to the IdP'
  )
  const idpHop = new URL(p1.agent.hops.find(h => h.startsWith(idp.authorizationEndpoint))!)
  t.equal(idpHop.searchParams.get('client_id'), idp.clientId, 'one client at the IdP')
  t.equal(idpHop.searchParams.get('redirect_uri'), `${g.base}/oauth/callback`, 'one redirect URI at the IdP: the gateway callback')
  const claims = claimsOf(p1.accessToken!)
  t.equal(claims.iss, idp.issuer, 'the client holds the IdP access token')
  t.equal(claims.aud, idp.clientId)

  // Refresh goes through the gateway and stays bound to its client.
  const rt = p1.refreshToken
  t.type(rt, 'string', 'a refresh token was issued')
  const other = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt!, client_id: 'vscode-like' })
  t.equal(other.status, 400)
  t.equal(other.body.error, 'invalid_grant', 'a refresh token used by another client is refused')
  const own = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt!, client_id: p1.registered!.client_id })
  t.equal(own.status, 200)
  t.equal(claimsOf(own.body.access_token as string).iss, idp.issuer)

  const p1pre = new FacadeProvider({ agent: new Agent(), clientId: 'vscode-like', redirectUrl: 'http://127.0.0.1:40002/callback' })
  t.match((await sdk1(g.url, p1pre)).echo, /hello sdk1/, 'sdk1 with the pre-registered client')
  const p2dcr = new FacadeProvider()
  t.match((await sdk2(g.url, p2dcr)).echo, /hello sdk2/, 'sdk2 with DCR')
  t.equal(p2dcr.registered!.client_id.split('.').length, 5)

  const p2 = new FacadeProvider({ agent: new Agent(), clientId: 'vscode-like', redirectUrl: 'http://127.0.0.1:40001/callback' })
  const f2 = await sdk2(g.url, p2)
  t.match(f2.echo, /hello sdk2/)
  t.equal(p2.agent.consentPages, 1)
  t.match(p2.agent.lastConsent!.html, /Pre-registered editor/)

  // The same user and client again: the approval is remembered (sealed cookie).
  const again = new FacadeProvider({ agent, clientId: p1.registered!.client_id })
  await sdk1(g.url, again)
  t.equal(agent.consentPages, 1, 'consent remembered for this user and client')
  t.notOk(/eyJ[\w-]+\.eyJ/.test(g.logText()), 'no tokens in the gateway log')
})

t.test('CIMD: SDK 2.x with a client ID metadata document served by the test', async t => {
  const cimd = await cimdServer(t)
  const { g } = await ossSetup(t, { keys: [FACADE_KEY], cimd: { testOnlyAllowLoopback: true, testOnlyCa: cimd.cert } })
  const url = `${cimd.origin}/clients/editor.json`
  cimd.docs.set('/clients/editor.json', u => ({
    headers: { 'cache-control': 'max-age=60' },
    body: JSON.stringify({ client_id: u, client_name: 'CIMD editor', redirect_uris: [CALLBACK], token_endpoint_auth_method: 'none' }),
  }))
  const p = new FacadeProvider({ clientMetadataUrl: url })
  const f = await sdk2(g.url, p)
  t.match(f.echo, /hello sdk2/)
  t.equal(p.registered?.client_id, url, 'the client id is the document URL')
  t.match(p.agent.lastConsent!.html, /id="verified-host">127\.0\.0\.1</, 'consent names the verified domain')
  const p1 = new FacadeProvider({ clientMetadataUrl: url, agent: p.agent })
  await sdk1(g.url, p1)
  t.equal(cimd.requests.filter(r => r === '/clients/editor.json').length, 1, 'the document was cached (Cache-Control max-age)')
  t.match(g.logText(), /testOnlyAllowLoopback is on/)
})

t.test('cloud_idp: SDK 1.x with DCR and 2.x pre-registered against the Entra emulator; secret added server-side, no resource', async t => {
  const port = await freePort()
  const emu = await startEntraEmulator({ clientSecret: SECRET, redirectUris: [`http://127.0.0.1:${port}/oauth/callback`] })
  t.teardown(() => emu.close())
  const g = await facadeGateway(
    t,
    base => ({
      issuer: emu.issuerV2,
      audiences: [`api://${emu.clientId}`, emu.clientId],
      clientId: emu.clientId,
      clientSecret: SECRET,
      provider: { cloud_idp: {} },
      resourceMetadata: { resource: `${base}/mcp`, scopesSupported: [...emu.apiScopes] },
      facade: { keys: [FACADE_KEY], clients: [{ clientId: 'cli', redirectUris: ['http://127.0.0.1/callback'] }] },
    }),
    { port }
  )
  const p = new FacadeProvider()
  const f = await sdk1(new URL(`http://127.0.0.1:${port}/mcp`), p)
  t.match(f.echo, /hello sdk1/)
  const claims = claimsOf(p.accessToken!)
  t.equal(claims.iss, emu.issuerV2)
  const tokenRequests = emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/token'))
  t.ok(tokenRequests.length >= 1)
  for (const r of tokenRequests) {
    const params = new Map(r.params)
    t.equal(params.get('client_secret'), SECRET, 'secret added by the gateway')
    t.notOk(params.has('resource'))
    t.equal(params.get('redirect_uri') ?? `http://127.0.0.1:${port}/oauth/callback`, `http://127.0.0.1:${port}/oauth/callback`)
  }
  for (const r of emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/authorize'))) t.notOk(new Map(r.params).has('resource'))
  t.notOk(JSON.stringify(p.tokens()).includes(SECRET), 'the client never sees the secret')
  t.notOk(g.logText().includes(SECRET), 'secret never logged')
  const refreshed = await redeem(`http://127.0.0.1:${port}`, {
    grant_type: 'refresh_token',
    refresh_token: p.refreshToken!,
    client_id: p.registered!.client_id,
  })
  t.equal(refreshed.status, 200, 'refresh through the gateway with the secret added')
  const p2 = new FacadeProvider({ clientId: 'cli' })
  t.match((await sdk2(new URL(`http://127.0.0.1:${port}/mcp`), p2)).echo, /hello sdk2/, 'sdk2 with a pre-registered client, iss checked')
  t.equal(claimsOf(p2.accessToken!).aud, emu.clientId)
})

t.test('facade: {} alone starts with an ephemeral key and says so', async t => {
  const { g } = await ossSetup(t, {})
  t.match(g.logText(), /keys is not set: sealing with an ephemeral key/)
  const res = await fetch(`${g.base}/.well-known/oauth-authorization-server/mcp`)
  t.equal(res.status, 200)
})

t.test(
  'private-use redirect schemes (RFC 8252 §7.1): refused by default; when listed, registration, pre-registered clients and the whole flow take them',
  async t => {
    const cursor = 'cursor://anysphere.cursor-retrieval/oauth/user-mcp/callback'
    const register = (base: string, uris: string[]): Promise<Response> =>
      fetch(`${base}/.well-known/oauth-authorization-server/client-registration`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ client_name: 'Cursor-like', redirect_uris: uris }),
      })

    const { g: plain } = await ossSetup(t, { keys: [FACADE_KEY] })
    const refused = await register(plain.base, [CALLBACK, cursor])
    t.equal(refused.status, 400, 'default: registration refuses the scheme')
    t.same(await refused.json(), {
      error: 'invalid_redirect_uri',
      error_description: 'redirect_uris[1] must use https, or http on a loopback address (not cursor)',
    })

    const { g } = await ossSetup(t, {
      keys: [FACADE_KEY],
      allowedRedirectSchemes: ['cursor'],
      clients: [{ clientId: 'cursor-like', clientName: 'Desktop editor', redirectUris: [cursor] }],
    })
    t.equal((await register(g.base, [CALLBACK, cursor])).status, 201, 'listed: registration takes it')
    t.equal((await register(g.base, ['vscode://vscode.github-authentication/cb'])).status, 400, 'an unlisted scheme is still refused')
    for (const bad of [`${cursor}#x`, 'cursor://user@anysphere.cursor-retrieval/cb']) {
      const res = await fetch(authorizeUrl(g.base, 'cursor-like', pkce().challenge, { redirect_uri: bad }), { redirect: 'manual' })
      t.equal(res.status, 400, bad)
      t.equal(res.headers.get('location'), null, `${bad}: never a redirect`)
    }

    const { verifier, challenge } = pkce()
    const agent = new Agent()
    const back = await agent.follow(authorizeUrl(g.base, 'cursor-like', challenge, { redirect_uri: cursor }), cursor)
    t.equal(agent.consentPages, 1)
    t.match(
      agent.lastConsent!.html,
      /<strong id="redirect-host">cursor:\/\/anysphere\.cursor-retrieval \(an application on this device\)<\/strong>/,
      'the consent page names the app, not a web host'
    )
    t.equal(back.protocol + '//' + back.host + back.pathname, cursor, 'the code goes to the app')
    t.equal(back.searchParams.get('state'), 'client-state-1')
    const tokens = await redeem(g.base, {
      grant_type: 'authorization_code',
      code: back.searchParams.get('code')!,
      client_id: 'cursor-like',
      redirect_uri: cursor,
      code_verifier: verifier,
    })
    t.equal(tokens.status, 200, 'and is redeemed')
    t.type(tokens.body.access_token, 'string')
  }
)

// Issue 22 item 15: the agent keeps every cookie attribute, so the attributes a browser acts on are
// asserted: HttpOnly and SameSite always, Secure exactly when the public URL is https (here a
// TLS-terminating proxy in front: mcp.baseUrl https, the listener http on loopback).
for (const scheme of ['http', 'https'] as const) {
  t.test(`facade cookies, ${scheme} public URL: HttpOnly, SameSite${scheme === 'https' ? ' and Secure' : ', not Secure'}`, async t => {
    const port = await freePort()
    const publicBase = scheme === 'https' ? 'https://gateway.example.test' : `http://127.0.0.1:${port}`
    const idp = await devIdpFor(t, () => [`${publicBase}/oauth/callback`])
    const g = await facadeGateway(t, ossAuth(idp), { port, ...(scheme === 'https' ? { baseUrl: publicBase } : {}) })
    const clientId = await register(g.base)
    const agent = new Agent()
    agent.route = u => u.replace(publicBase, g.base)
    const cb = await agent.follow(authorizeUrl(publicBase, clientId, pkce().challenge), CALLBACK)
    t.match(cb.searchParams.get('code'), /\S/, 'the flow reached the client with a code')
    const facade = agent.setCookies.filter(c => FACADE_COOKIE.test(c.name))
    t.same(
      [...new Set(facade.map(c => c.name.replace(/^__Host-/, '')))].sort(),
      ['mcp_facade_consent', 'mcp_facade_csrf'],
      'the consent CSRF and remembered-consent cookies were set'
    )
    for (const c of facade) {
      const attrs = [...c.attributes].map(([k, v]) => (v === '' ? k : `${k}=${v}`)).join('; ')
      t.same(cookieProblems(c), [], `${c.name} set on ${new URL(c.url).pathname}: ${attrs}`)
      t.ok(c.attributes.has('httponly'), `${c.name}: HttpOnly`)
      t.match(c.attributes.get('samesite'), /^(Lax|Strict)$/i, `${c.name}: SameSite`)
      t.equal(c.attributes.has('secure'), scheme === 'https', `${c.name}: Secure ${scheme === 'https' ? 'on https' : 'absent on http'}`)
    }
  })
}
