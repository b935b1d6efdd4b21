/**
 * mcpAuthentication against the real development OpenID provider
 * (oidc-provider, oss_idp-like): every 401 case, modes, the token cache,
 * header removal, protected resource metadata and the key-set drills.
 */
import t from 'tap'
import type * as Tap from 'tap'
import { Agent, createServer, request as httpRequest } from 'node:http'
import { createHash, randomBytes, randomUUID, createPublicKey } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { generateKeyPair, exportJWK, CompactSign, type CryptoKey, type JWK } from 'jose'
import { devIdp, authGateway, ossOptions, BASE } from './helpers/idp.ts'
import { startEntraEmulator, type EntraEmulator } from './helpers/entra-emulator.ts'
import { TokenCache } from '../plugins/mcp-authentication/token-cache.ts'
import { mcpAuthenticationModule } from '../plugins/mcp-authentication/index.ts'
import { until } from './helpers/gateway-harness.ts'

const PRM_URL = `${BASE}/.well-known/oauth-protected-resource/mcp`
const CHALLENGE = `Bearer resource_metadata="${PRM_URL}", scope="openid profile"`

async function call(
  url: string,
  token?: string,
  headers: Record<string, string> = {}
): Promise<{ status: number; headers: Headers; body: Record<string, unknown>; text: string }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(token === undefined ? {} : { authorization: `Bearer ${token}` }), ...headers },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  const text = await res.text()
  let body: Record<string, unknown> = {}
  try {
    body = JSON.parse(text) as Record<string, unknown>
  } catch {}
  return { status: res.status, headers: res.headers, body, text }
}

/** A raw request that can send the same header twice. */
function rawPost(url: string, rawHeaders: string[]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const body = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
    const headers = ['host', new URL(url).host, 'content-type', 'application/json', 'content-length', String(body.length), ...rawHeaders]
    const req = httpRequest(url, { method: 'POST', headers: headers as unknown as Record<string, string> }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', c => {
        text += c
      })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url')

async function authCodeToken(idp: Awaited<ReturnType<typeof devIdp>>): Promise<string> {
  const verifier = randomBytes(32).toString('base64url')
  const redirect = 'http://127.0.0.1:1/callback'
  const u = new URL(idp.authorizationEndpoint)
  u.search = new URLSearchParams({
    response_type: 'code',
    client_id: idp.clientId,
    redirect_uri: redirect,
    scope: 'openid profile',
    state: 's1',
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
    resource: `${BASE}/mcp`,
  }).toString()
  const res = await fetch(u, { redirect: 'manual' })
  const loc = new URL(res.headers.get('location') ?? '')
  const code = loc.searchParams.get('code')
  if (code === null) throw new Error(`no code in ${loc.origin}${loc.pathname}: ${loc.searchParams.get('error')}`)
  const tok = await fetch(idp.tokenEndpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: redirect, client_id: idp.clientId, code_verifier: verifier }),
  })
  const body = (await tok.json()) as { access_token: string }
  return body.access_token
}

