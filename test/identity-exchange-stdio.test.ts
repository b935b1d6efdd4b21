/**
 * Issue 25 from the outside: per-user environment for a stdio target. The
 * real CLI runs test/fixtures/env-server.mjs with `share: subject` and an
 * `auth` block that exchanges the caller's token (RFC 8693, dev IdP) and puts
 * `{sub}` and the minted token (`{credential}`) in the child's environment.
 * Two users get two children, each with its own USER_ID and a token minted
 * for them (decoded here); the same user again gets the same child.
 */
import t, { type Test } from 'tap'
import type { DevIdp } from '../bin/dev-idp.ts'
import {
  ENV_SERVER,
  EXCHANGE_CLIENT,
  EXCHANGE_SECRET,
  MODERN,
  audOf,
  claimsOf,
  exchangeCount,
  exchangeIdp,
  exchangeYaml,
  gatewayPorts,
  loginSdk1,
  loginSdk2,
  modernCall,
  resultOf,
  openRawSession,
  startCliGateway,
  toolJson,
  type CliGateway,
  gatewayHeadYaml,
} from './helpers/identity-e2e.ts'

const root = t
let idp: DevIdp
let gw: CliGateway

t.before(async () => {
  idp = await exchangeIdp(root, ['tools'])
  const ports = await gatewayPorts()
  const yaml = [
    ...gatewayHeadYaml(idp, ports),
    '    - name: tools',
    `      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(ENV_SERVER)}, USER_ID, CRM_TOKEN], share: subject }`,
    '      auth:',
    ...exchangeYaml(idp, 'tools'),
    "        env: { USER_ID: '{sub}', CRM_TOKEN: '{credential}' }",
    `admin: { host: 127.0.0.1, port: ${ports.admin} }`,
    '',
  ].join('\n')
  gw = await startCliGateway(root, yaml, { EXCHANGE_SECRET }, ports)
})

/** What one child reported, checked against the user whose child it must be. */
function checkChild(t: Test, env: Record<string, any>, user: string, clientToken: string): void {
  t.type(env.pid, 'number')
  t.equal(env.env?.USER_ID, user, `USER_ID is ${user}`)
  const token = env.env?.CRM_TOKEN as string
  if (!t.type(token, 'string', 'CRM_TOKEN holds the minted token')) return
  t.not(token, clientToken, "it is not the client's token")
  const claims = claimsOf(token)
  t.equal(claims.sub, user, `the minted token's sub is ${user}`)
  t.ok(audOf(claims).includes('tools'), `minted for the target's audience (aud ${JSON.stringify(claims.aud)})`)
  t.equal(claims.act?.sub, EXCHANGE_CLIENT, 'the gateway is the actor')
}

t.test('two users get two children, each with its own USER_ID and a token minted for them; the same user gets the same child again', async t => {
  const alice = await loginSdk1(t, gw.url, 'alice')
  const bob = await loginSdk2(t, gw.url, 'bob', true)
  t.equal(bob.client.getNegotiatedProtocolVersion(), MODERN, 'the 2.x client speaks 2026-07-28')

  const a = toolJson(await alice.client.callTool({ name: 'env', arguments: {} }))
  const b = toolJson(await bob.client.callTool({ name: 'env', arguments: {} }))
  checkChild(t, a, 'alice', alice.token)
  checkChild(t, b, 'bob', bob.token)
  t.not(a.pid, b.pid, 'two users, two children')
  t.not(a.env.CRM_TOKEN, b.env.CRM_TOKEN)

  // alice again, in a second session (raw, 2025-11-25) and on 2026-07-28: her child, her values.
  const session = await openRawSession(gw.url, alice.token)
  t.teardown(() => session.close())
  const again = toolJson(resultOf(await session.call('tools/call', { name: 'env', arguments: {} })))
  t.equal(again.pid, a.pid, "alice's second session shares her child (share: subject)")
  t.equal(again.env.USER_ID, 'alice', 'with her USER_ID')
  const modern = await modernCall(gw.url, alice.token, 'tools/call', { name: 'env', arguments: {} })
  t.equal(modern.status, 200, modern.status === 200 ? '2026-07-28 call answered' : modern.text.slice(0, 300))
  const m = toolJson(resultOf(modern))
  t.equal(m.env.USER_ID, 'alice', 'a 2026-07-28 call as alice reaches a child of alice')
  t.not(m.pid, b.pid, "never bob's child")
  const bobAgain = await modernCall(gw.url, bob.token, 'tools/call', { name: 'env', arguments: {} })
  t.equal(toolJson(resultOf(bobAgain)).env.USER_ID, 'bob', 'a 2026-07-28 call as bob reaches a child of bob')

  t.equal(exchangeCount(idp, { subject: 'alice', audience: 'tools' }), 1, 'one exchange for alice')
  t.equal(exchangeCount(idp, { subject: 'bob', audience: 'tools' }), 1, 'one exchange for bob')
})

t.test("concurrent calls of two users never reach the other user's child", async t => {
  const [carol, alice] = await Promise.all([loginSdk2(t, gw.url, 'carol', true), loginSdk1(t, gw.url, 'alice')])
  const seen = await Promise.all(
    Array.from({ length: 6 }, () => [
      carol.client.callTool({ name: 'env', arguments: {} }).then(r => ({ as: 'carol', env: toolJson(r) })),
      alice.client.callTool({ name: 'env', arguments: {} }).then(r => ({ as: 'alice', env: toolJson(r) })),
    ]).flat()
  )
  t.same(
    seen.filter(s => s.env.env?.USER_ID !== s.as || claimsOf(s.env.env?.CRM_TOKEN).sub !== s.as),
    [],
    'every answer came from a child of the caller, with their token'
  )
  const pids = (who: string): Set<number> => new Set(seen.filter(s => s.as === who).map(s => s.env.pid as number))
  t.same(
    [...pids('carol')].filter(p => pids('alice').has(p)),
    [],
    'no child served both users'
  )
})
