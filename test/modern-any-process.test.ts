/**
 * 2026-07-28 requests served by any process (issue 16 item 4): the real CLI
 * with `workers: 2`, every request on a fresh TCP connection so the primary's
 * round-robin spreads them over both workers. A task of the tasks extension
 * (SEP-2663) created on one worker is polled, updated and cancelled through
 * either (its id is the task sealed to its creator, task-seal.ts), the
 * per-subject task limit holds across workers (shared state), and an altered
 * id is an unknown task. A translated call (server-everything, session era)
 * parked on an InputRequiredResult is resumed by a retry landing on the other
 * worker (relayed to the owner its requestState names); with the owner gone
 * the retry's requestState is unknown (-32602). The same through two
 * in-process replicas sharing `cluster.secret`.
 */
import t, { type Test } from 'tap'
import { call, fixtureHttp } from './helpers/conformance-fixture.ts'
import { configFile, freePort, freshFetch, spawnCli, waitForPort, workersOf } from './helpers/cli.ts'
import { EVERYTHING, everythingTarget } from './helpers/gateway-harness.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'

const TASKS = 'io.modelcontextprotocol/tasks'
const WITH_TASKS = { elicitation: {}, extensions: { [TASKS]: {} } }
const LIMIT = 2

/** The CLI with `workers: 2` in front of `targets` (YAML lines); its /mcp URL once the port accepts. */
async function twoWorkers(t: Test, targets: string[], extra: string[] = []): Promise<{ url: string; pid: number }> {
  const port = await freePort()
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  targets:',
      ...targets.map(l => '    ' + l),
      ...extra,
      'workers: 2',
      // No admin listener: test files run in parallel, and two CLIs on the default admin.port (15000) refuse to start.
      'admin: { enabled: false }',
    ].join('\n'),
    'mcpp-anyproc-'
  )
  const cli = spawnCli(['-f', file])
  // SIGKILL: the primary's workers and children go with it (workers.test.ts checks that); nothing here is about shutdown.
  t.teardown(async () => {
    if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill('SIGKILL')
    await cli.exited
  })
  const giveUp = Promise.race([cli.exited, new Promise(resolve => setTimeout(resolve, 60_000).unref())])
  await waitForPort(port, giveUp)
  // Both workers up (a failure guard bounds the wait): round-robin then alternates between them.
  for (let i = 0; i < 300 && workersOf(cli.child.pid!).length < 2; i++) await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(workersOf(cli.child.pid!).length, 2, 'two workers')
  return { url: `http://127.0.0.1:${port}/mcp`, pid: cli.child.pid! }
}

const fresh = freshFetch as typeof fetch

t.test('workers: 2: a task is served by either worker; the per-subject limit holds across them', async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await twoWorkers(t, [`- { name: fixture, mcp: { url: "${upstream}" } }`], [`  limits: { maxTasksPerSession: ${LIMIT} }`])
  const created = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, {}, fresh)
  const taskId = created.json.result?.taskId as string
  t.type(taskId, 'string', 'a task', { got: created.json })
  // Six polls over fresh connections: three land on each worker.
  for (let i = 0; i < 6; i++) {
    const got = await call(url, 'tasks/get', { taskId }, WITH_TASKS, {}, fresh)
    t.equal(got.json.result?.status, 'working', `tasks/get #${i + 1}: the task, wherever it lands`, { got: got.json })
    t.equal(got.json.result?.taskId, taskId, 'under the id the client knows')
  }
  const tampered = taskId.slice(0, 20) + (taskId[20] === 'A' ? 'B' : 'A') + taskId.slice(21)
  for (let i = 0; i < 2; i++) {
    const bad = await call(url, 'tasks/get', { taskId: tampered }, WITH_TASKS, {}, fresh)
    t.equal(bad.json.error?.code, -32602, 'an altered id: an unknown task', { got: bad.json })
  }

  // Up to the limit, wherever each call lands: the one task above and one more, then refused.
  const results: string[] = []
  for (let i = 0; i < 4; i++) {
    const r = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, {}, fresh)
    results.push(r.json.result?.resultType ?? r.json.error?.code)
  }
  t.same(results, ['task', -32000, -32000, -32000], `${LIMIT} unfinished tasks across both workers, no more`)

  const cancel = await call(url, 'tasks/cancel', { taskId }, WITH_TASKS, {}, fresh)
  t.equal(cancel.json.result?.resultType, 'complete', 'cancelled through whichever worker', { got: cancel.json })
  let status: unknown
  for (let i = 0; i < 100 && status !== 'cancelled'; i++) status = (await call(url, 'tasks/get', { taskId }, WITH_TASKS, {}, fresh)).json.result?.status
  t.equal(status, 'cancelled', 'and cancelled upstream')
  const freed = await call(url, 'tools/call', { name: 'slow_compute', arguments: { seconds: 60 } }, WITH_TASKS, {}, fresh)
  t.equal(freed.json.result?.resultType, 'task', 'its slot is free again on every worker', { got: freed.json })
})

