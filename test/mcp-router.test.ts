/**
 * core/mcp/router.ts: the routing both eras share — names, URIs and
 * completion refs to targets, refusals by policy, merged lists.
 */
import t from 'tap'
import { TargetNamespace as Router } from '../core/mcp/routing/namespace.ts'
import { LIST_KEYS, NAMED, GATEWAY_INFO, isListMethod, isNamedMethod } from '../core/mcp/protocol.ts'
import type { RequestContext } from '../core/context.ts'
import type { Plugin, McpOperation } from '../core/plugin.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { readFileSync } from 'node:fs'
import { memoryLogger } from './helpers/logger.ts'

interface T {
  readonly target: string
}
const a: T = { target: 'alpha' }
const b: T = { target: 'beta' }
const ctx = {} as RequestContext

/** Refuses every item named `secret` (any kind), records what it was asked. */
function refuser(seen: McpOperation[] = []): Plugin {
  return {
    name: 'refuser',
    allowMcpOperation(_ctx, op) {
      seen.push(op)
      return (op.tool?.name ?? op.prompt?.name ?? op.resource?.uri) !== 'secret'
    },
  }
}

t.test('the tables and the gateway name', async t => {
  t.same(LIST_KEYS, { 'tools/list': 'tools', 'prompts/list': 'prompts', 'resources/list': 'resources', 'resources/templates/list': 'resourceTemplates' })
  t.same(Object.keys(NAMED).sort(), ['prompts/get', 'resources/read', 'resources/subscribe', 'resources/unsubscribe', 'tools/call'])
  // The narrowing the eras route by: own keys only, so an inherited name is an ordinary method.
  // Written out from the MCP method list (a paginated list; a request naming one item), not read back from the tables.
  for (const m of ['tools/list', 'prompts/list', 'resources/list', 'resources/templates/list']) t.ok(isListMethod(m), `${m} is a list`)
  for (const m of ['tools/call', 'prompts/get', 'resources/read', 'resources/subscribe', 'resources/unsubscribe']) t.ok(isNamedMethod(m), `${m} names an item`)
  for (const m of ['completion/complete', 'logging/setLevel', 'ping', 'tasks/list', 'roots/list'])
    t.notOk(isListMethod(m) || isNamedMethod(m), `${m} is neither`)
  for (const m of ['tools/call', 'constructor', 'toString', '__proto__', 'hasOwnProperty', '']) t.notOk(isListMethod(m), `${m} is no list`)
  for (const m of ['tools/list', 'constructor', 'toString', '__proto__', 'valueOf', '']) t.notOk(isNamedMethod(m), `${m} names no item`)
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
  t.same(GATEWAY_INFO, { name: 'mcp-proxy', version: pkg.version }, 'the version is the package version')
})

t.test('one target: everything is its, nothing renamed', async t => {
  const r = new Router([a], [])
  t.notOk(r.multi)
  t.same(r.resolve('tool', 'beta_echo'), { target: a, name: 'beta_echo' })
  t.same(r.resolve('resource', 'file:///x'), { target: a, name: 'file:///x' })
  const ref = { type: 'ref/prompt', name: 'p' }
  t.equal(r.completionTarget(ref), a)
  t.equal(ref.name, 'p', 'the ref is left alone')
  t.equal(r.clientUri('alpha', 'file:///x'), 'file:///x')
  const res: JsonRpcMessage = { jsonrpc: '2.0', result: { contents: [{ uri: 'file:///x' }] } }
  t.same(r.markContents('alpha', res).result, { contents: [{ uri: 'file:///x' }] })
})

t.test('several targets: prefixes and URI markers route, unknown ones do not', async t => {
  const r = new Router([a, b], [])
  t.ok(r.multi)
  t.same(r.resolve('tool', 'beta_echo_twice'), { target: b, name: 'echo_twice' }, 'the first _ splits')
  t.same(r.resolve('prompt', 'alpha_p'), { target: a, name: 'p' })
  t.same(r.resolve('resource', 'mcp-proxy://beta/test://static/1'), { target: b, name: 'test://static/1' })
  t.equal(r.resolve('tool', 'gamma_echo'), undefined, 'no such target')
  t.equal(r.resolve('tool', 'echo'), undefined, 'no prefix')
  t.equal(r.resolve('resource', 'test://static/1'), undefined, 'no marker')
  t.same(r.unknown('tool', 'gamma_echo'), { jsonrpc: '2.0', error: { code: -32602, message: 'Unknown tool: gamma_echo' } })
  t.same(r.unknown('resource', 'x://y'), { jsonrpc: '2.0', error: { code: -32002, message: 'Resource not found: x://y' } })
})

