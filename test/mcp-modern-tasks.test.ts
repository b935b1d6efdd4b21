/**
 * The tasks extension of 2026-07-28 (SEP-2663, `io.modelcontextprotocol/tasks`) through the
 * gateway to targets that speak the revision (the conformance fixture over HTTP and stdio):
 * advertised in server/discover as the targets do, task-creating tools/call and tasks/get,
 * tasks/update, tasks/cancel forwarded natively, task ids `<target>_<taskId>` with several
 * targets, a task visible only to the subject whose call created it and only while the rules
 * allow its tool, and a subject's unfinished tasks bounded (mcp.limits.maxTasksPerSession).
 */
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { startDevIdp } from '../bin/dev-idp.ts'
import { call, fixtureHttp, fixtureStdio, type Answer } from './helpers/conformance-fixture.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { freePort } from './helpers/cli.ts'

const TASKS = 'io.modelcontextprotocol/tasks'
/** Per-request capabilities declaring the extension (SEP-2575 per-request opt-in). */
const WITH_TASKS = { elicitation: {}, extensions: { [TASKS]: {} } }

/** tasks/get until the task's status is one of `want` (a failure guard bounds the wait). */
async function until(url: string, taskId: string, want: string[], extra: Record<string, string> = {}): Promise<Answer> {
  for (let i = 0; ; i++) {
    const r = await call(url, 'tasks/get', { taskId }, WITH_TASKS, extra)
    if (want.includes(r.json.result?.status) || r.json.error !== undefined || i >= 100) return r
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

/** A task's whole life through `url`, its tools named with `prefix`: ids as the client sees them. */
async function lifecycle(t: Test, url: string, prefix: string): Promise<void> {
  const discover = await call(url, 'server/discover', {}, WITH_TASKS)
  t.ok(discover.json.result?.capabilities?.extensions?.[TASKS], 'the extension advertised as the target does', { got: discover.json })
  t.notOk(discover.json.result?.capabilities?.tasks, 'no session-era tasks capability')

  const created = await call(url, 'tools/call', { name: prefix + 'slow_compute', arguments: { seconds: 0.2, label: 'gw' } }, WITH_TASKS)
  t.equal(created.json.result?.resultType, 'task', 'a CreateTaskResult', { got: created.json })
  const taskId = created.json.result?.taskId as string
  t.ok(taskId.startsWith(prefix), `task id named ${prefix}<taskId>`, { taskId })
  const done = await until(url, taskId, ['completed'])
  t.equal(done.json.result?.taskId, taskId, 'tasks/get answers with the client-facing id')
  t.equal(done.json.result?.result?.content?.[0]?.text, 'computed gw', 'the result inlined')

  const input = await call(url, 'tools/call', { name: prefix + 'confirm_delete', arguments: { filename: 'x.txt' } }, WITH_TASKS)
  const parked = await until(url, input.json.result?.taskId, ['input_required'])
  t.same(Object.keys(parked.json.result?.inputRequests ?? {}), ['confirm'], 'input requests with their keys', { got: parked.json })
  const ack = await call(
    url,
    'tasks/update',
    { taskId: input.json.result?.taskId, inputResponses: { confirm: { action: 'accept', content: { confirm: true } } } },
    WITH_TASKS
  )
  t.same(ack.json.result?.resultType, 'complete', 'tasks/update acknowledged', { got: ack.json })
  const deleted = await until(url, input.json.result?.taskId, ['completed'])
  t.equal(deleted.json.result?.result?.content?.[0]?.text, 'deleted x.txt', 'the task resumed with the answer')

  const long = await call(url, 'tools/call', { name: prefix + 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS)
  const cancel = await call(url, 'tasks/cancel', { taskId: long.json.result?.taskId }, WITH_TASKS)
  t.equal(cancel.json.result?.resultType, 'complete', 'tasks/cancel acknowledged', { got: cancel.json })
  t.equal((await until(url, long.json.result?.taskId, ['cancelled'])).json.result?.status, 'cancelled', 'and cancelled upstream')

  const gated = await call(url, 'tasks/get', { taskId }, {})
  t.equal(gated.status, 400, 'a request without the extension: 400')
  t.equal(gated.json.error?.code, -32021, 'MissingRequiredClientCapability', { got: gated.json })
  const unknown = await call(url, 'tasks/get', { taskId: prefix + 'no-such-task' }, WITH_TASKS)
  t.equal(unknown.json.error?.code, -32602, 'an unknown task: -32602', { got: unknown.json })
  const mismatch = await call(url, 'tasks/get', { taskId }, WITH_TASKS, { 'mcp-name': 'another' })
  t.equal(mismatch.json.error?.code, -32020, 'Mcp-Name must mirror params.taskId', { got: mismatch.json })
  for (const method of ['tasks/result', 'tasks/list']) {
    const gone = await call(url, method, method === 'tasks/list' ? {} : { taskId }, WITH_TASKS)
    t.equal(gone.json.error?.code, -32601, `${method} is not in the extension: -32601`)
  }
}

t.test('one native target, HTTP and stdio: the extension forwarded as the target speaks it', async t => {
  const upstream = await fixtureHttp(t)
  const http = await fullGateway(t, { targets: [{ name: 'fixture', mcp: { url: upstream } }] })
  await lifecycle(t, http.url, '')
  const stdio = await fullGateway(t, { targets: [fixtureStdio()] })
  await lifecycle(t, stdio.url, '')
})

t.test('two native targets: task ids named <target>_<taskId>, routed back by that name', async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'remote', mcp: { url: upstream } }, fixtureStdio()] })
  await lifecycle(t, url, 'remote_')
  await lifecycle(t, url, 'fixture_')
})

