/**
 * Slow SSE clients and chatty upstreams (issue 13 item 18): a stream the
 * client never reads holds a bounded number of bytes in the gateway, then is
 * closed (logged, counted): GET streams, POST answers of both eras, listen
 * streams. A
 * session without a stream keeps a backlog bounded in bytes. Other sessions
 * go on. What the gateway holds unsent is read from its own accounting
 * (the `mcp_proxy_sse_buffered_bytes` gauge, sampled throughout each flood,
 * and the bytes the slow-stream log line reports at the close), not from
 * this process's RSS: it stays within the bound (README: maxStreamBufferBytes,
 * 8 MiB by default) while an upstream pushes far more, and is 0 once the
 * client left. Whole gateway in process, faulty-server's `chatter` tool as
 * the upstream, default limits; and once with a real SDK server (the
 * conformance fixture's `test_flood`) as the upstream.
 */
import t from 'tap'
import type * as Tap from 'tap'
import { request, type IncomingMessage, type ClientRequest } from 'node:http'
import { fullGateway } from './helpers/full-gateway.ts'
import { faultyTarget, rawInitialize, sseMessages, until, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { fixtureStdio } from './helpers/conformance-fixture.ts'

const VERSION = '2025-06-18'
const MiB = 1024 * 1024

/** README "Limits": mcp.limits.maxStreamBufferBytes defaults to 8 MiB. */
const STREAM_BOUND = 8 * MiB
/** A stream that kept up may take one event past the bound (a chatter notification: 256 KiB and its framing). */
const ONE_EVENT = 257 * 1024

async function call(url: string, sid: string, msg: Record<string, unknown>): Promise<Array<Record<string, unknown>>> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': VERSION },
    body: JSON.stringify({ jsonrpc: '2.0', ...msg }),
  })
  return sseMessages(await res.text())
}

function tool(url: string, sid: string, id: number, name: string, args: Record<string, unknown> = {}): Promise<Array<Record<string, unknown>>> {
  return call(url, sid, { id, method: 'tools/call', params: { name, arguments: args } })
}

/** Opens the session's GET stream; resolves once its head is here. */
function openGet(url: string, sid: string): Promise<{ req: ClientRequest; res: IncomingMessage }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'GET', headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': VERSION } }, res =>
      resolve({ req, res })
    )
    req.on('error', reject)
    req.end()
  })
}

async function session(url: string): Promise<string> {
  const init = await rawInitialize(url, VERSION)
  if (init.status !== 200 || init.sessionId === null) throw new Error(`initialize: ${init.status} ${init.body}`)
  return init.sessionId
}