t.test('strict mode against the dev IdP', async t => {
  const idp = await devIdp(t)
  const gw = await authGateway(t, ossOptions(idp, { keySet: { cooldownSeconds: 600 } }))
  const now = Math.floor(Date.now() / 1000)

  t.test('missing token: 401 with the SPEC body and challenge', async t => {
    const r = await call(gw.url)
    t.equal(r.status, 401)
    t.same(r.body, { error: 'unauthorized', error_description: 'JWT token required' })
    t.equal(r.headers.get('www-authenticate'), CHALLENGE)
    const basic = await call(gw.url, undefined, { authorization: 'Basic YWxpY2U6cHc=' })
    t.equal(basic.status, 401, 'another scheme counts as no bearer token')
    t.equal(basic.body.error_description, 'JWT token required')
  })

  t.test('tokens from real flows are accepted', async t => {
    const cc = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
    const r1 = await call(gw.url, cc)
    t.equal(r1.status, 200)
    t.same(r1.body, { subject: 'mcp-service', groups: ['mcp-users'] })
    const code = await authCodeToken(idp)
    const r2 = await call(gw.url, code)
    t.equal(r2.status, 200)
    t.same(r2.body, { subject: 'alice', groups: ['mcp-users'] })
    const lower = await call(gw.url, undefined, { authorization: `bEaReR ${cc}` })
    t.equal(lower.status, 200, 'the scheme is case-insensitive')
  })

  t.test('aud array with one accepted value', async t => {
    const r = await call(gw.url, await idp.mintToken({ sub: 'u1', aud: ['other-api', idp.clientId] }))
    t.equal(r.status, 200)
  })

  t.test('every bad token gets 401 invalid_token without echoing the token', async t => {
    const jku = createServer((_req, res) => {
      jkuHits++
      res.end('{"keys":[]}')
    })
    let jkuHits = 0
    await new Promise<void>(resolve => jku.listen(0, '127.0.0.1', resolve))
    t.teardown(() => new Promise<void>(resolve => jku.close(() => resolve())))
    const jkuUrl = `http://127.0.0.1:${(jku.address() as AddressInfo).port}/jwks`

    const attacker = await generateKeyPair('RS256', { extractable: true })
    const attackerJwk: JWK = await exportJWK(attacker.publicKey)
    const jwks = (await (await fetch(idp.jwksUrl)).json()) as { keys: JWK[] }
    const pem = createPublicKey({ key: jwks.keys[0] as never, format: 'jwk' }).export({ type: 'spki', format: 'pem' }) as string
    const good = { sub: 'u1' }
    const payload = b64({ iss: idp.issuer, aud: idp.clientId, sub: 'u1', exp: now + 600 })

    const cases: Array<[string, string, string?]> = [
      ['garbage', 'not-a-jwt', 'malformed token'],
      ['two segments', `${b64({ alg: 'RS256' })}.${payload}`, 'malformed token'],
      ['four segments', `${await idp.mintToken(good)}.AAAA`, 'malformed token'],
      ['alg none, empty signature', `${b64({ alg: 'none', typ: 'JWT' })}.${payload}.`],
      ['alg HS256 with the RSA public key as secret', await idp.mintToken(good, { alg: 'HS256', key: Buffer.from(pem) }), 'token algorithm not accepted'],
      ['embedded jwk header', await idp.mintToken(good, { key: attacker.privateKey, kid: null, header: { jwk: attackerJwk } }), 'token header not accepted'],
      ['jku header', await idp.mintToken(good, { key: attacker.privateKey, kid: 'attacker', header: { jku: jkuUrl } }), 'token header not accepted'],
      ['x5u header', await idp.mintToken(good, { key: attacker.privateKey, kid: 'attacker', header: { x5u: jkuUrl } }), 'token header not accepted'],
      ['x5c header', await idp.mintToken(good, { key: attacker.privateKey, kid: 'attacker', header: { x5c: ['MIIB'] } }), 'token header not accepted'],
      ['unknown kid', await idp.mintToken(good, { key: attacker.privateKey, kid: randomUUID() }), 'token signing key not found'],
      ['wrong signature', await idp.mintToken(good, { key: attacker.privateKey }), 'token signature invalid'],
      ['expired', await idp.mintToken({ sub: 'u1', iat: now - 7200, exp: now - 3600 }), 'token expired'],
      ['nbf in the future', await idp.mintToken({ sub: 'u1', nbf: now + 3600 }), 'token not yet valid'],
      ['no exp', await idp.mintToken({ sub: 'u1', iss: idp.issuer, aud: idp.clientId }, { defaults: false }), 'token has no valid expiry'],
      ['iss without the trailing slash', await idp.mintToken({ sub: 'u1', iss: idp.issuer.slice(0, -1) }), 'token issuer not accepted'],
      ['iss with an extra trailing slash', await idp.mintToken({ sub: 'u1', iss: idp.issuer + '/' }), 'token issuer not accepted'],
      ['another issuer', await idp.mintToken({ sub: 'u1', iss: 'https://evil.example/application/o/mcp/' }), 'token issuer not accepted'],
      ['wrong aud', await idp.mintToken({ sub: 'u1', aud: 'another-client' }), 'token audience not accepted'],
      ['aud array without an accepted value', await idp.mintToken({ sub: 'u1', aud: ['a', 'b'] }), 'token audience not accepted'],
    ]
    for (const casing of ['none', 'None', 'NONE', 'nOnE']) {
      cases.push([`alg ${casing} with a signature`, `${b64({ alg: casing, typ: 'JWT' })}.${payload}.c2ln`, 'token algorithm not accepted'])
    }
    for (const [name, token, description] of cases) {
      const r = await call(gw.url, token)
      t.equal(r.status, 401, `${name}: 401`)
      t.equal(r.body.error, 'invalid_token', `${name}: invalid_token`)
      if (description !== undefined) t.equal(r.body.error_description, description, `${name}: description`)
      t.equal(
        r.headers.get('www-authenticate'),
        `${CHALLENGE}, error="invalid_token", error_description="${r.body.error_description as string}"`,
        `${name}: challenge`
      )
      t.notOk(r.text.includes(token.slice(0, 40)) && token.length > 20, `${name}: token not echoed`)
    }
    t.equal(jkuHits, 0, 'no request ever went to the jku/x5u URL')
    t.notOk(gw.logText().includes(cases[10]![1].split('.')[2]!), 'no token signature in the logs')
    t.ok(gw.metrics.counter('mcp_proxy_auth_failures_total', '').get({ reason: 'expired' }) >= 1, 'failures counted by reason')
  })

  t.test('query tokens and duplicate Authorization headers: 400', async t => {
    const token = await idp.mintToken({ sub: 'u1' })
    const q = await call(`${gw.url}?access_token=${token}`)
    t.equal(q.status, 400)
    t.equal(q.body.error, 'invalid_request')
    const dup = await rawPost(gw.url, ['authorization', `Bearer ${token}`, 'authorization', `Bearer ${token}`])
    t.equal(dup.status, 400)
    t.equal(JSON.parse(dup.body).error, 'invalid_request')
  })

  t.test('the Authorization header is removed before the endpoint', async t => {
    const r = await call(gw.url, await idp.mintToken({ sub: 'strip-me' }))
    t.equal(r.status, 200)
    t.same(gw.lastSeen(), { authorization: undefined, rawAuthorization: false, subject: 'strip-me' })
  })

  t.test('token cache: a repeat skips verification, one byte different does not', async t => {
    const token = await idp.mintToken({ sub: 'cached' })
    const before = (gw.auth.describe?.() as { verifications: number }).verifications
    t.equal((await call(gw.url, token)).status, 200)
    t.equal((await call(gw.url, token)).status, 200)
    const after = gw.auth.describe?.() as { verifications: number; tokenCache: { hits: number } }
    t.equal(after.verifications, before + 1, 'verified once')
    t.ok(after.tokenCache.hits >= 1)
    // One character inside the signature (the last base64url character may carry only padding bits).
    const i = token.length - 10
    const altered = token.slice(0, i) + (token[i] === 'A' ? 'B' : 'A') + token.slice(i + 1)
    const r = await call(gw.url, altered)
    t.equal(r.status, 401, 'a token differing in one byte is verified (and fails)')
    t.equal((gw.auth.describe?.() as { verifications: number }).verifications, before + 2)
  })

  t.test('protected resource metadata', async t => {
    for (const path of ['/.well-known/oauth-protected-resource/mcp', '/.well-known/oauth-protected-resource']) {
      const res = await fetch(gw.origin + path)
      t.equal(res.status, 200)
      t.equal(res.headers.get('access-control-allow-origin'), '*')
      t.same(await res.json(), {
        resource: `${BASE}/mcp`,
        authorization_servers: [`${BASE}/mcp`],
        mcp_protocol_version: '2025-06-18',
        resource_type: 'mcp-server',
        bearer_methods_supported: ['header'],
        scopes_supported: ['openid', 'profile'],
      })
    }
  })

  t.test('describe and ready carry no secrets', async t => {
    t.same(gw.auth.ready?.(), { ready: true })
    const d = gw.auth.describe?.() as { keySet: { kids: string[]; url: string } }
    t.equal(d.keySet.url, idp.jwksUrl, 'oss_idp key set at {issuer}jwks/')
    t.ok(d.keySet.kids.includes(idp.currentKid))
  })
})

