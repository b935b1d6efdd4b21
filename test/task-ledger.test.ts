/** The bounded record of a session's tasks (core/mcp/task-ledger.ts). */
import t from 'tap'
import { TaskLedger, isTerminal } from '../core/mcp/upstreams/task-ledger.ts'

t.test('unfinished tasks and reserved calls count against the limit; an ended task frees its slot', async t => {
  const ledger = new TaskLedger<string>(2)
  t.notOk(ledger.full(1), 'one call in flight, no task yet: room')
  ledger.add('a', 'tool-a')
  t.ok(ledger.full(1), 'one task and one call in flight: full')
  ledger.add('b', 'tool-b')
  t.ok(ledger.full(0))
  ledger.end('a')
  t.notOk(ledger.full(0), 'a ended: a slot is free')
  t.equal(ledger.working, 1)
  t.equal(ledger.get('a'), 'tool-a', 'an ended task is still known')
  ledger.end('a')
  ledger.end('unknown')
  t.equal(ledger.working, 1, 'ending twice, or an unknown task, changes nothing')
})

t.test('ended tasks are kept up to the limit, the oldest forgotten first', async t => {
  const ledger = new TaskLedger<number>(2)
  for (const [i, id] of ['a', 'b', 'c'].entries()) {
    ledger.add(id, i)
    ledger.end(id)
  }
  t.same(
    ['a', 'b', 'c'].map(id => ledger.has(id)),
    [false, true, true]
  )
  t.equal(ledger.working, 0)
  t.notOk(ledger.has(7), 'only string ids')
})

t.test('terminal statuses', async t => {
  t.same(['working', 'input_required', 'completed', 'failed', 'cancelled', undefined].map(isTerminal), [false, false, true, true, true, false])
})

t.test('delete forgets a task, working or ended; size counts both', async t => {
  const ledger = new TaskLedger<number>(3)
  ledger.add('a', 1)
  ledger.add('b', 2)
  ledger.end('b')
  t.equal(ledger.size, 2)
  ledger.delete('a')
  t.equal(ledger.working, 0, 'a working task deleted frees its slot')
  ledger.delete('b')
  t.equal(ledger.size, 0)
  t.notOk(ledger.has('b'))
})
