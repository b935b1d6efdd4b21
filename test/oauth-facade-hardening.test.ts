/**
 * The OAuth facade hardened (issue 22, items 3, 4, 6, 10, 12), from the
 * outside: the real gateway, the dev IdP (oidc-provider) and, where replicas
 * share state, a real redis-server.
 * - RFC 8707 `resource`: only this gateway's resource (the one its protected
 *   resource metadata advertises), on authorize, token and refresh.
 * - Refresh tokens single-use, and a reuse revokes the whole family (RFC 9700
 *   §4.14), also across two replicas sharing Redis.
 * - Remembered consent covers the scopes approved, not more.
 * - The registration limit is per resolved client address (mcp.trustedProxies)
 *   and shared across replicas.
 * - invalid_client with WWW-Authenticate (RFC 6749 §5.2); client ids too long
 *   for the flow refused at registration; `__Host-` cookies on https.
 */
import t from 'tap'
import {
  facadeGateway,
  devIdpFor,
  ossAuth,
  ossSetup,
  Agent,
  cimdServer,
  EVERYTHING,
  FACADE_KEY,
  CALLBACK,
  pkce,
  register,
  authorizeUrl,
  redeem,
  type FacadeGateway,
} from './helpers/facade.ts'
import { startRedis } from './helpers/redis.ts'
import { configFile, freePort, freshFetch, spawnCli, waitForPort } from './helpers/cli.ts'
import { addressAllowed, CimdResolver } from '../plugins/oauth-facade/cimd.ts'

const EVIL = 'https://evil.example/mcp'

/** One whole browser flow: the client's redirect URI reached, its query returned with the PKCE verifier. */
async function authorizeFlow(base: string, clientId: string, agent = new Agent(), extra: Record<string, string> = {}): Promise<{ cb: URL; verifier: string }> {
  const { verifier, challenge } = pkce()
  const cb = await agent.follow(authorizeUrl(base, clientId, challenge, extra), CALLBACK)
  return { cb, verifier }
}

async function tokensFor(g: FacadeGateway, clientId: string, agent?: Agent): Promise<Record<string, unknown>> {
  const { cb, verifier } = await authorizeFlow(g.base, clientId, agent)
  const code = cb.searchParams.get('code')
  if (code === null) throw new Error(`no code: ${cb.search}`)
  const res = await redeem(g.base, { grant_type: 'authorization_code', code, client_id: clientId, redirect_uri: CALLBACK, code_verifier: verifier })
  if (res.status !== 200) throw new Error(`token endpoint answered ${res.status}: ${JSON.stringify(res.body)}`)
  return res.body
}