t.test('optional and permissive modes', async t => {
  const idp = await devIdp(t)
  const optional = await authGateway(t, ossOptions(idp, { mode: 'optional' }))
  const permissive = await authGateway(t, ossOptions(idp, { mode: 'permissive' }))
  const good = await idp.mintToken({ sub: 'u2' })
  const bad = await idp.mintToken({ sub: 'u2', aud: 'nope' })

  const o1 = await call(optional.url)
  t.equal(o1.status, 200, 'optional: a missing token passes')
  t.same(o1.body.subject, null)
  t.equal((await call(optional.url, bad)).status, 401, 'optional: a bad token is rejected')
  t.same((await call(optional.url, good)).body.subject, 'u2')

  t.equal((await call(permissive.url)).status, 200)
  const p2 = await call(permissive.url, bad)
  t.equal(p2.status, 200, 'permissive: a bad token passes')
  t.same(p2.body.subject, null, 'without claims')
  t.same((await call(permissive.url, good)).body.subject, 'u2', 'verified claims are passed on')
  t.equal(permissive.lastSeen()?.authorization, undefined, 'header removed in permissive mode too')
})

t.test('token cache disabled: every request is verified', async t => {
  const idp = await devIdp(t)
  const gw = await authGateway(t, ossOptions(idp, { tokenCache: { enabled: false } }))
  const token = await idp.mintToken({ sub: 'u3' })
  await call(gw.url, token)
  await call(gw.url, token)
  t.equal((gw.auth.describe?.() as { verifications: number }).verifications, 2)
})

