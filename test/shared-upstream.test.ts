/**
 * `share: subject` stdio targets (core/mcp/shared-upstream.ts): the sessions
 * of one subject lease one pooled server-everything child, other subjects
 * get their own; ids, progress, subscriptions, server-to-client requests and
 * crashes stay with the right session. Real SDK clients, real children,
 * subjects from real tokens (dev IdP, mcpAuthentication).
 */
import t, { type Test } from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import type { TargetConfig } from '../core/config.ts'
import { validateConfig } from '../core/config.ts'
import { startGateway, everythingTarget, faultyTarget, processGone, until, rawInitialize, type GatewayHarness } from './helpers/gateway-harness.ts'
import { realAuth, type RealAuth } from './helpers/real-auth.ts'

/** Every subject a test here connects as: each a service account of the dev IdP with a real token. */
const SUBJECTS = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'gina']

function shared(target: TargetConfig, processesPerSubject = 1): TargetConfig {
  return { ...target, stdio: { ...target.stdio!, share: 'subject', processesPerSubject } }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ type: string; text?: string }> }).content.map(c => c.text ?? '').join('\n')
}

async function connect(
  t: Test,
  gw: GatewayHarness,
  auth: RealAuth,
  subject: string,
  opts: { sampling?: boolean } = {}
): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const client = new Client({ name: `shared-${subject}`, version: '1.0.0' }, { capabilities: opts.sampling === true ? { sampling: {} } : {} })
  const transport = new StreamableHTTPClientTransport(new URL(gw.url), { requestInit: { headers: await auth.as(subject) } })
  await client.connect(transport)
  t.teardown(() => client.close())
  return { client, transport }
}

function pidOf(gw: GatewayHarness, transport: StreamableHTTPClientTransport): number | undefined {
  return gw.endpoint.sessions().find(s => transport.sessionId!.startsWith(s.id))?.pids[0]
}

t.test('config: share is session or subject, processesPerSubject bounded', async t => {
  const base = (stdio: Record<string, unknown>): unknown => ({ mcp: { port: 0, targets: [{ name: 'a', stdio: { cmd: 'node', ...stdio } }] } })
  const ok = await validateConfig(base({ share: 'subject', processesPerSubject: 2 }))
  t.match(ok.mcp.targets[0]!.stdio, { share: 'subject', processesPerSubject: 2 })
  const dflt = await validateConfig(base({}))
  t.match(dflt.mcp.targets[0]!.stdio, { share: 'session', processesPerSubject: 1 }, 'defaults: one process per session')
  await t.rejects(validateConfig(base({ share: 'everyone' })), /mcp\.targets\[0\]\.stdio\.share: must be one of "session", "subject"/)
  await t.rejects(validateConfig(base({ share: 'subject', processesPerSubject: 0 })), /mcp\.targets\[0\]\.stdio\.processesPerSubject: must be >= 1/)
})

