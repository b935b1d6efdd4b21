/**
 * Entra's on-behalf-of errors from the outside (issue 25), each mapped to an
 * answer the MCP client can act on, in a session (a tools/call POST) and as a
 * 2026-07-28 request:
 * - consent not granted (AADSTS65001) -> 403 `insufficient_scope` with a
 *   scope the client can ask the gateway for, and `resource_metadata`;
 * - MFA required (AADSTS50076/50079) -> 401 `insufficient_claims` with the
 *   IdP's claims challenge, and `resource_metadata`;
 * - the IdP refuses the caller's token as the assertion (AADSTS50013: an
 *   app-only token; AADSTS500133: expired for Entra, not yet for the gateway's
 *   clock tolerance) -> 401 `invalid_token`;
 * - invalid scope (AADSTS70011) -> 502, a JSON-RPC error naming the target;
 * - IdP unreachable -> 503 with Retry-After; never a 500, never the IdP's text.
 * Then the official SDK clients act on the step-up answers: SDK 1.x
 * re-authorizes by itself (with the challenge's scope, or its claims), SDK 2.x
 * through its host (InsufficientScopeError; a forced re-authorization past its
 * refresh token), the user consents or completes MFA, and the call succeeds.
 * One emulator, three identity servers and one gateway (the real CLI) for the
 * file; a second emulator and gateway for the expired assertion.
 */
import t, { type Test } from 'tap'
import { randomUUID } from 'node:crypto'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import { auth as auth2, InsufficientScopeError, type OAuthClientProvider as Provider2 } from '@modelcontextprotocol/client'
import { startEntraEmulator } from './helpers/entra-emulator.ts'
import { freePort } from './helpers/cli.ts'
import {
  SECRET,
  identityServer,
  jwtArgs,
  startGateway,
  login1,
  login2,
  tokenFor,
  whoamiOf,
  rawSession,
  modernToolCall,
  oboRequests,
  claimsOf,
  claimsChallenge,
  bearerChallenge,
  sample,
  type Answer,
  type Gateway,
  type Session1,
  type Whoami,
} from './helpers/obo-world.ts'

const CONSENT_API = randomUUID()
const MFA_API = randomUUID()
const PLAIN_API = randomUUID()
const ADA = { oid: randomUUID(), name: 'Ada Admin', preferredUsername: 'ada@contoso.test', roles: ['mcp.admin'] }
const BOB = { oid: randomUUID(), name: 'Bob Builder', preferredUsername: 'bob@contoso.test', roles: ['mcp.admin'] }

const emu = await startEntraEmulator({
  clientSecret: SECRET,
  user: ADA,
  users: { [BOB.preferredUsername]: BOB },
  downstreamApis: [
    { appId: CONSENT_API, identifierUri: `api://${CONSENT_API}`, scopes: ['Reports.Read'], consented: false },
    { appId: MFA_API, identifierUri: `api://${MFA_API}`, scopes: ['Payroll.Read'], requireMfa: true },
    { appId: PLAIN_API, identifierUri: `api://${PLAIN_API}`, scopes: ['Data.Read'] },
  ],
})
t.teardown(() => emu.close())
const [consentServer, mfaServer, openServer] = await Promise.all([
  identityServer(t, jwtArgs({ jwksUrl: emu.jwksUrl, issuer: emu.issuerV2 }, CONSENT_API)),
  identityServer(t, jwtArgs({ jwksUrl: emu.jwksUrl, issuer: emu.issuerV2 }, MFA_API)),
  // A target without credentials (and a server that checks none), so that every caller's session has one healthy target.
  identityServer(t, ['--no-auth']),
])
// Nothing listens there: the IdP is unreachable.
const closedPort = await freePort()

const obo = (name: string, url: string, scope: string, tokenEndpoint = emu.tokenUrl, clientId = emu.clientId): string => `    - name: ${name}
      mcp: { url: "${url}" }
      auth:
        onBehalfOf:
          tokenEndpoint: "${tokenEndpoint}"
          clientId: "${clientId}"
          clientSecret: \${OBO_GATEWAY_SECRET}
          scope: "${scope}"`
