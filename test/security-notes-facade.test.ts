/**
 * README "Security notes", OAuth facade limits (issue 22 item 18), from the
 * outside: a whole gateway with the facade in front of the real development
 * IdP, a browser stand-in, real sockets. The used-code limit when full (503,
 * never a replay); expired state, code and refresh token; the 64 KiB token and
 * consent body caps; a CIMD client id whose name resolves to loopback;
 * `consent.rememberSeconds: 0`.
 *
 * Expiry uses a test clock, not sleeps: the gateway runs in this process, and
 * `Date.now` is moved forward past a lifetime for the one request that checks
 * it, then put back.
 */
import t from 'tap'
import type { Test } from 'tap'
import { createServer as createTcpServer, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import {
  ossSetup,
  facadeGateway,
  ossAuth,
  devIdpFor,
  cimdServer,
  Agent,
  FACADE_KEY,
  CALLBACK,
  pkce,
  register,
  authorizeUrl,
  redeem,
  type FacadeGateway,
} from './helpers/facade.ts'
import { freePort } from './helpers/cli.ts'

/** Runs `fn` with the process clock `seconds` ahead; the clock is put back whatever happens. */
async function later<T>(seconds: number, fn: () => Promise<T>): Promise<T> {
  const real = Date.now
  Date.now = () => real() + seconds * 1000
  try {
    return await fn()
  } finally {
    Date.now = real
  }
}

async function codeFor(g: FacadeGateway, clientId: string, agent = new Agent()): Promise<{ code: string; verifier: string }> {
  const { verifier, challenge } = pkce()
  const cb = await agent.follow(authorizeUrl(g.base, clientId, challenge), CALLBACK)
  const code = cb.searchParams.get('code')
  if (code === null) throw new Error(`no code: ${cb.search}`)
  return { code, verifier }
}

const codeForm = (clientId: string, c: { code: string; verifier: string }) => ({
  grant_type: 'authorization_code',
  code: c.code,
  client_id: clientId,
  redirect_uri: CALLBACK,
  code_verifier: c.verifier,
})

t.test('maxUsedCodes full: a new code gets 503 temporarily_unavailable and a used one is never accepted again', async t => {
  const { g } = await ossSetup(t, { keys: [FACADE_KEY], maxUsedCodes: 100 })
  const clientId = await register(g.base)
  const agent = new Agent()
  const first = await codeFor(g, clientId, agent)
  t.equal((await redeem(g.base, codeForm(clientId, first))).status, 200, 'the first code is redeemed')
  const replay = await redeem(g.base, codeForm(clientId, first))
  t.equal(replay.body.error, 'invalid_grant', 'while there is room, a replay is invalid_grant')
  // 99 more redeemed codes fill the memory of 100 (the schema's minimum).
  // Three browsers side by side (one IdP session each), 33 flows apiece.
  const lane = async (browser: Agent): Promise<number> => {
    let ok = 0
    for (let i = 0; i < 33; i++) if ((await redeem(g.base, codeForm(clientId, await codeFor(g, clientId, browser)))).status === 200) ok++
    return ok
  }
  const lanes = await Promise.all([agent, new Agent(), new Agent()].map(lane))
  t.equal(1 + lanes.reduce((a, b) => a + b, 0), 100, 'a hundred codes redeemed')
  const next = await codeFor(g, clientId, agent)
  const full = await redeem(g.base, codeForm(clientId, next))
  t.equal(full.status, 503, 'full: a new code is refused')
  t.equal(full.body.error, 'temporarily_unavailable')
  t.notOk('access_token' in full.body)
  const replayFull = await redeem(g.base, codeForm(clientId, first))
  t.not(replayFull.status, 200, 'full: a used code is still not accepted')
  t.notOk('access_token' in replayFull.body)
})

t.test('expired state, code and refresh token are refused; the same ones before their time pass', async t => {
  const { g } = await ossSetup(t, { keys: [FACADE_KEY], stateTtlSeconds: 60, codeTtlSeconds: 10, refreshTokenTtlSeconds: 300 })
  const clientId = await register(g.base)
  const agent = new Agent()

  t.test('state (stateTtlSeconds)', async t => {
    const { challenge } = pkce()
    const res = await fetch(authorizeUrl(g.base, clientId, challenge), { redirect: 'manual' })
    const state = new URL(res.headers.get('location')!).searchParams.get('state')!
    const callback = `${g.base}/oauth/callback?code=not-a-real-code&state=${encodeURIComponent(state)}`
    const expired = await later(61, () => fetch(callback, { redirect: 'manual' }))
    t.equal(expired.status, 400, 'past stateTtlSeconds: an error page')
    t.equal(expired.headers.get('location'), null, 'never a redirect')
    t.match(await expired.text(), /invalid or has expired/)
    t.match(g.logText(), /"reason":"state has expired"[^\n]*callback refused: state/, 'logged as expired')
    t.notMatch(g.logText(), /"grantType":"authorization_code"/, 'the IdP code was not redeemed')
    // Control: the same state in time is accepted (the made-up IdP code is then refused by the IdP).
    const inTime = await fetch(callback, { redirect: 'manual' })
    t.equal(inTime.status, 302)
    t.equal(new URL(inTime.headers.get('location')!).searchParams.get('error'), 'server_error')
    t.match(g.logText(), /"grantType":"authorization_code"/, 'in time, the IdP code went to the IdP')
  })

  t.test('code (codeTtlSeconds)', async t => {
    const c = await codeFor(g, clientId, agent)
    const expired = await later(11, () => redeem(g.base, codeForm(clientId, c)))
    t.equal(expired.status, 400, 'past codeTtlSeconds')
    t.equal(expired.body.error, 'invalid_grant')
    t.match(expired.body.error_description, /expired/)
    const inTime = await redeem(g.base, codeForm(clientId, c))
    t.equal(inTime.status, 200, 'the same code in time is redeemed')
  })

  t.test('refresh token (refreshTokenTtlSeconds)', async t => {
    const c = await codeFor(g, clientId, agent)
    const tokens = await redeem(g.base, codeForm(clientId, c))
    const refreshToken = tokens.body.refresh_token
    t.type(refreshToken, 'string', 'a refresh token was issued')
    const form = { grant_type: 'refresh_token', refresh_token: refreshToken as string, client_id: clientId }
    const expired = await later(301, () => redeem(g.base, form))
    t.equal(expired.status, 400, 'past refreshTokenTtlSeconds')
    t.equal(expired.body.error, 'invalid_grant')
    t.match(expired.body.error_description, /expired/)
    const inTime = await redeem(g.base, form)
    t.equal(inTime.status, 200, 'the same refresh token in time is accepted')
  })

  t.test('after all that, the sealing key is in no log line', async t => {
    t.notOk(g.logText().includes(FACADE_KEY.secret))
  })
})

/** Posts `bytes` bytes of form body; answers the status and the JSON or text body. */
async function postForm(url: string, bytes: number, extra: Record<string, string> = {}): Promise<{ status: number; text: string }> {
  const head = new URLSearchParams(extra).toString()
  const prefix = head === '' ? 'pad=' : `${head}&pad=`
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: prefix + 'x'.repeat(bytes - prefix.length),
    redirect: 'manual',
  })
  return { status: res.status, text: await res.text() }
}

