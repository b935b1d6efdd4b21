/**
 * Entra on-behalf-of from the outside (issue 25): users log in through the
 * gateway's cloud_idp bridge (the Entra emulator) with the official SDK
 * clients 1.x and 2.x, then call `whoami` on an HTTP target that validates
 * the token it receives itself (test/fixtures/identity-server.mjs: the
 * emulator's keys and issuer, its own audience, the downstream API's app id).
 * The target sees the user (`oid`), itself as audience, the gateway app as
 * `azp` and the configured scopes; never the client's token. Two users at
 * once never cross, the exchange is cached per user and target (single
 * flight), a certificate credential works in place of the secret, and a tool
 * an authorization rule denies costs no exchange. Both protocol eras.
 * One emulator, one identity server and one gateway (the real CLI) for the file.
 */
import t, { type Test } from 'tap'
import { generateKeyPairSync, createHash, randomUUID } from 'node:crypto'
import type { JWK } from 'jose'
import { startEntraEmulator } from './helpers/entra-emulator.ts'
import {
  SECRET,
  sha256,
  claimsOf,
  identityServer,
  jwtArgs,
  startGateway,
  login1,
  login2,
  tokenFor,
  whoamiOf,
  rawSession,
  modernToolCall,
  resultOf,
  oboRequests,
  type Answer,
  sample,
  type Whoami,
} from './helpers/obo-world.ts'

// The downstream APIs (app registrations the gateway app calls on the user's behalf).
const API = randomUUID()
/** An API nobody consented to: every use of it is an exchange attempt (refused, never cached). */
const LOCKED = randomUUID()
const API_SCOPES = ['Files.Read', 'User.Read']
const ADA = { oid: randomUUID(), name: 'Ada Admin', preferredUsername: 'ada@contoso.test', roles: ['mcp.admin'] }
const BOB = { oid: randomUUID(), name: 'Bob Builder', preferredUsername: 'bob@contoso.test', roles: ['mcp.admin'] }

// The gateway app's certificate credential: the key signs client_assertion, x5t names the certificate.
const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 })
const PEM = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()
const X5T = createHash('sha1')
  .update(publicKey.export({ type: 'spki', format: 'der' }))
  .digest('base64url')

const emu = await startEntraEmulator({
  clientSecret: SECRET,
  user: ADA,
  users: { [BOB.preferredUsername]: BOB },
  downstreamApis: [
    { appId: API, identifierUri: `api://${API}`, scopes: API_SCOPES },
    { appId: LOCKED, identifierUri: `api://${LOCKED}`, scopes: ['Admin.All'], consented: false },
  ],
  clientCertificates: [{ x5t: X5T, publicKey: publicKey.export({ format: 'jwk' }) as JWK }],
})
t.teardown(() => emu.close())
const server = await identityServer(t, jwtArgs({ jwksUrl: emu.jwksUrl, issuer: emu.issuerV2 }, API))

const GRAPH_SCOPE = `api://${API}/.default`
const CERT_SCOPE = `api://${API}/Files.Read`
const LOCKED_SCOPE = `api://${LOCKED}/.default`
const gw = await startGateway(
  t,
  emu,
  `    - name: graph
      mcp: { url: "${server.url}" }
      auth:
        onBehalfOf:
          tokenEndpoint: "${emu.tokenUrl}"
          clientId: "${emu.clientId}"
          clientSecret: \${OBO_GATEWAY_SECRET}
          scope: "${GRAPH_SCOPE}"
    - name: cert
      mcp: { url: "${server.url}" }
      auth:
        onBehalfOf:
          tokenEndpoint: "${emu.tokenUrl}"
          clientId: "${emu.clientId}"
          privateKey: { pem: "\${OBO_CERT_KEY}", alg: RS256, x5t: "${X5T}" }
          scope: "${CERT_SCOPE}"
    - name: locked
      mcp: { url: "${server.url}" }
      auth:
        onBehalfOf:
          tokenEndpoint: "${emu.tokenUrl}"
          clientId: "${emu.clientId}"
          clientSecret: \${OBO_GATEWAY_SECRET}
          scope: "${LOCKED_SCOPE}"`,
  { rules: ['"mcp.admin" in jwt.roles', 'mcp.tool.name != "dangerous"'], env: { OBO_CERT_KEY: PEM } }
)

