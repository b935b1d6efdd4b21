/**
 * core/mcp/calls.ts: the upstream id mapping of both eras, and the call
 * metrics it measures (call-metrics.ts).
 */
import t from 'tap'
import { UpstreamCalls } from '../core/mcp/upstreams/calls.ts'
import { createCallMeters } from '../core/mcp/upstreams/call-metrics.ts'
import { Metrics } from '../core/observability/metrics.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'

const req = (method: string, params?: Record<string, unknown>): JsonRpcMessage => ({ jsonrpc: '2.0', method, params })
const res = (id: unknown, result: unknown = {}): JsonRpcMessage => ({ jsonrpc: '2.0', id: id as number, result })

interface Call {
  readonly id: number
  readonly label: string
}

t.test('fresh ids per table; a response takes its call out once', async t => {
  const a = new UpstreamCalls<Call>()
  const b = new UpstreamCalls<Call>()
  const c1: Call = { id: a.nextId(), label: 'one' }
  const c2: Call = { id: a.nextId(), label: 'two' }
  t.not(c1.id, c2.id, 'ids differ on one upstream')
  t.equal(b.nextId(), c1.id, 'each upstream counts on its own')
  a.add(c1, req('ping'))
  a.add(c2, req('ping'))
  t.equal(a.size, 2)
  t.equal(a.answered(res(c2.id)), c2, 'the response finds its call')
  t.equal(a.answered(res(c2.id)), undefined, 'a second response with the same id finds nothing')
  t.equal(a.answered(res(String(c1.id))), undefined, 'ids are numbers: a string id never matches')
  t.equal(a.answered(res(null)), undefined)
  t.same([...a.values()], [c1])
})

t.test('remove is false once settled; drain empties the table', async t => {
  const calls = new UpstreamCalls<Call>()
  const c1: Call = { id: calls.nextId(), label: 'one' }
  const c2: Call = { id: calls.nextId(), label: 'two' }
  calls.add(c1, req('ping'))
  calls.add(c2, req('ping'))
  t.ok(calls.remove(c1), 'in flight: removed')
  t.notOk(calls.remove(c1), 'removed already: false (a timeout after the answer does nothing)')
  t.notOk(calls.remove({ id: c2.id, label: 'another call under the same id' }), 'only the very call is removed')
  t.same(calls.drain(), [c2])
  t.equal(calls.size, 0)
  t.same(calls.drain(), [])
})

t.test('with a meter, each call is counted once by method and tool, with its outcome', async t => {
  const metrics = new Metrics()
  const calls = new UpstreamCalls<Call>(createCallMeters(['up'], metrics, 10).get('up'))
  const call = (method: string, params?: Record<string, unknown>): Call => {
    const c: Call = { id: calls.nextId(), label: method }
    calls.add(c, req(method, params))
    return c
  }
  calls.answered(res(call('tools/list').id, { tools: [{ name: 'echo' }] }))
  calls.answered(res(call('tools/call', { name: 'echo' }).id, { content: [] }))
  calls.answered(res(call('tools/call', { name: 'echo' }).id, { isError: true, content: [] }))
  calls.answered({ jsonrpc: '2.0', id: call('tools/call', { name: 'unlisted' }).id, error: { code: -32602, message: 'no' } })
  const timedOut = call('tools/call', { name: 'echo' })
  t.ok(calls.remove(timedOut))
  t.notOk(calls.remove(timedOut), 'settled once')
  call('ping')
  calls.drain()
  const text = metrics.render()
  t.match(text, /mcp_proxy_tool_calls_total\{outcome="ok",target="up",tool="echo"\} 1\n/)
  t.match(text, /mcp_proxy_tool_calls_total\{outcome="tool_error",target="up",tool="echo"\} 1\n/)
  t.match(text, /mcp_proxy_tool_calls_total\{outcome="closed",target="up",tool="echo"\} 1\n/, 'a call taken out unanswered is closed')
  t.match(text, /mcp_proxy_tool_calls_total\{outcome="error",target="up",tool="other"\} 1\n/, 'an unadvertised name is other')
  t.match(text, /mcp_proxy_upstream_requests_total\{method="tools\/call",outcome="ok",target="up"\} 2\n/)
  t.match(text, /mcp_proxy_upstream_requests_total\{method="ping",outcome="closed",target="up"\} 1\n/, 'drained calls are closed')
  t.match(text, /mcp_proxy_upstream_duration_seconds_count\{method="tools\/list",target="up"\} 1\n/)
})
