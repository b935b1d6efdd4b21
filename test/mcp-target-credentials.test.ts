/**
 * The credential plumbing of the MCP layer (core/mcp/credentials.ts) in both eras, from the outside:
 * real callers (tokens of the dev IdP, verified by mcpAuthentication), a real MCP server over HTTP
 * (the conformance fixture, official SDK 2.x) behind a hop that records what reached it, a real stdio
 * child that prints its environment, and a stand-in for the credential layer itself
 * (helpers/credential-double.ts: headers and environment made from the caller's subject, refusals on
 * demand). What each test proves is in its name.
 */
import t, { type Test } from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { join } from 'node:path'
import type { TargetConfig } from '../core/config.ts'
import type { Plugin, PluginEnv } from '../core/plugin.ts'
import { Metrics } from '../core/observability/metrics.ts'
import authorization from '../plugins/authorization/index.ts'
import { INIT_HEADERS, ROOT, sseMessages, startGateway, until } from './helpers/gateway-harness.ts'
import { fixtureHttp, call, MODERN } from './helpers/conformance-fixture.ts'
import { realAuth } from './helpers/real-auth.ts'
import { recordingProxy, type Recorded } from './helpers/recording-proxy.ts'
import { brokerOf, credentialDouble, STEP_UP_CHALLENGE } from './helpers/credential-double.ts'
import { BASE } from './helpers/idp.ts'
import { memoryLogger } from './helpers/logger.ts'
import { createHttpPassthrough } from '../core/mcp/legacy/passthrough.ts'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'

const ENV_SERVER = join(ROOT, 'test/fixtures/env-server.mjs')
const MINTED = /^Bearer minted-(alice|bob)-\d+$/

const auth = await realAuth(t, ['alice', 'bob'])
const proxy = await recordingProxy(t, await fixtureHttp(t))

function httpTarget(name: string, headers: Record<string, string> = {}): TargetConfig {
  return { name, mcp: { url: proxy.url(name), headers } }
}

function envTarget(name: string, extra: Partial<NonNullable<TargetConfig['stdio']>> = {}): TargetConfig {
  return {
    name,
    stdio: {
      cmd: process.execPath,
      args: [ENV_SERVER, 'USER_ID', 'CRM_TOKEN', 'STATIC_VAR'],
      env: { USER_ID: 'from-the-config', STATIC_VAR: 'static' },
      ...extra,
    },
  }
}

interface Answer {
  status: number
  headers: Headers
  /** The JSON-RPC answer (the last message of an SSE stream). */
  message: any
  all: any[]
}

async function answerOf(res: Response): Promise<Answer> {
  const text = await res.text()
  const all = (res.headers.get('content-type') ?? '').startsWith('application/json') ? [JSON.parse(text)] : sseMessages(text)
  return { status: res.status, headers: res.headers, message: all.at(-1), all }
}

/** A raw session-era client of `url` for `subject` (a real token): initialize (its answer), then requests with the session id. */
async function rawSession(url: string, subject: string) {
  const authorization = `Bearer ${await auth.token(subject)}`
  const init = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, authorization },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    }),
  })
  const sid = init.headers.get('mcp-session-id')
  const opened = await answerOf(init)
  const headers = { ...INIT_HEADERS, authorization, 'mcp-session-id': sid ?? '', 'mcp-protocol-version': '2025-11-25' }
  if (sid !== null)
    await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) }).then(r => r.arrayBuffer())
  let seq = 0
  return {
    opened,
    sid,
    async call(method: string, params: Record<string, unknown> = {}): Promise<Answer> {
      return answerOf(await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: ++seq, method, params }) }))
    },
  }
}

/** One 2026-07-28 request of `subject`. */
async function modern(url: string, subject: string, method: string, params: Record<string, unknown>) {
  return call(url, method, params, {}, { authorization: `Bearer ${await auth.token(subject)}` })
}

function textOf(result: any): string {
  return (result?.content ?? []).map((c: { text?: string }) => c.text ?? '').join('')
}

/** The authorization plugin with `rules`, as the loader gives it (after mcpAuthentication). */
async function rules(list: string[]): Promise<Plugin> {
  const { log } = memoryLogger('warn')
  const env: PluginEnv = {
    log,
    config: {},
    baseUrl: BASE,
    configPath: 'mcp.policies.authorization',
    metrics: new Metrics(),
    provided: { protectedResource: { resource: BASE + '/mcp', scopesSupported: ['openid'] } },
  }
  return authorization.create({ rules: list }, env)
}