t.test('one gateway', async t => {
  // An IdP that does not rotate its refresh tokens (as many do not): single use is the gateway's own doing.
  const { g } = await ossSetup(t, { keys: [FACADE_KEY] }, { trustedProxies: ['127.0.0.1'] }, { rotateRefreshTokens: false })
  const resource = `${g.base}/mcp`
  const clientId = await register(g.base)

  t.test('resource (RFC 8707): another resource is refused with invalid_target on authorize, token and refresh', async t => {
    const prm = (await (await fetch(`${g.base}/.well-known/oauth-protected-resource/mcp`)).json()) as { resource: string }
    t.equal(prm.resource, resource, 'the resource the gateway advertises')
    const evil = await authorizeFlow(g.base, clientId, new Agent(), { resource: EVIL })
    t.equal(evil.cb.searchParams.get('error'), 'invalid_target', 'authorize: error sent back to the registered redirect URI')
    t.equal(evil.cb.searchParams.get('state'), 'client-state-1')
    t.notOk(evil.cb.searchParams.has('code'), 'no code for another resource')
    const trailing = await authorizeFlow(g.base, clientId, new Agent(), { resource: `${resource}/` })
    t.equal(trailing.cb.searchParams.get('error'), 'invalid_target', 'compared exactly: a trailing slash is another resource')

    const good = await authorizeFlow(g.base, clientId, new Agent(), { resource })
    const code = good.cb.searchParams.get('code')!
    t.type(code, 'string', "this gateway's resource is accepted")
    const form = { grant_type: 'authorization_code', code, client_id: clientId, redirect_uri: CALLBACK, code_verifier: good.verifier }
    const wrong = await redeem(g.base, { ...form, resource: EVIL })
    t.equal(wrong.status, 400)
    t.equal(wrong.body.error, 'invalid_target', 'token: another resource than the code was bound to')
    const ok = await redeem(g.base, { ...form, resource })
    t.equal(ok.status, 200, 'the code still works with its own resource (the refused attempt did not spend it)')
    const rt = ok.body.refresh_token as string
    t.type(rt, 'string')
    const evilRefresh = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt, client_id: clientId, resource: EVIL })
    t.equal(evilRefresh.status, 400)
    t.equal(evilRefresh.body.error, 'invalid_target', 'refresh: another resource')
    const refreshed = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt, client_id: clientId, resource })
    t.equal(refreshed.status, 200, 'refresh with the bound resource')

    // Absent resource: allowed, and bound to this gateway's resource.
    const none = await tokensFor(g, clientId)
    t.type(none.access_token, 'string', "no resource: the gateway's own")
  })

  t.test('refresh tokens: rotated, single-use; a reuse revokes the family (RFC 9700 §4.14)', async t => {
    const first = await tokensFor(g, clientId)
    const rt1 = first.refresh_token as string
    const second = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })
    t.equal(second.status, 200, 'the first use rotates')
    const rt2 = second.body.refresh_token as string
    t.type(rt2, 'string')
    t.not(rt2, rt1, 'a new refresh token')
    const third = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt2, client_id: clientId })
    t.equal(third.status, 200, 'the rotated one works once')
    const rt3 = third.body.refresh_token as string
    const replay = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })
    t.equal(replay.status, 400, 'a used refresh token is refused')
    t.equal(replay.body.error, 'invalid_grant')
    const newest = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: rt3, client_id: clientId })
    t.equal(newest.status, 400, "after a reuse the family's newest token is refused too")
    t.equal(newest.body.error, 'invalid_grant')
    t.match(g.logText(), /refresh token was used twice/, 'the reuse is logged')
    // Another grant of the same client is another family: untouched.
    const other = await tokensFor(g, clientId)
    const otherRefresh = await redeem(g.base, { grant_type: 'refresh_token', refresh_token: other.refresh_token as string, client_id: clientId })
    t.equal(otherRefresh.status, 200, 'another family keeps working')
  })

  t.test('remembered consent covers the approved scopes only', async t => {
    const agent = new Agent()
    const fresh = await register(g.base)
    const flow = async (scope: string) => (await authorizeFlow(g.base, fresh, agent, { scope })).cb
    t.type((await flow('openid')).searchParams.get('code'), 'string')
    t.equal(agent.consentPages, 1, 'asked the first time')
    t.type((await flow('openid')).searchParams.get('code'), 'string')
    t.equal(agent.consentPages, 1, 'the same scope: remembered')
    t.type((await flow('openid profile email offline_access')).searchParams.get('code'), 'string')
    t.equal(agent.consentPages, 2, 'more scopes: asked again')
    t.match(agent.lastConsent?.html, /<li>email<\/li>/, 'the page names the scopes')
    t.type((await flow('openid profile')).searchParams.get('code'), 'string')
    t.equal(agent.consentPages, 2, 'a subset of what was approved: remembered')
  })

  t.test('registration limit: per resolved client address (X-Forwarded-For from a trusted proxy)', async t => {
    const reg = (forwardedFor: string) =>
      fetch(`${g.base}/.well-known/oauth-authorization-server/client-registration`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-forwarded-for': forwardedFor },
        body: JSON.stringify({ client_name: 'proxied', redirect_uris: [CALLBACK] }),
      })
    // 25 clients behind the proxy, one registration each: more than one address's limit (20 a minute).
    for (let i = 1; i <= 25; i++) {
      const res = await reg(`198.51.100.${i}`)
      t.equal(res.status, 201, `client 198.51.100.${i}`)
      await res.arrayBuffer()
    }
    const statuses: number[] = []
    for (let i = 0; i < 30; i++) {
      const res = await reg('203.0.113.9')
      statuses.push(res.status)
      await res.arrayBuffer()
    }
    t.ok(
      statuses.slice(0, 20).every(s => s === 201),
      'one address gets its 20'
    )
    t.ok(statuses.includes(429), 'and is then limited')
    t.match(g.logText(), /"address":"203\.0\.113\.9"[^\n]*rate limit reached/, 'the log names the resolved address')
  })

  t.test('invalid_client: 401 with WWW-Authenticate naming the scheme the client used (RFC 6749 §5.2)', async t => {
    const res = await fetch(`${g.base}/oauth/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: 'Basic ' + Buffer.from('a:b').toString('base64') },
      body: new URLSearchParams({ grant_type: 'authorization_code', code: 'x', client_id: clientId }).toString(),
    })
    t.equal(res.status, 401)
    t.match(res.headers.get('www-authenticate'), /^Basic realm="/)
    t.equal(((await res.json()) as { error: string }).error, 'invalid_client')
    const secret = await redeem(g.base, { grant_type: 'authorization_code', code: 'x', client_id: clientId, client_secret: 's' })
    t.equal(secret.status, 400, 'credentials in the body: 400 (a 401 would need a challenge for a scheme the client did not use)')
    t.equal(secret.body.error, 'invalid_client')
  })

  t.test('registration: a client id too long for the flow is refused; one just within the limit completes the flow', async t => {
    const long = Array.from({ length: 10 }, (_, i) => `https://app${i}.example/${'a'.repeat(1000)}`)
    const res = await fetch(`${g.base}/.well-known/oauth-authorization-server/client-registration`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-forwarded-for': '192.0.2.77' },
      body: JSON.stringify({ client_name: 'long', redirect_uris: long }),
    })
    t.equal(res.status, 400, 'within maxRedirectUris and maxRedirectUriLength, but too long a client id')
    const body = (await res.json()) as { error: string; error_description: string }
    t.equal(body.error, 'invalid_client_metadata')
    t.match(body.error_description, /client id would be \d+ characters; at most 4096/)
    const within = await register(g.base, [CALLBACK, `https://app.example/${'b'.repeat(1000)}`, `https://app2.example/${'c'.repeat(900)}`])
    t.ok(within.length > 2500, `a long client id (${within.length})`)
    const { cb } = await authorizeFlow(g.base, within)
    t.type(cb.searchParams.get('code'), 'string', 'its whole flow works')
  })
})

