/**
 * core/targets/lifecycle.ts: what the transports report of each upstream's
 * start and end, as the admin view and the upstream gauges read it.
 */
import t from 'tap'
import { observeTargets } from '../core/targets/lifecycle.ts'
import { Metrics } from '../core/observability/metrics.ts'
import type { UpstreamInfo } from '../core/targets/types.ts'

t.test('starts, live list on demand, a failure counted once, a clean close no failure', async t => {
  const metrics = new Metrics()
  const [life] = observeTargets([{ name: 'up', kind: 'stdio' }], metrics)
  if (life === undefined) throw new Error('no lifecycle')
  const a: UpstreamInfo = { target: 'up', kind: 'stdio', pid: 11, startedAt: 1 }
  const b: UpstreamInfo = { target: 'up', kind: 'stdio', pid: 22, startedAt: 2 }
  life.started(a)
  life.started(b)
  t.same(
    life.describe().live,
    [
      { pid: 11, startedAt: 1 },
      { pid: 22, startedAt: 2 },
    ],
    'both live, pids read when asked'
  )
  life.ended(a, new Error('spawn ENOENT'))
  life.ended(a, new Error('exited'))
  life.ended(b, undefined)
  t.match(
    life.describe(),
    { name: 'up', kind: 'stdio', live: [], started: 2, failures: 1, lastError: 'spawn ENOENT' },
    'the second report of one failure is not counted'
  )
  const text = metrics.render()
  t.match(text, /mcp_proxy_upstream_starts_total\{target="up"\} 2\n/)
  t.match(text, /mcp_proxy_upstream_failures_total\{target="up"\} 1\n/)
  t.match(text, /mcp_proxy_upstreams\{target="up"\} 0\n/)
})
