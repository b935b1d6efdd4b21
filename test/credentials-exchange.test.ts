/**
 * RFC 8693 token exchange (core/credentials/) against the real dev IdP's
 * token-exchange grant (bin/dev-idp-token-exchange.ts, oidc-provider on
 * loopback): the minted token is the IdP's (verified here against its JWKS),
 * for the target's audience, bound to the caller; the cache answers the next
 * request, one exchange is in flight per caller however many wait, callers
 * never share a token, the bound evicts the least recently used and an
 * expired token is exchanged again; every client authentication the IdP
 * takes; and each failure becomes the answer the brief names (502 refused,
 * 401 caller token refused, 502 wrong audience, 503 + Retry-After for an IdP
 * that is down, unreadable, closed or hung), counted, remembered, not cached.
 */
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createRemoteJWKSet, decodeJwt, exportJWK, exportPKCS8, generateKeyPair, jwtVerify } from 'jose'
import type { DevIdp } from '../bin/dev-idp.ts'
import type { TargetConfig, TokenExchangeConfig } from '../core/config.ts'
import { createCredentialBroker, type Caller, type CredentialBroker, type TargetAuth } from '../core/credentials/index.ts'
import { ProxyError } from '../core/errors.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { devIdp } from './helpers/idp.ts'
import { memoryLogger } from './helpers/logger.ts'
import { freePort } from './helpers/cli.ts'
import { silentPeer } from './helpers/hung-peer.ts'

const SECRET = 'gateway-exchange-secret-0123'
const RMD = 'https://gw.example.test/.well-known/oauth-protected-resource/mcp'

interface Rig {
  idp: DevIdp
  /** The PKCS#8 PEM of the private_key_jwt client `mcp-gateway-jwt` (kid gw-1). */
  pem: string
}

async function rig(t: Test): Promise<Rig> {
  const key = await generateKeyPair('RS256', { extractable: true })
  const idp = await devIdp(t, {
    tokenExchange: {
      clients: {
        'mcp-gateway': { secret: SECRET, audiences: ['crm', 'https://crm.example/mcp', 'tickets'], scopes: ['crm.read', 'crm.write'] },
        'mcp-gateway-jwt': { jwks: [{ ...(await exportJWK(key.publicKey)), kid: 'gw-1', alg: 'RS256' }], audiences: ['crm'], scopes: ['crm.read'] },
      },
    },
  })
  return { idp, pem: await exportPKCS8(key.privateKey) }
}

interface Built {
  broker: CredentialBroker
  auth: TargetAuth
  metrics: Metrics
  logText: () => string
}

function build(
  idp: DevIdp,
  exchange: Partial<TokenExchangeConfig>,
  extra: { headers?: Record<string, string>; now?: () => number; endpoint?: string } = {}
): Built {
  const { log, text } = memoryLogger()
  const metrics = new Metrics()
  const target: TargetConfig = {
    name: 'crm',
    mcp: { url: 'https://crm.example/mcp', headers: {} },
    auth: {
      tokenExchange: {
        tokenEndpoint: extra.endpoint ?? idp.tokenEndpoint,
        clientId: 'mcp-gateway',
        clientSecret: SECRET,
        audience: ['crm'],
        scope: 'crm.read',
        ...exchange,
      },
      ...(extra.headers !== undefined ? { headers: extra.headers } : {}),
    },
  }
  const broker = createCredentialBroker([target], { log, metrics, resourceMetadataUrl: RMD, scopesSupported: ['openid', 'crm'], now: extra.now })
  return { broker, auth: broker.forTarget('crm')!, metrics, logText: text }
}

/** A caller as the MCP layer builds it from a token the dev IdP signed for the gateway's login client. */
async function caller(idp: DevIdp, sub: string, claims: Record<string, unknown> = {}): Promise<Caller> {
  const token = await idp.mintToken({ sub, groups: ['mcp-users'], ...claims })
  const verified = decodeJwt(token)
  return { key: `sub:${sub}`, subject: sub, claims: Object.freeze(verified), token, expiresAt: verified.exp }
}

function bearerOf(headers: Readonly<Record<string, string>>): string {
  const m = /^Bearer (.+)$/.exec(headers.authorization ?? '')
  if (m === null) throw new Error(`no bearer in ${JSON.stringify(Object.keys(headers))}`)
  return m[1]!
}

async function rejection(p: Promise<unknown>): Promise<ProxyError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e
  )
  if (!ProxyError.is(err)) throw new Error(`expected a ProxyError, got ${String(err)}`)
  return err
}

function counter(metrics: Metrics, name: string, labels: string): number {
  const m = new RegExp(`^${name}\\{${labels.replace(/[{}]/g, '\\$&')}\\} (\\d+)$`, 'm').exec(metrics.render())
  return m === null ? Number.NaN : Number(m[1])
}

