/**
 * Issue 25 from the outside, what goes wrong: a tool denied by an
 * authorization rule costs no exchange and is answered as the rules say; the
 * IdP refusing the exchange (an audience the gateway's client may not ask
 * for: invalid_target) answers the named call with an error naming the target
 * and never the IdP's error_description; the IdP down (its token endpoint a
 * closed loopback port) answers 503 with Retry-After; a fan-out (tools/list,
 * initialize) with failing targets still lists the others. Both eras.
 */
import t from 'tap'
import type { DevIdp } from '../bin/dev-idp.ts'
import { eventually, freePort } from './helpers/cli.ts'
import { outcome } from './helpers/outcome.ts'
import {
  EXCHANGE_SECRET,
  authPolicyYaml,
  directExchange,
  exchangeCount,
  exchangeIdp,
  exchangeYaml,
  gatewayPorts,
  jwtServer,
  metric,
  loginSdk2,
  modernCall,
  openRawSession,
  resultOf,
  startCliGateway,
  toolJson,
  type CliGateway,
  type RawAnswer,
  exchangeTargetYaml,
} from './helpers/identity-e2e.ts'

const root = t
let idp: DevIdp
let gw: CliGateway
const RULES = ['"mcp-users" in jwt.groups', 'mcp.tool.name != "dangerous" || "admins" in jwt.groups']

t.before(async () => {
  idp = await exchangeIdp(root, ['crm'])
  const [crm, secret, down] = await Promise.all(['crm', 'secret', 'down'].map(audience => jwtServer(root, idp, audience)))
  const closed = await freePort()
  const ports = await gatewayPorts()
  const yaml = [
    'mcp:',
    '  host: 127.0.0.1',
    `  port: ${ports.port}`,
    '  policies:',
    ...authPolicyYaml(idp, ports.port),
    '    authorization:',
    `      rules: ${JSON.stringify(RULES)}`,
    '  targets:',
    ...exchangeTargetYaml(idp, 'crm', crm!.url),
    // The exchange client may not mint for this audience: the IdP answers invalid_target.
    '    - name: vault',
    `      mcp: { url: ${JSON.stringify(secret!.url)} }`,
    '      auth:',
    ...exchangeYaml(idp, 'secret'),
    // Nothing listens on the token endpoint's port.
    '    - name: ledger',
    `      mcp: { url: ${JSON.stringify(down!.url)} }`,
    '      auth:',
    ...exchangeYaml(idp, 'down', `http://127.0.0.1:${closed}/application/o/token/`),
    `admin: { host: 127.0.0.1, port: ${ports.admin} }`,
    '',
  ].join('\n')
  gw = await startCliGateway(root, yaml, { EXCHANGE_SECRET }, ports)
})

const call = (token: string, name: string): Promise<RawAnswer> => modernCall(gw.url, token, 'tools/call', { name, arguments: {} })
const errorText = (r: RawAnswer): string => JSON.stringify(r.answer?.error ?? r.answer?.result ?? r.text)

/** What a client sees of one 2026-07-28 call, as comparable text (names replaced, see outcome.ts). */
function seenAs(token: string, name: string, names: string[]): Promise<string> {
  return outcome(async () => {
    const r = await call(token, name)
    if (r.answer?.error !== undefined) throw Object.assign(new Error(r.answer.error.message), r.answer.error)
    if (r.answer === undefined) throw new Error(`HTTP ${r.status}: ${r.text}`)
    return r.answer.result
  }, names)
}