const gw = await startGateway(
  t,
  emu,
  [
    `    - name: open\n      mcp: { url: "${openServer.url}" }`,
    obo('consent', consentServer.url, `api://${CONSENT_API}/.default`),
    obo('mfa', mfaServer.url, `api://${MFA_API}/.default`),
    obo('plain', openServer.url, `api://${PLAIN_API}/.default`),
    obo('badscope', openServer.url, `api://${PLAIN_API}/No.Such.Scope`),
    obo('down', openServer.url, `api://${PLAIN_API}/.default`, `http://127.0.0.1:${closedPort}/${emu.tenant}/oauth2/v2.0/token`),
  ].join('\n'),
  { rules: ['"mcp.admin" in jwt.roles'] }
)
/** The `scope` of the consent challenge, as the raw requests saw it. */
let challengedScope: string | undefined
const prm = (await (await fetch(gw.prm)).json()) as { scopes_supported?: string[] }

/**
 * Nothing of the IdP's own answer reaches the client: no error_description (`AADSTSnnnn: <text>`,
 * trace and correlation ids, a timestamp), nothing of the raw body (`error_codes`, `trace_id`).
 */
const IDP_TEXT = /AADSTS\d+:|Trace ID|Correlation ID|Timestamp|error_codes|trace_id|The provided value|has not consented|multi-factor|\d{4}-\d\d-\d\d[ T]\d\d:/i
function checkNoIdpText(t: Test, a: Answer, label: string): void {
  t.notMatch(a.text, IDP_TEXT, `${label}: none of the IdP's text in the body`)
  t.notMatch(a.headers.get('www-authenticate') ?? '', IDP_TEXT, `${label}: nor in the challenge`)
  t.not(a.status, 500, `${label}: never a 500`)
}

/** Every challenge points the client at the gateway's protected resource metadata. */
function checkChallenge(t: Test, a: Answer, status: number, error: string, label: string, gateway: Gateway = gw): Record<string, string> {
  t.equal(a.status, status, `${label}: HTTP ${status}`)
  const c = bearerChallenge(a.headers.get('www-authenticate'))
  t.ok(c, `${label}: a Bearer challenge (${a.headers.get('www-authenticate')})`)
  t.equal(c?.error, error, `${label}: error="${error}"`)
  t.equal(c?.resource_metadata, gateway.prm, `${label}: resource_metadata is the gateway's`)
  checkNoIdpText(t, a, label)
  return c ?? {}
}

/** One tools/call on `target` in both eras, with a token from the flow. */
async function bothEras(t: Test, token: string, target: string, gateway: Gateway = gw): Promise<Array<[string, Answer]>> {
  const session = await rawSession(gateway.mcp, token)
  t.teardown(() => session.close())
  return [
    ['session era', await session.callTool(`${target}_whoami`)],
    ['2026-07-28', await modernToolCall(gateway.mcp, token, `${target}_whoami`)],
  ]
}

t.test('consent not granted (AADSTS65001): 403 insufficient_scope with a scope the client can ask for', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  for (const [era, a] of await bothEras(t, token, 'consent')) {
    const c = checkChallenge(t, a, 403, 'insufficient_scope', era)
    t.ok(c.scope !== undefined && c.scope !== '', `${era}: the challenge names a scope`)
    challengedScope ??= c.scope
    const supported = new Set(prm.scopes_supported ?? [])
    t.ok(
      (c.scope ?? '').split(' ').every(s => supported.has(s)),
      `${era}: a scope the gateway's authorization server accepts (${c.scope})`
    )
    t.match(a.text, /consent/, `${era}: the message names the target`)
  }
})

t.test('MFA required (AADSTS50076/50079): 401 insufficient_claims with the claims challenge', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  for (const [era, a] of await bothEras(t, token, 'mfa')) {
    const c = checkChallenge(t, a, 401, 'insufficient_claims', era)
    const claims = claimsChallenge(c.claims)
    mfaClaims ??= claims
    t.ok(claims, `${era}: claims="${c.claims}" is the IdP's challenge (JSON)`)
    const capolids = (claims?.access_token as { capolids?: { essential?: boolean; values?: string[] } } | undefined)?.capolids
    t.ok(capolids?.essential === true && (capolids.values?.length ?? 0) > 0, `${era}: the Conditional Access policy to satisfy`)
    t.match(a.text, /mfa/, `${era}: the message names the target`)
  }
})