t.test('a caller token is exchanged for the IdP-signed token of the target: its audience, the caller as subject, the gateway as actor', async t => {
  const { idp } = await rig(t)
  const { auth, metrics, broker } = build(idp, {}, { headers: { 'X-User': '{sub}' } })
  t.equal(auth.mode, 'tokenExchange')
  t.equal(auth.perCaller, true)
  t.equal(counter(metrics, 'mcp_proxy_credential_exchanges_total', 'result="miss",target="crm"'), 0, 'series exist at 0 from the start')
  const alice = await caller(idp, 'alice')
  t.equal(auth.peek(alice), undefined, 'nothing cached yet')
  const cred = await auth.resolve(alice)
  const minted = bearerOf(cred.headers)
  const { payload } = await jwtVerify(minted, createRemoteJWKSet(new URL(idp.jwksUrl)), { issuer: idp.issuer, audience: 'crm' })
  t.equal(payload.sub, 'alice')
  t.same(payload.act, { sub: 'mcp-gateway' }, 'delegation: the gateway is the actor (RFC 8693 §4.1)')
  t.equal(payload.scope, 'crm.read')
  t.equal(cred.headers['x-user'], 'alice', 'claim headers beside the minted token')
  t.not(minted, alice.token, "the caller's token never goes to the target")
  t.ok(cred.freshUntil > Date.now() && cred.freshUntil <= (payload.exp as number) * 1000 - 60_000, 'fresh until exp minus the 60 s skew')
  t.same(idp.exchangeLog.at(-1), { clientId: 'mcp-gateway', sub: 'alice', audience: ['crm'], scope: 'crm.read' })

  t.equal(auth.peek(alice), cred, 'peek answers the cached credential')
  t.equal(await auth.resolve(alice), cred, 'and so does the next resolve')
  t.equal(idp.exchanges, 1, 'one exchange for three uses')
  t.equal(counter(metrics, 'mcp_proxy_credential_exchanges_total', 'result="miss",target="crm"'), 1)
  t.equal(counter(metrics, 'mcp_proxy_credential_exchanges_total', 'result="hit",target="crm"'), 1)
  t.equal(counter(metrics, 'mcp_proxy_credential_cache_entries', 'target="crm"'), 1)
  t.same(broker.describe(), [{ target: 'crm', mode: 'tokenExchange', headerNames: ['Authorization', 'X-User'], envNames: [], cached: 1 }])
})

t.test('single-flight: many requests of one caller wait for one exchange; two callers never share a token', async t => {
  const { idp } = await rig(t)
  const { auth, metrics } = build(idp, {})
  const alice = await caller(idp, 'alice')
  const bob = await caller(idp, 'bob')
  const many = await Promise.all([...Array.from({ length: 8 }, () => auth.resolve(alice)), ...Array.from({ length: 8 }, () => auth.resolve(bob))])
  t.equal(idp.exchanges, 2, 'one exchange per caller')
  const aliceTokens = new Set(many.slice(0, 8).map(c => bearerOf(c.headers)))
  const bobTokens = new Set(many.slice(8).map(c => bearerOf(c.headers)))
  t.equal(aliceTokens.size, 1)
  t.equal(bobTokens.size, 1)
  t.equal(decodeJwt([...aliceTokens][0]!).sub, 'alice')
  t.equal(decodeJwt([...bobTokens][0]!).sub, 'bob', "bob's requests get bob's token, never alice's")
  t.equal(counter(metrics, 'mcp_proxy_credential_exchanges_total', 'result="miss",target="crm"'), 2)
  t.equal(counter(metrics, 'mcp_proxy_credential_exchanges_total', 'result="hit",target="crm"'), 14, 'the waiters count as hits: no exchange of their own')
})

t.test('the cache is bounded (least recently used out first) and a token is exchanged again once it is no longer fresh', async t => {
  const { idp } = await rig(t)
  let skew = 0
  const { auth, broker, metrics } = build(idp, { cacheMaxEntries: 2 }, { now: () => Date.now() + skew })
  const [a, b, c] = await Promise.all(['a', 'b', 'c'].map(s => caller(idp, s)))
  await auth.resolve(a!)
  await auth.resolve(b!)
  await auth.resolve(a!) // a is now the most recently used
  await auth.resolve(c!) // evicts b
  t.equal(idp.exchanges, 3)
  t.equal(broker.describe()[0]!.cached, 2)
  t.equal(counter(metrics, 'mcp_proxy_credential_cache_entries', 'target="crm"'), 2)
  t.ok(auth.peek(a!), 'a stayed')
  t.equal(auth.peek(b!), undefined, 'b was the least recently used')
  await auth.resolve(b!)
  t.equal(idp.exchanges, 4, 'b is exchanged again')

  // The IdP's tokens live 300 s (exp in whole seconds): fresh until 240 s from issue, with the 60 s skew.
  skew = 238_000
  t.ok(auth.peek(a!), 'a token short of exp - skew is used')
  skew = 241_000
  t.equal(auth.peek(a!), undefined, 'a token past exp - skew is not')
  const again = await auth.resolve(a!)
  t.equal(idp.exchanges, 5, 'it is exchanged again')
  t.not(bearerOf(again.headers), undefined)
})

