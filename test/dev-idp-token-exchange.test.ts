/**
 * The dev IdP's RFC 8693 token-exchange grant (bin/dev-idp-token-exchange.ts), from the outside: real
 * HTTP to its token endpoint with login tokens from the real authorization-code flow, and every answer
 * checked the way a resource server would (signature against the served JWKS).
 */
import t from 'tap'
import { randomUUID } from 'node:crypto'
import { createRemoteJWKSet, decodeJwt, exportJWK, generateKeyPair, jwtVerify, SignJWT } from 'jose'
import type { DevIdp, DevIdpOptions } from '../bin/dev-idp.ts'
import { devIdp, loginToken } from './helpers/idp.ts'

const GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange'
const AT = 'urn:ietf:params:oauth:token-type:access_token'
const SECRET = 'gateway-exchange-secret'

const users: DevIdpOptions['users'] = {
  alice: { groups: ['mcp-users', 'sales'], email: 'alice@example.test', name: 'Alice' },
  bob: { groups: ['mcp-users'], email: 'bob@example.test', name: 'Bob' },
}

interface Answer {
  status: number
  body: Record<string, unknown>
  headers: Headers
}

async function exchange(idp: DevIdp, form: Record<string, string | string[]>, headers: Record<string, string> = {}): Promise<Answer> {
  const body = new URLSearchParams()
  for (const [k, v] of Object.entries(form)) for (const one of Array.isArray(v) ? v : [v]) body.append(k, one)
  const res = await fetch(idp.tokenEndpoint, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, body })
  return { status: res.status, body: (await res.json()) as Record<string, unknown>, headers: res.headers }
}

const basic = (id: string, secret: string) => ({ authorization: `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}` })

async function started(tt: Parameters<typeof devIdp>[0], extra: Partial<DevIdpOptions> = {}) {
  const client = await generateKeyPair('RS256', { extractable: true })
  const idp = await devIdp(tt, {
    users,
    tokenExchange: {
      clients: {
        'mcp-gateway': { secret: SECRET, audiences: ['crm', 'https://crm.example/mcp', 'tickets'], scopes: ['crm.read', 'crm.write'] },
        'mcp-gateway-jwt': { jwks: [{ ...(await exportJWK(client.publicKey)), kid: 'gw-1', alg: 'RS256' }], audiences: ['crm'], scopes: ['crm.read'] },
      },
    },
    ...extra,
  })
  return { idp, clientKey: client.privateKey }
}

const exchangeForm = (subjectToken: string, extra: Record<string, string | string[]> = {}) => ({
  grant_type: GRANT,
  subject_token: subjectToken,
  subject_token_type: AT,
  ...extra,
})

t.test('a login token is exchanged for a token minted for the target, bound to the user, naming the gateway in act', async t => {
  const { idp } = await started(t)
  const discovery = (await (await fetch(idp.discoveryUrl)).json()) as { grant_types_supported: string[] }
  t.ok(discovery.grant_types_supported.includes(GRANT), 'discovery lists the grant')
  const alice = await loginToken(idp, 'alice')
  t.equal(decodeJwt(alice).aud, idp.clientId, 'the subject token is a login token for the public client')

  const res = await exchange(idp, exchangeForm(alice, { audience: 'crm', scope: 'crm.read' }), basic('mcp-gateway', SECRET))
  t.equal(res.status, 200, JSON.stringify(res.body))
  t.match(res.body, { issued_token_type: AT, token_type: 'Bearer', expires_in: 300, scope: 'crm.read' })
  t.equal(res.headers.get('cache-control'), 'no-store')
  const { payload, protectedHeader } = await jwtVerify(res.body.access_token as string, createRemoteJWKSet(new URL(idp.jwksUrl)), {
    issuer: idp.issuer,
    audience: 'crm',
  })
  t.equal(protectedHeader.typ, 'at+jwt')
  t.match(payload, { sub: 'alice', aud: 'crm', scope: 'crm.read', client_id: 'mcp-gateway', act: { sub: 'mcp-gateway' }, groups: ['mcp-users', 'sales'] })
  t.equal((payload.exp as number) - (payload.iat as number), 300, 'default lifetime')
  t.type(payload.jti, 'string')
  t.equal(idp.exchanges, 1)
  t.same(idp.exchangeLog, [{ clientId: 'mcp-gateway', sub: 'alice', audience: ['crm'], scope: 'crm.read' }])
  t.notOk(JSON.stringify(idp.exchangeLog).includes(alice.slice(-20)), 'no token is kept in the log')
})