t.test('key set drills', async t => {
  t.test('unreachable at start: 503 with Retry-After and not ready, recovers', async t => {
    const idp = await devIdp(t)
    idp.setJwksAvailable(false)
    // The key set's clock, moved by the test (PluginEnv.now): no sleeping until the next fetch slot.
    let now = 1_000_000
    const gw = await authGateway(t, ossOptions(idp, { keySet: { cooldownSeconds: 1, retryAfterSeconds: 7 } }), undefined, undefined, { now: () => now })
    const ready = gw.auth.ready?.() as { ready: boolean; reason: string }
    t.equal(ready.ready, false)
    t.match(ready.reason, /signing keys not loaded: HTTP 503/)
    const r = await call(gw.url, await idp.mintToken({ sub: 'u4' }))
    t.equal(r.status, 503)
    t.equal(r.headers.get('retry-after'), '7')
    t.equal(r.body.error, 'temporarily_unavailable')
    t.equal((await call(gw.url)).status, 401, 'no token is still a 401 challenge')
    idp.setJwksAvailable(true)
    t.equal((await call(gw.url, await idp.mintToken({ sub: 'u4' }))).status, 503, 'the IdP is back, but the next fetch slot is not due yet')
    // Past the longest back-off (maxBackoffSeconds, 60 s by default): the background retries may have doubled the interval.
    now += 60_000
    t.equal((await call(gw.url, await idp.mintToken({ sub: 'u4' }))).status, 200, 'recovers at the next fetch slot once the key set is reachable')
    t.same(gw.auth.ready?.(), { ready: true })
  })

  t.test('unreachable after start: cached keys keep working', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp, { keySet: { cooldownSeconds: 600 } }))
    idp.setJwksAvailable(false)
    // An unknown kid forces a refetch, which fails: maybe a rotation the gateway cannot see, so 503, not 401 (issue 13 item 19).
    const attacker = await generateKeyPair('RS256')
    const unknown = await call(gw.url, await idp.mintToken({ sub: 'x' }, { key: attacker.privateKey, kid: 'new-kid' }))
    t.equal(unknown.status, 503)
    t.ok(unknown.headers.has('retry-after'))
    const d = gw.auth.describe?.() as { keySet: { lastError: string; loaded: boolean } }
    t.match(d.keySet.lastError, /HTTP 503/)
    t.equal(d.keySet.loaded, true)
    t.equal((await call(gw.url, await idp.mintToken({ sub: 'still-fine' }))).status, 200, 'last good keys are kept')
    t.same(gw.auth.ready?.(), { ready: true })
  })

  t.test('rotation: a new kid is accepted after one refetch; a flood of random kids causes no fetch storm', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp, { keySet: { cooldownSeconds: 600 } }))
    const start = idp.jwksRequests
    const kid = await idp.rotateKeys()
    const r = await call(gw.url, await idp.mintToken({ sub: 'rotated' }))
    t.equal(r.status, 200, 'token signed with the new key accepted')
    t.equal(idp.jwksRequests, start + 1, 'exactly one refetch')
    t.ok((gw.auth.describe?.() as { keySet: { kids: string[] } }).keySet.kids.includes(kid))
    const attacker = await generateKeyPair('RS256')
    const flood = await Promise.all(
      Array.from({ length: 40 }, async () => (await call(gw.url, await idp.mintToken({ sub: 'f' }, { key: attacker.privateKey, kid: randomUUID() }))).status)
    )
    t.ok(flood.every(s => s === 401))
    t.equal(idp.jwksRequests, start + 1, 'no fetch for random kids within the cooldown')
  })
})

