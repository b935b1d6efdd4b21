/**
 * The Entra emulator's on-behalf-of grant (test/helpers/entra-obo.ts), from the outside: real HTTP to
 * its token endpoint with users' tokens from its real authorization-code flow, each answer checked as
 * the downstream API would (signature against the served keys, its own audience) and each refusal in
 * Entra's error shape.
 */
import t, { type Test } from 'tap'
import { createHash, randomUUID } from 'node:crypto'
import { createRemoteJWKSet, decodeJwt, generateKeyPair, jwtVerify, SignJWT, type CryptoKey } from 'jose'
import { startEntraEmulator, type EntraEmulator, type EntraEmulatorOptions } from './helpers/entra-emulator.ts'

const SECRET = 'gateway-app-secret'
const CRM = { appId: randomUUID(), identifierUri: 'api://crm', scopes: ['read', 'write'] }
const LEGACY = { appId: randomUUID(), identifierUri: 'https://legacy.contoso.test', scopes: ['user_impersonation'], tokenVersion: 1 as const }

async function emulator(tt: Test, extra: EntraEmulatorOptions = {}): Promise<EntraEmulator> {
  const emu = await startEntraEmulator({
    clientSecret: SECRET,
    users: { alice: { roles: [] }, bob: { roles: [] } },
    downstreamApis: [CRM, LEGACY],
    ...extra,
  })
  tt.teardown(() => emu.close())
  return emu
}

interface Answer {
  status: number
  body: Record<string, any> // eslint-disable-line @typescript-eslint/no-explicit-any
}

async function obo(
  emu: EntraEmulator,
  assertion: string,
  scope: string | undefined,
  auth: Record<string, string> = { client_secret: SECRET },
  headers: Record<string, string> = {}
): Promise<Answer> {
  const form = new URLSearchParams({
    grant_type: 'urn:ietf:params:oauth:grant-type:jwt-bearer',
    client_id: emu.clientId,
    requested_token_use: 'on_behalf_of',
    assertion,
    ...(scope === undefined ? {} : { scope }),
    ...auth,
  })
  const res = await fetch(emu.tokenUrl, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, body: form })
  return { status: res.status, body: (await res.json()) as Answer['body'] }
}

const GUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'

/** Entra's error body, whole: the description's trailer names the same ids and time as the fields. */
function entraShape(t: Test, a: Answer, status: number, error: string, code: number): void {
  t.equal(a.status, status, `${code}: status`)
  t.equal(a.body.error, error, `${code}: error`)
  t.same(a.body.error_codes, [code])
  const m = new RegExp(
    `^AADSTS${code}: .+\\r\\nTrace ID: (${GUID})\\r\\nCorrelation ID: (${GUID})\\r\\nTimestamp: (\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\dZ)$`,
    's'
  ).exec(a.body.error_description)
  t.ok(m, `${code}: description ${JSON.stringify(a.body.error_description)}`)
  t.same([a.body.trace_id, a.body.correlation_id, a.body.timestamp], m?.slice(1, 4))
  t.equal(a.body.error_uri, `https://login.microsoftonline.com/error?code=${code}`)
}