t.test('two replicas sharing redis (cluster.redis): refresh reuse and the registration limit are seen by both', async t => {
  const redis = await startRedis(t)
  const port = await freePort()
  const publicBase = `http://127.0.0.1:${port}`
  const idp = await devIdpFor(t, () => [`${publicBase}/oauth/callback`], { rotateRefreshTokens: false })
  const bPort = await freePort()
  const cluster = (advertiseUrl: string) => ({ secret: 'facade-hardening-cluster-0123456789abcdef', advertiseUrl, redis: { url: redis.url } })
  const mcp = { trustedProxies: ['127.0.0.1'] }
  const a = await facadeGateway(t, ossAuth(idp), { port, cluster: cluster(publicBase), mcp })
  const b = await facadeGateway(t, ossAuth(idp), { port: bPort, publicBase, cluster: cluster(`http://127.0.0.1:${bPort}`), mcp })
  const clientId = await register(a.base)
  const first = await tokensFor(a, clientId)
  const rt1 = first.refresh_token as string
  const onA = await redeem(a.base, { grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })
  t.equal(onA.status, 200, 'rotated on A')
  const onB = await redeem(b.base, { grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })
  t.equal(onB.status, 400, 'the used token on B: refused')
  t.equal(onB.body.error, 'invalid_grant')
  const newest = await redeem(a.base, { grant_type: 'refresh_token', refresh_token: onA.body.refresh_token as string, client_id: clientId })
  t.equal(newest.status, 400, "the family's newest token on A: revoked by the reuse B saw")

  const reg = (base: string) =>
    fetch(`${base}/.well-known/oauth-authorization-server/client-registration`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-forwarded-for': '203.0.113.50' },
      body: JSON.stringify({ redirect_uris: [CALLBACK] }),
    })
  const statuses: number[] = []
  for (let i = 0; i < 30; i++) {
    const res = await reg(i % 2 === 0 ? a.base : b.base)
    statuses.push(res.status)
    await res.arrayBuffer()
  }
  // Each replica alone would allow 20 (30 spread over two is 15 each): one shared bucket limits them.
  t.ok(
    statuses.slice(0, 20).every(s => s === 201),
    'twenty from one address, spread over both replicas'
  )
  t.ok(statuses.includes(429), 'then limited: one bucket for both replicas')
})

