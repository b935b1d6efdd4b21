/**
 * A malformed upstream list answer (issue 22, item 7): a list item that is
 * `null`, not an object, or lacks its string `name` / `uri` / `uriTemplate`
 * is an invalid result (MCP 2025-11-25 schema: Tool, Prompt, Resource,
 * ResourceTemplate). Where the gateway reads the items (per-operation rules
 * filter them; several targets rename them) such an answer becomes a JSON-RPC
 * error `-32603` naming the target for that request only: the session goes
 * on, its child is not pinned. With several targets a target whose list is
 * invalid is left out as a failing target is (or fails the list, fail-closed).
 * Real gateway, real stdio upstream (test/fixtures/malformed-list-server.mjs),
 * server-everything beside it; both protocol eras.
 */
import t from 'tap'
import { fileURLToPath } from 'node:url'
import { everythingTarget, processGone, until } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { modernCall, openSession } from './helpers/raw-mcp.ts'

const SERVER = fileURLToPath(new URL('./fixtures/malformed-list-server.mjs', import.meta.url))
const RULES = { authorization: { rules: ['mcp.tool.name != "secret"'] } }
const LISTS = ['tools/list', 'prompts/list', 'resources/list', 'resources/templates/list'] as const

function badTarget(name = 'bad', args: string[] = []): Record<string, unknown> {
  return { name, stdio: { cmd: process.execPath, args: [SERVER, ...args] } }
}

t.test(
  'session era, one target, per-operation rules: each invalid list is -32603 naming the target; the session goes on; no child pinned',
  { timeout: 60000 },
  async t => {
    const gw = await fullGateway(t, { targets: [badTarget()], policies: RULES }, 'debug')
    const s = await openSession(gw.url)
    for (const method of LISTS) {
      const { answer } = await s.call(method)
      t.equal(answer.result, undefined, `${method}: no result`)
      t.equal(answer.error?.code, -32603, `${method}: internal error (the upstream's result is invalid)`)
      t.match(answer.error?.message, /upstream bad answered an invalid .*(list|templates)/, `${method}: the message names the target`)
      const mine = gw.gw.endpoint.sessions().find(x => s.id.startsWith(x.id))
      t.equal(mine?.inFlight, 0, `${method}: nothing left in flight`)
    }
    t.match(gw.logText(), /invalid .*result/, 'the operator sees why')
    const echo = await s.call('tools/call', { name: 'echo', arguments: { message: 'still here' } })
    t.same(echo.answer.result?.content, [{ type: 'text', text: 'still here' }], 'the session still works')
    const pids = gw.gw.endpoint.sessions().find(x => s.id.startsWith(x.id))?.pids ?? []
    t.equal(pids.length, 1, 'one child')
    await s.close()
    t.ok(await until(() => pids.every(processGone)), 'the child ends with its session')
  }
)

t.test('session era, several targets: the invalid target is left out (logged), or fails the list fail-closed', { timeout: 60000 }, async t => {
  const open = await fullGateway(t, { targets: [badTarget(), everythingTarget('everything')] })
  const s = await openSession(open.url)
  const tools = await s.call('tools/list')
  const names = (tools.answer.result?.tools as Array<{ name: string }>).map(x => x.name)
  t.ok(names.includes('everything_echo'), 'the healthy target is listed')
  t.notOk(
    names.some(n => n.startsWith('bad_')),
    'the invalid target is left out'
  )
  t.match(open.logText(), /"target":"bad".*invalid tools\/list result|invalid tools\/list result.*"target":"bad"/, 'logged with the target')
  const ok = await s.call('tools/call', { name: 'bad_echo', arguments: { message: 'x' } })
  t.same(ok.answer.result?.content, [{ type: 'text', text: 'x' }], 'the session still works')
  await s.close()

  const closed = await fullGateway(t, { targets: [badTarget(), everythingTarget('everything')], failClosed: true, policies: RULES })
  const c = await openSession(closed.url)
  for (const method of LISTS) {
    const { answer } = await c.call(method)
    t.equal(answer.error?.code, -32603, `${method} fail-closed: internal error`)
    t.match(answer.error?.message, /target bad: upstream bad answered an invalid/, `${method}: names the target`)
  }
  t.same((await c.call('ping')).answer.result, {}, 'the session still works')
  await c.close()
})

t.test('2026-07-28, one target, per-operation rules: -32603 naming the target, the next request works', { timeout: 60000 }, async t => {
  const gw = await fullGateway(t, { targets: [badTarget('bad', ['--good-tools'])], policies: RULES })
  for (const method of ['prompts/list', 'resources/list', 'resources/templates/list']) {
    const { status, answer } = await modernCall(gw.url, method)
    t.equal(status, 200, `${method}: answered as a JSON-RPC error`)
    t.equal(answer.error?.code, -32603, `${method}: internal error`)
    t.match(answer.error?.message, /upstream bad answered an invalid/, `${method}: names the target`)
  }
  const echo = await modernCall(gw.url, 'tools/call', { name: 'echo', arguments: { message: 'modern' } })
  t.same(echo.answer.result?.content, [{ type: 'text', text: 'modern' }], 'the next request works')
})

t.test('2026-07-28, several targets, fail-closed: -32603 naming the target', { timeout: 60000 }, async t => {
  const gw = await fullGateway(t, { targets: [badTarget('bad', ['--good-tools']), everythingTarget('everything')], failClosed: true })
  const { answer } = await modernCall(gw.url, 'prompts/list')
  t.equal(answer.error?.code, -32603)
  t.match(answer.error?.message, /target bad: upstream bad answered an invalid prompts\/list result/)
  const echo = await modernCall(gw.url, 'tools/call', { name: 'everything_echo', arguments: { message: 'ok' } })
  t.match(JSON.stringify(echo.answer.result?.content), /ok/, 'the next request works')
})
