/**
 * Entra on-behalf-of (core/credentials/) against the Entra emulator's OBO
 * grant (test/helpers/entra-obo.ts), with users' tokens from its real
 * authorization-code flow: the downstream token (verified against the
 * emulator's keys, the API's own audience, the user's oid) for v2 and v1 APIs,
 * the gateway authenticated by its secret or a certificate (x5t), the cache
 * and per-user isolation; and Entra's refusals as the MCP client must see
 * them: consent -> 403 insufficient_scope, MFA -> 401 insufficient_claims
 * with the claims challenge a client can follow (a sign-in with those claims
 * then succeeds), the assertion refused -> 401 invalid_token, scope, resource
 * and client errors -> 502, the audience check of a v2 API with a custom app
 * ID URI, an emulator that is down -> 503.
 */
import t, { type Test } from 'tap'
import { createHash, randomUUID } from 'node:crypto'
import { createRemoteJWKSet, decodeJwt, exportPKCS8, generateKeyPair, jwtVerify } from 'jose'
import type { OnBehalfOfConfig, TargetConfig } from '../core/config.ts'
import { createCredentialBroker, type Caller, type CredentialBroker, type TargetAuth } from '../core/credentials/index.ts'
import { ProxyError } from '../core/errors.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { startEntraEmulator, type EntraEmulator, type EntraEmulatorOptions } from './helpers/entra-emulator.ts'
import { memoryLogger } from './helpers/logger.ts'

const SECRET = 'gateway-app-secret-0123456789'
const RMD = 'https://gw.example.test/.well-known/oauth-protected-resource/mcp'
/** A v2 API with Entra's default app ID URI, `api://<its app id>`. */
const CRM_ID = randomUUID()
const CRM = { appId: CRM_ID, identifierUri: `api://${CRM_ID}`, scopes: ['read', 'write'] }
/** A v1 API with a custom URI: its tokens' `aud` is the URI. */
const LEGACY = { appId: randomUUID(), identifierUri: 'https://legacy.contoso.test', scopes: ['user_impersonation'], tokenVersion: 1 as const }
/** A v2 API with a custom URI: its tokens' `aud` is its app id, which the scope does not name. */
const TICKETS = { appId: randomUUID(), identifierUri: 'api://tickets', scopes: ['read'] }

async function emulator(tt: Test, extra: EntraEmulatorOptions = {}): Promise<EntraEmulator> {
  const emu = await startEntraEmulator({
    clientSecret: SECRET,
    users: { alice: { roles: [] }, bob: { roles: [] } },
    downstreamApis: [CRM, LEGACY, TICKETS],
    ...extra,
  })
  tt.teardown(() => emu.close())
  return emu
}

interface Built {
  broker: CredentialBroker
  auth: TargetAuth
  metrics: Metrics
  logText: () => string
}

function build(emu: EntraEmulator, obo: Partial<OnBehalfOfConfig>, extra: { stepUpScope?: string } = {}): Built {
  const { log, text } = memoryLogger()
  const metrics = new Metrics()
  const target: TargetConfig = {
    name: 'graph',
    mcp: { url: 'https://graph.example/mcp', headers: {} },
    auth: {
      onBehalfOf: { tokenEndpoint: emu.tokenUrl, clientId: emu.clientId, clientSecret: SECRET, scope: `${CRM.identifierUri}/.default`, ...obo },
      ...(extra.stepUpScope !== undefined ? { stepUpScope: extra.stepUpScope } : {}),
    },
  }
  const broker = createCredentialBroker([target], { log, metrics, resourceMetadataUrl: RMD, scopesSupported: [`api://${emu.clientId}/mcp_access`] })
  return { broker, auth: broker.forTarget('graph')!, metrics, logText: text }
}

async function caller(emu: EntraEmulator, login: string, o?: { claims?: string }): Promise<Caller> {
  const token = await emu.loginToken(login, o)
  const claims = decodeJwt(token)
  return { key: `oid:${String(claims.oid)}`, subject: String(claims.sub), claims: Object.freeze(claims), token, expiresAt: claims.exp }
}

const bearerOf = (h: Readonly<Record<string, string>>): string => /^Bearer (.+)$/.exec(h.authorization ?? '')?.[1] ?? ''

async function rejection(p: Promise<unknown>): Promise<ProxyError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e
  )
  if (!ProxyError.is(err)) throw new Error(`expected a ProxyError, got ${String(err)}`)
  return err
}

function failures(b: Built, reason: string): number {
  const m = new RegExp(`^mcp_proxy_credential_failures_total\\{reason="${reason}",target="graph"\\} (\\d+)$`, 'm').exec(b.metrics.render())
  return m === null ? Number.NaN : Number(m[1])
}

