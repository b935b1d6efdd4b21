/**
 * The tasks utility (MCP 2025-11-25 basic/utilities/tasks; an extension in
 * 2026-07-28) through the gateway in the session era, with several targets:
 * the capability is advertised when a target has it; a task-augmented
 * tools/call goes to the tool's target and its task id comes back naming that
 * target, so tasks/get, tasks/result, tasks/cancel and tasks/list (merged over
 * the targets that list tasks) reach the right upstream; with per-operation
 * rules a task is the caller's only if its underlying tool is. Real
 * server-everything children (simulate-research-query is a task tool, four
 * one-second stages), the official SDK client.
 */
import t, { type Test } from 'tap'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CallToolResultSchema,
  CancelTaskResultSchema,
  CreateTaskResultSchema,
  GetTaskResultSchema,
  ListTasksResultSchema,
  McpError,
  TaskStatusNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js'
import type { Plugin } from '../core/plugin.ts'
import { ROOT, startGateway, everythingTarget, until, type GatewayHarness } from './helpers/gateway-harness.ts'

const LATE = join(ROOT, 'test/fixtures/late-server.mjs')
const TOOL = 'simulate-research-query'

async function connect(t: Test, gw: GatewayHarness): Promise<Client> {
  const client = new Client({ name: 'tasks', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(gw.url)))
  t.teardown(() => client.close())
  return client
}

function startTask(client: Client, name: string, topic: string): Promise<string> {
  return client
    .request({ method: 'tools/call', params: { name, arguments: { topic }, task: { ttl: 60_000 } } }, CreateTaskResultSchema)
    .then(r => r.task.taskId)
}

const errorOf = (p: Promise<unknown>): Promise<string> =>
  p.then(
    r => `no error: ${JSON.stringify(r)}`,
    (e: Error) => (e instanceof McpError ? `${e.code} ${e.message}` : e.message)
  )

t.test("several targets: task-augmented calls, tasks/get, tasks/result, tasks/cancel and tasks/list reach the task's target", async t => {
  const gw = await startGateway(t, { targets: [everythingTarget('a'), everythingTarget('b')] })
  const client = await connect(t, gw)
  t.match(client.getServerCapabilities()?.tasks, { list: {}, cancel: {}, requests: { tools: { call: {} } } }, "the targets' tasks capability is advertised")

  const onB = await startTask(client, `b_${TOOL}`, 'gateways')
  t.match(onB, /^b_/, 'the task id names its target')
  const onA = await startTask(client, `a_${TOOL}`, 'proxies')
  t.match(onA, /^a_/)

  const got = await client.request({ method: 'tasks/get', params: { taskId: onB } }, GetTaskResultSchema)
  t.equal(got.taskId, onB, "tasks/get answers under the client's task id")
  t.match(got.status, /^(working|completed)$/)

  const listed = await client.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)
  t.same(listed.tasks.map(x => x.taskId).sort(), [onA, onB].sort(), "tasks/list merges both targets' tasks")

  const cancelled = await client.request({ method: 'tasks/cancel', params: { taskId: onA } }, CancelTaskResultSchema)
  t.same([cancelled.taskId, cancelled.status], [onA, 'cancelled'], "tasks/cancel reached a's task")
  t.equal((await client.request({ method: 'tasks/get', params: { taskId: onB } }, GetTaskResultSchema)).status === 'cancelled', false, "b's task goes on")

  const result = await client.request({ method: 'tasks/result', params: { taskId: onB } }, CallToolResultSchema, { timeout: 30_000 })
  t.match(JSON.stringify(result.content), /gateways/, "tasks/result gives the tool's result from b")

  t.match(
    await errorOf(client.request({ method: 'tasks/get', params: { taskId: 'c_nothing' } }, GetTaskResultSchema)),
    /-32602/,
    'a task id naming no target is invalid params'
  )
})

t.test('several targets, none with tasks: no tasks capability, tasks/* unknown', async t => {
  const late = (name: string) => ({ name, stdio: { cmd: process.execPath, args: [LATE, 'stdio'], env: {} } })
  const gw = await startGateway(t, { targets: [late('x'), late('y')] })
  const client = await connect(t, gw)
  t.equal(client.getServerCapabilities()?.tasks, undefined)
  t.match(await errorOf(client.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)), /-32601/, 'tasks/list: method not found')
})