t.test("the IdP refuses the caller's token as the assertion (AADSTS50013): 401 invalid_token", async t => {
  // A daemon's app-only token (client credentials): the gateway accepts it (it holds the app role), but
  // on-behalf-of needs a user, so Entra refuses it as the assertion.
  const form = new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: emu.clientId,
    client_secret: SECRET,
    scope: `api://${emu.clientId}/.default`,
  })
  const res = await fetch(emu.tokenUrl, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: form })
  const { access_token: token } = (await res.json()) as { access_token: string }
  t.equal(claimsOf(token).idtyp, 'app', 'an app-only token')
  for (const [era, a] of await bothEras(t, token, 'plain')) {
    checkChallenge(t, a, 401, 'invalid_token', era)
    t.match(a.text, /plain/, `${era}: the message names the target`)
  }
  t.ok(
    emu.oboLog.some(r => r.error === 50013),
    'the IdP answered AADSTS50013'
  )
})

t.test('an assertion the gateway still accepts but Entra finds expired (AADSTS500133): 401 invalid_token', async t => {
  // An emulator whose tokens expired 5 s ago: within the gateway's clock tolerance (30 s), past Entra's (none).
  const late = await startEntraEmulator({
    clientSecret: SECRET,
    accessTokenTtlSeconds: -5,
    downstreamApis: [{ appId: PLAIN_API, identifierUri: `api://${PLAIN_API}`, scopes: ['Data.Read'] }],
  })
  t.teardown(() => late.close())
  const lateGw = await startGateway(
    t,
    late,
    [
      `    - name: open\n      mcp: { url: "${openServer.url}" }`,
      obo('plain', openServer.url, `api://${PLAIN_API}/.default`, late.tokenUrl, late.clientId),
    ].join('\n'),
    { rules: ['"mcp.admin" in jwt.roles'] }
  )
  const token = await tokenFor(lateGw.mcp)
  t.ok((claimsOf(token).exp as number) * 1000 < Date.now(), 'the token has expired')
  for (const [era, a] of await bothEras(t, token, 'plain', lateGw)) {
    checkChallenge(t, a, 401, 'invalid_token', era, lateGw)
    t.match(a.text, /plain/, `${era}: the message names the target`)
  }
  t.ok(
    late.oboLog.some(r => r.error === 500133),
    'the IdP answered AADSTS500133'
  )
})

t.test('invalid scope (AADSTS70011): 502, a JSON-RPC error naming the target', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  for (const [era, a] of await bothEras(t, token, 'badscope')) {
    t.equal(a.status, 502, `${era}: HTTP 502`)
    const [m] = a.messages
    t.equal(m?.jsonrpc, '2.0', `${era}: a JSON-RPC answer`)
    t.equal(m?.id, 1, `${era}: to the request`)
    t.type(m?.error?.code, 'number', `${era}: an error`)
    t.match(m?.error?.message, /badscope/, `${era}: naming the target (${m?.error?.message})`)
    t.match(m?.error?.message, /\((invalid_scope|AADSTS70011)\)/, `${era}: and the IdP's code`)
    checkNoIdpText(t, a, era)
  }
  t.ok(oboRequests(emu, { scope: `api://${PLAIN_API}/No.Such.Scope` }).length >= 2, 'the IdP was asked (each time: a refusal is not cached)')
})

t.test('the IdP unreachable: 503 with Retry-After, never a 500', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  for (const [era, a] of await bothEras(t, token, 'down')) {
    t.equal(a.status, 503, `${era}: HTTP 503`)
    const retry = a.headers.get('retry-after')
    t.ok(retry !== null && /^\d+$/.test(retry) && Number(retry) > 0, `${era}: Retry-After in seconds (${retry})`)
    t.match(a.text, /down/, `${era}: the message names the target`)
    checkNoIdpText(t, a, era)
  }
})