t.test("the user's token is exchanged on their behalf for the API's own token: v2 by app id, v1 by URI; cached; users apart", async t => {
  const emu = await emulator(t)
  const keys = createRemoteJWKSet(new URL(emu.jwksUrl))
  const alice = await caller(emu, 'alice')
  const bob = await caller(emu, 'bob')
  const crm = build(emu, {})
  const [a1, a2, b1] = await Promise.all([crm.auth.resolve(alice), crm.auth.resolve(alice), crm.auth.resolve(bob)])
  t.equal(emu.oboExchanges, 2, 'one exchange per user, however many requests')
  t.equal(a1, a2)
  const { payload } = await jwtVerify(bearerOf(a1!.headers), keys, { issuer: emu.issuerV2, audience: CRM.appId })
  t.equal(payload.oid, alice.claims.oid, "the API sees alice's oid")
  t.equal(payload.scp, 'read write', '.default: every scope consented')
  t.equal(decodeJwt(bearerOf(b1!.headers)).oid, bob.claims.oid, "bob's token is bob's")
  t.not(bearerOf(a1!.headers), alice.token)
  t.equal(await crm.auth.resolve(alice), a1, 'the next request is a cache hit')
  t.equal(emu.oboExchanges, 2)
  t.same(crm.broker.describe(), [{ target: 'graph', mode: 'onBehalfOf', headerNames: ['Authorization'], envNames: [], cached: 2 }])
  const sent = emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/token')).at(-1)!
  const form = new Map(sent.params)
  t.equal(form.get('grant_type'), 'urn:ietf:params:oauth:grant-type:jwt-bearer')
  t.equal(form.get('requested_token_use'), 'on_behalf_of')
  t.equal(form.get('client_id'), emu.clientId, 'client_secret_post by default, as Microsoft documents')
  t.equal(sent.authorization, undefined)

  const legacy = build(emu, { scope: `${LEGACY.identifierUri}/user_impersonation` })
  const v1 = await legacy.auth.resolve(alice)
  await t.resolves(jwtVerify(bearerOf(v1.headers), keys, { issuer: emu.issuerV1, audience: LEGACY.identifierUri }), 'a v1 API gets a v1 token for its URI')

  const basic = build(emu, { clientAuthMethod: 'client_secret_basic' })
  t.ok(bearerOf((await basic.auth.resolve(bob)).headers), 'HTTP Basic works too')
})

t.test('a certificate credential: private_key_jwt with the thumbprint as x5t', async t => {
  const cert = await generateKeyPair('RS256', { extractable: true })
  const x5t = createHash('sha1').update('gateway certificate').digest('base64url')
  const emu = await emulator(t, { clientCertificates: [{ x5t, publicKey: cert.publicKey }] })
  const alice = await caller(emu, 'alice')
  const pem = await exportPKCS8(cert.privateKey)
  const signed = build(emu, { clientSecret: undefined, privateKey: { pem, alg: 'RS256', x5t } })
  const cred = await signed.auth.resolve(alice)
  t.equal(decodeJwt(bearerOf(cred.headers)).azpacr, '2', 'Entra saw a certificate credential')
  const wrong = build(emu, { clientSecret: undefined, privateKey: { pem, alg: 'RS256', x5t: 'bm90LXJlZ2lzdGVyZWQ' } })
  t.match(await rejection(wrong.auth.resolve(alice)), {
    code: 'MCPP_ERR_TARGET_CREDENTIAL',
    statusCode: 502,
    message: 'target graph: the identity provider refused the on-behalf-of exchange (AADSTS700027)',
  })
})

t.test('consent required (AADSTS65001): 403 insufficient_scope naming the scopes and the resource metadata; once consented it works', async t => {
  const emu = await emulator(t)
  emu.updateDownstreamApi(CRM.appId, { consented: false })
  const alice = await caller(emu, 'alice')
  const b = build(emu, {})
  const err = await rejection(b.auth.resolve(alice))
  t.match(err, {
    code: 'MCPP_ERR_TARGET_STEP_UP',
    statusCode: 403,
    oauthError: 'insufficient_scope',
    message: "target graph: the identity provider needs the user's consent (AADSTS65001)",
  })
  t.equal(err.headers['www-authenticate'], `Bearer error="insufficient_scope", scope="api://${emu.clientId}/mcp_access", resource_metadata="${RMD}"`)
  t.equal(failures(b, 'step_up'), 1)
  t.match(b.logText(), /AADSTS65001: The user or administrator has not consented/, "Entra's description is logged")
  const own = build(emu, {}, { stepUpScope: 'openid offline_access' })
  t.match((await rejection(own.auth.resolve(alice))).headers, { 'www-authenticate': /scope="openid offline_access"/ }, 'auth.stepUpScope wins')

  emu.setConsent('alice', CRM.appId, true)
  t.ok(bearerOf((await b.auth.resolve(alice)).headers), 'the refusal was not cached: consent given, the next request succeeds')
})

