/**
 * core/mcp/naming.ts: how several targets share one namespace.
 */
import t from 'tap'
import { prefixName, splitName, markUri, unmarkUri, mergeCapabilities, renameListItem, URI_SCHEME } from '../core/mcp/routing/naming.ts'

t.test('tool and prompt names: <target>_<name>, split at the first _', async t => {
  t.equal(prefixName('everything', 'get_sum'), 'everything_get_sum')
  t.same(splitName('everything_get_sum'), ['everything', 'get_sum'])
  t.equal(splitName('echo'), undefined, 'no _')
  t.equal(splitName('_echo'), undefined, 'empty target')
  t.equal(splitName('everything_'), undefined, 'empty name')
})

t.test('resource URIs: mcp-proxy://<target>/<original>, the original verbatim', async t => {
  t.equal(URI_SCHEME, 'mcp-proxy://')
  t.equal(markUri('fs', 'file:///etc/x?y=1#z'), 'mcp-proxy://fs/file:///etc/x?y=1#z')
  t.same(unmarkUri('mcp-proxy://fs/file:///etc/x?y=1#z'), ['fs', 'file:///etc/x?y=1#z'])
  t.same(unmarkUri(markUri('t', 'test://{id}/x')), ['t', 'test://{id}/x'], 'templates keep their {vars}')
  t.equal(unmarkUri('file:///x'), undefined, 'not ours')
  t.equal(unmarkUri('mcp-proxy:///x'), undefined, 'no target')
  t.equal(unmarkUri('mcp-proxy://fs'), undefined, 'no path')
})

t.test('mergeCapabilities: nested objects merged, booleans OR-ed, first scalar kept', async t => {
  t.same(
    mergeCapabilities([
      { tools: { listChanged: false }, logging: {}, experimental: { a: 1 } },
      { tools: { listChanged: true }, resources: { subscribe: true }, experimental: { a: 2, b: 3 } },
    ]),
    { tools: { listChanged: true }, logging: {}, experimental: { a: 1, b: 3 }, resources: { subscribe: true } }
  )
  t.same(mergeCapabilities([]), {})
})

t.test('renameListItem renames by list kind', async t => {
  t.same(renameListItem('a', 'tools', { name: 'echo', description: 'd' }), { name: 'a_echo', description: 'd' })
  t.same(renameListItem('a', 'prompts', { name: 'p' }), { name: 'a_p' })
  t.same(renameListItem('a', 'resources', { uri: 'x://1', name: 'one' }), { uri: 'mcp-proxy://a/x://1', name: 'one' })
  t.same(renameListItem('a', 'resourceTemplates', { uriTemplate: 'x://{id}' }), { uriTemplate: 'mcp-proxy://a/x://{id}' })
})