t.test('token cache, per-connection memo: same token on the same connection, same expiry and key checks', async t => {
  const realNow = Date.now
  let now = realNow()
  Date.now = () => now
  t.teardown(() => {
    Date.now = realNow
  })
  const cache = new TokenCache(10, 300)
  const conn = {}
  const other = {}
  const auth = { subject: 's', claims: {}, expiresAt: Math.floor(now / 1000) + 60 }
  const token = 'aaa.bbb.ccc'
  let kidValid = true
  const validKid = (kid: string | undefined): boolean => kidValid && kid === 'k1'
  cache.set(token, auth, 'k1', conn)
  t.equal(cache.get(token, validKid, conn), auth, 'memo hit')
  t.equal(cache.get(token, validKid, other), auth, 'another connection: hash hit')
  t.equal(cache.get('aaa.bbb.ccd', validKid, conn), undefined, 'one byte different on the same connection: miss')
  t.equal(cache.get('aaa.bbb.cc', validKid, conn), undefined, 'a prefix on the same connection: miss')
  t.equal(cache.get(token, validKid, conn), auth, 'back to the memo (through the hash)')
  const small = new TokenCache(1, 300)
  small.set(token, auth, 'k1', conn)
  small.set('ddd.eee.fff', auth, 'k1', other)
  t.equal(small.size, 1)
  t.equal(small.get(token, validKid, other), undefined, 'evicted from the hashed entries')
  t.equal(small.get(token, validKid, conn), auth, 'still served by its connection memo, no hash needed')
  kidValid = false
  t.equal(cache.get(token, validKid, conn), undefined, 'a key gone from the key set: miss on the memo too')
  kidValid = true
  cache.set(token, auth, 'k1', conn)
  now += 61_000
  t.equal(cache.get(token, validKid, conn), undefined, 'expired: miss on the memo too')
  const hits = cache.hits
  now -= 61_000
  cache.set(token, auth, 'k1', conn)
  cache.clear()
  t.equal(cache.get(token, validKid, conn), undefined, 'clear() forgets the memo')
  t.equal(cache.hits, hits)
})

t.test('token cache: a keep-alive connection repeating its token is verified once', async t => {
  const idp = await devIdp(t)
  const gw = await authGateway(t, ossOptions(idp))
  const token = await idp.mintToken({ sub: 'memo' })
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => agent.destroy())
  const post = (tok: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const body = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
      const req = httpRequest(gw.url, { method: 'POST', agent, headers: { 'content-type': 'application/json', authorization: `Bearer ${tok}` } }, res => {
        res.resume()
        res.on('end', () => resolve(res.statusCode ?? 0))
      })
      req.on('error', reject)
      req.end(body)
    })
  const before = gw.auth.describe?.() as { verifications: number; tokenCache: { hits: number } }
  for (let i = 0; i < 3; i++) t.equal(await post(token), 200)
  const after = gw.auth.describe?.() as { verifications: number; tokenCache: { hits: number } }
  t.equal(after.verifications, before.verifications + 1)
  t.equal(after.tokenCache.hits, before.tokenCache.hits + 2)
  const i = token.length - 10
  t.equal(await post(token.slice(0, i) + (token[i] === 'A' ? 'B' : 'A') + token.slice(i + 1)), 401, 'one byte different on the same connection')
  t.equal(await post(token), 200)
  t.equal((gw.auth.describe?.() as { verifications: number }).verifications, before.verifications + 2)
})

/**
 * A key set server the test controls, and tokens signed with its keys from
 * raw JSON payloads, for the tokens no IdP mints: numbers that parse to
 * Infinity, claims nested thousands deep.
 */
interface OwnKeys {
  url: string
  fetches: () => number
  /** Signs `payload` (raw JSON text, sent as it is) with the current key. */
  signRaw: (payload: string, kid?: string) => Promise<string>
  /** Signs claims (with iss, aud, iat, exp defaults) with the current key. */
  sign: (claims: Record<string, unknown>, kid?: string) => Promise<string>
  /** A new key that becomes the signer; the old one stays in the set. */
  rotate: () => Promise<string>
  setAvailable: (up: boolean) => void
}

