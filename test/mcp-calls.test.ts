/**
 * core/mcp/calls.ts: the upstream id mapping of both eras.
 */
import t from 'tap'
import { UpstreamCalls } from '../core/mcp/calls.ts'

interface Call { readonly id: number; readonly label: string }

t.test('fresh ids per table; a response takes its call out once', async t => {
  const a = new UpstreamCalls<Call>()
  const b = new UpstreamCalls<Call>()
  const c1: Call = { id: a.nextId(), label: 'one' }
  const c2: Call = { id: a.nextId(), label: 'two' }
  t.not(c1.id, c2.id, 'ids differ on one upstream')
  t.equal(b.nextId(), c1.id, 'each upstream counts on its own')
  a.add(c1)
  a.add(c2)
  t.equal(a.size, 2)
  t.equal(a.answered(c2.id), c2, 'the response finds its call')
  t.equal(a.answered(c2.id), undefined, 'a second response with the same id finds nothing')
  t.equal(a.answered(String(c1.id)), undefined, 'ids are numbers: a string id never matches')
  t.equal(a.answered(null), undefined)
  t.same([...a.values()], [c1])
})

t.test('remove is false once settled; drain empties the table', async t => {
  const calls = new UpstreamCalls<Call>()
  const c1: Call = { id: calls.nextId(), label: 'one' }
  const c2: Call = { id: calls.nextId(), label: 'two' }
  calls.add(c1)
  calls.add(c2)
  t.ok(calls.remove(c1), 'in flight: removed')
  t.notOk(calls.remove(c1), 'removed already: false (a timeout after the answer does nothing)')
  t.notOk(calls.remove({ id: c2.id, label: 'another call under the same id' }), 'only the very call is removed')
  t.same(calls.drain(), [c2])
  t.equal(calls.size, 0)
  t.same(calls.drain(), [])
})
