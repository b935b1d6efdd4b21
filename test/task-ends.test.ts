/**
 * core/mcp/upstreams/task-ledger.ts `endsTask`: the one rule both eras free a task slot by
 * (MCP 2025-11-25 tasks; SEP-2663): a result given, a cancellation acknowledged, or a terminal
 * status seen. A tasks/get or tasks/update of a running task keeps it.
 */
import t from 'tap'
import { endsTask } from '../core/mcp/upstreams/task-ledger.ts'

t.test('endsTask', async t => {
  t.ok(endsTask('tasks/result', { content: [] }), 'a result given')
  t.ok(endsTask('tasks/cancel', { status: 'cancelled' }), 'a cancellation acknowledged')
  t.ok(endsTask('tasks/cancel', {}), 'a cancellation acknowledged, whatever its body')
  for (const status of ['completed', 'failed', 'cancelled']) t.ok(endsTask('tasks/get', { status }), `tasks/get: ${status}`)
  t.ok(endsTask('tasks/update', { status: 'completed' }), 'tasks/update: terminal')
  for (const status of ['working', 'input_required', undefined]) t.notOk(endsTask('tasks/get', { status }), `tasks/get: ${String(status)} keeps the task`)
  t.notOk(endsTask('tasks/update', { status: 'working' }), 'tasks/update: working keeps the task')
  t.notOk(endsTask('tasks/get', undefined), 'no result keeps the task')
})