async function ownKeys(t: Tap.Test, issuer: string, audience: string): Promise<OwnKeys> {
  const keys: Array<{ kid: string; privateKey: CryptoKey; jwk: JWK }> = []
  const add = async (): Promise<string> => {
    const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true })
    const kid = randomUUID()
    keys.push({ kid, privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' } })
    return kid
  }
  await add()
  let up = true
  let fetches = 0
  const server = createServer((_req, res) => {
    fetches++
    if (!up) {
      res.writeHead(503).end()
      return
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: keys.map(k => k.jwk) }))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  const signRaw = (payload: string, kid?: string): Promise<string> => {
    const k = keys[keys.length - 1]!
    return new CompactSign(new TextEncoder().encode(payload)).setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: kid ?? k.kid }).sign(k.privateKey)
  }
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks/`,
    fetches: () => fetches,
    signRaw,
    sign: (claims, kid) => {
      const now = Math.floor(Date.now() / 1000)
      return signRaw(JSON.stringify({ iss: issuer, aud: audience, iat: now, exp: now + 600, client_id: audience, ...claims }), kid)
    },
    rotate: add,
    setAvailable: v => {
      up = v
    },
  }
}

t.test('issue 13 item 2: an ID token is not an access token', async t => {
  t.test('oss_idp: the ID token of a real code flow gets 401, its access token 200', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp))
    const { accessToken, idToken } = await authCodeTokens(idp)
    t.equal((await call(gw.url, accessToken)).status, 200, 'the access token (typ at+jwt) is accepted')
    const r = await call(gw.url, idToken)
    t.equal(r.status, 401, 'the ID token (same iss, aud and sub) is refused')
    t.equal(r.body.error, 'invalid_token')
    t.equal(r.body.error_description, 'token is not an access token')
    t.equal(
      (await call(gw.url, await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password'))).status,
      200,
      'client-credentials tokens still pass'
    )
    // An Authentik access token is its ID token plus azp and uid: azp tells them apart.
    t.equal(
      (await call(gw.url, await idp.mintToken({ sub: 'u1', azp: idp.clientId, uid: 'x' }, { header: { typ: 'JWT' } }))).status,
      200,
      'Authentik-shaped access token'
    )
    t.equal(
      (await call(gw.url, await idp.mintToken({ sub: 'u1', nonce: 'n', at_hash: 'h', azp: undefined }))).status,
      401,
      'an ID-token-shaped token is refused'
    )
    const off = await authGateway(t, ossOptions(idp, { rejectIdTokens: false }))
    t.equal((await call(off.url, idToken)).status, 200, 'rejectIdTokens: false turns the check off')
  })

  t.test("cloud_idp: the ID token for the gateway's own client gets 401; access tokens need scp or roles", async t => {
    const emu = await startEntraEmulator()
    t.teardown(() => emu.close())
    const gw = await authGateway(t, {
      mode: 'strict',
      issuer: emu.issuerV2,
      audiences: [emu.clientId, `api://${emu.clientId}`],
      provider: { cloud_idp: {} },
      clientId: emu.clientId,
      jwks: emu.jwksUrl,
      resourceMetadata: { resource: `${BASE}/mcp`, scopesSupported: emu.apiScopes as string[] },
    })
    const tokens = await entraCodeTokens(emu)
    t.ok(tokens.id_token !== undefined, 'the emulator issued an ID token')
    t.equal((await call(gw.url, tokens.access_token)).status, 200, 'the access token (scp, roles) is accepted')
    const r = await call(gw.url, tokens.id_token)
    t.equal(r.status, 401, 'ID token: aud = client id, v2 issuer, no scp, no roles')
    t.equal(r.body.error, 'invalid_token')
    t.equal(r.body.error_description, 'token is not an access token')
  })
})

async function authCodeTokens(idp: Awaited<ReturnType<typeof devIdp>>): Promise<{ accessToken: string; idToken: string }> {
  const verifier = randomBytes(32).toString('base64url')
  const redirect = 'http://127.0.0.1:1/callback'
  const u = new URL(idp.authorizationEndpoint)
  u.search = new URLSearchParams({
    response_type: 'code',
    client_id: idp.clientId,
    redirect_uri: redirect,
    scope: 'openid profile',
    state: 's1',
    nonce: 'n1',
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
    resource: `${BASE}/mcp`,
  }).toString()
  const code = new URL((await fetch(u, { redirect: 'manual' })).headers.get('location') ?? '').searchParams.get('code') ?? ''
  const tok = await fetch(idp.tokenEndpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: redirect, client_id: idp.clientId, code_verifier: verifier }),
  })
  const body = (await tok.json()) as { access_token: string; id_token: string }
  return { accessToken: body.access_token, idToken: body.id_token }
}

async function entraCodeTokens(emu: EntraEmulator): Promise<{ access_token: string; id_token: string }> {
  const verifier = randomBytes(32).toString('base64url')
  const redirect = 'http://127.0.0.1:1/callback'
  const u = new URL(emu.authorizeUrl)
  u.search = new URLSearchParams({
    response_type: 'code',
    client_id: emu.clientId,
    redirect_uri: redirect,
    scope: `openid ${emu.apiScopes.join(' ')}`,
    state: 's',
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
  }).toString()
  const code = new URL((await fetch(u, { redirect: 'manual' })).headers.get('location') ?? '').searchParams.get('code') ?? ''
  const tok = await fetch(emu.tokenUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      grant_type: 'authorization_code',
      code,
      redirect_uri: redirect,
      client_id: emu.clientId,
      code_verifier: verifier,
      scope: `openid ${emu.apiScopes.join(' ')}`,
    }),
  })
  return (await tok.json()) as { access_token: string; id_token: string }
}

