/**
 * A target left out of a session at initialize because the caller's credential was refused
 * (core/mcp/legacy/session.ts `#revive`), reached again by a list fan-out in a multi-target
 * session, raw requests in the session era (what a client sees):
 * - while the credential is still refused, tools/list answers with the other targets (no error),
 *   nothing reaches the refused target, and the session goes on (its calls, a later revival);
 * - once it resolves (Entra consent granted), the next tools/list includes the target's tools
 *   (`<target>_`), the target gets one initialize and one notifications/initialized, and the
 *   client's GET stream one notifications/tools/list_changed (nothing for prompts or resources,
 *   which the target does not have);
 * - concurrent requests reviving the same target start it once (its initialize held at the
 *   target while they wait);
 * - the same with the dev IdP's RFC 8693 exchange refused as `invalid_target` (a 502, not a
 *   step-up, still a credential refusal) and then allowed.
 * The Entra emulator, identity servers (the consent target's behind a recording hop that can hold
 * its initialize), the real CLI; the dev IdP and an in-process gateway for the token exchange.
 */
import t, { type Test } from 'tap'
import { randomUUID } from 'node:crypto'
import { startEntraEmulator } from './helpers/entra-emulator.ts'
import { recordingProxy } from './helpers/recording-proxy.ts'
import { devIdp, loginToken, ossOptions } from './helpers/idp.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import {
  SECRET,
  identityServer,
  jwtArgs,
  startGateway,
  tokenFor,
  rawSession,
  resultOf,
  whoamiOf,
  oboRequests,
  claimsOf,
  bearerChallenge,
  type Answer,
  type Message,
  type RawSession,
} from './helpers/obo-world.ts'

const CONSENT_API = randomUUID()
const SCOPE = `api://${CONSENT_API}/.default`
const CAROL = { oid: randomUUID(), name: 'Carol', preferredUsername: 'carol@contoso.test' }
const DAVE = { oid: randomUUID(), name: 'Dave', preferredUsername: 'dave@contoso.test' }

const XSECRET = 'revive-exchange-secret-4e1a'
// The two IdPs and a target without credentials (nor any check: every session has one healthy target), started at once.
const [emu, idp, openServer] = await Promise.all([
  startEntraEmulator({
    clientSecret: SECRET,
    user: CAROL,
    users: { [DAVE.preferredUsername]: DAVE },
    downstreamApis: [{ appId: CONSENT_API, identifierUri: `api://${CONSENT_API}`, scopes: ['Reports.Read'], consented: false }],
  }),
  // The exchange client may not ask for `crm` yet: invalid_target until the test allows it.
  devIdp(t, { tokenExchange: { clients: { 'mcp-gateway': { secret: XSECRET, audiences: ['tickets'], scopes: ['crm.read'] } } } }),
  identityServer(t, ['--no-auth']),
])
t.teardown(() => emu.close())
const consentServer = await identityServer(t, jwtArgs({ jwksUrl: emu.jwksUrl, issuer: emu.issuerV2 }, CONSENT_API))

/** While set, an initialize reaching the consent target waits until `open` is called (a revival held in flight). */
let gate: { reached: () => void; opened: Promise<void> } | undefined
const proxy = await recordingProxy(t, consentServer.url, r => {
  if (gate === undefined || r.body?.method !== 'initialize') return undefined
  gate.reached()
  return gate.opened
})
const gw = await startGateway(
  t,
  emu,
  `    - name: open
      mcp: { url: "${openServer.url}" }
    - name: consent
      mcp: { url: "${proxy.url('consent')}" }
      auth:
        onBehalfOf:
          tokenEndpoint: "${emu.tokenUrl}"
          clientId: "${emu.clientId}"
          clientSecret: \${OBO_GATEWAY_SECRET}
          scope: "${SCOPE}"`
)

/** The JSON-RPC messages `method` carried to the consent target for the user `oid` (the bearer names the user). */
function reached(method: string, oid: string): number {
  return proxy.of('consent').filter(r => r.body?.method === method && claimsOf(/^Bearer (\S+)$/.exec(String(r.headers.authorization))?.[1] ?? '').oid === oid)
    .length
}

