/**
 * core/mcp/sse.ts on real sockets: a client that keeps up receives an event
 * larger than the stream bound; one that stops reading is cut once it is
 * behind and the bound is reached; the backlog keeps the newest messages
 * within its byte bound, drops an oversized one, and hands them over in
 * order.
 */
import t, { type Test } from 'tap'
import { createServer, request, type IncomingMessage, type ServerResponse } from 'node:http'
import { once } from 'node:events'
import { Metrics } from '../core/observability/metrics.ts'
import { Backlog, SseStream, SSE_HEADERS, streamLimits, type StreamLimits } from '../core/mcp/sse.ts'
import { memoryLogger } from './helpers/logger.ts'
import { sseMessages, until } from './helpers/gateway-harness.ts'

/** A server whose one response is handed to the test, and a client request to it. */
async function pair(t: Test): Promise<{ res: ServerResponse; client: IncomingMessage }> {
  let res!: ServerResponse
  const server = createServer((_req, r) => {
    res = r
    r.writeHead(200, SSE_HEADERS)
    r.flushHeaders()
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => {
    server.closeAllConnections()
    server.close()
  })
  const { port } = server.address() as import('node:net').AddressInfo
  const req = request({ host: '127.0.0.1', port, path: '/' })
  req.on('error', () => {})
  req.end()
  const [client] = (await once(req, 'response')) as [IncomingMessage]
  return { res, client }
}

function limits(max: { stream?: number; backlog?: number }): { l: StreamLimits; metrics: Metrics; text: () => string } {
  const { log, text } = memoryLogger('info')
  const metrics = new Metrics()
  return { l: streamLimits({ maxStreamBufferBytes: max.stream, maxBacklogBytes: max.backlog, log, metrics }), metrics, text }
}

t.test('a client that keeps up gets an event larger than the bound', async t => {
  const { l, metrics } = limits({ stream: 64 * 1024 })
  const { res, client } = await pair(t)
  const stream = new SseStream(res, l)
  let text = ''
  client.setEncoding('utf8')
  client.on('data', (d: string) => {
    text += d
  })
  const big = 'b'.repeat(1024 * 1024)
  t.ok(stream.send({ jsonrpc: '2.0', method: 'notifications/message', params: { data: big } }))
  t.ok(await until(() => text.endsWith('\n\n') && text.length > 1024 * 1024), 'the whole event arrived')
  t.ok(stream.send({ jsonrpc: '2.0', method: 'notifications/message', params: { data: 'after' } }), 'and the stream stays open')
  t.ok(await until(() => text.includes('"after"')))
  t.equal(metrics.counter('mcp_proxy_sse_slow_streams_closed_total', '').get(), 0)
})

t.test('a client that stops reading is cut at the bound, its close handlers run', async t => {
  const { l, metrics, text } = limits({ stream: 256 * 1024 })
  const { res, client } = await pair(t)
  client.pause()
  const stream = new SseStream(res, l)
  let closed = false
  stream.onClose(() => {
    closed = true
  })
  const event = { jsonrpc: '2.0', method: 'notifications/message', params: { data: 'x'.repeat(64 * 1024) } }
  let sent = 0
  // One event per turn, as upstream lines come; bounded: the kernel takes a few MiB first.
  while (sent < 4096 && stream.send(event)) {
    sent++
    await new Promise(resolve => setImmediate(resolve))
  }
  t.ok(sent < 4096, `the stream refused an event after ${sent}`)
  t.notOk(stream.open)
  t.ok(res.destroyed, 'destroyed: its unsent bytes are freed now')
  t.ok(await until(() => closed), 'close handlers ran')
  t.equal(metrics.counter('mcp_proxy_sse_slow_streams_closed_total', '').get(), 1)
  t.match(text(), /closed a slow SSE stream/)
  t.notOk(stream.send(event), 'a closed stream takes nothing')
})

t.test('the backlog keeps the newest within its bytes, drops an oversized message, hands over in order', async t => {
  const { l, metrics, text } = limits({ backlog: 4096 })
  const backlog = new Backlog(l, l.log)
  const msg = (i: number, size = 1000): Record<string, unknown> => ({ jsonrpc: '2.0', method: 'notifications/message', params: { i, data: 'm'.repeat(size) } })
  for (let i = 0; i < 10; i++) backlog.push(msg(i))
  t.ok(backlog.bytes <= 4096, `held ${backlog.bytes} bytes`)
  backlog.push(msg(99, 8192))
  const dropped = metrics.counter('mcp_proxy_sse_backlog_dropped_total', '')
  t.equal(dropped.get(), 7 + 1, 'the oldest and the oversized one counted')
  t.equal(text().match(/session backlog full/g)?.length, 1, 'logged once')
  const { res, client } = await pair(t)
  let body = ''
  client.setEncoding('utf8')
  client.on('data', (d: string) => {
    body += d
  })
  backlog.flushTo(new SseStream(res, l))
  t.equal(backlog.bytes, 0)
  res.end()
  await once(client, 'end')
  const ids = sseMessages(body).map(m => (m.params as { i: number }).i)
  t.same(ids, [7, 8, 9], 'the newest that fit, oldest first')
})