t.test('issue 13 item 3: the subject is sub or the configured claim, never the client id', async t => {
  const idp = await devIdp(t)
  const gw = await authGateway(t, ossOptions(idp))
  const byOid = await authGateway(t, ossOptions(idp, { subjectClaim: 'oid' }))
  const a = await idp.mintToken({ oid: 'user-a', azp: idp.clientId, client_id: idp.clientId })
  const b = await idp.mintToken({ oid: 'user-b', azp: idp.clientId, client_id: idp.clientId })
  for (const token of [a, b]) {
    const r = await call(gw.url, token)
    t.equal(r.status, 401, 'no sub: refused, not the client id as subject')
    t.equal(r.body.error, 'invalid_token')
    t.equal(r.body.error_description, 'token has no subject')
  }
  t.same((await call(byOid.url, a)).body.subject, 'user-a', 'subjectClaim: oid')
  t.same((await call(byOid.url, b)).body.subject, 'user-b')
  t.equal((await call(byOid.url, await idp.mintToken({ sub: 'only-sub', azp: idp.clientId }))).status, 401, 'subjectClaim named and missing: 401')
  t.equal((await call(gw.url, await idp.mintToken({ sub: '', azp: idp.clientId }))).status, 401, 'an empty sub is no subject')
  t.equal((await call(gw.url, await idp.mintToken({ sub: 7, azp: idp.clientId } as never))).status, 401, 'a non-string sub is no subject')
})

t.test('issue 13 items 4 and 5: exp, nbf, iat finite integers; claims bounded', async t => {
  const idp = await devIdp(t)
  const ownIssuer = 'https://idp.example.test/application/o/own/'
  const keys = await ownKeys(t, ownIssuer, 'own-client')
  const opts = { ...ossOptions(idp), issuer: ownIssuer, audiences: ['own-client'], clientId: 'own-client', jwks: keys.url }
  const gw = await authGateway(t, opts)
  const capped = await authGateway(t, { ...opts, maxTokenLifetimeSeconds: 3600 })
  const now = Math.floor(Date.now() / 1000)
  const head = `"iss":"${ownIssuer}","aud":"own-client","client_id":"own-client","sub":"u1"`
  t.equal((await call(gw.url, await keys.signRaw(`{${head},"iat":${now},"exp":${now + 600}}`))).status, 200, 'the baseline token passes')
  const odd: Array<[string, string]> = [
    ['exp 1e308', `{${head},"iat":${now},"exp":1e308}`],
    ['exp 1e400 (Infinity)', `{${head},"iat":${now},"exp":1e400}`],
    ['exp with a fraction', `{${head},"iat":${now},"exp":${now + 600}.5}`],
    ['nbf -1e400 (-Infinity)', `{${head},"iat":${now},"nbf":-1e400,"exp":${now + 600}}`],
    ['iat -1e400 (-Infinity)', `{${head},"iat":-1e400,"exp":${now + 600}}`],
    ['iat with a fraction', `{${head},"iat":${now}.25,"exp":${now + 600}}`],
    ['nbf a string', `{${head},"iat":${now},"nbf":"${now}","exp":${now + 600}}`],
  ]
  for (const [name, payload] of odd) {
    const r = await call(gw.url, await keys.signRaw(payload))
    t.equal(r.status, 401, `${name}: 401`)
    t.equal(r.body.error, 'invalid_token', `${name}: invalid_token`)
  }
  const long = await keys.signRaw(`{${head},"iat":${now},"exp":${now + 7200}}`)
  t.equal((await call(gw.url, long)).status, 200, 'no lifetime cap by default')
  const r = await call(capped.url, long)
  t.equal(r.status, 401, 'maxTokenLifetimeSeconds: a two-hour token is refused')
  t.equal(r.body.error_description, 'token lifetime too long')
  t.equal((await call(capped.url, await keys.signRaw(`{${head},"exp":${now + 7200}}`))).status, 401, 'without iat the lifetime counts from now')
  t.equal((await call(capped.url, await keys.signRaw(`{${head},"iat":${now},"exp":${now + 600}}`))).status, 200)

  // Arrays: the most depth per byte, so the token still fits in Node's 16 KiB of headers.
  const deep = '['.repeat(4000) + ']'.repeat(4000)
  const d = await call(gw.url, await keys.signRaw(`{${head},"iat":${now},"exp":${now + 600},"nested":${deep}}`))
  t.equal(d.status, 401, 'a claim nested 4000 deep: 401, not 500')
  t.equal(d.body.error_description, 'token claims nested too deeply')
  const small = await authGateway(t, { ...opts, maxTokenBytes: 4096 })
  const wide = await call(small.url, await keys.signRaw(`{${head},"iat":${now},"exp":${now + 600},"pad":"${'a'.repeat(5000)}"}`))
  t.equal(wide.status, 401, 'a token longer than maxTokenBytes: 401')
  t.equal(wide.body.error_description, 'token too large')
  const ok = await call(gw.url, await keys.signRaw(`{${head},"iat":${now},"exp":${now + 600},"nested":{"a":{"b":[{"c":[1]}]}}}`))
  t.equal(ok.status, 200, 'ordinary nesting passes')
  t.notMatch(gw.logText(), /RangeError|Maximum call stack/, 'no stack overflow anywhere')
})