t.test("per-operation rules: a task is the caller's only while its tool is allowed", async t => {
  // Tools of b only (a stands in for a target the caller may not use); b too until the test withdraws it.
  let bAllowed = true
  const rules: Plugin = {
    name: 'test-rules',
    allowMcpOperation: (_ctx, op) => op.tool === undefined || (op.tool.target === 'b' && bAllowed),
  }
  const gw = await startGateway(t, { targets: [everythingTarget('a'), everythingTarget('b')], plugins: [rules] })
  const client = await connect(t, gw)
  const mine = await startTask(client, `b_${TOOL}`, 'allowed')
  t.match(await errorOf(startTask(client, `a_${TOOL}`, 'refused')), /not found|-32602/i, 'a task of a refused tool is not created')
  t.same(
    (await client.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)).tasks.map(x => x.taskId),
    [mine],
    "only the caller's own task is listed"
  )
  t.equal((await client.request({ method: 'tasks/get', params: { taskId: mine } }, GetTaskResultSchema)).taskId, mine)
  t.match(
    await errorOf(client.request({ method: 'tasks/get', params: { taskId: 'a_made-up' } }, GetTaskResultSchema)),
    /-32602/,
    'a task the session did not create is unknown'
  )
  bAllowed = false
  t.same(
    (await client.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)).tasks,
    [],
    'once its tool is refused, the task is no longer listed'
  )
  t.match(await errorOf(client.request({ method: 'tasks/result', params: { taskId: mine } }, CallToolResultSchema)), /-32602/, '... nor its result given')
})

t.test("a task-augmented call's progress token stays valid after its CreateTaskResult, until the task's result", async t => {
  const late = (name: string, ...flags: string[]) => ({ name, stdio: { cmd: process.execPath, args: [LATE, 'stdio', ...flags], env: {} } })
  const gw = await startGateway(t, { targets: [late('x', '--tasks'), late('y')] })
  const client = await connect(t, gw)
  const errors: Error[] = []
  client.onerror = err => {
    errors.push(err)
  }
  const seen: number[] = []
  const created = await client.request({ method: 'tools/call', params: { name: 'x_task-progress', arguments: {}, task: {} } }, CreateTaskResultSchema, {
    onprogress: p => {
      seen.push(p.progress)
    },
  })
  t.equal(created.task.taskId, 'x_t-1')
  // The fixture writes the task's progress before it answers this.
  const got = await client.request({ method: 'tasks/get', params: { taskId: 'x_t-1' } }, GetTaskResultSchema)
  t.equal(got.status, 'completed')
  await client.ping()
  t.ok(await until(() => seen.length > 0 || errors.length > 0), 'the progress arrived')
  t.same(seen, [1], "the task's progress reached the caller")
  t.same(errors, [])
  const result = await client.request({ method: 'tasks/result', params: { taskId: 'x_t-1' } }, CallToolResultSchema)
  t.same(result.content, [{ type: 'text', text: 'task done' }])
})

t.test("a child shared per subject: a task's status notifications reach only the session that created it", async t => {
  const shared = everythingTarget()
  const gw = await startGateway(t, { targets: [{ ...shared, stdio: { ...shared.stdio!, share: 'subject', processesPerSubject: 1 } }] })
  const owner = await connect(t, gw)
  const other = await connect(t, gw)
  t.equal(gw.endpoint.pooled().length, 1, 'one child for both sessions')
  const seen: Record<'owner' | 'other', string[]> = { owner: [], other: [] }
  owner.setNotificationHandler(TaskStatusNotificationSchema, n => {
    seen.owner.push(n.params.taskId)
  })
  other.setNotificationHandler(TaskStatusNotificationSchema, n => {
    seen.other.push(n.params.taskId)
  })
  const taskId = await startTask(owner, TOOL, 'isolation')
  t.ok(await until(() => seen.owner.length > 0), 'the owner hears of its task')
  await other.ping()
  await until(() => seen.other.length > 0, 4, 25)
  t.same(seen.other, [], 'the other session on the same child does not')
  t.ok(seen.owner.every(id => id === taskId))
  await owner.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema)
})

const lateTarget = (name: string, ...flags: string[]) => ({ name, stdio: { cmd: process.execPath, args: [LATE, 'stdio', ...flags], env: {} } })
const sharedLate = () => ({
  name: 'late',
  stdio: { cmd: process.execPath, args: [LATE, 'stdio', '--tasks'], env: {}, share: 'subject' as const, processesPerSubject: 1 },
})