t.test('https public URL: consent and remember cookies are __Host- with Secure, HttpOnly, SameSite=Lax, Path=/', async t => {
  const port = await freePort()
  const publicBase = `https://gw.test:${port}`
  const idp = await devIdpFor(t, () => [`${publicBase}/oauth/callback`])
  const g = await facadeGateway(t, ossAuth(idp), { port, publicBase })
  // TLS is terminated in front of the gateway: the agent speaks http to it for the https public URL.
  const agent = new Agent()
  agent.route = u => u.replace(publicBase, g.base)
  const setCookies: string[] = []
  const fetchOrig = agent.fetch.bind(agent)
  agent.fetch = async (url, init) => {
    const res = await fetchOrig(url, init)
    if (agent.route(url).startsWith(g.base)) setCookies.push(...res.headers.getSetCookie())
    return res
  }
  const clientId = await register(g.base)
  const { challenge } = pkce()
  const cb = await agent.follow(authorizeUrl(publicBase, clientId, challenge), CALLBACK)
  t.type(cb.searchParams.get('code'), 'string')
  t.equal(agent.consentPages, 1)
  const csrf = setCookies.find(c => /^__Host-mcp_facade_csrf=[^;]+;/.test(c))
  const remember = setCookies.find(c => /^__Host-mcp_facade_consent=[^;]+;/.test(c))
  for (const [name, c] of [
    ['csrf', csrf],
    ['remember', remember],
  ] as const) {
    t.ok(c, `${name} cookie set with the __Host- prefix`)
    const attrs = (c ?? '')
      .split(';')
      .slice(1)
      .map(a => a.trim().toLowerCase())
    t.ok(attrs.includes('secure'), `${name}: Secure`)
    t.ok(attrs.includes('httponly'), `${name}: HttpOnly`)
    t.ok(attrs.includes('samesite=lax'), `${name}: SameSite=Lax`)
    t.ok(attrs.includes('path=/'), `${name}: Path=/`)
    t.notOk(
      attrs.some(a => a.startsWith('domain=')),
      `${name}: no Domain`
    )
  }
  // Remembered through the prefixed cookie.
  await agent.follow(authorizeUrl(publicBase, clientId, challenge), CALLBACK)
  t.equal(agent.consentPages, 1, 'the __Host- remember cookie is read back')
})