t.test('workers: 2: a parked translated call is resumed by a retry on the other worker; its owner gone, the requestState is unknown', async t => {
  const { url, pid } = await twoWorkers(t, [`- { name: everything, stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] } }`])
  const caps = { elicitation: { form: {} } }
  const params = { name: 'trigger-elicitation-request', arguments: {} }
  const park = async (): Promise<{ key: string; state: string }> => {
    const first = await call(url, 'tools/call', params, caps, {}, fresh)
    t.equal(first.json.result?.resultType, 'input_required', 'an InputRequiredResult', { got: first.json })
    return { key: Object.keys(first.json.result?.inputRequests ?? {})[0]!, state: first.json.result?.requestState }
  }
  // Round-robin alternates the workers connection by connection once both accept: retries land on the other one.
  for (let round = 1; round <= 3; round++) {
    const { key, state } = await park()
    const done = await call(url, 'tools/call', { ...params, requestState: state, inputResponses: { [key]: { action: 'decline' } } }, caps, {}, fresh)
    t.equal(done.json.result?.resultType, 'complete', `round ${round}: the retry completes the call`, { got: done.json })
    t.match(JSON.stringify(done.json.result?.content), /decline/i, "with the client's answer")
  }

  // Both workers killed: the primary starts new ones; the parked call's owner is gone.
  const { key, state } = await park()
  const old = workersOf(pid)
  for (const w of old) process.kill(w, 'SIGKILL')
  let now: number[] = []
  for (let i = 0; i < 400 && (now.length < 2 || now.some(w => old.includes(w))); i++) {
    await new Promise(resolve => setTimeout(resolve, 50))
    now = workersOf(pid)
  }
  t.equal(now.filter(w => !old.includes(w)).length, 2, 'two new workers')
  let gone: Awaited<ReturnType<typeof call>> | undefined
  // A new worker may still be starting (503, a failure guard bounds the wait).
  for (let i = 0; i < 400 && (gone === undefined || gone.status === 503); i++) {
    gone = await call(url, 'tools/call', { ...params, requestState: state, inputResponses: { [key]: { action: 'decline' } } }, caps, {}, fresh).catch(
      () => undefined
    )
    if (gone === undefined || gone.status === 503) await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.equal(gone?.status, 200, 'answered')
  t.same(gone?.json.error, { code: -32602, message: 'Invalid params: unknown or expired requestState' }, 'the owner gone: an unknown requestState', {
    got: gone?.json,
  })
})

t.test('two replicas sharing cluster.secret: a task and a parked call created on one are served through the other', async t => {
  const upstream = await fixtureHttp(t)
  const targets = [{ name: 'fixture', mcp: { url: upstream } }, everythingTarget()]
  const replica = async (secret = 'cluster-secret-for-tests-0123456789abcdef'): Promise<FullGateway> => {
    const port = await freePort()
    return fullGateway(t, { port, targets }, 'info', { cluster: { secret, advertiseUrl: `http://127.0.0.1:${port}` } })
  }
  const a = await replica()
  const b = await replica()
  const other = await replica('another-cluster-secret-0123456789abcdefgh')

  const created = await call(a.url, 'tools/call', { name: 'fixture_slow_compute', arguments: { seconds: 60 } }, WITH_TASKS)
  const taskId = created.json.result?.taskId as string
  t.ok(taskId?.startsWith('fixture_'), 'a task on A, named by its target', { got: created.json })
  t.equal((await call(b.url, 'tasks/get', { taskId }, WITH_TASKS)).json.result?.status, 'working', 'B serves it')
  t.equal((await call(other.url, 'tasks/get', { taskId }, WITH_TASKS)).json.error?.code, -32602, 'a gateway with another secret: an unknown task')
  t.equal((await call(b.url, 'tasks/cancel', { taskId }, WITH_TASKS)).json.result?.resultType, 'complete', 'B cancels it')

  const caps = { elicitation: { form: {} } }
  const params = { name: 'everything_trigger-elicitation-request', arguments: {} }
  const park = async (): Promise<Record<string, unknown>> => {
    const first = await call(a.url, 'tools/call', params, caps)
    t.equal(first.json.result?.resultType, 'input_required', 'parked on A', { got: first.json })
    return {
      ...params,
      requestState: first.json.result?.requestState,
      inputResponses: { [Object.keys(first.json.result?.inputRequests ?? {})[0]!]: { action: 'decline' } },
    }
  }
  const done = await call(b.url, 'tools/call', await park(), caps)
  t.equal(done.json.result?.resultType, 'complete', 'the retry through B completes the call on A', { got: done.json })
  const retry = await park()
  await a.gw.close()
  const gone = await call(b.url, 'tools/call', retry, caps)
  t.same(gone.json.error, { code: -32602, message: 'Invalid params: unknown or expired requestState' }, 'A gone: an unknown requestState', { got: gone.json })
})