/** Every request `seen` carried a credential minted for one subject, the one its X-User names, never a client's token. */
async function checkMinted(t: Test, seen: readonly Recorded[]): Promise<void> {
  const tokens = [await auth.token('alice'), await auth.token('bob')]
  for (const r of seen) {
    const m = MINTED.exec(String(r.headers.authorization))
    t.ok(m !== null && r.headers['x-user'] === m[1], `${r.method} ${r.body?.method ?? ''}: ${r.headers.authorization} for ${r.headers['x-user']}`)
    t.notOk(
      tokens.some(tok => JSON.stringify(r.headers).includes(tok)),
      "never a client's own token"
    )
  }
}

t.test('session era: the caller headers reach every exchange (POST, GET stream, resumed GET, DELETE), each subject its own', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('crm', { 'x-static': 'static' })], plugins: [auth.plugin], credentials: brokerOf(crm) })
  const before = proxy.of('crm').length
  const sessions = await Promise.all(
    ['alice', 'bob'].map(async subject => {
      const client = new Client({ name: `creds-${subject}`, version: '1' })
      const transport = new StreamableHTTPClientTransport(new URL(g.url), { requestInit: { headers: await auth.as(subject) } })
      await client.connect(transport)
      // The fixture closes this call's stream before the answer: the gateway resumes it with a GET (Last-Event-ID).
      const res = await client.callTool({ name: 'test_reconnection', arguments: {} })
      return { subject, client, transport, text: textOf(res) }
    })
  )
  for (const s of sessions) t.ok(s.text.length > 0, `${s.subject}: the call across a reconnection was answered`)
  for (const s of sessions) await s.transport.terminateSession()
  for (const s of sessions) await s.client.close()
  const seen = () => proxy.of('crm').slice(before)
  t.ok(
    await until(() => ['alice', 'bob'].every(u => seen().some(r => r.method === 'DELETE' && r.headers['x-user'] === u))),
    'each upstream session was deleted with its caller'
  )
  const kinds = (u: string) => seen().filter(r => r.headers['x-user'] === u)
  for (const u of ['alice', 'bob']) {
    const mine = kinds(u)
    t.ok(
      mine.some(r => r.method === 'POST' && r.body?.method === 'initialize'),
      `${u}: initialize POST`
    )
    t.ok(
      mine.some(r => r.method === 'POST' && r.body?.method === 'tools/call'),
      `${u}: tools/call POST`
    )
    t.ok(
      mine.some(r => r.method === 'GET' && r.headers['last-event-id'] === undefined),
      `${u}: the server-to-client GET stream`
    )
    t.ok(
      mine.some(r => r.method === 'GET' && r.headers['last-event-id'] !== undefined),
      `${u}: the resumed GET`
    )
    t.ok(
      mine.some(r => r.method === 'DELETE'),
      `${u}: the DELETE`
    )
  }
  t.ok(
    seen().every(r => r.headers['x-static'] === 'static'),
    "the target's static headers still go with every exchange"
  )
  await checkMinted(t, seen())
  // One upstream session is one caller's: never a request of one subject in the other's session.
  const bySession = new Map<string, Set<unknown>>()
  for (const r of seen()) {
    const sid = r.headers['mcp-session-id']
    if (typeof sid === 'string') bySession.set(sid, (bySession.get(sid) ?? new Set()).add(r.headers['x-user']))
  }
  t.equal(bySession.size, 2, 'two upstream sessions')
  for (const users of bySession.values()) t.equal(users.size, 1, 'each upstream session saw one subject')
  t.same([...new Set(crm.resolves)].sort(), ['alice', 'bob'], 'resolved for each subject')
  t.same(crm.tokens.sort(), [await auth.token('alice'), await auth.token('bob')].sort(), "the credential layer got each caller's own token")
})

t.test('2026-07-28: the caller headers reach the target, each subject its own', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('crm')], plugins: [auth.plugin], credentials: brokerOf(crm) })
  const before = proxy.of('crm').length
  const [a, b] = await Promise.all([
    modern(g.url, 'alice', 'tools/call', { name: 'test_simple_text', arguments: {} }),
    modern(g.url, 'bob', 'tools/call', { name: 'test_simple_text', arguments: {} }),
  ])
  t.equal(a.status, 200)
  t.equal(b.status, 200)
  t.match(textOf(a.json.result), /simple text/)
  const seen = proxy.of('crm').slice(before)
  t.ok(
    seen.some(r => r.body?.method === 'tools/call' && r.headers['x-user'] === 'alice'),
    "alice's call went with her credential"
  )
  t.ok(
    seen.some(r => r.body?.method === 'tools/call' && r.headers['x-user'] === 'bob'),
    "bob's with his"
  )
  await checkMinted(t, seen)
})