t.test('CIMD address check: IPv6 forms carrying a private IPv4 address are refused (no connection is made)', async t => {
  for (const address of [
    '::127.0.0.1',
    '::7f00:1',
    '::a00:1',
    '::ffff:0:7f00:1',
    '::ffff:0:a00:1',
    '::ffff:0:10.0.0.1',
    '::ffff:7f00:1',
    '::ffff:127.0.0.1',
    '64:ff9b::7f00:1',
    '64:ff9b::a00:1',
    '64:ff9b::10.0.0.1',
    '::',
    '::1',
    '0:0:0:0:0:0:a9fe:a9fe',
    '::ffff:0:a9fe:a9fe',
  ]) {
    t.equal(addressAllowed(address, false), false, `${address} refused`)
  }
  for (const address of ['93.184.215.14', '::5db8:d70e', '::ffff:5db8:d70e', '::ffff:0:5db8:d70e', '2606:2800:21f:cb07:6820:80da:af6b:8b2c']) {
    t.equal(addressAllowed(address, false), true, `${address} (public) allowed`)
  }
  // A name resolving (injected lookup) to those forms: refused before any request is opened.
  for (const address of ['::7f00:1', '::ffff:0:7f00:1', '::ffff:0:a00:1', '64:ff9b::a00:1']) {
    let requests = 0
    const resolver = new CimdResolver(
      {
        timeoutMs: 1000,
        maxBytes: 4096,
        maxCacheSeconds: 0,
        defaultCacheSeconds: 0,
        maxEntries: 10,
        testOnlyAllowLoopback: false,
        maxFetchesPerAddress: 10,
        maxFetchesPerMinute: 10,
        maxConcurrentFetches: 4,
        maxConcurrentFetchesPerAddress: 2,
      },
      {
        lookup: async host => {
          t.equal(host, 'cimd.example', 'the name is resolved')
          return [{ address, family: 6 }]
        },
        request: (() => {
          requests++
          throw new Error('no request may be opened')
        }) as never,
      }
    )
    await t.rejects(resolver.resolve('https://cimd.example/client.json', '192.0.2.1'), /private or reserved/, `${address}: refused`)
    t.equal(requests, 0, `${address}: no request opened`)
  }
})

t.test('CIMD fetches: bounded per client address (per minute and in flight); the client is told no reason', async t => {
  const cimd = await cimdServer(t)
  const { g } = await ossSetup(
    t,
    {
      keys: [FACADE_KEY],
      cimd: { testOnlyAllowLoopback: true, testOnlyCa: cimd.cert, timeoutMs: 3000 },
    },
    { trustedProxies: ['127.0.0.1'] }
  )
  const { challenge } = pkce()
  const open = (id: string, from: string) => fetch(authorizeUrl(g.base, id, challenge), { redirect: 'manual', headers: { 'x-forwarded-for': from } })
  const answers: Array<{ status: number; text: string; retryAfter: string | null }> = []
  // The defaults (schema.json): 10 fetches a minute per address, 2 in flight.
  for (let i = 1; i <= 11; i++) {
    const res = await open(`${cimd.origin}/missing-${i}.json`, '198.51.100.20')
    answers.push({ status: res.status, text: await res.text(), retryAfter: res.headers.get('retry-after') })
  }
  t.same(
    answers.map(a => a.status),
    [...new Array(10).fill(400), 429],
    'ten fetches a minute for one address, then 429'
  )
  t.ok(Number(answers[10]!.retryAfter) >= 1, 'with Retry-After')
  t.equal(cimd.requests.length, 10, 'the eleventh URL was never fetched')
  for (const a of answers.slice(0, 10)) {
    t.match(a.text, /could not be used/, 'a generic reason')
    t.notMatch(a.text, /404|answered|resolve|fetch/, 'nothing about what the URL answered')
  }
  t.match(g.logText(), /client metadata document answered 404/, 'the detail is in the log')
  const other = await open(`${cimd.origin}/missing-12.json`, '198.51.100.21')
  t.equal(other.status, 400, 'another address is not limited by the first')
  await other.arrayBuffer()

  // In flight: two hanging fetches for one address, then a third is refused at once.
  // A barrier: both hanging requests have reached the document server.
  let arrived = 0
  let bothArrived: () => void = () => {}
  const both = new Promise<void>(resolve => {
    bothArrived = resolve
  })
  const hang = () => {
    if (++arrived === 2) bothArrived()
    return { hang: true }
  }
  cimd.docs.set('/hang-1.json', hang)
  cimd.docs.set('/hang-2.json', hang)
  const seen = cimd.requests.length
  const hanging = [open(`${cimd.origin}/hang-1.json`, '198.51.100.30'), open(`${cimd.origin}/hang-2.json`, '198.51.100.30')]
  await both
  const third = await open(`${cimd.origin}/missing-13.json`, '198.51.100.30')
  t.equal(third.status, 429, 'a third concurrent fetch for the address: 429')
  await third.arrayBuffer()
  t.equal(cimd.requests.length, seen + 2, 'and not fetched')
  for (const res of await Promise.all(hanging)) {
    t.equal(res.status, 400, 'the hanging ones time out')
    t.match(await res.text(), /could not be used/)
  }
})

