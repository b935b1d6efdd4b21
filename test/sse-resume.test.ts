/**
 * Resumable streams of the session era (MCP 2025-11-25, transports,
 * "Resumability and Redelivery"): every event the gateway writes on /mcp
 * carries an id; a POST stream the client loses mid-call does not cancel the
 * upstream request (a disconnect is not a cancellation), and its answer comes
 * on a GET with `Last-Event-ID`. Raw sockets against the gateway in front of
 * the conformance fixture over stdio (its test_tool_with_progress reports
 * progress three times, 50 ms apart, then answers with the progress token).
 */
import t from 'tap'
import { request } from 'node:http'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ROOT, startGateway, rawInitialize, INIT_HEADERS, sseMessages, until } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'

const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')

interface Event {
  id?: string
  data: string
}

function parseEvents(text: string): Event[] {
  return text
    .split('\n\n')
    .filter(b => b.trim() !== '')
    .map(block => {
      const ev: Event = { data: '' }
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) ev.id = line.slice(3).trim()
        else if (line.startsWith('data:')) ev.data += line.slice(5).trimStart()
      }
      return ev
    })
}

t.test('a POST stream cut mid-call: the call goes on, and its answer comes on a GET with Last-Event-ID', async t => {
  const gw = await startGateway(t, { targets: [{ name: 'conformance', stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {} } }] })
  const init = await rawInitialize(gw.url)
  t.equal(init.status, 200)
  const sid = init.sessionId!
  const headers = { ...INIT_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' }
  await fetch(gw.url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })

  // The call, read until its first progress event, then the connection is destroyed.
  const url = new URL(gw.url)
  const body = JSON.stringify({
    jsonrpc: '2.0',
    id: 7,
    method: 'tools/call',
    params: { name: 'test_tool_with_progress', arguments: {}, _meta: { progressToken: 'tok-1' } },
  })
  const seen = await new Promise<Event[]>((resolve, reject) => {
    const req = request(
      { host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { ...headers, 'content-length': Buffer.byteLength(body) } },
      res => {
        let text = ''
        res.setEncoding('utf8')
        res.on('data', (d: string) => {
          text += d
          const events = parseEvents(text.slice(0, text.lastIndexOf('\n\n') + 2))
          if (events.some(e => e.data.includes('notifications/progress'))) {
            req.destroy()
            resolve(events)
          }
        })
        res.on('end', () => reject(new Error(`stream ended before any progress: ${text}`)))
      }
    )
    req.on('error', err => {
      if (!req.destroyed) reject(err)
    })
    req.end(body)
  })
  const last = seen[seen.length - 1]!
  t.ok(
    seen.every(e => e.id !== undefined && e.id !== ''),
    'every event of the POST stream has an id',
    { seen }
  )
  t.notOk(
    seen.some(e => e.data.includes('"result"')),
    'the cut came before the answer'
  )

  // Reconnect with the last event id seen: the rest of the stream, answer included.
  const res = await fetch(gw.url, {
    headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25', 'last-event-id': last.id ?? '' },
    signal: AbortSignal.timeout(30_000),
  })
  t.equal(res.status, 200, 'the GET with Last-Event-ID is accepted')
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader()
  let text = ''
  let answer: Record<string, any> | undefined
  const replayed: Event[] = []
  while (answer === undefined) {
    const { value, done } = await reader.read()
    if (done) break
    text += value
    const complete = text.slice(0, text.lastIndexOf('\n\n') + 2)
    text = text.slice(complete.length)
    for (const ev of parseEvents(complete)) {
      replayed.push(ev)
      if (ev.data === '') continue
      const msg = JSON.parse(ev.data) as Record<string, any>
      if (msg.id === 7) answer = msg
    }
  }
  await reader.cancel().catch(() => {})
  t.same(answer?.result?.content, [{ type: 'text', text: 'tok-1' }], 'the answer of the cut call arrives on the resumed stream')
  t.notOk(
    replayed.some(e => e.id === last.id || seen.some(s => s.id === e.id && e.data !== '')),
    'events the client had are not sent again',
    { replayed, seen }
  )
  t.ok(
    replayed.filter(e => e.data !== '').every(e => e.id !== undefined),
    'replayed events keep their ids'
  )
  // The fixture writes each notifications/cancelled it gets on stderr (logged by the gateway), and a
  // marker when a progress call ends. A cancel for the cut would have reached its stdin before this
  // second call did, so it would be logged before this call's marker.
  const after = await fetch(gw.url, {
    method: 'POST',
    headers,
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 8,
      method: 'tools/call',
      params: { name: 'test_tool_with_progress', arguments: {}, _meta: { progressToken: 'tok-2' } },
    }),
  })
  t.same(
    sseMessages(await after.text()).at(-1),
    { jsonrpc: '2.0', id: 8, result: { content: [{ type: 'text', text: 'tok-2' }] } },
    'a later call on the same upstream'
  )
  t.ok(await until(() => gw.logText().includes('fixture: progress done tok-2')), "the fixture's marker for the later call was logged")
  t.ok(gw.logText().includes('fixture: progress done tok-1'), 'the cut call ran to its end upstream')
  t.notMatch(gw.logText(), /fixture: cancelled/, 'the server never got a notifications/cancelled: the cut did not cancel the call')
})