t.test('failures are counted by reason', async t => {
  const m = await gw.metrics()
  for (const [target, reason] of [
    ['consent', 'step_up'],
    ['mfa', 'step_up'],
    ['plain', 'invalid_token'],
    ['badscope', 'refused'],
    ['down', 'unavailable'],
  ]) {
    t.ok(sample(m, 'mcp_proxy_credential_failures_total', { target: target!, reason: reason! }) >= 2, `${target}: ${reason}`)
  }
})

/**
 * The call the SDK retries after the re-authorization, in the session it started with (SDK 1.x
 * keeps its session); a new session of the same client, where the same call must succeed too.
 */
async function retried(t: Test, s: Session1, tool: string): Promise<Whoami | undefined> {
  const again = await s.client.callTool({ name: tool, arguments: {} }).then(
    r => whoamiOf(r),
    (e: unknown) => e as Error
  )
  t.notOk(again instanceof Error, `${tool} succeeds in the same session after the re-authorization${again instanceof Error ? ` (got: ${again.message})` : ''}`)
  const fresh = new Client1({ name: 'sdk1', version: '1.0.0' })
  await fresh.connect(new Transport1(gw.mcp, { authProvider: s.provider as unknown as Provider1 }))
  t.teardown(() => fresh.close().catch(() => {}))
  const inNew = whoamiOf(await fresh.callTool({ name: tool, arguments: {} }))
  t.ok(inNew.oid !== undefined, `${tool} succeeds in a new session`)
  return again instanceof Error ? inNew : again
}

t.test('SDK 1.x follows the consent step-up: it re-authorizes with the scope asked for, the user consents, the call succeeds', async t => {
  const s = await login1(t, gw.mcp, ADA.preferredUsername)
  // At the next sign-in the user grants the consent (the emulator's consent state).
  s.provider.onAuthorize = () => emu.setConsent(ADA.preferredUsername, CONSENT_API, true)
  const err = await s.client.callTool({ name: 'consent_whoami', arguments: {} }).then(
    () => undefined,
    (e: unknown) => e
  )
  t.ok(err instanceof Unauthorized1, `the 403 led the SDK into a new authorization (${String(err)})`)
  t.equal(s.provider.authorizations.length, 2, 'a second authorization request')
  const scope = s.provider.authorizations[1]!.searchParams.get('scope')
  t.ok(challengedScope, 'the consent challenge was seen above')
  t.equal(scope, challengedScope, "it asked for the challenge's scope")
  await s.transport.finishAuth(s.provider.code())
  const who = await retried(t, s, 'consent_whoami')
  t.equal(who?.oid, ADA.oid, 'the target sees Ada')
  t.equal(who?.aud, CONSENT_API, 'with its own audience')
  t.equal(who?.azp, emu.clientId)
})

/** The claims the MFA challenge asks for, as the raw requests saw it. */
let mfaClaims: Record<string, unknown> | undefined

t.test('SDK 1.x follows the MFA challenge: it re-authorizes with the claims asked for, the call succeeds in the same session', async t => {
  const s = await login1(t, gw.mcp, ADA.preferredUsername)
  const sessionId = s.transport.sessionId
  const err = await s.client.callTool({ name: 'mfa_whoami', arguments: {} }).then(
    () => undefined,
    (e: unknown) => e
  )
  t.ok(err instanceof Unauthorized1, `the 401 led the SDK into a new authorization (${String(err)})`)
  const asked = s.provider.authorizations.at(-1)!
  t.same(JSON.parse(asked.searchParams.get('claims') ?? 'null'), mfaClaims, "the authorization request carries the challenge's claims (an MFA sign-in)")
  await s.transport.finishAuth(s.provider.code())
  const who = await retried(t, s, 'mfa_whoami')
  t.equal(s.transport.sessionId, sessionId, 'the same session')
  t.equal(who?.oid, ADA.oid)
  t.equal(who?.aud, MFA_API)
  const assertion = oboRequests(emu, { oid: ADA.oid, scope: `api://${MFA_API}/.default` })
    .map(r => claimsOf(new Map(r.params).get('assertion') ?? ''))
    .at(-1)
  t.ok((assertion?.amr as string[] | undefined)?.includes('mfa'), "the exchange that succeeded carried the user's new token, with MFA")
})