/** What every whoami through `graph` must show for `user`. */
function checkGraphIdentity(t: Test, who: Whoami, user: typeof ADA, clientToken: string, label: string): void {
  t.equal(who.oid, user.oid, `${label}: the target saw the user`)
  t.equal(who.aud, API, `${label}: the target's own audience (the API's app id)`)
  t.equal(who.azp, emu.clientId, `${label}: azp is the gateway app`)
  t.equal(who.iss, emu.issuerV2, `${label}: issued by the IdP`)
  t.same(String(who.scp).split(' ').sort(), [...API_SCOPES].sort(), `${label}: scp as configured (.default: every scope of the API)`)
  t.not(who.bearerSha256, sha256(clientToken), `${label}: not the client's token`)
}

async function checkNeverSawClientTokens(t: Test, tokens: string[]): Promise<void> {
  const seen = await server.seen()
  t.ok(seen.length > 0, 'the target lists the bearers it received')
  for (const tok of tokens) t.notOk(seen.includes(sha256(tok)), "the client's token never reached the target")
}

const clientTokens: string[] = []

/** A refusal, whatever its form (an HTTP error, a JSON-RPC error, an error result), and no tool answer. */
function checkRefused(t: Test, a: Answer, label: string): void {
  const m = a.messages.findLast(x => x.id !== undefined)
  t.ok(a.status >= 400 || m?.error !== undefined || m?.result?.isError === true, `${label}: refused (${a.status} ${a.text.slice(0, 200)})`)
  t.notMatch(a.text, /"done"|\\"oid\\"/, `${label}: the tool did not run`)
  t.notMatch(a.headers.get('www-authenticate') ?? '', /insufficient_scope|insufficient_claims/, `${label}: the rule's denial, not an exchange's step-up`)
}

t.test('a tool an authorization rule denies costs no exchange (2026-07-28, first use of the target)', async t => {
  // A token from the full flow and nothing else: no session, no discovery, so no exchange yet.
  const token = await tokenFor(gw.mcp, BOB.preferredUsername)
  clientTokens.push(token)
  const before = await gw.metrics()
  checkRefused(t, await modernToolCall(gw.mcp, token, 'graph_dangerous'), 'graph_dangerous')
  t.equal(oboRequests(emu, { oid: BOB.oid }).length, 0, 'no on-behalf-of request')
  const after = await gw.metrics()
  for (const result of ['hit', 'miss']) {
    t.equal(
      sample(after, 'mcp_proxy_credential_exchanges_total', { target: 'graph', result }),
      sample(before, 'mcp_proxy_credential_exchanges_total', { target: 'graph', result }),
      `no credential was asked for (${result})`
    )
  }
  // The same user's allowed call on the same target does exchange: the counters above could have moved.
  const allowed = await modernToolCall(gw.mcp, token, 'graph_whoami')
  checkGraphIdentity(t, whoamiOf(resultOf(allowed)), BOB, token, 'allowed call')
  t.equal(oboRequests(emu, { oid: BOB.oid, scope: GRAPH_SCOPE }).length, 1, 'one exchange for the allowed call')
})

t.test('single flight: concurrent first calls of one user make one exchange', async t => {
  // Bob has used graph only (above): cert is a target he has never used.
  const token = await tokenFor(gw.mcp, BOB.preferredUsername)
  clientTokens.push(token)
  t.equal(oboRequests(emu, { oid: BOB.oid, scope: CERT_SCOPE }).length, 0, 'Bob has not used cert yet')
  const answers = await Promise.all(Array.from({ length: 5 }, (_, i) => modernToolCall(gw.mcp, token, 'cert_whoami', {}, i + 1)))
  for (const a of answers) t.equal(whoamiOf(resultOf(a)).oid, BOB.oid)
  t.equal(oboRequests(emu, { oid: BOB.oid, scope: CERT_SCOPE }).length, 1, 'five concurrent calls, one exchange')
})