t.test('a tool denied by a rule costs no exchange and is answered as the rules say', async t => {
  // carol's first request to the gateway: the IdP has never been asked for her.
  const carol = await idp.mintToken({ sub: 'carol', groups: ['mcp-users'] })
  const before = exchangeCount(idp)
  const denials = (): Promise<number> => metric(`${gw.admin}/metrics`, 'mcp_proxy_authorization_denials_total', { rule: '1' })
  const deniedBefore = await denials()
  const denied = await seenAs(carol, 'crm_dangerous', ['crm_dangerous', 'dangerous'])
  t.equal(exchangeCount(idp), before, 'the IdP was not asked: the rule refused the call first')
  t.equal(exchangeCount(idp, { subject: 'carol' }), 0)
  t.notMatch(denied, /denied|forbidden|admins|rule|policy|mcp-proxy-denied|done/i, `nothing hints at the rule, nothing ran (${denied})`)
  t.equal(await denials(), deniedBefore + 1, 'the refusal is counted against rule[1]')

  // Before carol has a credential for crm, hearing the target's own answer would cost an exchange: the
  // gateway answers the refused call itself, as for a name in no target (docs/authorization.md, the exception).
  t.match(denied, /Unknown tool: <name>/, `the gateway's own unknown-tool answer (${denied})`)
  // Once the credential is cached, a refused call reads exactly like a call to a tool the target does not have.
  const missing = await seenAs(carol, 'crm_no-such-tool', ['crm_no-such-tool', 'no-such-tool'])
  t.equal(exchangeCount(idp, { subject: 'carol', audience: 'crm' }), 1, 'an allowed call does exchange')
  t.match(missing, /<name>/, "that answer is the target's own, naming the tool asked for")
  const deniedWarm = await seenAs(carol, 'crm_dangerous', ['crm_dangerous', 'dangerous'])
  t.equal(deniedWarm, missing, 'with a credential cached, the denied call is answered exactly like a call to a tool that does not exist')
  t.equal(exchangeCount(idp, { subject: 'carol', audience: 'crm' }), 1, 'and costs no further exchange')

  // In a session the credential is there from initialize: the refused call goes on under a stand-in, and
  // reads exactly as the target's answer for a tool it does not have.
  const session = await openRawSession(gw.url, carol)
  t.teardown(() => session.close())
  const inSession = (name: string, names: string[]): Promise<string> =>
    outcome(async () => {
      const r = await session.call('tools/call', { name, arguments: {} })
      if (r.answer?.error !== undefined) throw Object.assign(new Error(r.answer.error.message), r.answer.error)
      return resultOf(r)
    }, names)
  const deniedInSession = await inSession('crm_dangerous', ['crm_dangerous', 'dangerous'])
  t.equal(deniedInSession, await inSession('crm_no-such-tool', ['crm_no-such-tool', 'no-such-tool']), 'session era: refused reads as unknown')
  t.notMatch(deniedInSession, /done/, 'and the tool did not run')

  const admin = await idp.mintToken({ sub: 'dave', groups: ['mcp-users', 'admins'] })
  t.match(await seenAs(admin, 'crm_dangerous', []), /done/, 'an admin may call it')

  const outsider = await idp.mintToken({ sub: 'mallory', groups: ['sales'] })
  const refused = await call(outsider, 'crm_whoami')
  t.equal(refused.status, 403, 'the endpoint rule: 403')
  t.same(JSON.parse(refused.text), { error: 'forbidden', error_description: 'access denied by authorization policy' })
  t.equal(exchangeCount(idp, { subject: 'mallory' }), 0, 'and no exchange for it')
})