t.test('MFA required (AADSTS50076/50079): 401 insufficient_claims carrying the claims challenge; a sign-in with those claims succeeds', async t => {
  const emu = await emulator(t)
  emu.updateDownstreamApi(CRM.appId, { requireMfa: true })
  const alice = await caller(emu, 'alice')
  const b = build(emu, {})
  const err = await rejection(b.auth.resolve(alice))
  t.match(err, { code: 'MCPP_ERR_TARGET_STEP_UP', statusCode: 401, oauthError: 'insufficient_claims', message: /authenticate again \(AADSTS50076\)$/ })
  const m = /^Bearer error="insufficient_claims", claims="([A-Za-z0-9+/=]+)", resource_metadata="(.+)"$/.exec(err.headers['www-authenticate'] ?? '')
  t.ok(m, err.headers['www-authenticate'] ?? 'no challenge')
  t.equal(m?.[2], RMD)
  const claims = Buffer.from(m?.[1] ?? '', 'base64').toString('utf8')
  t.match(JSON.parse(claims), { access_token: { capolids: { essential: true } } }, "Entra's claims challenge, as it sent it")

  const stepped = await caller(emu, 'alice', { claims })
  t.ok(bearerOf((await b.auth.resolve(stepped)).headers), 'the client signs in again with the claims: the exchange succeeds')

  emu.updateDownstreamApi(CRM.appId, { mfaEnrollmentRequired: true })
  const bob = await caller(emu, 'bob')
  t.match(await rejection(b.auth.resolve(bob)), { statusCode: 401, message: /\(AADSTS50079\)$/ })
  t.equal(failures(b, 'step_up'), 2)
})

t.test('the assertion refused (AADSTS50013, 500133): 401 invalid_token, the client authenticates again', async t => {
  const emu = await emulator(t)
  const stranger = await emulator(t)
  const b = build(emu, {})
  const foreign = await caller(stranger, 'alice')
  const err = await rejection(b.auth.resolve(foreign))
  t.match(err, { code: 'MCPP_ERR_UNAUTHORIZED', statusCode: 401, message: "target graph: the identity provider refused the caller's token (AADSTS50013)" })
  t.equal(err.headers['www-authenticate'], `Bearer error="invalid_token", resource_metadata="${RMD}"`)

  const stale = await emulator(t, { accessTokenTtlSeconds: -60 })
  const expired = await caller(stale, 'alice')
  const late = build(stale, {})
  t.match(await rejection(late.auth.resolve(expired)), { code: 'MCPP_ERR_UNAUTHORIZED', statusCode: 401, message: /\(AADSTS500133\)$/ })
  t.equal(failures(b, 'invalid_token'), 1)
})

t.test("scope, resource and client errors are the operator's: 502 naming the AADSTS code only", async t => {
  const emu = await emulator(t)
  const alice = await caller(emu, 'alice')
  const cases: Array<[Partial<OnBehalfOfConfig>, string]> = [
    [{ scope: `${CRM.identifierUri}/admin` }, 'AADSTS70011'],
    [{ scope: 'api://nowhere/.default' }, 'AADSTS500011'],
    [{ scope: `${CRM.identifierUri}/read ${LEGACY.identifierUri}/user_impersonation` }, 'AADSTS28000'],
    [{ clientSecret: 'not-the-secret' }, 'AADSTS7000215'],
  ]
  for (const [cfg, code] of cases) {
    const b = build(emu, cfg)
    const err = await rejection(b.auth.resolve(alice))
    t.match(err, {
      code: 'MCPP_ERR_TARGET_CREDENTIAL',
      statusCode: 502,
      expose: true,
      message: `target graph: the identity provider refused the on-behalf-of exchange (${code})`,
    })
    t.notMatch(err.message, /nowhere|tenant|secret/, 'nothing of the description')
    t.equal(failures(b, 'refused'), 1)
  }
})

t.test('the audience check: a v2 API with a custom app ID URI needs expectedAudience (its app id), else nothing is sent', async t => {
  const emu = await emulator(t)
  const alice = await caller(emu, 'alice')
  const guessed = build(emu, { scope: 'api://tickets/read' })
  t.match(await rejection(guessed.auth.resolve(alice)), { statusCode: 502, message: 'target graph: the identity provider minted a token for another audience' })
  t.equal(failures(guessed, 'audience'), 1)
  t.equal(guessed.auth.peek(alice), undefined)
  const told = build(emu, { scope: 'api://tickets/read', expectedAudience: [TICKETS.appId] })
  t.equal(decodeJwt(bearerOf((await told.auth.resolve(alice)).headers)).aud, TICKETS.appId)
})

t.test('an emulator that is down or answers garbage: 503 with Retry-After, and back when it heals', async t => {
  const emu = await emulator(t)
  const alice = await caller(emu, 'alice')
  const b = build(emu, {})
  for (const kind of ['unavailable', 'malformed'] as const) {
    emu.setTokenEndpointFailure(kind)
    const err = await rejection(b.auth.resolve(alice))
    t.match(err, { code: 'MCPP_ERR_IDP_UNAVAILABLE', statusCode: 503, headers: { 'retry-after': '5' } })
  }
  t.equal(failures(b, 'unavailable'), 2)
  emu.setTokenEndpointFailure(undefined)
  t.ok(bearerOf((await b.auth.resolve(alice)).headers))
  t.match(b.broker.describe()[0], { cached: 1, lastFailure: { reason: 'unavailable' } }, 'the last failure stays visible after a success')
})