t.test('a stream that is never read, a chatty upstream, and a session without a stream', async t => {
  const g = await fullGateway(t, { targets: [faultyTarget()] })
  const slowClosed = (): number => g.gw.metrics.counter('mcp_proxy_sse_slow_streams_closed_total', '').get()
  /** The gateway's own gauge: bytes written to open SSE streams and not yet sent. */
  const buffered = (): number => g.gw.metrics.gauge('mcp_proxy_sse_buffered_bytes', '').collect!()[0]![1]
  let peak = 0
  /** Samples the gauge while waiting for `cond` (bounded): the most the gateway held unsent meanwhile. */
  const watching = (cond: () => boolean, tries = 400): Promise<boolean> =>
    until(() => {
      peak = Math.max(peak, buffered())
      return cond()
    }, tries)
  /** What each closed slow stream held when it was closed, as the gateway logged it. */
  const heldAtClose = (): number[] => [...g.logText().matchAll(/"bufferedBytes":(\d+),"limit":(\d+),"msg":"closed a slow SSE stream/g)].map(m => Number(m[1]))
  const bounded = (t: Tap.Test, streams: number, what: string): void => {
    t.ok(peak <= streams * (STREAM_BOUND + ONE_EVENT), `${what}: the gateway held at most ${(peak / MiB).toFixed(1)} MiB unsent (bound ${streams} x 8 MiB)`)
    t.ok(
      heldAtClose().length > 0 && heldAtClose().every(b => b <= STREAM_BOUND + ONE_EVENT),
      `each slow stream held at most the bound when closed: ${heldAtClose()
        .map(b => (b / MiB).toFixed(1))
        .join(', ')} MiB`
    )
  }
  const a = await session(g.url)
  const b = await session(g.url)
  // Warm up both sessions' paths.
  t.match(await tool(g.url, a, 1, 'echo', { message: 'warm' }), [{ result: { content: [{ text: 'warm' }] } }])
  t.match(await tool(g.url, b, 1, 'chatter', { count: 8, bytes: 65536 }), [{}, {}, {}, {}, {}, {}, {}, {}, { id: 1, result: {} }])

  await t.test('a GET stream never read: closed once its buffer is full, other sessions unaffected', async t => {
    const get = await openGet(g.url, a)
    t.equal(get.res.statusCode, 200)
    get.res.pause()
    // 64 MiB of notifications unrelated to any request: they go to the GET stream.
    const flood = tool(g.url, a, 2, 'chatter', { count: 256, bytes: 256 * 1024, after: true, tag: 'get' })
    const other = tool(g.url, b, 2, 'echo', { message: 'still here' })
    t.match(await other, [{ id: 2, result: { content: [{ text: 'still here' }] } }], 'another session is served during the flood')
    t.match(await flood, [{ id: 2, result: { content: [{ text: 'chatting' }] } }])
    t.ok(await watching(() => g.logText().includes('chatter done get')), 'the upstream sent everything')
    t.ok(await watching(() => g.gw.endpoint.sessions().find(s => a.startsWith(s.id))?.getStream === false, 80), 'the stuck GET stream was closed')
    t.ok(slowClosed() >= 1, 'counted in mcp_proxy_sse_slow_streams_closed_total')
    t.match(g.logText(), /closed a slow SSE stream/, 'and logged')
    bounded(t, 1, '64 MiB pushed to a client that is still connected')
    t.equal(buffered(), 0, 'nothing held unsent once the stream was closed, though its client is still connected')
    t.match(await tool(g.url, b, 3, 'echo', { message: 'after too' }), [{ id: 3, result: { content: [{ text: 'after too' }] } }])
    get.req.destroy()
  })

  await t.test('a POST answer never read: closed the same way', async t => {
    const closed = slowClosed()
    // Notifications sent while the call runs go to its own POST stream, which nobody reads.
    const req = request(g.url, { method: 'POST', headers: { ...INIT_HEADERS, 'mcp-session-id': b, 'mcp-protocol-version': VERSION } }, res => res.pause())
    req.on('error', () => {})
    req.end(
      JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'chatter', arguments: { count: 256, bytes: 256 * 1024, tag: 'post' } } })
    )
    peak = 0
    t.ok(await watching(() => slowClosed() > closed), 'the POST stream was closed as slow')
    t.ok(await watching(() => g.logText().includes('chatter done post')), 'the upstream sent everything')
    // The rest of the notifications may share this answer's stream (no GET stream): look for the answer.
    t.match(
      (await tool(g.url, b, 5, 'echo', { message: 'b lives' })).find(m => m.id === 5),
      { result: { content: [{ text: 'b lives' }] } }
    )
    bounded(t, 1, 'up to 64 MiB pushed')
    req.destroy()
    t.ok(await until(() => buffered() === 0), 'nothing held unsent once the client left')
  })

  await t.test('a 2026-07-28 answer never read: closed the same way', async t => {
    const closed = slowClosed()
    // Log notifications while the call runs turn its answer into an SSE stream (logLevel in _meta).
    const meta = {
      'io.modelcontextprotocol/protocolVersion': '2026-07-28',
      'io.modelcontextprotocol/clientCapabilities': {},
      'io.modelcontextprotocol/logLevel': 'info',
    }
    const req = request(
      g.url,
      { method: 'POST', headers: { ...INIT_HEADERS, 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'chatter' } },
      res => res.pause()
    )
    req.on('error', () => {})
    req.end(
      JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'tools/call',
        params: { name: 'chatter', arguments: { count: 384, bytes: 256 * 1024, tag: 'modern' }, _meta: meta },
      })
    )
    peak = 0
    t.ok(await watching(() => slowClosed() > closed), 'the answer stream was closed as slow')
    t.ok(await watching(() => g.logText().includes('chatter done modern')), 'the upstream sent everything')
    t.match(
      (await tool(g.url, b, 6, 'echo', { message: 'b still' })).find(m => m.id === 6),
      { result: { content: [{ text: 'b still' }] } }
    )
    bounded(t, 1, 'up to 96 MiB pushed')
    req.destroy()
    t.ok(await until(() => buffered() === 0), 'nothing held unsent once the client left')
  })

  await t.test('a 2026-07-28 listen stream never read: closed the same way', async t => {
    const closed = slowClosed()
    const meta = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} }
    const modern = (method: string, params: Record<string, unknown>, name?: string): ClientRequest => {
      const req = request(g.url, {
        method: 'POST',
        headers: { ...INIT_HEADERS, 'mcp-protocol-version': '2026-07-28', 'mcp-method': method, ...(name === undefined ? {} : { 'mcp-name': name }) },
      })
      req.on('error', () => {})
      req.end(JSON.stringify({ jsonrpc: '2.0', id: 1, method, params: { ...params, _meta: meta } }))
      return req
    }
    const pooled = (): Array<{ leases: number; inFlight: number }> => g.gw.endpoint.pooled().filter(p => p.target === 'faulty')
    // The listen stream leases the least busy pooled upstream; a call that hangs takes a second one, so
    // the next call shares the listen's upstream and its change notifications reach the listen stream.
    const listen = modern('subscriptions/listen', { notifications: { toolsListChanged: true } })
    const head = await new Promise<IncomingMessage>(resolve => listen.once('response', resolve))
    t.equal(head.statusCode, 200)
    head.pause()
    const hang = modern('tools/call', { name: 'hang', arguments: {} }, 'hang')
    t.ok(
      await until(() => pooled().length === 2 && pooled().every(p => p.leases >= 1) && pooled().some(p => p.inFlight === 1)),
      'two pooled upstreams, both leased'
    )
    peak = 0
    const flood = await fetch(g.url, {
      method: 'POST',
      headers: { ...INIT_HEADERS, 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'chatter' },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 2,
        method: 'tools/call',
        params: { name: 'chatter', arguments: { count: 384, bytes: 256 * 1024, method: 'notifications/tools/list_changed', tag: 'listen' }, _meta: meta },
      }),
    })
    t.match(await flood.json(), { id: 2, result: { content: [{ text: 'sent 384' }] } })
    t.ok(await watching(() => slowClosed() > closed), 'the listen stream was closed as slow')
    bounded(t, 1, '96 MiB of change notifications pushed')
    listen.destroy()
    hang.destroy()
    t.ok(await until(() => buffered() === 0), 'nothing held unsent once the client left')
  })

  await t.test('a session without a stream keeps a backlog bounded in bytes, newest last', async t => {
    const c = await session(g.url)
    // Answered first: the 64 MiB that follow find no open stream.
    t.match(await tool(g.url, c, 1, 'chatter', { count: 256, bytes: 256 * 1024, after: true, tag: 'backlog' }), [{ id: 1, result: {} }])
    t.ok(await until(() => g.logText().includes('chatter done backlog'), 400), 'the upstream sent everything')
    // The backlog goes to the next GET stream; a short marker follows it.
    const get = await openGet(g.url, c)
    let text = ''
    get.res.setEncoding('utf8')
    get.res.on('data', (d: string) => {
      text += d
    })
    t.match(await tool(g.url, c, 2, 'chatter', { count: 1, bytes: 5, after: true }), [{ id: 2, result: {} }])
    t.ok(await until(() => text.includes('"data":"ccccc"'), 200), 'the marker arrived')
    get.req.destroy()
    const backlog = sseMessages(text).length - 1
    t.ok(backlog >= 1, `the newest messages are kept (${backlog})`)
    t.ok(text.length < 2 * MiB, `the backlog held ${(text.length / MiB).toFixed(2)} MiB of the 64 MiB sent`)
    t.ok(g.gw.metrics.counter('mcp_proxy_sse_backlog_dropped_total', '').get() >= 200, 'the dropped ones are counted')
    t.match(g.logText(), /session backlog full/, 'and logged')
  })

  await t.test('nothing held after the clients left', async t => {
    t.ok(await until(() => buffered() === 0), `no SSE bytes held unsent (${buffered()})`)
  })
})