t.test("a task is its creator's: another subject, or a tool the rules deny, finds no such task; the limit holds per subject", async t => {
  const idp = await startDevIdp()
  t.teardown(() => idp.close())
  const upstream = await fixtureHttp(t)
  const port = await freePort()
  const { url, logText } = await fullGateway(t, {
    port,
    targets: [{ name: 'fixture', mcp: { url: upstream } }],
    limits: { maxTasksPerSession: 2 },
    policies: {
      mcpAuthentication: {
        mode: 'strict',
        issuer: idp.issuer,
        audiences: [idp.clientId],
        provider: { oss_idp: {} },
        clientId: idp.clientId,
        resourceMetadata: { resource: `http://127.0.0.1:${port}/mcp` },
      },
      authorization: { rules: ['mcp.tool.name != "confirm_delete" || "deleters" in jwt.groups'] },
    },
  })
  const as = async (sub: string, groups: string[] = []): Promise<Record<string, string>> => ({
    authorization: `Bearer ${await idp.mintToken({ sub, groups })}`,
  })
  const alice = await as('alice', ['deleters'])
  const bob = await as('bob', ['deleters'])

  const created = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, alice)
  const taskId = created.json.result?.taskId as string
  t.type(taskId, 'string', 'alice created a task', { got: created.json })
  for (const method of ['tasks/get', 'tasks/update', 'tasks/cancel']) {
    const other = await call(url, method, method === 'tasks/update' ? { taskId, inputResponses: {} } : { taskId }, WITH_TASKS, bob)
    t.equal(other.json.error?.code, -32602, `bob: ${method} of alice's task is an unknown task`, { got: other.json })
  }
  t.equal(
    (await call(url, 'tasks/get', { taskId }, WITH_TASKS, alice)).json.result?.status,
    'working',
    "alice's task still runs (bob's cancel never reached it)"
  )

  // Rules hold for the task's tool: alice loses the group that allows confirm_delete.
  const asking = await call(url, 'tools/call', { name: 'confirm_delete', arguments: { filename: 'y' } }, WITH_TASKS, alice)
  const askingId = asking.json.result?.taskId as string
  t.type(askingId, 'string', 'a confirm_delete task', { got: asking.json })
  const demoted = await as('alice')
  t.equal((await call(url, 'tasks/get', { taskId: askingId }, WITH_TASKS, demoted)).json.error?.code, -32602, 'its tool denied now: an unknown task')

  // alice has two unfinished tasks: a third is refused (and cancelled upstream); bob has his own budget.
  const third = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, alice)
  t.match(third.json.error, { code: -32000, message: /Too many tasks/ }, 'past the limit: -32000', { got: third.json })
  t.match(logText(), /too many unfinished tasks/, 'and a warning')
  t.equal(
    (await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, bob)).json.result?.resultType,
    'task',
    'bob is not counted with alice'
  )
  await call(url, 'tasks/cancel', { taskId }, WITH_TASKS, alice)
  t.equal((await until(url, taskId, ['cancelled'], alice)).json.result?.status, 'cancelled', 'a cancelled task ends')
  const freed = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, alice)
  t.equal(freed.json.result?.resultType, 'task', 'its slot is free again', { got: freed.json })
  t.equal((await call(url, 'tasks/get', { taskId }, WITH_TASKS, alice)).json.result?.status, 'cancelled', 'an ended task stays known to its creator')
  const sync = await call(url, 'tools/call', { name: 'greet', arguments: { name: 'A' } }, WITH_TASKS, alice)
  t.equal(sync.json.result?.content?.[0]?.text, 'Hello, A!', 'at the limit, a call that creates no task is served')
})