t.test('a refused credential is answered before any header, with its status and challenge (session POST and 2026-07-28 request)', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('crm')], plugins: [auth.plugin], credentials: brokerOf(crm) })
  const before = proxy.of('crm').length

  crm.refuse('bob', 'step_up')
  const bob = await rawSession(g.url, 'bob')
  t.equal(bob.opened.status, 403, 'initialize refused: the step-up status')
  t.equal(bob.opened.headers.get('www-authenticate'), STEP_UP_CHALLENGE, 'with the challenge the client follows')
  t.equal(bob.sid, null, 'no session')
  t.match(bob.opened.message, { jsonrpc: '2.0', id: 0, error: { message: /target crm/ } })
  t.notOk(
    proxy
      .of('crm')
      .slice(before)
      .some(r => r.headers['x-user'] === 'bob'),
    'nothing reached the target for bob'
  )

  const alice = await rawSession(g.url, 'alice')
  t.equal(alice.opened.status, 200)
  crm.refuse('alice', 'unavailable')
  const calls = () =>
    proxy
      .of('crm')
      .slice(before)
      .filter(r => r.body?.method === 'tools/call').length
  const refused = await alice.call('tools/call', { name: 'test_simple_text', arguments: {} })
  t.equal(refused.status, 503, 'a session request refused: the broker status')
  t.equal(refused.headers.get('retry-after'), '5')
  t.match(refused.message, { id: 1, error: { message: 'target crm: the identity provider is unavailable' } })
  t.equal(calls(), 0, 'the call never reached the target')
  crm.allow('alice')
  const again = await alice.call('tools/call', { name: 'test_simple_text', arguments: {} })
  t.equal(again.status, 200, 'the session goes on once the credential is there again')
  t.match(textOf(again.message.result), /simple text/)

  crm.refuse('alice', 'step_up')
  const m = await modern(g.url, 'alice', 'tools/call', { name: 'test_simple_text', arguments: {} })
  t.equal(m.status, 403, '2026-07-28: the step-up status')
  t.match(m.json, { id: 7, error: { message: /target crm/ } })
  crm.refuse('alice', 'unavailable')
  const res = await fetch(g.url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, authorization: `Bearer ${await auth.token('alice')}`, 'mcp-protocol-version': MODERN, 'mcp-method': 'tools/list' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 9,
      method: 'tools/list',
      params: {
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
          'io.modelcontextprotocol/clientCapabilities': {},
        },
      },
    }),
  })
  t.equal(res.status, 503, 'a single target list is not a fan-out: the refusal is the answer')
  t.equal(res.headers.get('retry-after'), '5')
  t.equal(calls(), 1, 'only the call made while the credential was there reached the target')
})

t.test('a fan-out leaves out only the target whose credential is refused (both eras)', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('crm'), httpTarget('plain')], plugins: [auth.plugin], credentials: brokerOf(crm) })
  crm.refuse('bob', 'step_up')
  const names = (r: any): string[] => (r?.result?.tools ?? []).map((x: { name: string }) => x.name)

  const bob = await rawSession(g.url, 'bob')
  t.equal(bob.opened.status, 200, 'the session opens with the targets it can reach')
  const bobList = await bob.call('tools/list')
  t.ok(names(bobList.message).length > 0 && names(bobList.message).every(n => n.startsWith('plain_')), "bob's list: the plain target's tools only")
  const alice = await rawSession(g.url, 'alice')
  const aliceList = names((await alice.call('tools/list')).message)
  t.ok(aliceList.some(n => n.startsWith('crm_')) && aliceList.some(n => n.startsWith('plain_')), "alice's list: both targets")

  const bobModern = await modern(g.url, 'bob', 'tools/list', {})
  t.equal(bobModern.status, 200)
  t.ok(names(bobModern.json).length > 0 && names(bobModern.json).every(n => n.startsWith('plain_')), '2026-07-28: the plain target only')
  const aliceModern = names((await modern(g.url, 'alice', 'tools/list', {})).json)
  t.ok(aliceModern.some(n => n.startsWith('crm_')))
  const named = await modern(g.url, 'bob', 'tools/call', { name: 'crm_test_simple_text', arguments: {} })
  t.equal(named.status, 403, 'a named call of the left-out target answers the refusal')
  t.equal((await modern(g.url, 'bob', 'tools/call', { name: 'plain_test_simple_text', arguments: {} })).status, 200, 'the other target serves bob')
  t.match(g.logText(), /"target":"crm","code":"MCPP_ERR_TARGET_STEP_UP".*credential for target refused/, 'logged with the target and the code')
  t.notOk(
    proxy.of('plain').some(r => r.headers.authorization !== undefined || r.headers['x-user'] !== undefined),
    'a target without auth gets no credential'
  )
})