t.test(
  'client authentication: client_secret_basic (default), client_secret_post and private_key_jwt are what the IdP takes; a wrong secret is invalid_client',
  async t => {
    const { idp, pem } = await rig(t)
    const alice = await caller(idp, 'alice')
    const jwt = build(idp, { clientId: 'mcp-gateway-jwt', clientSecret: undefined, privateKey: { pem, alg: 'RS256', kid: 'gw-1' } })
    const cred = await jwt.auth.resolve(alice)
    t.equal(decodeJwt(bearerOf(cred.headers)).client_id, 'mcp-gateway-jwt', 'the IdP verified the signed assertion against the registered key')

    const post = build(idp, { clientAuthMethod: 'client_secret_post' })
    t.equal(decodeJwt(bearerOf((await post.auth.resolve(alice)).headers)).client_id, 'mcp-gateway', 'the secret in the body')
    const wrong = build(idp, { clientSecret: 'not-the-secret-at-all' })
    const err = await rejection(wrong.auth.resolve(alice))
    t.match(err, {
      code: 'MCPP_ERR_TARGET_CREDENTIAL',
      statusCode: 502,
      expose: true,
      message: 'target crm: the identity provider refused the token exchange (invalid_client)',
    })
    const unknownKey = build(idp, { clientId: 'mcp-gateway-jwt', clientSecret: undefined, privateKey: { pem, alg: 'RS256', kid: 'not-registered' } })
    t.match(
      await rejection(unknownKey.auth.resolve(alice)),
      { statusCode: 502, message: /\(invalid_client\)$/ },
      'the assertion names its kid: one the IdP does not know is refused'
    )
  }
)

t.test('the IdP refuses the exchange: 502 naming target and error, counted as refused, not cached, the next request tries again', async t => {
  const { idp } = await rig(t)
  const alice = await caller(idp, 'alice')
  const target = build(idp, { audience: ['billing'] })
  const err = await rejection(target.auth.resolve(alice))
  t.match(err, {
    code: 'MCPP_ERR_TARGET_CREDENTIAL',
    statusCode: 502,
    message: 'target crm: the identity provider refused the token exchange (invalid_target)',
  })
  t.notMatch(err.message, /billing|not allowed/, "the IdP's description is not repeated to the client")
  t.match(target.logText(), /audience or resource not allowed for this client: billing/, 'it is in the log')
  t.equal(target.auth.peek(alice), undefined, 'a failure is not cached')
  await rejection(target.auth.resolve(alice))
  t.equal(idp.exchangeLog.filter(r => r.error === 'invalid_target').length, 2, 'each request asks again')
  t.equal(counter(target.metrics, 'mcp_proxy_credential_failures_total', 'reason="refused",target="crm"'), 2)
  t.match(target.broker.describe()[0], { cached: 0, lastFailure: { reason: 'refused' } })

  const scope = build(idp, { scope: 'crm.admin' })
  t.match(await rejection(scope.auth.resolve(alice)), { statusCode: 502, message: /\(invalid_scope\)$/ })
})

t.test("the IdP refuses the caller's token: 401 MCPP_ERR_UNAUTHORIZED with an invalid_token challenge naming the resource metadata", async t => {
  const { idp } = await rig(t)
  const { auth, metrics } = build(idp, {})
  const foreign = await caller(idp, 'alice', { aud: 'some-other-client' })
  const err = await rejection(auth.resolve(foreign))
  t.match(err, {
    code: 'MCPP_ERR_UNAUTHORIZED',
    statusCode: 401,
    oauthError: 'invalid_token',
    message: "target crm: the identity provider refused the caller's token (invalid_grant)",
  })
  t.equal(err.headers['www-authenticate'], `Bearer error="invalid_token", resource_metadata="${RMD}"`)
  t.equal(counter(metrics, 'mcp_proxy_credential_failures_total', 'reason="invalid_token",target="crm"'), 1)

  const anonymous: Caller = { key: 'anon', subject: undefined, claims: {}, token: undefined }
  const none = await rejection(auth.resolve(anonymous))
  t.match(none, { code: 'MCPP_ERR_UNAUTHORIZED', statusCode: 401 })
  t.equal(none.headers['www-authenticate'], `Bearer resource_metadata="${RMD}"`)
})