t.test('two users exchanged side by side each get their own subject', async t => {
  const { idp } = await started(t)
  const [alice, bob] = await Promise.all([loginToken(idp, 'alice'), loginToken(idp, 'bob')])
  const [a, b] = await Promise.all([
    exchange(idp, exchangeForm(alice, { audience: 'crm' }), basic('mcp-gateway', SECRET)),
    exchange(idp, exchangeForm(bob, { audience: 'crm' }), basic('mcp-gateway', SECRET)),
  ])
  t.equal(decodeJwt(a.body.access_token as string).sub, 'alice')
  t.equal(decodeJwt(b.body.access_token as string).sub, 'bob')
  t.equal(decodeJwt(b.body.access_token as string).scope, 'crm.read crm.write', 'no scope asked: all the client may have')
  t.equal(idp.exchanges, 2)
})

t.test('claims copied from the subject token, resource as the audience, several targets at once, ttl', async t => {
  const { idp } = await started(t, {
    tokenExchange: { ttlSeconds: 120, clients: { 'mcp-gateway': { secret: SECRET, audiences: ['crm', 'https://crm.example/mcp'], scopes: ['crm.read'] } } },
  })
  const subject = await idp.mintToken({ sub: 'carol', email: 'carol@example.test', name: 'Carol', groups: ['ops'], scope: 'openid' })
  const byResource = await exchange(idp, exchangeForm(subject, { resource: 'https://crm.example/mcp' }), basic('mcp-gateway', SECRET))
  t.equal(byResource.status, 200, JSON.stringify(byResource.body))
  t.equal(byResource.body.expires_in, 120)
  t.match(decodeJwt(byResource.body.access_token as string), {
    sub: 'carol',
    aud: 'https://crm.example/mcp',
    email: 'carol@example.test',
    name: 'Carol',
    groups: ['ops'],
  })
  const both = await exchange(idp, exchangeForm(subject, { audience: 'crm', resource: 'https://crm.example/mcp' }), basic('mcp-gateway', SECRET))
  t.same(decodeJwt(both.body.access_token as string).aud, ['crm', 'https://crm.example/mcp'])
  const none = await exchange(idp, exchangeForm(subject), basic('mcp-gateway', SECRET))
  t.equal(decodeJwt(none.body.access_token as string).aud, 'crm', "no audience asked: the client's first")
})