t.test("past the limit the server's new task is cancelled upstream; a task whose ttlMs passed is forgotten and frees its slot", async t => {
  let n = 0
  const cancelled: string[] = []
  const upstream = createServer((req, res) => {
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        const reply = (result: unknown): void => {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result }))
        }
        const now = new Date().toISOString()
        if (body.method === 'server/discover')
          reply({ resultType: 'complete', supportedVersions: ['2026-07-28'], capabilities: { tools: {}, extensions: { [TASKS]: {} } } })
        else if (body.method === 'tools/call')
          reply({ resultType: 'task', taskId: `t${++n}`, status: 'working', createdAt: now, lastUpdatedAt: now, ttlMs: 100 })
        else if (body.method === 'tasks/cancel') {
          cancelled.push(body.params.taskId)
          reply({ resultType: 'complete' })
        } else if (body.method === 'tasks/get')
          reply({ resultType: 'complete', taskId: body.params.taskId, status: 'working', createdAt: now, lastUpdatedAt: now, ttlMs: 100 })
        else reply({ resultType: 'complete', tools: [] })
      })
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        upstream.closeAllConnections()
        upstream.close(() => resolve())
      })
  )
  const port = (upstream.address() as AddressInfo).port
  const { url } = await fullGateway(t, { targets: [{ name: 'raw', mcp: { url: `http://127.0.0.1:${port}/mcp` } }], limits: { maxTasksPerSession: 1 } })
  const first = await call(url, 'tools/call', { name: 'job', arguments: {} }, WITH_TASKS)
  t.equal(first.json.result?.status, 'working', 'the first task', { got: first.json })
  t.not(first.json.result?.taskId, 't1', "under a sealed id, not the upstream's")
  const second = await call(url, 'tools/call', { name: 'job', arguments: {} }, WITH_TASKS)
  t.match(second.json.error, { code: -32000, message: /Too many tasks/ }, 'past the limit', { got: second.json })
  // Failure guards only: the gateway's cancel is sent in the background, the TTL runs out on its own.
  for (let i = 0; i < 100 && !cancelled.includes('t2'); i++) await new Promise(resolve => setTimeout(resolve, 20))
  t.same(cancelled, ['t2'], 'the refused task was cancelled upstream')
  let accepted: Answer | undefined
  for (let i = 0; i < 100 && accepted === undefined; i++) {
    await new Promise(resolve => setTimeout(resolve, 50))
    const r = await call(url, 'tools/call', { name: 'job', arguments: {} }, WITH_TASKS)
    if (r.json.result?.resultType === 'task') accepted = r
  }
  t.ok(accepted, "after t1's ttlMs a new task is accepted")
  t.equal((await call(url, 'tasks/get', { taskId: first.json.result?.taskId }, WITH_TASKS)).json.error?.code, -32602, 'the expired task is forgotten')
  t.equal((await call(url, 'tasks/get', { taskId: 't1' }, WITH_TASKS)).json.error?.code, -32602, "the upstream's own id is no id of the gateway")
})