t.test('a call the rules deny costs no credential (both eras)', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, {
    targets: [httpTarget('crm')],
    plugins: [auth.plugin, await rules(['mcp.tool.name != "test_error_handling"'])],
    credentials: brokerOf(crm),
  })
  const before = proxy.of('crm').length
  const called = () =>
    proxy
      .of('crm')
      .slice(before)
      .filter(r => r.body?.method === 'tools/call')
      .map(r => r.body.params.name as string)

  const alice = await rawSession(g.url, 'alice')
  // The session's server-to-client GET stream opens in the background (with its own credential): let it, first.
  t.ok(
    await until(() =>
      proxy
        .of('crm')
        .slice(before)
        .some(r => r.method === 'GET')
    )
  )
  crm.clear()
  const resolved = crm.resolves.length
  const denied = await alice.call('tools/call', { name: 'test_error_handling', arguments: {} })
  t.equal(denied.status, 200)
  t.match(denied.message.error, { code: -32602, message: 'Unknown tool: test_error_handling' }, 'answered as a tool no target has')
  t.equal(crm.resolves.length, resolved, 'no credential was asked for')
  t.same(called(), [], 'nothing reached the target')
  t.equal((await alice.call('tools/call', { name: 'test_simple_text', arguments: {} })).status, 200)
  t.equal(crm.resolves.length, resolved + 1, 'an allowed call has its credential')
  const standIn = await alice.call('tools/call', { name: 'test_error_handling', arguments: {} })
  t.notMatch(JSON.stringify(standIn.message), /mcp-proxy-denied/, 'the stand-in name never reaches the caller')
  t.equal(crm.resolves.length, resolved + 1, 'a cached credential: the refused call goes on under its stand-in, no new resolve')
  t.match(called()[1], /^mcp-proxy-denied-/, 'the upstream was asked under the stand-in name only')

  crm.clear()
  const r2 = crm.resolves.length
  const m = await modern(g.url, 'alice', 'tools/call', { name: 'test_error_handling', arguments: {} })
  t.match(m.json.error, { code: -32602 }, '2026-07-28: refused')
  t.equal(crm.resolves.length, r2, '2026-07-28: no credential asked for')
})

t.test("stdio: the caller's environment reaches the child, each subject its own (session, share: subject, 2026-07-28)", async t => {
  const env = async (send: (name: string, args: Record<string, unknown>) => Promise<any>): Promise<{ pid: number; env: Record<string, string | null> }> =>
    JSON.parse(textOf(await send('env', {})))

  await t.test('one child per session', async t => {
    const tools = credentialDouble('tools')
    const g = await startGateway(t, { targets: [envTarget('tools')], plugins: [auth.plugin], credentials: brokerOf(tools) })
    const seen = await Promise.all(
      ['alice', 'bob'].map(async u => {
        const s = await rawSession(g.url, u)
        return env(async (name, args) => (await s.call('tools/call', { name, arguments: args })).message.result)
      })
    )
    t.match(seen[0]!.env, { USER_ID: 'alice', CRM_TOKEN: /^minted-alice-\d+$/, STATIC_VAR: 'static' }, "alice's child: her environment after the target's own")
    t.match(seen[1]!.env, { USER_ID: 'bob', CRM_TOKEN: /^minted-bob-\d+$/, STATIC_VAR: 'static' }, "bob's child: his")
    t.not(seen[0]!.pid, seen[1]!.pid)

    tools.refuse('bob', 'step_up')
    const refused = await rawSession(g.url, 'bob')
    t.equal(refused.opened.status, 403, 'a child whose environment is refused is never spawned: the refusal is the answer')
    t.equal(refused.opened.headers.get('www-authenticate'), STEP_UP_CHALLENGE)
  })

  await t.test('share: subject', async t => {
    const tools = credentialDouble('tools')
    const g = await startGateway(t, { targets: [envTarget('tools', { share: 'subject' })], plugins: [auth.plugin], credentials: brokerOf(tools) })
    const [a1, a2, b] = await Promise.all(
      ['alice', 'alice', 'bob'].map(async u => {
        const s = await rawSession(g.url, u)
        return env(async (name, args) => (await s.call('tools/call', { name, arguments: args })).message.result)
      })
    )
    t.equal(a1!.pid, a2!.pid, "alice's sessions share her child")
    t.not(a1!.pid, b!.pid, "bob's is another")
    t.match(a1!.env, { USER_ID: 'alice' })
    t.match(b!.env, { USER_ID: 'bob' })
  })

  await t.test('2026-07-28', async t => {
    const tools = credentialDouble('tools')
    const g = await startGateway(t, { targets: [envTarget('tools')], plugins: [auth.plugin], credentials: brokerOf(tools) })
    const [a, b] = await Promise.all(
      ['alice', 'bob'].map(async u => env(async (name, args) => (await modern(g.url, u, 'tools/call', { name, arguments: args })).json.result))
    )
    t.match(a!.env, { USER_ID: 'alice', CRM_TOKEN: /^minted-alice-/ })
    t.match(b!.env, { USER_ID: 'bob', CRM_TOKEN: /^minted-bob-/ })
  })
})

