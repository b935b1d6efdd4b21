/**
 * core/mcp/policy.ts: per-operation authorization and the stand-in of a refused call.
 */
import t from 'tap'
import type { RequestContext } from '../core/context.ts'
import type { Plugin, McpOperation } from '../core/plugin.ts'
import { allowOperation, filterListItems, deniedStandIn } from '../core/mcp/routing/policy.ts'

const ctx = {} as RequestContext

function checker(name: string, allow: (op: McpOperation) => boolean, seen: McpOperation[] = []): Plugin {
  return {
    name,
    allowMcpOperation(_c, op) {
      seen.push(op)
      return allow(op)
    },
  }
}

t.test('allowOperation: every checker must allow; none means always', async t => {
  t.ok(allowOperation([], ctx, 'tools/call', 'tool', 'x', 't'))
  const seen: McpOperation[] = []
  const yes = checker('yes', () => true, seen)
  const no = checker('no', () => false)
  t.ok(allowOperation([yes], ctx, 'tools/call', 'tool', 'echo', 'a'))
  t.notOk(allowOperation([yes, no], ctx, 'prompts/get', 'prompt', 'p', 'a'))
  allowOperation([yes], ctx, 'resources/read', 'resource', 'x://1', 'b')
  t.same(
    seen,
    [
      { method: 'tools/call', tool: { name: 'echo', target: 'a' } },
      { method: 'prompts/get', prompt: { name: 'p', target: 'a' } },
      { method: 'resources/read', resource: { uri: 'x://1', target: 'b' } },
    ],
    'the operation names the kind, the upstream name and the target'
  )
})

t.test('filterListItems: list items are checked as the call that would use them', async t => {
  const seen: McpOperation[] = []
  const noSecret = checker('c', op => !['secret', 's://h/secret'].includes((op.tool?.name ?? op.prompt?.name ?? op.resource?.uri)!), seen)
  t.same(filterListItems([noSecret], ctx, 'tools/list', [{ name: 'a' }, { name: 'secret' }], 't'), [{ name: 'a' }])
  t.same(filterListItems([noSecret], ctx, 'prompts/list', [{ name: 'secret' }], 't'), [])
  // Resources are checked as a read would see them (resource-uri.ts): normalized; one a read would refuse is not listed.
  t.same(filterListItems([noSecret], ctx, 'resources/list', [{ uri: 'S://h/x/../secret' }, { uri: 's://h/x' }, { uri: 'no uri' }], 't'), [{ uri: 's://h/x' }])
  t.same(filterListItems([noSecret], ctx, 'resources/templates/list', [{ uriTemplate: 'secret' }], 't'), [])
  t.same(
    seen.map(o => o.method),
    ['tools/call', 'tools/call', 'prompts/get', 'resources/read', 'resources/read', 'resources/read']
  )
  t.same(
    seen.slice(3, 5).map(o => o.resource?.uri),
    ['s://h/secret', 's://h/x'],
    'the rules saw the normalized URIs'
  )
  const items = [{ name: 'secret' }]
  t.equal(filterListItems([], ctx, 'tools/list', items, 't'), items, 'no checkers: the same array')
})

t.test('deniedStandIn: a random name no server has, restored in the answer', async t => {
  const s1 = deniedStandIn('secret', 'tool')
  const s2 = deniedStandIn('secret', 'tool')
  t.not(s1.value, s2.value, 'random per call')
  t.match(s1.value, /^mcp-proxy-denied-[0-9a-f]{24}$/)
  t.match(deniedStandIn('file:///etc/passwd', 'resource').value, /^file:\/\/mcp-proxy-denied-[0-9a-f]{24}$/, 'a resource keeps its scheme')
  const quoted = deniedStandIn('say "hi"', 'tool')
  const restored = quoted.restore({ jsonrpc: '2.0', id: 1, result: { content: [{ type: 'text', text: `Unknown tool: ${quoted.value}` }], isError: true } })
  t.same(restored.result, { content: [{ type: 'text', text: 'Unknown tool: say "hi"' }], isError: true }, 'JSON-escaped back into the answer')
  const untouched = { jsonrpc: '2.0' as const, id: 1, result: { ok: true } }
  t.equal(s1.restore(untouched), untouched, 'an answer without the stand-in is returned as is')
})