/** The on-behalf-of exchanges of `oid` for the consent target: refused (consent missing) and issued. */
function exchanges(oid: string): { refused: number; issued: number } {
  const all = oboRequests(emu, { oid, scope: SCOPE }).length
  const issued = emu.oboLog.filter(r => r.oid === oid && r.api === CONSENT_API && r.error === undefined).length
  return { refused: all - issued, issued }
}

/** The tool names of a tools/list answer (failing the test on an error answer). */
function toolNames(t: Test, a: Answer, label: string): string[] {
  const m = a.messages.find(x => x.id !== undefined)
  t.equal(a.status, 200, `${label}: HTTP 200`)
  t.notOk(m?.error, `${label}: no error${m?.error === undefined ? '' : ` (${JSON.stringify(m.error)})`}`)
  return ((m?.result?.tools ?? []) as Array<{ name: string }>).map(x => x.name).sort()
}

/** The list_changed notifications a GET stream carried, by kind. */
function listChanged(messages: readonly Message[]): Record<string, number> {
  const out: Record<string, number> = { tools: 0, prompts: 0, resources: 0 }
  for (const m of messages) {
    const kind = /^notifications\/(\w+)\/list_changed$/.exec(String(m.method))?.[1]
    if (kind !== undefined) out[kind] = (out[kind] ?? 0) + 1
  }
  return out
}

async function session(t: Test, url: URL, token: string): Promise<{ s: RawSession; stream: Promise<Message[]> }> {
  const s = await rawSession(url, token)
  t.teardown(() => s.close())
  const { messages } = await s.listen()
  return { s, stream: messages }
}

const OPEN = ['open_dangerous', 'open_whoami']
const ALL = ['consent_dangerous', 'consent_whoami', ...OPEN]

t.test('a list while the credential is refused leaves the target out; once consent is granted, a list revives it and announces it', async t => {
  const token = await tokenFor(gw.mcp, CAROL.preferredUsername)
  const { s, stream } = await session(t, gw.mcp, token)
  t.same(exchanges(CAROL.oid), { refused: 1, issued: 0 }, 'the initialize asked once, consent missing')

  const before = exchanges(CAROL.oid).refused
  t.same(toolNames(t, await s.call('tools/list'), 'refused'), OPEN, 'the other target answers, the refused one left out')
  t.equal(exchanges(CAROL.oid).refused, before + 1, 'the list tried the credential again (a refusal is not cached)')
  t.same(toolNames(t, await s.call('tools/list'), 'refused again'), OPEN, 'and again')
  t.equal(reached('initialize', CAROL.oid), 0, 'nothing reached the refused target')
  const named = await s.callTool('consent_whoami')
  t.equal(named.status, 403, "a named call's refusal is its answer")
  t.equal(bearerChallenge(named.headers.get('www-authenticate'))?.error, 'insufficient_scope', 'the consent step-up')
  t.equal(whoamiOf(resultOf(await s.callTool('open_whoami'))).bearerSha256, null, 'the session goes on: a call to the other target')

  emu.setConsent(CAROL.preferredUsername, CONSENT_API, true)
  t.same(toolNames(t, await s.call('tools/list'), 'consented'), ALL, "the revived target's tools, prefixed")
  const who = whoamiOf(resultOf(await s.callTool('consent_whoami')))
  t.equal(who.oid, CAROL.oid, 'the target sees the user')
  t.equal(who.aud, CONSENT_API, 'with its own audience')
  t.same(toolNames(t, await s.call('tools/list'), 'joined'), ALL, 'the target stays in the session')
  t.equal(reached('initialize', CAROL.oid), 1, 'the target was initialized once')
  t.equal(reached('notifications/initialized', CAROL.oid), 1, 'and told so once')
  t.same(exchanges(CAROL.oid).issued, 1, 'one token minted, then cached')

  await s.close()
  t.same(listChanged(await stream), { tools: 1, prompts: 0, resources: 0 }, 'the GET stream: tools/list_changed once, none while refused')
})