t.test('client authentication: secret in the body, private_key_jwt, and refusals that never reach the grant', async t => {
  const { idp, clientKey } = await started(t)
  const alice = await loginToken(idp, 'alice')
  const post = await exchange(idp, exchangeForm(alice, { audience: 'crm', client_id: 'mcp-gateway', client_secret: SECRET }))
  t.equal(post.status, 200, 'client_secret_post')

  const assertion = (key = clientKey) =>
    new SignJWT({ jti: randomUUID() })
      .setProtectedHeader({ alg: 'RS256', kid: 'gw-1' })
      .setIssuer('mcp-gateway-jwt')
      .setSubject('mcp-gateway-jwt')
      .setAudience(idp.tokenEndpoint)
      .setIssuedAt()
      .setExpirationTime('1m')
      .sign(key)
  const jwtAuth = async (key = clientKey) => ({
    client_assertion_type: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer',
    client_assertion: await assertion(key),
  })
  const pkj = await exchange(idp, exchangeForm(alice, { audience: 'crm', ...(await jwtAuth()) }))
  t.equal(pkj.status, 200, JSON.stringify(pkj.body))
  t.match(decodeJwt(pkj.body.access_token as string), { client_id: 'mcp-gateway-jwt', act: { sub: 'mcp-gateway-jwt' } })
  t.equal(idp.exchanges, 2)
  const logged = idp.exchangeLog.length

  const other = await generateKeyPair('RS256')
  const forged = await exchange(idp, exchangeForm(alice, { audience: 'crm', ...(await jwtAuth(other.privateKey)) }))
  t.equal(forged.status, 401)
  t.equal(forged.body.error, 'invalid_client', 'an assertion signed by another key')
  const wrong = await exchange(idp, exchangeForm(alice, { audience: 'crm' }), basic('mcp-gateway', 'not-the-secret'))
  t.equal(wrong.status, 401)
  t.equal(wrong.body.error, 'invalid_client', 'a wrong secret')
  const anonymous = await exchange(idp, exchangeForm(alice, { audience: 'crm', client_id: 'mcp-gateway' }))
  t.equal(anonymous.body.error, 'invalid_client', 'no secret at all')
  const publicClient = await exchange(idp, exchangeForm(alice, { audience: 'crm', client_id: idp.clientId }))
  t.equal(publicClient.status, 400)
  t.equal(publicClient.body.error, 'invalid_request', 'the public client may not use the grant')
  t.equal(idp.exchanges, 2, 'no token issued on a refused client')
  t.equal(idp.exchangeLog.length, logged, 'unauthenticated requests never reach the grant')
})

t.test('the subject token must be an access token this IdP issued for an audience the client may exchange', async t => {
  const { idp } = await started(t)
  const alice = await loginToken(idp, 'alice')
  const stranger = await generateKeyPair('RS256')
  const now = Math.floor(Date.now() / 1000)
  const cases: Array<[string, string]> = [
    ['signed by another key', await idp.mintToken({ sub: 'alice' }, { key: stranger.privateKey })],
    ['expired', await idp.mintToken({ sub: 'alice', iat: now - 7200, exp: now - 3600 })],
    ['another issuer', await idp.mintToken({ sub: 'alice', iss: 'https://elsewhere.example/' })],
    ['minted for another audience', await idp.mintToken({ sub: 'alice', aud: 'crm' })],
    ['an ID token', await idp.mintToken({ sub: 'alice', nonce: 'n', at_hash: 'x' })],
    ['no sub', await idp.mintToken({})],
    ['not a JWT', 'opaque-token-value'],
  ]
  for (const [name, token] of cases) {
    const res = await exchange(idp, exchangeForm(token, { audience: 'crm' }), basic('mcp-gateway', SECRET))
    t.equal(res.status, 400, name)
    t.equal(res.body.error, 'invalid_grant', name)
  }
  const missing = await exchange(idp, { grant_type: GRANT, subject_token_type: AT, audience: 'crm' }, basic('mcp-gateway', SECRET))
  t.equal(missing.body.error, 'invalid_request', 'no subject_token')
  for (const type of ['urn:ietf:params:oauth:token-type:id_token', 'urn:ietf:params:oauth:token-type:refresh_token']) {
    const res = await exchange(idp, exchangeForm(alice, { audience: 'crm', subject_token_type: type }), basic('mcp-gateway', SECRET))
    t.equal(res.body.error, 'invalid_request', `subject_token_type ${type}`)
  }
  const noType = await exchange(idp, { grant_type: GRANT, subject_token: alice, audience: 'crm' }, basic('mcp-gateway', SECRET))
  t.equal(noType.body.error, 'invalid_request', 'no subject_token_type')
  const actor = await exchange(idp, exchangeForm(alice, { audience: 'crm', actor_token: alice, actor_token_type: AT }), basic('mcp-gateway', SECRET))
  t.equal(actor.body.error, 'invalid_request', 'actor tokens are not supported')
  t.equal(idp.exchanges, 0)
  t.equal(idp.exchangeLog.filter(r => r.error === 'invalid_grant').length, cases.length, 'each refusal is logged with its error')

  idp.setTokenExchangePolicy('mcp-gateway', { subjectAudiences: ['crm'] })
  const widened = await exchange(idp, exchangeForm(cases[3]![1], { audience: 'crm' }), basic('mcp-gateway', SECRET))
  t.equal(widened.status, 200, 'subjectAudiences decides which subject tokens a client may exchange')
  const login = await exchange(idp, exchangeForm(alice, { audience: 'crm' }), basic('mcp-gateway', SECRET))
  t.equal(login.body.error, 'invalid_grant', 'and the default no longer applies once it is set')
})