t.test('issue 13 items 19 and 20: key rotation while the IdP is down, and under a flood of bogus kids', async t => {
  const ownIssuer = 'https://idp.example.test/application/o/rot/'
  const idp = await devIdp(t)

  t.test('an unknown kid while the key set cannot be refreshed: 503 + Retry-After, then accepted', async t => {
    const keys = await ownKeys(t, ownIssuer, 'rot-client')
    let now = 1_000_000
    const gw = await authGateway(
      t,
      { ...ossOptions(idp), issuer: ownIssuer, audiences: ['rot-client'], clientId: 'rot-client', jwks: keys.url },
      undefined,
      undefined,
      { now: () => now }
    )
    t.equal((await call(gw.url, await keys.sign({ sub: 'u' }))).status, 200)
    keys.setAvailable(false)
    await keys.rotate()
    const r = await call(gw.url, await keys.sign({ sub: 'u' }))
    t.equal(r.status, 503, 'not 401: the client must not drop its token and log in again')
    t.match(r.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/)
    t.equal(r.body.error, 'temporarily_unavailable')
    keys.setAvailable(true)
    // Past the longest back-off (60 s by default) on the key set's clock: the next fetch is due.
    now += 60_000
    t.equal((await call(gw.url, await keys.sign({ sub: 'u' }))).status, 200, 'the new key is accepted once the key set is back')
  })

  t.test('a genuine rotation is accepted under a flood of bogus kids, with a bounded number of fetches', async t => {
    const keys = await ownKeys(t, ownIssuer, 'rot-client')
    // Default keySet settings: the point is what an operator gets without tuning. The key set's
    // clock stands still (PluginEnv.now): however long the flood runs, the next on-demand fetch is
    // one cooldown (3 s) away, so a request for a new kid waits for that one shared slot.
    const gw = await authGateway(
      t,
      { ...ossOptions(idp), issuer: ownIssuer, audiences: ['rot-client'], clientId: 'rot-client', jwks: keys.url },
      undefined,
      undefined,
      { now: () => 1_000_000 }
    )
    let flooding = true
    let bogus = 0
    const flood = Array.from({ length: 8 }, async () => {
      while (flooding) {
        await call(gw.url, await keys.sign({ sub: 'x' }, randomUUID()))
        bogus++
      }
    })
    t.ok(await until(() => bogus >= 8, 400, 25), 'the flood runs')
    const fetchesBefore = keys.fetches()
    await keys.rotate()
    const status = (await call(gw.url, await keys.sign({ sub: 'rotated' }))).status
    const fetched = keys.fetches() - fetchesBefore
    flooding = false
    await Promise.all(flood)
    t.equal(status, 200, 'the rotated key is accepted, at its first try, while bogus kids keep coming')
    // The slot the rotated kid joined; plus, at most, one that fired between the count and the rotation.
    t.ok(fetched >= 1 && fetched <= 2, `one shared fetch for the rotation and the flood: ${fetched}`)
  })
})

t.test("without the OAuth facade's schema, a facade block is a config error naming it, never passed on unchecked", async t => {
  const bare = mcpAuthenticationModule()
  t.throws(
    () =>
      bare.check?.(
        { mode: 'strict', issuer: 'https://idp.example.test/', resourceMetadata: { resource: `${BASE}/mcp` }, facade: {} },
        'mcp.policies.mcpAuthentication'
      ),
    {
      code: 'MCPP_ERR_CONFIG',
      message: /^mcp\.policies\.mcpAuthentication\.facade: the OAuth facade is not among the available plugins$/,
    }
  )
})