t.test('token and consent bodies are capped at 64 KiB: 413 beyond, read and judged at the cap', async t => {
  const { g } = await ossSetup(t)
  const clientId = await register(g.base)
  for (const path of ['/oauth/token', '/oauth/consent']) {
    const over = await postForm(`${g.base}${path}`, 64 * 1024 + 1, { grant_type: 'authorization_code', client_id: clientId, code: 'x' })
    t.equal(over.status, 413, `${path}: 64 KiB + 1 byte`)
    const at = await postForm(`${g.base}${path}`, 64 * 1024, { grant_type: 'authorization_code', client_id: clientId, code: 'x' })
    t.equal(at.status, 400, `${path}: exactly 64 KiB is read and refused on its merits`)
  }
})

/** A TCP listener on 127.0.0.1 that counts the connections it gets. */
async function listener(t: Test): Promise<{ port: number; connections: () => number }> {
  let count = 0
  const sockets: Socket[] = []
  const server = createTcpServer(s => {
    count++
    sockets.push(s)
    s.destroy()
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      })
  )
  return { port: (server.address() as AddressInfo).port, connections: () => count }
}

t.test('a CIMD client_id whose name resolves to loopback is refused before any connection', async t => {
  const target = await listener(t)
  const { g } = await ossSetup(t)
  const { challenge } = pkce()
  const clientId = `https://localhost:${target.port}/client.json`
  const res = await fetch(authorizeUrl(g.base, clientId, challenge), { redirect: 'manual' })
  t.equal(res.status, 400)
  t.equal(res.headers.get('location'), null, 'an error page, never a redirect')
  const page = await res.text()
  t.match(page, /could not be used/, 'the client is told only that the document could not be used')
  t.notMatch(page, /private or reserved/, 'the reason is not on the page (no oracle)')
  t.match(g.logText(), /private or reserved/, 'the reason is in the log')
  t.equal(target.connections(), 0, 'no connection reached the listener behind the name')
  // Control: with the test-only loopback switch the same client id does reach the listener.
  const port = await freePort()
  const idp = await devIdpFor(t, () => [`http://127.0.0.1:${port}/oauth/callback`])
  const open = await facadeGateway(t, ossAuth(idp, { keys: [FACADE_KEY], cimd: { testOnlyAllowLoopback: true, timeoutMs: 2000 } }), { port })
  const reached = await fetch(authorizeUrl(open.base, clientId, challenge), { redirect: 'manual' })
  t.equal(reached.status, 400)
  await reached.text()
  t.ok(target.connections() > 0, 'the control reaches the listener: the refusal above is the name check')
})

