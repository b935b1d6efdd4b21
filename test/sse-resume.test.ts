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
import { ROOT, startGateway, rawInitialize, INIT_HEADERS } from './helpers/gateway-harness.ts'

const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')

interface Event { id?: string; data: string }

function parseEvents (text: string): Event[] {
  return text.split('\n\n').filter(b => b.trim() !== '').map(block => {
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
  const body = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'test_tool_with_progress', arguments: {}, _meta: { progressToken: 'tok-1' } } })
  const seen = await new Promise<Event[]>((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { ...headers, 'content-length': Buffer.byteLength(body) } }, res => {
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
    })
    req.on('error', err => { if (!req.destroyed) reject(err) })
    req.end(body)
  })
  const last = seen[seen.length - 1]!
  t.ok(seen.every(e => e.id !== undefined && e.id !== ''), 'every event of the POST stream has an id', { seen })
  t.notOk(seen.some(e => e.data.includes('"result"')), 'the cut came before the answer')

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
  t.notOk(replayed.some(e => e.id === last.id || seen.some(s => s.id === e.id && e.data !== '')), 'events the client had are not sent again', { replayed, seen })
  t.ok(replayed.filter(e => e.data !== '').every(e => e.id !== undefined), 'replayed events keep their ids')
  t.notMatch(gw.logText(), /client disconnected/, 'the upstream call was not cancelled')
})