for (const rules of [false, true]) {
  t.test(
    `${rules ? 'per-operation rules' : 'no rules'}: a session's unfinished tasks are bounded (mcp.limits.maxTasksPerSession); a terminal status frees a slot`,
    async t => {
      const allowAll: Plugin = { name: 'test-rules', allowMcpOperation: () => true }
      const gw = await startGateway(t, { targets: [lateTarget('x', '--tasks')], plugins: rules ? [allowAll] : [], limits: { maxTasksPerSession: 2 } })
      const client = await connect(t, gw)
      const hold = (): Promise<string> => startTask(client, 'task-hold', 'bounded')
      const finish = (taskId: string, notify: boolean) => client.callTool({ name: 'task-finish', arguments: { taskId, notify } })
      const first = await hold()
      const second = await hold()
      t.match(await errorOf(hold()), /^-32000 .*2 unfinished tasks.*mcp\.limits\.maxTasksPerSession/, 'past the limit: a clear JSON-RPC error')
      t.match(gw.logText(), /task-augmented call refused: too many unfinished tasks/, 'and a log line')
      t.equal((await client.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)).tasks.length, 2, 'the refused call created no task upstream')

      await finish(first, false)
      t.equal((await client.request({ method: 'tasks/get', params: { taskId: first } }, GetTaskResultSchema)).status, 'completed')
      const third = await hold()
      t.match(await errorOf(hold()), /maxTasksPerSession/, 'a completed status seen in tasks/get freed one slot, only one')

      await finish(second, true)
      await hold()
      t.match(await errorOf(hold()), /maxTasksPerSession/, 'a completed notifications/tasks/status freed one slot')

      const result = await client.request({ method: 'tasks/result', params: { taskId: first } }, CallToolResultSchema)
      t.same(result.content, [{ type: 'text', text: 'task done' }], "an ended task is still its caller's: its result is given")
      t.not(third, first)
    }
  )
}

t.test("a child shared per subject: tasks/list lists only the calling session's tasks; another session's task is unknown", async t => {
  const gw = await startGateway(t, { targets: [sharedLate()] })
  const one = await connect(t, gw)
  const two = await connect(t, gw)
  t.equal(gw.endpoint.pooled().length, 1, 'one child for both sessions')
  const a = await startTask(one, 'task-hold', 'one')
  const b = await startTask(two, 'task-hold', 'two')
  t.same(
    (await one.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)).tasks.map(x => x.taskId),
    [a],
    'the first session lists its own task only'
  )
  t.same(
    (await two.request({ method: 'tasks/list', params: {} }, ListTasksResultSchema)).tasks.map(x => x.taskId),
    [b],
    '... and the second its own'
  )
  t.match(
    await errorOf(two.request({ method: 'tasks/get', params: { taskId: a } }, GetTaskResultSchema)),
    /-32602 .*Unknown task/,
    "the other session's task is unknown to it"
  )
  t.match(await errorOf(two.request({ method: 'tasks/cancel', params: { taskId: a } }, CancelTaskResultSchema)), /-32602/, '... and cannot be cancelled by it')
  t.equal((await one.request({ method: 'tasks/get', params: { taskId: a } }, GetTaskResultSchema)).status, 'working')
})

t.test('a child shared per subject: a status the child sends before its CreateTaskResult reaches the session that created the task', async t => {
  const gw = await startGateway(t, { targets: [sharedLate()] })
  const owner = await connect(t, gw)
  const other = await connect(t, gw)
  const seen: Record<'owner' | 'other', Array<{ taskId: string; status: string }>> = { owner: [], other: [] }
  owner.setNotificationHandler(TaskStatusNotificationSchema, n => {
    seen.owner.push({ taskId: n.params.taskId, status: n.params.status })
  })
  other.setNotificationHandler(TaskStatusNotificationSchema, n => {
    seen.other.push({ taskId: n.params.taskId, status: n.params.status })
  })
  const taskId = await startTask(owner, 'task-early', 'race')
  t.ok(await until(() => seen.owner.length > 0), 'the early status reached the owner')
  t.same(seen.owner, [{ taskId, status: 'working' }])
  await other.ping()
  t.same(seen.other, [], 'not the other session')
})

t.test('per-operation rules, a child per session: a status the child sends before its CreateTaskResult reaches the caller', async t => {
  const allowAll: Plugin = { name: 'test-rules', allowMcpOperation: () => true }
  const gw = await startGateway(t, { targets: [lateTarget('x', '--tasks')], plugins: [allowAll] })
  const client = await connect(t, gw)
  const seen: Array<{ taskId: string; status: string }> = []
  client.setNotificationHandler(TaskStatusNotificationSchema, n => {
    seen.push({ taskId: n.params.taskId, status: n.params.status })
  })
  const taskId = await startTask(client, 'task-early', 'race')
  t.ok(await until(() => seen.length > 0), 'the early status reached the caller')
  t.same(seen, [{ taskId, status: 'working' }])
})