t.test('workers: 2 (real CLI): a refresh token is single-use and the registration limit one bucket across the workers', async t => {
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const idp = await devIdpFor(t, () => [`${base}/oauth/callback`], { rotateRefreshTokens: false })
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  trustedProxies: [127.0.0.1]',
      '  targets:',
      `    - { name: everything, stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] } }`,
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      `      issuer: ${idp.issuer}`,
      `      audiences: [${idp.clientId}]`,
      `      clientId: ${idp.clientId}`,
      '      provider: { oss_idp: {} }',
      `      resourceMetadata: { resource: ${base}/mcp, scopesSupported: [openid, profile] }`,
      `      facade: { keys: [{ kid: ${FACADE_KEY.kid}, secret: ${FACADE_KEY.secret} }] }`,
      'admin: { enabled: false }',
      'workers: 2',
    ].join('\n'),
    'mcpp-facade-workers-'
  )
  const cli = spawnCli(['-f', file])
  t.teardown(async () => {
    if (cli.child.exitCode === null) cli.child.kill('SIGTERM')
    await cli.exited
  })
  await waitForPort(port, cli.exited)
  // Every request on a fresh connection: the primary spreads them over both workers.
  const form = async (body: Record<string, string>) => {
    const res = await freshFetch(`${base}/oauth/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(body).toString(),
    })
    return { status: res.status, body: (await res.json()) as Record<string, unknown> }
  }
  const reg = async (forwardedFor?: string) => {
    const res = await freshFetch(`${base}/.well-known/oauth-authorization-server/client-registration`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(forwardedFor !== undefined ? { 'x-forwarded-for': forwardedFor } : {}) },
      body: JSON.stringify({ redirect_uris: [CALLBACK] }),
    })
    return { status: res.status, body: (await res.json()) as Record<string, unknown> }
  }
  const clientId = (await reg()).body.client_id as string
  t.type(clientId, 'string')
  const { cb, verifier } = await authorizeFlow(base, clientId)
  const tokens = await form({
    grant_type: 'authorization_code',
    code: cb.searchParams.get('code')!,
    client_id: clientId,
    redirect_uri: CALLBACK,
    code_verifier: verifier,
  })
  t.equal(tokens.status, 200, 'code redeemed')
  const rt1 = tokens.body.refresh_token as string
  const rotated = await form({ grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })
  t.equal(rotated.status, 200, 'the first use rotates')
  const replays = await Promise.all([1, 2, 3, 4].map(() => form({ grant_type: 'refresh_token', refresh_token: rt1, client_id: clientId })))
  t.same(
    replays.map(r => r.status),
    [400, 400, 400, 400],
    'the used token is refused on every worker'
  )
  const newest = await form({ grant_type: 'refresh_token', refresh_token: rotated.body.refresh_token as string, client_id: clientId })
  t.equal(newest.status, 400, "the family's newest token is revoked")

  const statuses: number[] = []
  for (let i = 0; i < 30; i++) statuses.push((await reg('203.0.113.77')).status)
  // Each worker alone would allow 20 (30 spread over two is about 15 each): one bucket for the address.
  t.ok(
    statuses.slice(0, 20).every(s => s === 201),
    'twenty from one address'
  )
  t.ok(statuses.includes(429), 'then limited across the workers')
})