t.test("the IdP refusing the exchange: the named call fails naming the target, never with the IdP's error_description", async t => {
  const bob = await loginSdk2(t, gw.url, 'bob', true)
  const direct = await directExchange(idp, bob.token, 'secret')
  t.equal(direct.body.error, 'invalid_target', 'the IdP itself refuses this audience')
  const description = String(direct.body.error_description ?? '')
  t.ok(description.length > 0, `the IdP says why (${description})`)

  const modern = await call(bob.token, 'vault_whoami')
  t.equal(modern.status, 502, `2026-07-28: 502 (${modern.text.slice(0, 200)})`)
  t.match(modern.answer?.error?.message, /\bvault\b/, 'the message names the target')
  t.match(modern.answer?.error?.message, /invalid_target/, "and the IdP's error code")
  t.notOk(modern.text.includes(description), "never the IdP's error_description")

  const session = await openRawSession(gw.url, bob.token)
  t.teardown(() => session.close())
  const inSession = await session.call('tools/call', { name: 'vault_whoami', arguments: {} })
  t.equal(inSession.status, 502, `session era: 502 (${inSession.text.slice(0, 200)})`)
  t.match(errorText(inSession), /vault[^"]*invalid_target/, 'naming the target and the IdP error code')
  t.notOk(inSession.text.includes(description), "never the IdP's error_description")

  // The SDK client sees an error too, and its other target still works.
  const sdk = await bob.client.callTool({ name: 'vault_whoami', arguments: {} }).then(
    r => JSON.stringify(r),
    (e: unknown) => String(e)
  )
  t.match(sdk, /\bvault\b/, `the 2.x client gets an error naming the target (${sdk.slice(0, 200)})`)
  t.notOk(sdk.includes(description), "never the IdP's error_description")
  t.equal(toolJson(await bob.client.callTool({ name: 'crm_whoami', arguments: {} })).sub, 'bob', "the client's other target still works")
  const logged = await eventually(gw.output, out => out.includes('invalid_target'), 100, 20)
  const line = logged.split('\n').find(l => l.includes('invalid_target') && l.includes('vault'))
  t.ok(line, `the refusal is logged with the target and the IdP's code (${line?.slice(0, 300)})`)
})

t.test('the IdP down: 503 with Retry-After, naming the target, in both eras', async t => {
  const bob = await idp.mintToken({ sub: 'bob', groups: ['mcp-users', 'sales'] })
  const modern = await call(bob, 'ledger_whoami')
  t.equal(modern.status, 503, `2026-07-28: 503 (${modern.text.slice(0, 200)})`)
  t.equal(modern.headers.get('retry-after'), '5', 'Retry-After: 5')
  t.match(modern.answer?.error?.message, /\bledger\b/, 'naming the target')

  const session = await openRawSession(gw.url, bob)
  t.teardown(() => session.close())
  const inSession = await session.call('tools/call', { name: 'ledger_whoami', arguments: {} })
  t.equal(inSession.status, 503, `session era: 503 (${inSession.text.slice(0, 200)})`)
  t.equal(inSession.headers.get('retry-after'), '5', 'Retry-After: 5')
  t.match(errorText(inSession), /\bledger\b/, 'naming the target')
})

t.test('a fan-out with failing targets still lists the others', async t => {
  const bob = await idp.mintToken({ sub: 'bob', groups: ['mcp-users', 'sales'] })
  const names = (r: RawAnswer): string[] => ((r.answer?.result?.tools ?? []) as Array<{ name: string }>).map(x => x.name)
  const modern = await modernCall(gw.url, bob, 'tools/list')
  t.equal(modern.status, 200, '2026-07-28 tools/list answered')
  t.ok(names(modern).includes('crm_whoami'), `2026-07-28 tools/list: the working target is listed (${names(modern).join(', ')})`)
  t.notOk(
    names(modern).some(n => n.startsWith('vault_') || n.startsWith('ledger_')),
    'the failing ones are left out'
  )

  const session = await openRawSession(gw.url, bob)
  t.teardown(() => session.close())
  const listed = await session.call('tools/list')
  t.equal(listed.status, 200, 'initialize and tools/list of a session answer despite two failing targets')
  t.ok(names(listed).includes('crm_whoami'), `session tools/list: ${names(listed).join(', ')}`)
  t.notOk(names(listed).some(n => n.startsWith('vault_') || n.startsWith('ledger_')))
})

t.test('the failures are counted per target and reason, and the admin view shows the last one', async t => {
  const failures = (target: string, reason: string): Promise<number> => metric(`${gw.admin}/metrics`, 'mcp_proxy_credential_failures_total', { target, reason })
  t.ok((await failures('vault', 'refused')) >= 1, 'vault: refused')
  t.ok((await failures('ledger', 'unavailable')) >= 1, 'ledger: unavailable')
  t.equal(await failures('crm', 'refused'), 0, 'crm: none')
  const targets = (await (await fetch(`${gw.admin}/api/targets`)).json()) as Array<{ name: string; credentials: Record<string, any> | null }>
  const view = Object.fromEntries(targets.map(x => [x.name, x.credentials]))
  t.match(view.vault, { mode: 'tokenExchange', lastFailure: { reason: 'refused' } })
  t.match(view.ledger, { mode: 'tokenExchange', lastFailure: { reason: 'unavailable' } })
  t.match(view.crm, { mode: 'tokenExchange', lastFailure: null })
  t.ok(view.crm!.cached >= 1, `crm caches its minted tokens (${view.crm!.cached})`)
})
