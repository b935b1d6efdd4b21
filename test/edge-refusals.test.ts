/**
 * Refusals at the edge and of HTTP targets, from the outside (issue 22,
 * items 11 and 12): a whole gateway (startGateway from a validated config)
 * on 127.0.0.1:0, raw sockets and real loopback clients.
 *
 * - item 11: a body over `maxBodyBytes` gets its 413 even while the client
 *   goes on writing (lingering close: the rest is drained, bounded, before
 *   the connection closes; a reset used to eat the answer);
 * - item 12: an anonymous passthrough session answers only the client
 *   address that opened it; an HTTP target's own 401 (and its
 *   WWW-Authenticate naming its authorization server) never reaches the
 *   client: a 502 naming the target instead, both eras.
 */
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { everythingTarget, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { fixtureHttp, call } from './helpers/conformance-fixture.ts'

/** Longest one exchange may take before the test counts it as hung (a failure guard, not a measurement). */
const GUARD_MS = 15_000

interface Exchange {
  received: string
  error: string | undefined
  written: number
}

/**
 * A client that sends `total` body bytes in 16 KiB chunks, each after the last was handed to
 * the kernel, and reads the answer once its body is sent (as most HTTP clients do: the answer
 * waits in its receive buffer meanwhile). Resolves with what it read and the error that ended
 * the connection, if any (EPIPE/ECONNRESET when the server reset it under the writes).
 */
function uploadSteadily(port: number, head: string, total: number): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    const chunk = Buffer.alloc(16 * 1024, 0x20)
    let received = ''
    let written = 0
    let error: string | undefined
    const guard = setTimeout(() => {
      socket.destroy()
      reject(new Error(`no end within the guard; received ${JSON.stringify(received.slice(0, 200))}`))
    }, GUARD_MS)
    socket.pause()
    socket.on('data', d => {
      received += d.toString('latin1')
    })
    socket.on('error', err => {
      error = (err as NodeJS.ErrnoException).code ?? err.message
    })
    socket.once('close', () => {
      clearTimeout(guard)
      resolve({ received, error, written })
    })
    const more = (): void => {
      if (socket.destroyed || !socket.writable) return
      if (written >= total) {
        socket.resume()
        return
      }
      written += chunk.length
      socket.write(chunk, err => {
        if (err === undefined || err === null) more()
      })
    }
    socket.once('connect', () => {
      socket.write(head)
      more()
    })
  })
}

function statusAndBody(text: string): { status: number; body: unknown } | undefined {
  const end = text.indexOf('\r\n\r\n')
  if (end === -1) return undefined
  const head = text.slice(0, end)
  const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? -1)
  const body = Buffer.from(text.slice(end + 4), 'latin1')
  if (length < 0 || body.length < length) return undefined
  return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]), body: JSON.parse(body.subarray(0, length).toString('utf8')) }
}

t.test('item 11: a body over maxBodyBytes gets its 413 while the client is still writing (no reset eats it), every time', async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()], limits: { maxBodyBytes: 64 * 1024 } })
  const port = Number(new URL(gw.url).port)
  // Past what the kernel buffers on loopback hold (a few MiB), within the gateway's drain bound (linger.ts).
  const total = 6 * 1024 * 1024
  const head = 'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n'
  for (const [what, framing] of [
    ['declared too large', `Content-Length: ${total}\r\n\r\n`],
    ['chunked, growing past the limit', 'Transfer-Encoding: chunked\r\n\r\n'],
  ] as const) {
    const lost: string[] = []
    for (let i = 0; i < 8; i++) {
      // Chunked framing: one chunk as large as the whole upload, so the raw chunks are its data.
      const ex = await uploadSteadily(port, head + framing + (framing.startsWith('Transfer') ? `${total.toString(16)}\r\n` : ''), total)
      const got = statusAndBody(ex.received)
      if (got?.status !== 413) {
        lost.push(`#${i + 1}: ${ex.error ?? 'closed'} after ${ex.received.length} bytes read`)
        continue
      }
      t.match(
        got.body,
        { jsonrpc: '2.0', id: null, error: { code: -32600, message: `request body exceeds ${64 * 1024} bytes` } },
        `${what} #${i + 1}: the JSON-RPC error`
      )
    }
    t.same(lost, [], `${what}: the 413 reached the client every time`)
  }
})