/**
 * SDK 2.x holds a refresh token (it asks for offline_access), so on a 401 it refreshes and retries
 * once; a refresh cannot add MFA, and it gives up with the second 401. The host then follows the
 * claims challenge with a new authorization (auth() forced past the refresh), as MSAL would.
 */
t.test('SDK 2.x (2026-07-28) and the MFA challenge: the host re-authorizes with the claims asked for, the call succeeds', async t => {
  const s = await login2(t, gw.mcp, 'modern', BOB.preferredUsername)
  const err = await s.client.callTool({ name: 'mfa_whoami', arguments: {} }).then(
    () => undefined,
    (e: unknown) => e
  )
  t.equal((err as { data?: { status?: number } } | undefined)?.data?.status, 401, `the SDK surfaced the 401 (${String(err)})`)
  t.equal(s.provider.challenge?.error, 'insufficient_claims', 'with the claims challenge')
  t.equal(s.provider.challenge?.resource_metadata, gw.prm)
  const started = await auth2(s.provider as unknown as Provider2, {
    serverUrl: gw.mcp,
    resourceMetadataUrl: new URL(s.provider.challenge!.resource_metadata!),
    forceReauthorization: true,
  })
  t.equal(started, 'REDIRECT', 'a new authorization request')
  t.same(JSON.parse(s.provider.authorizations.at(-1)!.searchParams.get('claims') ?? 'null'), mfaClaims, "with the challenge's claims")
  await s.transport.finishAuth(s.provider.callback!.searchParams)
  const who = whoamiOf(await s.client.callTool({ name: 'mfa_whoami', arguments: {} }))
  t.equal(who.oid, BOB.oid, 'the target sees Bob')
  t.equal(who.aud, MFA_API, 'with its own audience')
})

/**
 * SDK 2.x re-authorizes on its own only when the challenge's scope widens what its token holds
 * (`isStrictScopeSuperset`); a consent step-up names the gateway's own scopes, which the token
 * already has. So the host drives it, as the SDK documents for `onInsufficientScope: 'throw'`:
 * the challenge's scope and resource metadata from InsufficientScopeError, auth() forced to a
 * new authorization, then the same call again.
 */
t.test('SDK 2.x (2026-07-28) and the consent step-up, driven by the host: the challenge, a new authorization, the call succeeds', async t => {
  const s = await login2(t, gw.mcp, 'modern', BOB.preferredUsername, 'throw')
  const err = await s.client.callTool({ name: 'consent_whoami', arguments: {} }).then(
    () => undefined,
    (e: unknown) => e
  )
  t.ok(err instanceof InsufficientScopeError, `the SDK surfaced the step-up (${String(err)})`)
  const challenge = err as InsufficientScopeError
  t.equal(challenge.requiredScope, challengedScope, "with the challenge's scope")
  t.equal(String(challenge.resourceMetadataUrl), gw.prm, 'and the resource metadata')
  s.provider.onAuthorize = () => emu.setConsent(BOB.preferredUsername, CONSENT_API, true)
  const started = await auth2(s.provider as unknown as Provider2, {
    serverUrl: gw.mcp,
    scope: challenge.requiredScope,
    resourceMetadataUrl: challenge.resourceMetadataUrl,
    forceReauthorization: true,
  })
  t.equal(started, 'REDIRECT', 'a new authorization request')
  await s.transport.finishAuth(s.provider.callback!.searchParams)
  const who = whoamiOf(await s.client.callTool({ name: 'consent_whoami', arguments: {} }))
  t.equal(who.oid, BOB.oid, 'the target sees Bob')
  t.equal(who.aud, CONSENT_API, 'with its own audience')
})

t.test('no secret or token in the gateway output; the IdP text is logged for the operator', async t => {
  const out = gw.output()
  t.notOk(out.includes(SECRET), 'the client secret')
  t.notMatch(out, /eyJ[\w-]+\.eyJ[\w-]+\.[\w-]+/, 'no JWT')
  t.match(out, /AADSTS65001/, "the IdP's description is in the log (not a secret)")
})