t.test('consent.rememberSeconds 0: consent is asked every time, no remember cookie', async t => {
  const { g } = await ossSetup(t, { keys: [FACADE_KEY], consent: { rememberSeconds: 0 } })
  const clientId = await register(g.base)
  const agent = new Agent()
  for (let i = 1; i <= 3; i++) {
    const c = await codeFor(g, clientId, agent)
    t.equal(agent.consentPages, i, `flow ${i}: consent asked`)
    t.equal((await redeem(g.base, codeForm(clientId, c))).status, 200)
  }
  const gatewayCookies = [...(agent.jar.get(new URL(g.base).origin)?.keys() ?? [])]
  t.same(gatewayCookies, [], 'nothing remembered in a cookie')
})

t.test('CIMD cache bounds: maxCacheSeconds caps max-age, no-store is fetched every time, maxEntries evicts', async t => {
  const cimd = await cimdServer(t)
  const { g } = await ossSetup(t, { keys: [FACADE_KEY], cimd: { testOnlyAllowLoopback: true, testOnlyCa: cimd.cert, maxCacheSeconds: 60, maxEntries: 2 } })
  const doc = (cacheControl: string) => (u: string) => ({
    headers: { 'cache-control': cacheControl },
    body: JSON.stringify({ client_id: u, client_name: 'cached', redirect_uris: [CALLBACK] }),
  })
  for (const name of ['a', 'b', 'c']) cimd.docs.set(`/${name}.json`, doc('max-age=86400'))
  cimd.docs.set('/ns.json', doc('no-store'))
  const { challenge } = pkce()
  const authorize = async (name: string): Promise<void> => {
    const res = await fetch(authorizeUrl(g.base, `${cimd.origin}/${name}.json`, challenge), { redirect: 'manual' })
    await res.text()
    if (res.status !== 302) throw new Error(`${name}: ${res.status}`)
  }
  const fetches = (name: string) => cimd.requests.filter(r => r === `/${name}.json`).length
  await authorize('a')
  await authorize('a')
  t.equal(fetches('a'), 1, 'max-age: the second authorize uses the cached document')
  await later(61, () => authorize('a'))
  t.equal(fetches('a'), 2, 'past maxCacheSeconds (60) the document is fetched again, whatever its max-age (one day)')
  await authorize('ns')
  await authorize('ns')
  t.equal(fetches('ns'), 2, 'no-store: fetched every time')
  await authorize('b')
  await authorize('c')
  await authorize('a')
  t.equal(fetches('a'), 3, 'maxEntries 2: after b and c, a was forgotten')
  await authorize('c')
  t.equal(fetches('c'), 1, 'the most recent entry is still cached')
})

t.test('facade registration limits: maxBodyBytes 16384 (413), maxRedirectUris 10 and maxRedirectUriLength 1024 (400 invalid_redirect_uri)', async t => {
  const { g } = await ossSetup(t)
  const registerRaw = async (body: string): Promise<{ status: number; body: Record<string, unknown> }> => {
    const res = await fetch(`${g.base}/.well-known/oauth-authorization-server/client-registration`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    })
    const text = await res.text()
    return { status: res.status, body: text.startsWith('{') ? (JSON.parse(text) as Record<string, unknown>) : {} }
  }
  const client = (uris: string[], extra: Record<string, unknown> = {}) =>
    JSON.stringify({ client_name: 'limits', redirect_uris: uris, token_endpoint_auth_method: 'none', ...extra })
  const uri = (i: number) => `http://127.0.0.1:53682/callback/${i}`
  const ten = Array.from({ length: 10 }, (_, i) => uri(i))
  t.equal((await registerRaw(client(ten))).status, 201, '10 redirect URIs pass')
  const eleven = await registerRaw(client([...ten, uri(10)]))
  t.equal(eleven.status, 400, '11 redirect URIs')
  t.equal(eleven.body.error, 'invalid_redirect_uri')
  const base = 'http://127.0.0.1:53682/'
  t.equal((await registerRaw(client([base + 'a'.repeat(1024 - base.length)]))).status, 201, 'a 1024-character redirect URI passes')
  const long = await registerRaw(client([base + 'a'.repeat(1025 - base.length)]))
  t.equal(long.status, 400, 'a 1025-character redirect URI')
  t.equal(long.body.error, 'invalid_redirect_uri')
  const big = await registerRaw(client([uri(0)], { pad: 'x'.repeat(16384) }))
  t.equal(big.status, 413, 'a body over 16384 bytes')
})