t.test('SDK 1.x: log in through the gateway, whoami in a session sees the user, never the client token', async t => {
  const s = await login1(t, gw.mcp, ADA.preferredUsername)
  const token = s.provider.accessToken!
  clientTokens.push(token)
  t.equal(claimsOf(token).oid, ADA.oid, 'logged in as Ada')
  t.equal(claimsOf(token).aud, emu.clientId, "the client's token is for the gateway app")
  const { tools } = await s.client.listTools()
  t.ok(
    tools.some(x => x.name === 'graph_whoami'),
    'the target lists its tools through the gateway'
  )
  t.notOk(
    tools.some(x => x.name === 'graph_dangerous'),
    'the denied tool is filtered from the list'
  )
  const who = whoamiOf(await s.client.callTool({ name: 'graph_whoami', arguments: {} }))
  checkGraphIdentity(t, who, ADA, token, 'sdk1')
  t.ok((await server.seen()).includes(who.bearerSha256!), 'the hash whoami reports is a bearer the target received')
  await checkNeverSawClientTokens(t, clientTokens)
})

t.test('SDK 2.x: a session (2025-11-25) and a 2026-07-28 client, each logged in through the gateway', async t => {
  for (const era of ['session', 'modern'] as const) {
    const s = await login2(t, gw.mcp, era, ADA.preferredUsername)
    const token = s.provider.accessToken!
    clientTokens.push(token)
    t.equal(s.transport.sessionId !== undefined, era === 'session', `${era}: ${era === 'session' ? 'a session' : 'no session'}`)
    const who = whoamiOf(await s.client.callTool({ name: 'graph_whoami', arguments: {} }))
    checkGraphIdentity(t, who, ADA, token, `sdk2 ${era}`)
  }
  await checkNeverSawClientTokens(t, clientTokens)
  t.equal(oboRequests(emu, { oid: ADA.oid, scope: GRAPH_SCOPE }).length, 1, "Ada's logins share one exchange for graph: the cache is per user and target")
})

t.test('raw requests with a token from the flow: a tools/call inside a session and a 2026-07-28 request', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  clientTokens.push(token)
  const session = await rawSession(gw.mcp, token)
  t.teardown(() => session.close())
  checkGraphIdentity(t, whoamiOf(resultOf(await session.callTool('graph_whoami'))), ADA, token, 'session era')
  checkGraphIdentity(t, whoamiOf(resultOf(await modernToolCall(gw.mcp, token, 'graph_whoami'))), ADA, token, '2026-07-28')
  await checkNeverSawClientTokens(t, clientTokens)
})

t.test('two users at once never cross; repeated calls hit the cache (one exchange per user and target)', async t => {
  const ada = await login1(t, gw.mcp, ADA.preferredUsername)
  const bob = await login1(t, gw.mcp, BOB.preferredUsername)
  const bobToken = await tokenFor(gw.mcp, BOB.preferredUsername)
  const adaToken = await tokenFor(gw.mcp, ADA.preferredUsername)
  clientTokens.push(ada.provider.accessToken!, bob.provider.accessToken!, bobToken, adaToken)
  const rounds = 6
  const before = await gw.metrics()
  const calls: Array<Promise<{ who: Whoami; user: typeof ADA; label: string; token: string }>> = []
  for (let i = 0; i < rounds; i++) {
    calls.push(
      ada.client
        .callTool({ name: 'graph_whoami', arguments: { i } })
        .then(r => ({ who: whoamiOf(r), user: ADA, label: `ada sdk1 #${i}`, token: ada.provider.accessToken! })),
      bob.client
        .callTool({ name: 'graph_whoami', arguments: { i } })
        .then(r => ({ who: whoamiOf(r), user: BOB, label: `bob sdk1 #${i}`, token: bob.provider.accessToken! })),
      modernToolCall(gw.mcp, adaToken, 'graph_whoami', {}, i + 1).then(a => ({
        who: whoamiOf(resultOf(a)),
        user: ADA,
        label: `ada raw #${i}`,
        token: adaToken,
      })),
      modernToolCall(gw.mcp, bobToken, 'graph_whoami', {}, i + 1).then(a => ({
        who: whoamiOf(resultOf(a)),
        user: BOB,
        label: `bob raw #${i}`,
        token: bobToken,
      }))
    )
  }
  const answers = await Promise.all(calls)
  for (const a of answers) checkGraphIdentity(t, a.who, a.user, a.token, a.label)
  const adaHashes = new Set(answers.filter(a => a.user === ADA).map(a => a.who.bearerSha256))
  const bobHashes = new Set(answers.filter(a => a.user === BOB).map(a => a.who.bearerSha256))
  t.equal(adaHashes.size, 1, "all of Ada's calls carried one cached token")
  t.equal(bobHashes.size, 1, "all of Bob's calls carried one cached token")
  t.notOk(
    [...adaHashes].some(h => bobHashes.has(h)),
    'never the same token for two users'
  )
  t.equal(oboRequests(emu, { oid: ADA.oid, scope: GRAPH_SCOPE }).length, 1, 'Ada: still one exchange for graph')
  t.equal(oboRequests(emu, { oid: BOB.oid, scope: GRAPH_SCOPE }).length, 1, 'Bob: still one exchange for graph')
  const after = await gw.metrics()
  const delta = (result: string): number =>
    sample(after, 'mcp_proxy_credential_exchanges_total', { target: 'graph', result }) -
    sample(before, 'mcp_proxy_credential_exchanges_total', { target: 'graph', result })
  t.ok(delta('hit') >= rounds * 4, `every call was a cache hit (${delta('hit')} hits counted)`)
  t.equal(delta('miss'), 0, 'and none a miss')
  await checkNeverSawClientTokens(t, clientTokens)
})