t.test('concurrent requests reviving the same target start it once', async t => {
  const token = await tokenFor(gw.mcp, DAVE.preferredUsername)
  const { s, stream } = await session(t, gw.mcp, token)
  t.equal(reached('initialize', DAVE.oid), 0, 'left out at initialize')
  emu.setConsent(DAVE.preferredUsername, CONSENT_API, true)

  let reachedGate!: () => void
  let open!: () => void
  const held = new Promise<void>(resolve => (reachedGate = resolve))
  gate = { reached: () => reachedGate(), opened: new Promise<void>(resolve => (open = resolve)) }
  t.teardown(() => {
    gate = undefined
    open()
  })
  const calls = [s.call('tools/list'), s.call('tools/list'), s.call('tools/list'), s.callTool('consent_whoami')]
  await held
  // The four were sent before this ping, which is answered while the revival is still held: they meet the
  // revival in flight (one arriving after the release would find the target up: weaker, never a false failure).
  t.equal((await s.call('ping')).status, 200, 'the session answers meanwhile')
  open()
  const [l1, l2, l3, call] = await Promise.all(calls)
  for (const [i, a] of [l1!, l2!, l3!].entries()) t.same(toolNames(t, a, `list ${i + 1}`), ALL, `list ${i + 1} includes the revived target`)
  t.equal(whoamiOf(resultOf(call!)).oid, DAVE.oid, 'the named call reached it')
  t.equal(reached('initialize', DAVE.oid), 1, 'one initialize at the target')
  t.equal(reached('notifications/initialized', DAVE.oid), 1, 'one notifications/initialized')
  t.equal(exchanges(DAVE.oid).issued, 1, 'one token minted')

  await s.close()
  t.same(listChanged(await stream), { tools: 1, prompts: 0, resources: 0 }, 'one tools/list_changed')
})

t.test('the token exchange refused as invalid_target (502), then allowed: a list revives the target', async t => {
  const crmProxy = await recordingProxy(t, (await identityServer(t, jwtArgs(idp, 'crm', 'crm.read'))).url)
  const exchange = { tokenEndpoint: idp.tokenEndpoint, clientId: 'mcp-gateway', clientSecret: XSECRET, audience: ['crm'], scope: 'crm.read' }
  const g = await fullGateway(t, {
    targets: [
      { name: 'open', mcp: { url: openServer.url } },
      { name: 'crm', mcp: { url: crmProxy.url('crm') }, auth: { tokenExchange: exchange } },
    ],
    policies: { mcpAuthentication: ossOptions(idp) },
  })
  const token = await loginToken(idp, 'alice')
  const { s, stream } = await session(t, new URL(g.url), token)
  const refusals = (): number => idp.exchangeLog.filter(r => r.error === 'invalid_target').length
  t.equal(refusals(), 1, 'the initialize was refused: invalid_target')

  t.same(toolNames(t, await s.call('tools/list'), 'refused'), OPEN, 'the other target answers, the refused one left out')
  t.equal(refusals(), 2, 'the list tried the exchange again')
  const named = await s.callTool('crm_whoami')
  t.equal(named.status, 502, 'a named call: 502')
  t.match(named.messages[0]?.error?.message, /crm.*\(invalid_target\)/, 'naming the target and the code')
  t.equal(whoamiOf(resultOf(await s.callTool('open_whoami'))).bearerSha256, null, 'the session goes on')
  t.equal(crmProxy.of('crm').length, 0, 'nothing reached the refused target')

  idp.setTokenExchangePolicy('mcp-gateway', { audiences: ['crm'] })
  t.same(toolNames(t, await s.call('tools/list'), 'allowed'), ['crm_dangerous', 'crm_whoami', ...OPEN], "the revived target's tools")
  const who = whoamiOf(resultOf(await s.callTool('crm_whoami')))
  t.match(who, { sub: claimsOf(token).sub, aud: 'crm', act: { sub: 'mcp-gateway' } }, 'the target sees the user, its audience, the gateway as actor')
  t.equal(crmProxy.of('crm').filter(r => r.body?.method === 'initialize').length, 1, 'one initialize at the target')
  t.equal(idp.exchanges, 1, 'one token minted')

  await s.close()
  t.same(listChanged(await stream), { tools: 1, prompts: 0, resources: 0 }, 'the GET stream: tools/list_changed once')
})