t.test('sessions of one subject share a child; other subjects do not', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(everythingTarget())], plugins: [auth.plugin] })
  const a1 = await connect(t, gw, auth, 'alice')
  const a2 = await connect(t, gw, auth, 'alice')
  const b1 = await connect(t, gw, auth, 'bob')
  const pa1 = pidOf(gw, a1.transport)
  const pa2 = pidOf(gw, a2.transport)
  const pb1 = pidOf(gw, b1.transport)
  t.ok(pa1 !== undefined && pb1 !== undefined, 'pids reported')
  t.equal(pa1, pa2, "alice's two sessions use one child")
  t.not(pa1, pb1, 'bob has his own child')
  t.equal(gw.endpoint.pooled().length, 2, 'two pooled children')
  t.same(
    gw.endpoint
      .pooled()
      .map(p => [p.subject, p.leases])
      .sort(),
    [
      ['alice', 2],
      ['bob', 1],
    ],
    'leases per child'
  )
  t.match(a1.client.getServerVersion(), { name: 'mcp-servers/everything' }, 'serverInfo of the shared child')

  // Many concurrent calls from both sessions on one child: every answer goes to its own request.
  const calls: Array<Promise<void>> = []
  for (let i = 0; i < 40; i++) {
    const c = i % 2 === 0 ? a1.client : a2.client
    calls.push(
      c.callTool({ name: 'echo', arguments: { message: `m-${i}` } }).then(r => {
        t.equal(textOf(r), `Echo: m-${i}`)
      })
    )
  }
  await Promise.all(calls)

  // Progress goes to the session whose request asked for it, with its own token.
  const progress: number[] = []
  const long = a2.client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 0.3, steps: 3 } }, undefined, {
    onprogress: p => progress.push(p.progress),
  })
  const echo = await a1.client.callTool({ name: 'echo', arguments: { message: 'meanwhile' } })
  t.equal(textOf(echo), 'Echo: meanwhile', 'the other session is served while a long call runs')
  t.match(textOf(await long), /Long running operation completed/)
  t.same(progress, [1, 2, 3], 'progress reached the caller')

  // Ending one session leaves the child to the other.
  await a1.transport.terminateSession()
  t.ok(await until(() => gw.endpoint.sessions().length === 2), 'session gone')
  t.equal(textOf(await a2.client.callTool({ name: 'echo', arguments: { message: 'still here' } })), 'Echo: still here')
  t.equal(pidOf(gw, a2.transport), pa1, 'same child')
  t.notOk(processGone(pa1!), 'child alive while a session holds it')

  // The pool keeps an unleased child until its idle timeout; closing the gateway ends it.
  await a2.transport.terminateSession()
  t.ok(await until(() => gw.endpoint.pooled().find(p => p.subject === 'alice')?.leases === 0), 'no leases left')
  await gw.endpoint.close()
  t.ok(await until(() => processGone(pa1!) && processGone(pb1!)), 'children ended with the gateway')
})

t.test('processesPerSubject spreads sessions over several children', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(faultyTarget(), 2)], plugins: [auth.plugin] })
  const ids: string[] = []
  for (let i = 0; i < 4; i++) {
    const r = await rawInitialize(gw.url, '2025-06-18', await auth.as('carol'))
    t.equal(r.status, 200)
    ids.push(r.sessionId!)
  }
  const pids = new Set(gw.endpoint.sessions().map(s => s.pids[0]))
  t.equal(pids.size, 2, 'two children for four sessions')
  t.same(
    gw.endpoint.pooled().map(p => p.leases),
    [2, 2],
    'sessions balanced by leases'
  )
})

t.test('initialize keeps the client revision; subscriptions and notifications stay per session', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(everythingTarget())], plugins: [auth.plugin] })
  const old = await rawInitialize(gw.url, '2025-03-26', await auth.as('dave'))
  t.equal(old.status, 200)
  t.match(old.body, /"protocolVersion":"2025-03-26"/, 'a 2025-03-26 session stays 2025-03-26 on a child initialized at the latest revision')

  const s1 = await connect(t, gw, auth, 'dave')
  const s2 = await connect(t, gw, auth, 'dave')
  t.equal(pidOf(gw, s1.transport), pidOf(gw, s2.transport), 'one child')
  const updates1: string[] = []
  const updates2: string[] = []
  s1.client.setNotificationHandler(ResourceUpdatedNotificationSchema, n => {
    updates1.push(n.params.uri)
  })
  s2.client.setNotificationHandler(ResourceUpdatedNotificationSchema, n => {
    updates2.push(n.params.uri)
  })
  const { resources } = await s1.client.listResources()
  const uri = resources[0]!.uri
  t.same(await s1.client.subscribeResource({ uri }), {}, 'subscribed')
  t.same(await s1.client.subscribeResource({ uri }), {}, 'subscribing twice is harmless')
  // The tool sends one update at once for every subscribed URI (then every 5 s).
  await s2.client.callTool({ name: 'toggle-subscriber-updates', arguments: {} })
  t.ok(await until(() => updates1.includes(uri)), 'the subscribed session got notifications/resources/updated')
  t.same(updates2, [], 'the other session on the same child did not')
  t.same(await s1.client.unsubscribeResource({ uri }), {}, 'unsubscribed')
  t.same(await s2.client.unsubscribeResource({ uri }), {}, 'unsubscribing what was never subscribed is harmless')
})