t.test('certificate credential: the exchange authenticates with client_assertion (x5t), never the secret', async t => {
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  clientTokens.push(token)
  const who = whoamiOf(resultOf(await modernToolCall(gw.mcp, token, 'cert_whoami')))
  t.equal(who.oid, ADA.oid)
  t.equal(who.aud, API)
  t.equal(who.azp, emu.clientId)
  t.equal(who.scp, 'Files.Read', 'the named scope')
  const [req] = oboRequests(emu, { oid: ADA.oid, scope: CERT_SCOPE })
  t.ok(req, 'the certificate target exchanged')
  const p = new Map(req!.params)
  t.equal(p.get('client_assertion_type'), 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer')
  t.notOk(p.has('client_secret'), 'no secret in the request')
  t.notOk(req!.authorization !== undefined && /^basic/i.test(req!.authorization), 'no Basic secret either')
  const header = JSON.parse(Buffer.from((p.get('client_assertion') ?? '').split('.')[0]!, 'base64url').toString()) as Record<string, unknown>
  t.equal(header.x5t, X5T, "the assertion names the certificate's thumbprint")
  const assertion = claimsOf(p.get('client_assertion')!)
  t.equal(assertion.iss, emu.clientId)
  t.equal(assertion.sub, emu.clientId)
  t.equal(assertion.aud, emu.tokenUrl, "the assertion's audience is the token endpoint")
})

t.test('a denied tool costs no exchange in either era, where each use of the target is an exchange attempt', async t => {
  // `locked`: nobody consented to its API, so its exchange fails every time and nothing is ever cached.
  const token = await tokenFor(gw.mcp, ADA.preferredUsername)
  clientTokens.push(token)
  const session = await rawSession(gw.mcp, token)
  t.teardown(() => session.close())
  for (const [era, call] of [
    ['session era', (name: string) => session.callTool(name)],
    ['2026-07-28', (name: string) => modernToolCall(gw.mcp, token, name)],
  ] as const) {
    const attempts = oboRequests(emu, { scope: LOCKED_SCOPE }).length
    checkRefused(t, await call('locked_dangerous'), `${era}: locked_dangerous`)
    t.equal(oboRequests(emu, { scope: LOCKED_SCOPE }).length, attempts, `${era}: no on-behalf-of request`)
    // The allowed tool of the same target is an attempt (and the consent step-up): the count could have moved.
    const allowed = await call('locked_whoami')
    t.equal(allowed.status, 403, `${era}: locked_whoami is the consent step-up`)
    t.equal(oboRequests(emu, { scope: LOCKED_SCOPE }).length, attempts + 1, `${era}: one on-behalf-of request for the allowed tool`)
  }
})

t.test('no secret, key or token in the gateway output', async t => {
  const out = gw.output()
  t.notOk(out.includes(SECRET), 'the client secret')
  t.notOk(out.includes(PEM.split('\n')[1]!), 'the private key')
  for (const tok of clientTokens) t.notOk(out.includes(tok.split('.')[2]!), "a client token's signature")
  t.notMatch(out, /eyJ[\w-]+\.eyJ[\w-]+\.[\w-]+/, 'no JWT at all')
})
