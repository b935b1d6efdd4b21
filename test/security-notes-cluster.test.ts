/**
 * README "Security notes", cluster (issue 22 item 18), from the outside: a
 * session owner replica (the real CLI) that hangs (SIGSTOP) against
 * `cluster.forwardTimeoutMs`, continued (SIGCONT) and killed in teardown; a
 * forged or altered `requestState` (2026-07-28 input requests) is unknown and
 * relayed nowhere. Hung Redis: security-notes-redis.test.ts.
 */
import t from 'tap'
import { spawnCli, waitForPort, freePort, configFile } from './helpers/cli.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { everythingTarget } from './helpers/gateway-harness.ts'
import { call } from './helpers/conformance-fixture.ts'
import { SECRET, everything, stop, post, initialize } from './helpers/hung-peer.ts'
import { EVERYTHING } from './helpers/facade.ts'

t.test('cluster.forwardTimeoutMs: an owner that hangs (SIGSTOP) costs the client a 404, not a hung request', async t => {
  const ownerPort = await freePort()
  const owner = `http://127.0.0.1:${ownerPort}`
  const file = await configFile(
    [
      'mcp:',
      `  port: ${ownerPort}`,
      '  host: 127.0.0.1',
      '  targets:',
      '    - name: everything',
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      'admin: { enabled: false }',
      `cluster: { secret: "${SECRET}", advertiseUrl: "${owner}" }`,
    ].join('\n') + '\n',
    'mcpp-hung-owner-'
  )
  const run = spawnCli(['-f', file])
  t.teardown(async () => {
    if (run.child.exitCode !== null || run.child.signalCode !== null) return
    run.child.kill('SIGCONT')
    run.child.kill('SIGKILL')
    await run.exited
  })
  await waitForPort(ownerPort, run.exited)
  const relayPort = await freePort()
  const relay = await fullGateway(t, { port: relayPort, targets: [everything] }, 'debug', {
    cluster: { secret: SECRET, advertiseUrl: `http://127.0.0.1:${relayPort}`, forwardTimeoutMs: 1000 },
  })
  const sid = await initialize(`${owner}/mcp`)
  const list = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
  const through = await post(relay.url, list, { 'mcp-session-id': sid })
  t.equal(through.status, 200, "control: the relay serves the owner's session while the owner answers")
  stop(t, run.child)
  const hung = await post(relay.url, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }), { 'mcp-session-id': sid })
  t.equal(hung.status, 404, 'the owner does not answer the head in time: 404 (session gone)')
  t.equal(JSON.parse(hung.text).error.code, -32001)
  t.match(relay.logText(), /session owner cannot be reached/, 'logged by the relay')
  const fresh = await initialize(relay.url)
  t.ok(fresh, 'the client initializes again on the relay')
})

t.test('a forged or altered requestState (2026-07-28 input request, cluster) is unknown (-32602) and relayed nowhere', async t => {
  const replica = async (): Promise<FullGateway> => {
    const port = await freePort()
    return fullGateway(t, { port, targets: [everythingTarget()] }, 'debug', { cluster: { secret: SECRET, advertiseUrl: `http://127.0.0.1:${port}` } })
  }
  const a = await replica()
  const b = await replica()
  const caps = { elicitation: { form: {} } }
  const params = { name: 'trigger-elicitation-request', arguments: {} }
  const first = await call(a.url, 'tools/call', params, caps)
  t.equal(first.json.result?.resultType, 'input_required', 'a call parked on A', { got: first.json })
  const state = first.json.result?.requestState as string
  const key = Object.keys(first.json.result?.inputRequests ?? {})[0]!
  const retry = (requestState: string) => ({ ...params, requestState, inputResponses: { [key]: { action: 'decline' } } })
  const i = Math.floor(state.length / 2)
  const altered = state.slice(0, i) + (state[i] === 'A' ? 'B' : 'A') + state.slice(i + 1)
  for (const [name, forged] of [
    ['altered', altered],
    ['made up', 'A'.repeat(state.length)],
  ] as const) {
    const r = await call(b.url, 'tools/call', retry(forged), caps)
    t.same(r.json.error, { code: -32602, message: 'Invalid params: unknown or expired requestState' }, `${name}: unknown`, { got: r.json })
  }
  t.notMatch(b.logText(), /forwarded to the session owner|session owner cannot be reached/, 'B relayed none of them')
  const done = await call(b.url, 'tools/call', retry(state), caps)
  t.equal(done.json.result?.resultType, 'complete', 'control: the real requestState through B completes the call on A', { got: done.json })
  t.match(b.logText(), /forwarded to the session owner/, 'control: that one was relayed')
})