t.test('server-to-client requests reach a session only if its client declared the capability', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(everythingTarget())], plugins: [auth.plugin] })
  const withSampling = await connect(t, gw, auth, 'erin', { sampling: true })
  withSampling.client.setRequestHandler(CreateMessageRequestSchema, async () => ({
    model: 'm',
    role: 'assistant',
    content: { type: 'text', text: 'sampled by erin' },
  }))
  const without = await connect(t, gw, auth, 'erin')
  const again = await connect(t, gw, auth, 'erin', { sampling: true })
  // Children are pooled per declared capability set: the child never learns sampling on behalf of a client that did not declare it.
  t.not(pidOf(gw, withSampling.transport), pidOf(gw, without.transport), 'a child per capability set')
  t.equal(pidOf(gw, withSampling.transport), pidOf(gw, again.transport), 'the same set shares its child')
  const yes = await withSampling.client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'x', maxTokens: 5 } })
  t.match(textOf(yes), /sampled by erin/, 'sampling round trip for the client that declared it')
  const no = await without.client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'x', maxTokens: 5 } }).then(
    r => JSON.stringify(r),
    (e: Error) => e.message
  )
  t.match(no, /not found/i, 'a client without sampling has no sampling tool, and is never sent a sampling request')
  t.notMatch(no, /sampled by erin/)
})

t.test('a crash of the shared child ends every session on it; the next initialize starts a new one', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(faultyTarget())], plugins: [auth.plugin] })
  const a = await connect(t, gw, auth, 'frank')
  const b = await connect(t, gw, auth, 'frank')
  const pid = pidOf(gw, a.transport)!
  const crash = a.client.callTool({ name: 'crash', arguments: {} }).then(
    () => 'answered',
    (e: Error) => e.message
  )
  t.match(await crash, /closed|Connection/i, 'the crashing call fails')
  t.ok(await until(() => gw.endpoint.sessions().length === 0), 'both sessions ended')
  t.ok(processGone(pid), 'child gone')
  const err = await b.client.callTool({ name: 'echo', arguments: { message: 'x' } }).then(
    () => 'answered',
    (e: Error) => e.message
  )
  t.match(err, /404|Session not found/, "the other session's next request gets 404")
  const c = await connect(t, gw, auth, 'frank')
  t.equal(textOf(await c.client.callTool({ name: 'echo', arguments: { message: 'again' } })), 'again')
  t.not(pidOf(gw, c.transport), pid, 'a new child')
})

t.test('the whole gateway (config file path: loader, upstream tracker, endpoint) honours share: subject', async t => {
  const { fullGateway } = await import('./helpers/full-gateway.ts')
  const target = shared(faultyTarget())
  const { gw, url } = await fullGateway(t, { targets: [target] })
  const a = await rawInitialize(url, '2025-06-18')
  const b = await rawInitialize(url, '2025-06-18')
  t.equal(a.status, 200)
  t.equal(b.status, 200)
  const pids = gw.endpoint.sessions().map(s => s.pids[0])
  t.equal(pids.length, 2, 'two sessions')
  t.ok(pids[0] !== undefined && pids[0] === pids[1], 'anonymous callers are one subject: one child for both sessions')
  t.equal(gw.endpoint.pooled().length, 1, 'one pooled child')
  const metrics = gw.metrics.render()
  t.match(metrics, /mcp_proxy_upstream_starts_total\{target="faulty"\} 1\n/, 'the tracker counted one start, not one per session')
})

t.test('a timed-out call on a shared child is cancelled there; the other session is unaffected', async t => {
  const auth = await realAuth(t, SUBJECTS)
  const gw = await startGateway(t, { targets: [shared(faultyTarget())], plugins: [auth.plugin], session: { requestTimeoutSeconds: 1 } })
  const a = await connect(t, gw, auth, 'gina')
  const b = await connect(t, gw, auth, 'gina')
  const hung = await a.client.callTool({ name: 'hang', arguments: {} }, undefined, { timeout: 30_000 }).then(
    () => 'answered',
    (e: Error) => e.message
  )
  t.match(hung, /timed out/i, 'the gateway answered the hung call with a timeout error')
  t.equal(gw.endpoint.pooled()[0]!.inFlight, 0, 'the call on the child was cancelled, not left in flight')
  t.equal(textOf(await b.client.callTool({ name: 'echo', arguments: { message: 'fine' } })), 'fine', 'the other session on the child still works')
  t.equal(textOf(await a.client.callTool({ name: 'echo', arguments: { message: 'me too' } })), 'me too', 'and so does the one that timed out')
})