t.test('several targets: completion refs route and are rewritten in place', async t => {
  const r = new Router([a, b], [])
  const prompt = { type: 'ref/prompt', name: 'beta_greet' }
  t.equal(r.completionTarget(prompt), b)
  t.equal(prompt.name, 'greet')
  const resource = { type: 'ref/resource', uri: 'mcp-proxy://alpha/test://{id}' }
  t.equal(r.completionTarget(resource), a)
  t.equal(resource.uri, 'test://{id}')
  const unknown = { type: 'ref/prompt', name: 'gamma_greet' }
  t.equal(r.completionTarget(unknown), undefined)
  t.equal(unknown.name, 'gamma_greet', 'an unknown ref is left alone')
  t.equal(r.completionTarget({ type: 'ref/other', name: 'alpha_x' }), undefined)
  t.equal(r.completionTarget(undefined), undefined)
})

t.test('several targets: URIs going to the client carry their target', async t => {
  const r = new Router([a, b], [])
  t.equal(r.clientUri('beta', 'test://static/1'), 'mcp-proxy://beta/test://static/1')
  const res: JsonRpcMessage = { jsonrpc: '2.0', result: { contents: [{ uri: 'test://1' }, { text: 'no uri' }] } }
  t.same(r.markContents('beta', res).result, { contents: [{ uri: 'mcp-proxy://beta/test://1' }, { text: 'no uri' }] })
})

t.test('refuse: undefined when allowed; a stand-in that restores the name when not', async t => {
  const seen: McpOperation[] = []
  const r = new Router([a, b], [refuser(seen)])
  t.equal(r.refuse(ctx, 'tools/call', 'tool', 'echo', 'alpha'), undefined)
  t.same(seen[0], { method: 'tools/call', tool: { name: 'echo', target: 'alpha' } }, 'rules see the upstream name and the target')
  const standIn = r.refuse(ctx, 'resources/read', 'resource', 'secret', 'beta')
  t.ok(standIn !== undefined)
  t.notMatch(standIn!.value, /secret/, 'the stand-in does not carry the name')
  const upstreamAnswer: JsonRpcMessage = { jsonrpc: '2.0', id: 3, error: { code: -32002, message: `Resource ${standIn!.value} not found` } }
  t.same(
    standIn!.restore(upstreamAnswer),
    { jsonrpc: '2.0', id: 3, error: { code: -32002, message: 'Resource secret not found' } },
    'the answer names what the caller asked for'
  )
  t.ok(new Router([a], []).allows(ctx, 'resources/read', 'resource', 'secret', 'alpha'), 'no checkers: all allowed')
  t.notOk(r.allows(ctx, 'resources/read', 'resource', 'secret', 'alpha'))
})

t.test('filterResult drops what the caller may not see, in place', async t => {
  const r = new Router([a], [refuser()])
  const result = { tools: [{ name: 'echo' }, { name: 'secret' }], nextCursor: 'c' }
  r.filterResult(ctx, 'tools/list', result, 'alpha')
  t.same(result, { tools: [{ name: 'echo' }], nextCursor: 'c' })
  const templates = { resourceTemplates: [{ uriTemplate: 'secret' }, { uriTemplate: 'x://{id}' }] }
  r.filterResult(ctx, 'resources/templates/list', templates, 'alpha')
  t.same(templates, { resourceTemplates: [{ uriTemplate: 'x://{id}' }] })
  r.filterResult(ctx, 'tools/list', undefined, 'alpha')
})

/** Pages of each target's list, by cursor. */
function pages(byTarget: Record<string, Record<string, JsonRpcMessage>>) {
  const asked: string[] = []
  return {
    asked,
    fetch: async (tg: T, params: Record<string, unknown>): Promise<JsonRpcMessage> => {
      const cursor = (params.cursor as string | undefined) ?? ''
      asked.push(`${tg.target}:${cursor}`)
      const page = byTarget[tg.target]?.[cursor]
      if (page === undefined) throw new Error(`no page ${cursor}`)
      return structuredClone(page)
    },
  }
}