t.test('a user token becomes a token for the downstream API: its audience, the named scopes, the same oid, a pairwise sub', async t => {
  const emu = await emulator(t)
  const alice = await emu.loginToken('alice')
  const login = decodeJwt(alice)
  t.equal(login.aud, emu.clientId, 'the assertion is a token for the gateway app')

  const res = await obo(emu, alice, 'api://crm/read offline_access')
  t.equal(res.status, 200, JSON.stringify(res.body))
  t.match(res.body, { token_type: 'Bearer', scope: 'api://crm/read', expires_in: 3600, ext_expires_in: 3600 })
  const { payload } = await jwtVerify(res.body.access_token, createRemoteJWKSet(new URL(emu.jwksUrl)), { issuer: emu.issuerV2, audience: CRM.appId })
  t.match(payload, {
    oid: emu.userNamed('alice').oid,
    scp: 'read',
    azp: emu.clientId,
    azpacr: '1',
    tid: emu.tenant,
    ver: '2.0',
    preferred_username: 'alice@contoso.test',
  })
  t.type(payload.sub, 'string')
  t.not(payload.sub, login.sub, 'sub is pairwise: the downstream app sees another sub than the gateway')
  t.equal(emu.oboExchanges, 1)
  t.same(emu.oboLog, [{ oid: emu.userNamed('alice').oid, api: CRM.appId, scp: 'read' }])

  const all = await obo(emu, alice, `${CRM.appId}/.default`, {}, { authorization: `Basic ${Buffer.from(`${emu.clientId}:${SECRET}`).toString('base64')}` })
  t.equal(all.status, 200, 'the API named by its app id, the secret in HTTP Basic')
  t.equal(decodeJwt(all.body.access_token).scp, 'read write', '.default: every scope the API exposes')
  t.equal(all.body.scope, 'api://crm/read api://crm/write')
})

t.test('a v1 API gets a v1 token; two users at once never cross', async t => {
  const emu = await emulator(t)
  const [alice, bob] = await Promise.all([emu.loginToken('alice'), emu.loginToken('bob')])
  const [a, b] = await Promise.all([obo(emu, alice, 'https://legacy.contoso.test/.default'), obo(emu, bob, 'https://legacy.contoso.test/.default')])
  const keys = createRemoteJWKSet(new URL(emu.jwksUrl))
  const { payload: pa } = await jwtVerify(a.body.access_token, keys, { issuer: emu.issuerV1, audience: LEGACY.identifierUri })
  const { payload: pb } = await jwtVerify(b.body.access_token, keys, { issuer: emu.issuerV1, audience: LEGACY.identifierUri })
  t.match(pa, { appid: emu.clientId, appidacr: '1', ver: '1.0', scp: 'user_impersonation', upn: 'alice@contoso.test', oid: emu.userNamed('alice').oid })
  t.match(pb, { upn: 'bob@contoso.test', oid: emu.userNamed('bob').oid })
  t.not(pa.oid, pb.oid)
  t.not(pa.sub, pb.sub)
  t.equal(emu.oboExchanges, 2)
})

