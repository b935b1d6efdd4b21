/**
 * Upstream tracking costs nothing on the data path (issue 14, item 3): a
 * tools/call through the whole gateway reaches the stdio transport's own
 * send(), and its answer reaches the session's call table, without passing
 * through admin code; the admin's view (starts, live pids) and the call
 * metrics are still there.
 */
import t from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioUpstream } from '../core/targets/stdio.ts'
import { UpstreamCalls } from '../core/mcp/upstreams/calls.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { everythingTarget } from './helpers/gateway-harness.ts'

t.test('upstream messages both ways bypass core/admin; metrics still count the call', async t => {
  const sends: string[] = []
  const answers: string[] = []
  const send = StdioUpstream.prototype.send
  const answered = UpstreamCalls.prototype.answered
  StdioUpstream.prototype.send = function recordSend(this: StdioUpstream, ...args: Parameters<typeof send>) {
    sends.push(new Error('send').stack ?? '')
    return send.apply(this, args)
  }
  UpstreamCalls.prototype.answered = function recordAnswer(this: UpstreamCalls<{ id: number }>, ...args: Parameters<typeof answered>) {
    answers.push(new Error('answered').stack ?? '')
    return answered.apply(this, args) as never
  }
  t.teardown(() => {
    StdioUpstream.prototype.send = send
    UpstreamCalls.prototype.answered = answered
  })

  const { gw, url } = await fullGateway(t, { targets: [everythingTarget()] })
  const client = new Client({ name: 'tracking-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url)))
  t.teardown(() => client.close())
  await client.listTools()
  const r = await client.callTool({ name: 'echo', arguments: { message: 'hi' } })
  t.match(r, { content: [{ type: 'text', text: /hi/ }] }, 'the call went through')

  t.ok(sends.length >= 2, 'the transport sent initialize and the call')
  t.ok(answers.length >= 2, 'the answers reached the call table')
  const viaAdmin = (stacks: string[]): string[] => stacks.filter(s => /core[\\/]admin[\\/]/.test(s))
  t.same(viaAdmin(sends), [], 'nothing of core/admin wraps send()')
  t.same(viaAdmin(answers), [], 'nothing of core/admin sits between the transport and the session (onMessage)')

  const metrics = await gw.metrics.render()
  t.match(metrics, /mcp_proxy_tool_calls_total\{outcome="ok",target="everything",tool="echo"\} 1\n/, 'the tool call is counted, by the call table')
  t.match(metrics, /mcp_proxy_upstream_starts_total\{target="everything"\} 1\n/, 'the start is counted, by the transport')
  t.match(metrics, /mcp_proxy_upstreams\{target="everything"\} 1\n/, 'the live upstream is listed when scraped')
})
