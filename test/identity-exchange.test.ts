/**
 * Issue 25 from the outside, RFC 8693 token exchange on the dev IdP: users
 * log in through the gateway (the real CLI) with the official SDK clients
 * (1.x in a session, 2.x on 2026-07-28) and call `whoami` on an HTTP MCP
 * server that checks its bearer itself (signature, issuer, its own audience).
 * The target sees the user, its own audience and the gateway as the actor,
 * never the client's token; two users at once never cross; the cache makes it
 * one exchange per (user, target); claim headers reach the target; a static
 * bearer reaches its own target only.
 */
import t, { type Test } from 'tap'
import type { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import type { Client as Client2 } from '@modelcontextprotocol/client'
import type { DevIdp } from '../bin/dev-idp.ts'
import {
  EXCHANGE_CLIENT,
  EXCHANGE_SECRET,
  MODERN,
  audOf,
  exchangeCount,
  exchangeIdp,
  gatewayPorts,
  identityServer,
  jwtServer,
  loginSdk1,
  loginSdk2,
  metric,
  modernCall,
  resultOf,
  openRawSession,
  sha256,
  startCliGateway,
  whoamiOf,
  type CliGateway,
  type IdentityServer,
  type LoggedIn,
  type Whoami,
  gatewayHeadYaml,
  exchangeTargetYaml,
} from './helpers/identity-e2e.ts'

const LEGACY_API_KEY = 'legacy-static-api-key-8c2e41b7d9'
/** Clients logged in here live for the whole file: their teardown is the root's. */
const root = t

let idp: DevIdp
let crm: IdentityServer
let legacy: IdentityServer
let plain: IdentityServer
let gw: CliGateway
let alice: LoggedIn<Client1>
let bob: LoggedIn<Client2>

t.before(async () => {
  idp = await exchangeIdp(root, ['crm'])
  ;[crm, legacy, plain] = await Promise.all([
    jwtServer(root, idp, 'crm'),
    identityServer(root, ['--static-bearer', LEGACY_API_KEY]),
    identityServer(root, ['--no-auth']),
  ])
  const ports = await gatewayPorts()
  const yaml = [
    ...gatewayHeadYaml(idp, ports),
    ...exchangeTargetYaml(idp, 'crm', crm.url),
    "        headers: { X-User: '{sub}', X-Groups: '{groups}' }",
    '    - name: legacy',
    `      mcp: { url: ${JSON.stringify(legacy.url)} }`,
    '      auth: { bearer: "${LEGACY_API_KEY}" }',
    '    - name: plain',
    `      mcp: { url: ${JSON.stringify(plain.url)} }`,
    `admin: { host: 127.0.0.1, port: ${ports.admin} }`,
    '',
  ].join('\n')
  gw = await startCliGateway(root, yaml, { EXCHANGE_SECRET, LEGACY_API_KEY }, ports)
})

/** What the crm target saw of one call, checked against the user who made it. */
function checkSeenAs(t: Test, w: Whoami, user: string, clientToken: string): void {
  t.equal(w.sub, user, `the target saw ${user}`)
  t.ok(audOf(w).includes('crm'), `its own audience (aud ${JSON.stringify(w.aud)})`)
  t.notOk(audOf(w).includes(idp.clientId), "not the audience of the client's token")
  t.equal(w.act?.sub, EXCHANGE_CLIENT, 'the gateway is the actor (act.sub)')
  t.equal(w.iss, idp.issuer, 'issued by the IdP')
  t.not(w.bearerSha256, sha256(clientToken), "the bearer is not the client's token")
}

const whoami1 = async (c: Client1, tool = 'crm_whoami'): Promise<Whoami> => whoamiOf(await c.callTool({ name: tool, arguments: {} }))
const whoami2 = async (c: Client2, tool = 'crm_whoami'): Promise<Whoami> => whoamiOf(await c.callTool({ name: tool, arguments: {} }))

t.test('SDK 1.x in a session: alice logs in through the gateway; the target sees alice, its own audience, the gateway as actor, never her token', async t => {
  alice = await loginSdk1(root, gw.url, 'alice')
  const tools = (await alice.client.listTools()).tools.map(x => x.name)
  t.ok(tools.includes('crm_whoami'), `the target's tool is listed (${tools.join(', ')})`)
  checkSeenAs(t, await whoami1(alice.client), 'alice', alice.token)
  t.notOk((await crm.seen()).includes(sha256(alice.token)), "GET /seen: the target never received alice's token")
})

t.test('SDK 2.x on 2026-07-28: bob logs in through the gateway; the target sees bob, never his token', async t => {
  bob = await loginSdk2(root, gw.url, 'bob', true)
  t.equal(bob.client.getNegotiatedProtocolVersion(), MODERN, 'the 2.x client speaks 2026-07-28')
  const tools = (await bob.client.listTools()).tools.map(x => x.name)
  t.ok(tools.includes('crm_whoami'), 'tools/list through the gateway')
  checkSeenAs(t, await whoami2(bob.client), 'bob', bob.token)
  t.notOk((await crm.seen()).includes(sha256(bob.token)), "GET /seen: the target never received bob's token")
})

t.test('raw requests with the tokens the clients got: a 2025-11-25 session and a single 2026-07-28 request', async t => {
  const session = await openRawSession(gw.url, alice.token)
  t.teardown(() => session.close())
  const inSession = await session.call('tools/call', { name: 'crm_whoami', arguments: {} })
  t.equal(inSession.status, 200, '2025-11-25 session call answered')
  checkSeenAs(t, whoamiOf(resultOf(inSession)), 'alice', alice.token)

  const modern = await modernCall(gw.url, bob.token, 'tools/call', { name: 'crm_whoami', arguments: {} })
  t.equal(modern.status, 200, modern.status === 200 ? '2026-07-28 call answered' : modern.text.slice(0, 300))
  checkSeenAs(t, whoamiOf(resultOf(modern)), 'bob', bob.token)

  const listed = await modernCall(gw.url, alice.token, 'tools/list')
  t.ok(
    (listed.answer?.result?.tools as Array<{ name: string }>).some(x => x.name === 'crm_whoami'),
    '2026-07-28 tools/list lists the target'
  )
})

t.test('two users at once never cross; one exchange per (user, target); repeated calls are cache hits', async t => {
  const hits = { target: 'crm', result: 'hit' }
  const hitsBefore = await metric(`${gw.admin}/metrics`, 'mcp_proxy_credential_exchanges_total', hits)
  const rounds = 8
  const seen = await Promise.all(
    Array.from({ length: rounds }, (_, i) => [
      whoami1(alice.client).then(w => ({ as: 'alice', w, i })),
      whoami2(bob.client).then(w => ({ as: 'bob', w, i })),
      modernCall(gw.url, alice.token, 'tools/call', { name: 'crm_whoami', arguments: {} }).then(r => ({ as: 'alice', w: whoamiOf(resultOf(r)), i })),
      modernCall(gw.url, bob.token, 'tools/call', { name: 'crm_whoami', arguments: {} }).then(r => ({ as: 'bob', w: whoamiOf(resultOf(r)), i })),
    ]).flat()
  )
  t.equal(seen.length, rounds * 4, 'every call answered')
  const crossed = seen.filter(s => s.w.sub !== s.as)
  t.same(crossed, [], 'every call was made as the user who made it')
  t.same(new Set(seen.filter(s => s.as === 'alice').map(s => s.w.bearerSha256)).size, 1, "alice's calls carried one minted token (cached)")
  t.same(new Set(seen.filter(s => s.as === 'bob').map(s => s.w.bearerSha256)).size, 1, "bob's calls carried one minted token (cached)")
  t.not(seen.find(s => s.as === 'alice')!.w.bearerSha256, seen.find(s => s.as === 'bob')!.w.bearerSha256, 'each user has a token of their own')

  t.equal(exchangeCount(idp, { subject: 'alice', audience: 'crm' }), 1, 'the IdP minted one crm token for alice')
  t.equal(exchangeCount(idp, { subject: 'bob', audience: 'crm' }), 1, 'the IdP minted one crm token for bob')
  t.equal(exchangeCount(idp), 2, 'and nothing else (no exchange for the static-bearer or plain targets)')
  const hitsAfter = await metric(`${gw.admin}/metrics`, 'mcp_proxy_credential_exchanges_total', hits)
  t.ok(hitsAfter >= hitsBefore + rounds * 4, `mcp_proxy_credential_exchanges_total{result="hit"} grew by every call (${hitsBefore} -> ${hitsAfter})`)
  t.equal(await metric(`${gw.admin}/metrics`, 'mcp_proxy_credential_exchanges_total', { target: 'crm', result: 'miss' }), 2, 'two misses: one per user')
})

t.test('claim headers reach the target; a static bearer reaches only its own target', async t => {
  const a = await whoami1(alice.client)
  t.equal(a.headers?.['x-user'], 'alice', 'X-User: {sub}')
  t.equal(a.headers?.['x-groups'], 'mcp-users', 'X-Groups: {groups}')
  const b = await whoami2(bob.client)
  t.equal(b.headers?.['x-user'], 'bob', 'X-User for bob')
  t.equal(b.headers?.['x-groups'], 'mcp-users,sales', 'an array claim is joined by ","')

  const staticKey = sha256(LEGACY_API_KEY)
  for (const [who, call] of [
    ['alice', () => whoami1(alice.client, 'legacy_whoami')],
    ['bob', () => whoami2(bob.client, 'legacy_whoami')],
  ] as const) {
    const w = await call()
    t.equal(w.bearerSha256, staticKey, `${who}: the static-bearer target got the key from the environment`)
    t.equal(w.headers?.['x-user'], undefined, `${who}: no claim headers where none are configured`)
  }
  for (const [who, call] of [
    ['alice', () => whoami1(alice.client, 'plain_whoami')],
    ['bob', () => whoami2(bob.client, 'plain_whoami')],
  ] as const) {
    const w = await call()
    t.notOk(w.bearerSha256, `${who}: the target without auth sees no Authorization at all`)
    t.equal(w.headers?.['x-user'], undefined, `${who}: and no claim headers`)
  }
  t.same(await plain.seen(), [], 'GET /seen of the target without auth: no bearer ever')
  const legacySeen = await legacy.seen()
  t.ok(legacySeen.length > 0 && legacySeen.every(h => h === staticKey), 'the static-bearer target only ever got its key')
  t.notOk((await crm.seen()).includes(staticKey), 'the static key never reached another target')
})

t.test("no target ever received a client's token, in any mode", async t => {
  const clientTokens = new Set([sha256(alice.token), sha256(bob.token)])
  for (const [name, server] of [
    ['crm', crm],
    ['legacy', legacy],
    ['plain', plain],
  ] as const) {
    const seen = await server.seen()
    t.same(
      seen.filter(h => clientTokens.has(h)),
      [],
      `${name}: none of the ${seen.length} bearers it received is a client's token`
    )
  }
})