t.test('mergeLists follows every cursor, filters, renames, keeps config order', async t => {
  const r = new Router([a, b], [refuser()])
  const { fetch, asked } = pages({
    alpha: {
      '': { jsonrpc: '2.0', result: { tools: [{ name: 'one' }, { name: 'secret' }], nextCursor: 'p2' } },
      p2: { jsonrpc: '2.0', result: { tools: [{ name: 'two' }] } },
    },
    beta: { '': { jsonrpc: '2.0', result: { tools: [{ name: 'three' }] } } },
  })
  const { log } = memoryLogger()
  const merged = await r.mergeLists(ctx, 'tools/list', fetch, () => false, log, false)
  t.same(
    merged,
    { jsonrpc: '2.0', result: { tools: [{ name: 'alpha_one' }, { name: 'alpha_two' }, { name: 'beta_three' }] } },
    'no nextCursor: the merged list is whole'
  )
  t.same(asked.sort(), ['alpha:', 'alpha:p2', 'beta:'])
})

t.test('mergeLists stops at a cursor seen before, and when the client is gone', async t => {
  const r = new Router([a, b], [])
  const loop = pages({
    alpha: {
      '': { jsonrpc: '2.0', result: { resources: [{ uri: 'x://1' }], nextCursor: 'p2' } },
      p2: { jsonrpc: '2.0', result: { resources: [{ uri: 'x://2' }], nextCursor: 'p2' } },
    },
    beta: { '': { jsonrpc: '2.0', result: { resources: [] } } },
  })
  const { log } = memoryLogger()
  const merged = await r.mergeLists(ctx, 'resources/list', loop.fetch, () => false, log, false)
  t.same(merged.result, { resources: [{ uri: 'mcp-proxy://alpha/x://1' }, { uri: 'mcp-proxy://alpha/x://2' }] })
  t.equal(loop.asked.filter(x => x === 'alpha:p2').length, 1, 'the repeated cursor is not asked for again')
  const stopped = pages({
    alpha: { '': { jsonrpc: '2.0', result: { prompts: [{ name: 'p' }], nextCursor: 'more' } } },
    beta: { '': { jsonrpc: '2.0', result: { prompts: [] } } },
  })
  const partial = await r.mergeLists(ctx, 'prompts/list', stopped.fetch, () => true, log, false)
  t.same(partial.result, { prompts: [{ name: 'alpha_p' }] })
  t.notOk(stopped.asked.includes('alpha:more'), 'no page is fetched after the client went away')
})

t.test('mergeLists: a failing target is left out and logged, or fails the list fail-closed', async t => {
  const r = new Router([a, b], [])
  const src = {
    alpha: { '': { jsonrpc: '2.0' as const, error: { code: -32603, message: 'boom' } } },
    beta: { '': { jsonrpc: '2.0' as const, result: { tools: [{ name: 'ok' }] } } },
  }
  const open = memoryLogger()
  t.same((await r.mergeLists(ctx, 'tools/list', pages(src).fetch, () => false, open.log, false)).result, { tools: [{ name: 'beta_ok' }] })
  t.match(open.text(), /"target":"alpha".*target failed during list/)
  const closed = await r.mergeLists(ctx, 'tools/list', pages(src).fetch, () => false, open.log, true)
  t.same(closed, { jsonrpc: '2.0', error: { code: -32603, message: 'target alpha: boom' } })
  const thrown = await r.mergeLists(ctx, 'tools/list', pages({ beta: src.beta }).fetch, () => false, open.log, true)
  t.same(thrown, { jsonrpc: '2.0', error: { code: -32000, message: 'target alpha: no page ' } }, 'a thrown failure (no upstream) is a server error')
})

t.test('instructions: marked per target with several, as they are with one', async t => {
  const live = [
    { target: 'alpha', initResult: { instructions: 'use alpha' } },
    { target: 'beta', initResult: {} },
    { target: 'gamma', initResult: { instructions: 'use gamma' } },
  ]
  t.equal(new Router([a, b], []).instructions(live), '[alpha] use alpha\n\n[gamma] use gamma')
  t.equal(new Router([a], []).instructions([live[0]!]), 'use alpha')
  t.equal(new Router([a], []).instructions([{ target: 'alpha', initResult: undefined }]), undefined)
})