t.test('a real SDK server floods a POST answer nobody reads: closed at the bound, the session goes on', async t => {
  // The conformance fixture (the official SDK's McpServer over stdio) instead of faulty-server: the same
  // bound holds for what a real server writes (its test_flood tool logs on the call's own stream).
  const g = await fullGateway(t, { targets: [fixtureStdio()] })
  const slowClosed = (): number => g.gw.metrics.counter('mcp_proxy_sse_slow_streams_closed_total', '').get()
  const buffered = (): number => g.gw.metrics.gauge('mcp_proxy_sse_buffered_bytes', '').collect!()[0]![1]
  let peak = 0
  const watching = (cond: () => boolean, tries = 400): Promise<boolean> =>
    until(() => {
      peak = Math.max(peak, buffered())
      return cond()
    }, tries)
  const sid = await session(g.url)
  t.match(await tool(g.url, sid, 1, 'test_simple_text'), [{ id: 1, result: { content: [{ text: 'This is a simple text response for testing.' }] } }])
  const req = request(g.url, { method: 'POST', headers: { ...INIT_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': VERSION } }, res => res.pause())
  req.on('error', () => {})
  // 48 MiB of log notifications on a stream nobody reads.
  req.end(
    JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'test_flood', arguments: { count: 192, bytes: 256 * 1024, tag: 'real' } } })
  )
  t.ok(await watching(() => slowClosed() >= 1), 'the stream was closed as slow')
  t.ok(await watching(() => g.logText().includes('fixture: flood done real')), 'the server sent everything')
  t.ok(peak <= STREAM_BOUND + ONE_EVENT, `the gateway held at most ${(peak / MiB).toFixed(1)} MiB unsent (bound 8 MiB)`)
  const held = [...g.logText().matchAll(/"bufferedBytes":(\d+),"limit":(\d+),"msg":"closed a slow SSE stream/g)].map(m => Number(m[1]))
  t.ok(held.length === 1 && held[0]! <= STREAM_BOUND + ONE_EVENT, `held at most the bound when closed: ${held.map(b => (b / MiB).toFixed(1)).join(', ')} MiB`)
  t.match(
    (await tool(g.url, sid, 3, 'test_simple_text')).find(m => m.id === 3),
    { result: { content: [{ text: 'This is a simple text response for testing.' }] } },
    'the session is served after'
  )
  req.destroy()
  t.ok(await until(() => buffered() === 0), 'nothing held unsent once the client left')
})