/**
 * Polling (SEP-1699), opt-in with mcp.streams.pollAfterMs: a POST stream whose request is
 * still running after that long is closed by the gateway (after its priming event, which
 * carries an id and `retry:`), and the client resumes it with Last-Event-ID.
 * test/fixtures/late-server.mjs answers `hold` only once `release` is called, so the poll
 * always comes first.
 */
const LATE = join(ROOT, 'test/fixtures/late-server.mjs')
const lateTarget = { name: 'late', stdio: { cmd: process.execPath, args: [LATE, 'stdio'], env: {} } }

t.test('polling: a POST stream still running after mcp.streams.pollAfterMs is closed, and resumed with Last-Event-ID', async t => {
  const { url } = await fullGateway(t, { targets: [lateTarget], streams: { pollAfterMs: 50 } })
  const init = await rawInitialize(url)
  const sid = init.sessionId!
  const headers = { ...INIT_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' }
  await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  const call = (id: number, name: string): Promise<Response> =>
    fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: {} } }),
      signal: AbortSignal.timeout(30_000),
    })

  const polled = await call(3, 'hold')
  t.equal(polled.headers.get('content-type'), 'text/event-stream')
  const first = parseEvents(await polled.text())
  t.ok(first.length >= 1 && first[0]!.id !== undefined && first[0]!.data === '', 'the stream starts with a priming event with an id', { first })
  t.notOk(
    first.some(e => e.data.includes('"result"')),
    'the gateway closed the stream before the answer',
    { first }
  )

  t.same(
    sseMessages(await (await call(4, 'release')).text()).at(-1),
    { jsonrpc: '2.0', id: 4, result: { content: [{ type: 'text', text: 'released 1' }] } },
    'the held call was still running upstream'
  )
  const resumed = await fetch(url, {
    headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25', 'last-event-id': first.at(-1)!.id! },
    signal: AbortSignal.timeout(30_000),
  })
  t.equal(resumed.status, 200)
  const rest = parseEvents(await resumed.text())
  t.same(
    rest.filter(e => e.data !== '').map(e => JSON.parse(e.data) as unknown),
    [{ jsonrpc: '2.0', id: 3, result: { content: [{ type: 'text', text: 'released' }] } }],
    'the answer comes on the resumed stream, which then ends'
  )
})

t.test('polling: an SDK client reconnects by itself and gets its answer; off by default', async t => {
  const { url, logText } = await fullGateway(t, { targets: [lateTarget], streams: { pollAfterMs: 50 } }, 'debug')
  const client = new Client({ name: 'polling', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url)))
  t.teardown(() => client.close())
  const held = client.callTool({ name: 'hold', arguments: {} })
  // Released once its stream was polled: the answer then needs the reconnection.
  t.ok(await until(() => logText().includes('POST stream polled')), "the gateway closed the call's stream")
  await client.callTool({ name: 'release', arguments: {} })
  t.same((await held).content, [{ type: 'text', text: 'released' }])

  const plain = await fullGateway(t, { targets: [lateTarget] })
  const init = await rawInitialize(plain.url)
  const headers = { ...INIT_HEADERS, 'mcp-session-id': init.sessionId!, 'mcp-protocol-version': '2025-11-25' }
  const res = await fetch(plain.url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'hold', arguments: {} } }),
    signal: AbortSignal.timeout(30_000),
  })
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader()
  await reader.read()
  await fetch(plain.url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ jsonrpc: '2.0', id: 10, method: 'tools/call', params: { name: 'release', arguments: {} } }),
  }).then(r => r.text())
  let text = ''
  for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value
  t.match(
    sseMessages(text).at(-1),
    { id: 9, result: { content: [{ text: 'released' }] } },
    'without the key the answer comes on the POST stream itself (SPEC behaviour)'
  )
})