t.test('client authentication: secret missing or wrong, certificate assertion good and bad', async t => {
  const cert = await generateKeyPair('RS256')
  const x5t = createHash('sha1').update('gateway certificate').digest('base64url')
  const emu = await emulator(t, { clientCertificates: [{ x5t, publicKey: cert.publicKey }] })
  const alice = await emu.loginToken('alice')
  entraShape(t, await obo(emu, alice, 'api://crm/read', {}), 401, 'invalid_client', 7000218)
  entraShape(t, await obo(emu, alice, 'api://crm/read', { client_secret: 'the secret id, not its value' }), 401, 'invalid_client', 7000215)

  const assertion = (o: { key?: CryptoKey; thumb?: string; aud?: string; exp?: string } = {}) =>
    new SignJWT({ jti: randomUUID() })
      .setProtectedHeader({ alg: 'RS256', x5t: o.thumb ?? x5t })
      .setIssuer(emu.clientId)
      .setSubject(emu.clientId)
      .setAudience(o.aud ?? emu.tokenUrl)
      .setIssuedAt()
      .setExpirationTime(o.exp ?? '5m')
      .sign(o.key ?? cert.privateKey)
  const byCert = async (o?: Parameters<typeof assertion>[0]) =>
    obo(emu, alice, 'api://crm/read', { client_assertion_type: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer', client_assertion: await assertion(o) })
  const good = await byCert()
  t.equal(good.status, 200, JSON.stringify(good.body))
  t.equal(decodeJwt(good.body.access_token).azpacr, '2', 'certificate-authenticated')

  const other = await generateKeyPair('RS256')
  entraShape(t, await byCert({ thumb: 'unregistered-thumbprint' }), 401, 'invalid_client', 700027)
  entraShape(t, await byCert({ key: other.privateKey }), 401, 'invalid_client', 700027)
  entraShape(t, await byCert({ exp: '-1m' }), 401, 'invalid_client', 700024)
  entraShape(t, await byCert({ aud: 'https://elsewhere.example/token' }), 401, 'invalid_client', 50027)
  t.equal(emu.oboExchanges, 1)
  t.equal(emu.oboLog.length, 1, 'an unauthenticated client never reaches the grant')
})

t.test('the assertion: a bad signature, another audience, an app-only token, not a JWT (50013); expired (500133)', async t => {
  const emu = await emulator(t)
  const alice = await emu.loginToken('alice')
  const stranger = await startEntraEmulator({ clientId: emu.clientId, tenant: emu.tenant })
  t.teardown(() => stranger.close())
  const crmToken = (await obo(emu, alice, 'api://crm/read')).body.access_token as string
  const appOnly = await (
    await fetch(emu.tokenUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ grant_type: 'client_credentials', client_id: emu.clientId, client_secret: SECRET, scope: `api://${emu.clientId}/.default` }),
    })
  ).json()
  for (const [name, token] of [
    ['signed by another key', await stranger.loginToken()],
    ["a token for the downstream API (another app's audience)", crmToken],
    ['an app-only token', (appOnly as { access_token: string }).access_token],
    ['not a JWT', 'not-a-token'],
  ] as const) {
    t.comment(name)
    entraShape(t, await obo(emu, token, 'api://crm/read'), 400, 'invalid_grant', 50013)
  }
  const audience = await obo(emu, crmToken, 'api://crm/read')
  t.match(audience.body.error_description, `The audience in the assertion was '${CRM.appId}' and the expected audience is '${emu.clientId}'`)

  const born = await emulator(t, { accessTokenTtlSeconds: -60 })
  const expired = await born.loginToken('alice')
  entraShape(t, await obo(born, expired, 'api://crm/read'), 400, 'invalid_grant', 500133)
  t.equal(emu.oboExchanges, 1, 'only the good one issued')
})

t.test('consent: AADSTS65001 with suberror consent_required until the user (or an admin) consents', async t => {
  const emu = await emulator(t, { downstreamApis: [{ ...CRM, consented: false }] })
  const [alice, bob] = await Promise.all([emu.loginToken('alice'), emu.loginToken('bob')])
  const refused = await obo(emu, alice, 'api://crm/read')
  entraShape(t, refused, 400, 'invalid_grant', 65001)
  t.equal(refused.body.suberror, 'consent_required')
  t.match(refused.body.error_description, `the application with ID '${emu.clientId}'`)
  emu.setConsent('alice', 'api://crm', true)
  t.equal((await obo(emu, alice, 'api://crm/read')).status, 200, 'alice consented')
  t.equal((await obo(emu, bob, 'api://crm/read')).body.error_codes[0], 65001, 'bob did not')
  emu.updateDownstreamApi(CRM.appId, { consented: true })
  t.equal((await obo(emu, bob, 'api://crm/read')).status, 200, 'admin consent covers everyone')
  emu.setConsent('bob', CRM.appId, false)
  t.equal((await obo(emu, bob, 'api://crm/read')).status, 400, "a user's own refusal wins")
  t.throws(() => emu.setConsent('carol', 'api://crm', true), /no user carol/)
  t.throws(() => emu.setConsent('alice', 'api://nothing', true), /no downstream API/)
})