t.test('a caller without a token reaching a per-caller target is refused (fail closed)', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('crm')], credentials: brokerOf(crm) })
  const init = await fetch(g.url, {
    method: 'POST',
    headers: INIT_HEADERS,
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(init.status, 403, "the broker's refusal, as it is")
  t.same(crm.tokens, [undefined], 'asked without a token, and refused')
  const m = await call(g.url, 'tools/call', { name: 'test_simple_text', arguments: {} })
  t.equal(m.status, 403, '2026-07-28 too')
})

t.test('no auth: a target gets exactly what it got before (static headers, no attachment)', async t => {
  const crm = credentialDouble('crm')
  const g = await startGateway(t, { targets: [httpTarget('plain', { 'x-static': 'static' })], plugins: [auth.plugin], credentials: brokerOf(crm) })
  const before = proxy.of('plain').length
  const s = await rawSession(g.url, 'alice')
  t.equal((await s.call('tools/call', { name: 'test_simple_text', arguments: {} })).status, 200)
  t.equal((await modern(g.url, 'alice', 'tools/call', { name: 'test_simple_text', arguments: {} })).status, 200)
  const seen = proxy.of('plain').slice(before)
  t.ok(seen.length >= 3)
  for (const r of seen) {
    t.equal(r.headers['x-static'], 'static')
    t.equal(r.headers.authorization, undefined, 'no Authorization: the client token is never passed on')
    t.equal(r.headers['x-user'], undefined)
  }
  t.same(crm.resolves, [], 'the credential layer was never asked')
})

t.test('passthrough: the caller headers go with each request, the client token never; a refusal is the answer', async t => {
  const crm = credentialDouble('crm')
  const { log } = memoryLogger()
  const passthrough = createHttpPassthrough({ name: 'pass', mcp: { url: proxy.url('pass'), headers: { 'x-static': 'static' } } }, { log, auth: crm })
  const plugins = [auth.plugin]
  const gw = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: passthrough,
    log,
    metrics: new Metrics(),
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 5000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await gw.listen(0, '127.0.0.1')
  t.teardown(async () => {
    await passthrough.close()
    await gw.close(0)
  })
  const url = `http://127.0.0.1:${port}/mcp`

  const client = new Client({ name: 'creds-pass', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: await auth.as('alice') } })
  await client.connect(transport)
  t.match(textOf(await client.callTool({ name: 'test_simple_text', arguments: {} })), /simple text/)
  await transport.terminateSession()
  await client.close()
  const seen = proxy.of('pass')
  t.ok(
    seen.some(r => r.method === 'POST' && r.body?.method === 'tools/call'),
    'the call went through'
  )
  t.ok(
    seen.some(r => r.method === 'DELETE'),
    'so did the DELETE'
  )
  t.ok(
    seen.every(r => r.headers['x-user'] === 'alice' && r.headers['x-static'] === 'static'),
    "alice's credential and the static headers on every request"
  )
  await checkMinted(t, seen)

  crm.refuse('bob', 'step_up')
  const before = seen.length
  const bob = await rawSession(url, 'bob')
  t.equal(bob.opened.status, 403)
  t.equal(bob.opened.headers.get('www-authenticate'), STEP_UP_CHALLENGE)
  t.equal(proxy.of('pass').length, before, 'nothing reached the target')

  const alice = await rawSession(url, 'alice')
  t.equal(alice.opened.status, 200)
  crm.refuse('alice', 'unavailable')
  const refused = await alice.call('tools/list')
  t.equal(refused.status, 503)
  t.equal(refused.headers.get('retry-after'), '5')
  crm.allow('alice')
  t.equal((await alice.call('tools/list')).status, 200, 'and on once the credential is there')
})