t.test('a minted token for another audience is never handed out: 502, counted as audience', async t => {
  const { idp } = await rig(t)
  const alice = await caller(idp, 'alice')
  const { auth, metrics, logText } = build(idp, { expectedAudience: ['https://crm.example/mcp'] })
  const err = await rejection(auth.resolve(alice))
  t.match(err, { code: 'MCPP_ERR_TARGET_CREDENTIAL', statusCode: 502, message: 'target crm: the identity provider minted a token for another audience' })
  t.equal(idp.exchanges, 1, 'the IdP did mint one')
  t.equal(auth.peek(alice), undefined, 'it is not cached')
  t.equal(counter(metrics, 'mcp_proxy_credential_failures_total', 'reason="audience",target="crm"'), 1)
  t.match(logText(), /"aud":\["crm"\]/, 'the log says which audience it had')

  const both = build(idp, { audience: ['crm'], resource: ['https://crm.example/mcp'] })
  const cred = await both.auth.resolve(alice)
  t.same(decodeJwt(bearerOf(cred.headers)).aud, ['crm', 'https://crm.example/mcp'], 'by default audience and resource are expected: one of them suffices')
})

t.test('an IdP that cannot be used: 503 MCPP_ERR_IDP_UNAVAILABLE with Retry-After 5 (down, unreadable, closed port, hung)', async t => {
  const { idp } = await rig(t)
  const alice = await caller(idp, 'alice')
  const expectUnavailable = async (b: Built, why: RegExp): Promise<void> => {
    const err = await rejection(b.auth.resolve(alice))
    t.match(err, { code: 'MCPP_ERR_IDP_UNAVAILABLE', statusCode: 503, expose: true, message: /^target crm: the identity provider .*; try again later$/ })
    t.equal(err.headers['retry-after'], '5')
    t.match(err.message, why)
    t.equal(counter(b.metrics, 'mcp_proxy_credential_failures_total', 'reason="unavailable",target="crm"'), 1)
    t.match(b.broker.describe()[0], { lastFailure: { reason: 'unavailable' } })
  }
  idp.setTokenEndpointFailure('unavailable')
  await expectUnavailable(build(idp, {}), /answered 503/)
  idp.setTokenEndpointFailure('malformed')
  await expectUnavailable(build(idp, {}), /answered what is not a JSON object/)
  idp.setTokenEndpointFailure(undefined)

  const closed = await freePort()
  await expectUnavailable(build(idp, {}, { endpoint: `http://127.0.0.1:${closed}/token` }), /could not be reached \(ECONNREFUSED\)/)
  const hung = await silentPeer(t)
  const slow = build(idp, { timeoutMs: 200 }, { endpoint: `${hung.url}/token` })
  await expectUnavailable(slow, /did not answer within 200 ms/)
  t.equal(hung.accepted(), 1, 'the hung peer was asked')

  const healed = build(idp, {})
  t.ok(bearerOf((await healed.auth.resolve(alice)).headers), 'and once the IdP answers again, so does the gateway')
})

t.test('a short-lived token is used for at most half its life, not exchanged on every request', async t => {
  const idp = await devIdp(t, { tokenExchange: { ttlSeconds: 60, clients: { 'mcp-gateway': { secret: SECRET, audiences: ['crm'], scopes: ['crm.read'] } } } })
  let skew = 0
  const { auth } = build(idp, {}, { now: () => Date.now() + skew })
  const alice = await caller(idp, 'alice')
  await auth.resolve(alice)
  skew = 28_000
  t.ok(auth.peek(alice), 'a 60 s token with the 60 s default skew is still used after 28 s')
  skew = 31_000
  t.equal(auth.peek(alice), undefined, 'and no longer after 31 s')
})

t.test('an answer without a usable bearer token is refused (502), whatever the IdP says it is', async t => {
  const { idp } = await rig(t)
  const alice = await caller(idp, 'alice')
  const answers = [
    { access_token: 'abc', token_type: 'DPoP', issued_token_type: 'urn:ietf:params:oauth:token-type:access_token' },
    { access_token: 'abc\r\nX-Injected: 1', token_type: 'Bearer' },
    { token_type: 'Bearer', expires_in: 60 },
  ]
  let next = 0
  const server = createServer((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answers[next++])))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  const b = build(idp, {}, { endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}/token` })
  for (let i = 0; i < answers.length; i++) {
    t.match(await rejection(b.auth.resolve(alice)), {
      code: 'MCPP_ERR_TARGET_CREDENTIAL',
      statusCode: 502,
      message: "target crm: the identity provider's token exchange answer holds no usable bearer token",
    })
  }
  t.equal(counter(b.metrics, 'mcp_proxy_credential_failures_total', 'reason="refused",target="crm"'), 3)
})