/** A POST from `localAddress` over a fresh connection; status, session id and text. */
function postFrom(
  url: string,
  localAddress: string,
  body: unknown,
  headers: Record<string, string> = {}
): Promise<{ status: number; sid: string | undefined; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'POST', localAddress, agent: false, headers: { ...INIT_HEADERS, ...headers } }, res => {
      let text = ''
      res
        .setEncoding('utf8')
        .on('data', d => {
          text += d
        })
        .once('end', () => resolve({ status: res.statusCode ?? 0, sid: res.headers['mcp-session-id'] as string | undefined, text }))
    })
    req.once('error', reject)
    req.end(JSON.stringify(body))
  })
}

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
}
const PING = { jsonrpc: '2.0', id: 2, method: 'ping' }

t.test('item 12: an anonymous passthrough session answers only the client address that opened it', async t => {
  const upstream = await fixtureHttp(t)
  const gw = await fullGateway(t, { targets: [{ name: 'fixture', mcp: { url: upstream } }] })
  const init = await postFrom(gw.url, '127.0.0.1', INIT)
  t.equal(init.status, 200, 'initialized from 127.0.0.1')
  t.type(init.sid, 'string', 'a session id')
  const session = { 'mcp-session-id': init.sid!, 'mcp-protocol-version': '2025-06-18' }
  const own = await postFrom(gw.url, '127.0.0.1', PING, session)
  t.equal(own.status, 200, 'its own address is served')
  const other = await postFrom(gw.url, '127.0.0.2', PING, session)
  t.equal(other.status, 404, 'another address presenting the id: not found', { got: other.text })
  t.match(JSON.parse(other.text), { error: { message: 'Session not found' } })
  t.equal((await postFrom(gw.url, '127.0.0.1', PING, session)).status, 200, 'and the session still serves its owner')
})

/** A real HTTP server answering every request 401 with a challenge naming its own authorization server. */
async function refusingTarget(t: Test): Promise<{ url: string; hits: () => number }> {
  let hits = 0
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    hits++
    req.resume()
    const body = JSON.stringify({ error: 'invalid_token' })
    res.writeHead(401, {
      'www-authenticate': `Bearer error="invalid_token", resource_metadata="http://127.0.0.1:${(server.address() as AddressInfo).port}/.well-known/oauth-protected-resource/evil"`,
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
    })
    res.end(body)
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`, hits: () => hits }
}

t.test("item 12: an HTTP target's own 401 is a 502 naming the target; its WWW-Authenticate never reaches the client", async t => {
  const refusing = await refusingTarget(t)
  const expected = 'target "locked" refused the gateway\'s credentials (401)'

  await t.test('passthrough (one HTTP target, session era)', async t => {
    const gw = await fullGateway(t, { targets: [{ name: 'locked', mcp: { url: refusing.url } }] })
    const before = refusing.hits()
    const res = await fetch(gw.url, { method: 'POST', headers: INIT_HEADERS, body: JSON.stringify(INIT) })
    const text = await res.text()
    t.ok(refusing.hits() > before, 'the target was asked')
    t.equal(res.status, 502, 'a gateway error', { got: text })
    t.equal(res.headers.get('www-authenticate'), null, "the target's challenge is not passed on")
    // The body was piped, never parsed: no id to answer with (JSON-RPC 2.0 §5: null).
    t.same(JSON.parse(text), { jsonrpc: '2.0', id: null, error: { code: -32000, message: expected } })
    t.match(gw.logText(), /refused the gateway's credentials/, 'and logged')
  })

  await t.test('translated (two targets, session era) and 2026-07-28', async t => {
    const gw = await fullGateway(t, { targets: [{ name: 'locked', mcp: { url: refusing.url } }, everythingTarget()] })
    const res = await fetch(gw.url, { method: 'POST', headers: INIT_HEADERS, body: JSON.stringify(INIT) })
    const text = await res.text()
    t.equal(res.headers.get('www-authenticate'), null, 'no challenge passed on')
    t.notMatch(text, /resource_metadata|evil/, "nothing of the target's challenge in the answer")
    // The log line is JSON: its quotes are escaped.
    t.match(gw.logText(), /target \\"locked\\" refused the gateway's credentials \(401\)/, 'logged, naming the target')
    const one = await fullGateway(t, { targets: [{ name: 'locked', mcp: { url: refusing.url } }] })
    const modern = await call(one.url, 'tools/list', {})
    t.equal(modern.status, 502, '2026-07-28: a gateway error')
    t.match(modern.json?.error, { code: -32000, message: /locked/ }, 'naming the target', { got: modern.json })
    t.notMatch(JSON.stringify(modern.json), /resource_metadata|evil|invalid_token/, "nothing of the target's answer")
    t.equal(modern.json?.id, 7, "for the request's id")
    t.match(one.logText(), /target \\"locked\\" refused the gateway's credentials \(401\)/, 'logged, naming the target')
  })
})