t.test('MFA: AADSTS50076 with a claims challenge; a sign-in that follows it (claims on authorize) passes', async t => {
  const emu = await emulator(t, { downstreamApis: [{ ...CRM, requireMfa: true }] })
  const alice = await emu.loginToken('alice')
  t.same(decodeJwt(alice).amr, ['pwd'])
  const challenge = await obo(emu, alice, 'api://crm/read')
  entraShape(t, challenge, 400, 'interaction_required', 50076)
  const claims = JSON.parse(challenge.body.claims as string) as { access_token: { capolids: { essential: boolean; values: string[] } } }
  t.equal(claims.access_token.capolids.essential, true)
  t.match(claims.access_token.capolids.values[0], new RegExp(`^${GUID}$`))
  t.equal(emu.oboExchanges, 0)

  const stepped = await emu.loginToken('alice', { claims: challenge.body.claims as string })
  t.same(decodeJwt(stepped).amr, ['pwd', 'mfa'], 'the claims challenge was followed: an MFA sign-in')
  t.equal((await obo(emu, stepped, 'api://crm/read')).status, 200)

  emu.setUser('bob', { amr: ['pwd', 'mfa'] })
  t.equal((await obo(emu, await emu.loginToken('bob'), 'api://crm/read')).status, 200, "bob's sign-ins are MFA now")
  emu.updateDownstreamApi('api://crm', { mfaEnrollmentRequired: true })
  entraShape(t, await obo(emu, alice, 'api://crm/read'), 400, 'interaction_required', 50079)
})

t.test('scope: unknown resource (500011), unknown scope (70011), two resources (28000), missing parameters (900144)', async t => {
  const emu = await emulator(t)
  const alice = await emu.loginToken('alice')
  entraShape(t, await obo(emu, alice, 'api://payroll/read'), 400, 'invalid_resource', 500011)
  entraShape(t, await obo(emu, alice, 'api://crm/delete'), 400, 'invalid_scope', 70011)
  entraShape(t, await obo(emu, alice, 'offline_access'), 400, 'invalid_scope', 70011)
  entraShape(t, await obo(emu, alice, 'api://crm/read https://legacy.contoso.test/user_impersonation'), 400, 'invalid_scope', 28000)
  entraShape(t, await obo(emu, alice, undefined), 400, 'invalid_request', 900144)
  const noUse = await fetch(emu.tokenUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      grant_type: 'urn:ietf:params:oauth:grant-type:jwt-bearer',
      client_id: emu.clientId,
      client_secret: SECRET,
      assertion: alice,
      scope: 'api://crm/read',
    }),
  })
  entraShape(t, { status: noUse.status, body: (await noUse.json()) as Answer['body'] }, 400, 'invalid_request', 900144)
  t.equal(emu.oboExchanges, 0)
  t.same(
    emu.oboLog.map(r => r.error),
    [500011, 70011, 70011, 28000, 900144, 900144],
    'each refusal logged with its code'
  )
})

t.test('users: login_hint picks one, no hint the default; unknown names fail loudly', async t => {
  const emu = await emulator(t)
  t.equal(decodeJwt(await emu.loginToken()).oid, emu.user.oid, 'the default user')
  t.equal(decodeJwt(await emu.loginToken('bob@contoso.test')).oid, emu.userNamed('bob').oid, 'by preferred username')
  t.not(emu.userNamed('alice').oid, emu.userNamed('bob').oid)
  t.throws(() => emu.userNamed('mallory'), /no user mallory/)
})

t.test('token endpoint outages: 503 temporarily_unavailable, an unparsable answer; healed', async t => {
  const emu = await emulator(t)
  const alice = await emu.loginToken('alice')
  emu.setTokenEndpointFailure('unavailable')
  const down = await obo(emu, alice, 'api://crm/read')
  t.equal(down.status, 503)
  t.equal(down.body.error, 'temporarily_unavailable')
  emu.setTokenEndpointFailure('malformed')
  const garbage = await fetch(emu.tokenUrl, { method: 'POST', body: new URLSearchParams({ grant_type: 'x' }) })
  t.equal(garbage.status, 200)
  await t.rejects(garbage.json(), 'not JSON')
  emu.setTokenEndpointFailure(undefined)
  t.equal((await obo(emu, alice, 'api://crm/read')).status, 200)
  t.equal(emu.oboExchanges, 1)
})