t.test('targets and scopes beyond the client policy: invalid_target and invalid_scope', async t => {
  const { idp } = await started(t)
  const alice = await loginToken(idp, 'alice')
  const cases: Array<[Record<string, string | string[]>, string]> = [
    [{ audience: 'payroll' }, 'invalid_target'],
    [{ resource: 'https://payroll.example/mcp' }, 'invalid_target'],
    [{ audience: ['crm', 'payroll'] }, 'invalid_target'],
    [{ audience: 'crm', scope: 'crm.read crm.admin' }, 'invalid_scope'],
    [{ audience: 'crm', requested_token_type: 'urn:ietf:params:oauth:token-type:id_token' }, 'invalid_request'],
  ]
  for (const [extra, error] of cases) {
    const res = await exchange(idp, exchangeForm(alice, extra), basic('mcp-gateway', SECRET))
    t.equal(res.status, 400, JSON.stringify(extra))
    t.equal(res.body.error, error, JSON.stringify(extra))
  }
  t.equal(idp.exchanges, 0)
  idp.setTokenExchangePolicy('mcp-gateway', { audiences: ['payroll'], scopes: ['crm.admin'] })
  const allowed = await exchange(idp, exchangeForm(alice, { audience: 'payroll', scope: 'crm.admin' }), basic('mcp-gateway', SECRET))
  t.equal(allowed.status, 200, 'a policy changed at run time applies to the next request')
  t.throws(() => idp.setTokenExchangePolicy('nobody', { audiences: [] }), /no token-exchange client nobody/)
})

t.test('token endpoint outages: 503, an unparsable answer; healed', async t => {
  const { idp } = await started(t)
  const alice = await loginToken(idp, 'alice')
  idp.setTokenEndpointFailure('unavailable')
  const down = await fetch(idp.tokenEndpoint, { method: 'POST', headers: basic('mcp-gateway', SECRET), body: new URLSearchParams(exchangeForm(alice)) })
  t.equal(down.status, 503)
  idp.setTokenEndpointFailure('malformed')
  const garbage = await fetch(idp.tokenEndpoint, { method: 'POST', headers: basic('mcp-gateway', SECRET), body: new URLSearchParams(exchangeForm(alice)) })
  t.equal(garbage.status, 200)
  await t.rejects(garbage.json(), 'the answer is not JSON')
  idp.setTokenEndpointFailure(undefined)
  const healed = await exchange(idp, exchangeForm(alice, { audience: 'crm' }), basic('mcp-gateway', SECRET))
  t.equal(healed.status, 200)
  t.equal(idp.exchanges, 1, 'only the healed request was served')
})

t.test('without tokenExchange the grant does not exist', async t => {
  const idp = await devIdp(t)
  const discovery = (await (await fetch(idp.discoveryUrl)).json()) as { grant_types_supported: string[] }
  t.notOk(discovery.grant_types_supported.includes(GRANT))
  const res = await exchange(idp, exchangeForm(await loginToken(idp, 'alice'), { client_id: idp.clientId }))
  t.equal(res.body.error, 'unsupported_grant_type')
  t.equal(idp.exchanges, 0)
})
