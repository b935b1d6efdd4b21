/**
 * A header sent twice to /mcp, in each era, through real sockets: pins the
 * one rule of core/mcp/headers.ts (`header()`): a repeated field reads as
 * its values joined with ", " (RFC 9110 §5.3, what node:http does), so a
 * list header (Accept) split over two lines still lists both types, and a
 * singleton (MCP-Protocol-Version, Mcp-Session-Id, Mcp-Method) sent twice is
 * no valid single value and is refused.
 */
import t from 'tap'
import { connect } from 'node:net'
import { startGateway, everythingTarget, INIT_HEADERS, sseMessages } from './helpers/gateway-harness.ts'

interface Raw {
  status: number
  body: string
}

/** A POST written to the socket as is, its header lines in order (repeats kept); the server closes after its answer (Connection: close). */
function post(url: string, lines: Array<[string, string]>, body: unknown): Promise<Raw> {
  const { hostname, port, pathname } = new URL(url)
  const payload = JSON.stringify(body)
  const head = [
    `POST ${pathname} HTTP/1.1`,
    `host: ${hostname}:${port}`,
    ...lines.map(([k, v]) => `${k}: ${v}`),
    `content-length: ${Buffer.byteLength(payload)}`,
    'connection: close',
  ]
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(head.join('\r\n') + '\r\n\r\n' + payload))
    let text = ''
    socket
      .setEncoding('utf8')
      .on('data', d => {
        text += d
      })
      .on('error', reject)
      .on('close', () => {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)
        const rest = text.slice(text.indexOf('\r\n\r\n') + 4)
        // A chunked answer (SSE): the chunks' data without their size lines.
        const chunked = /\r\ntransfer-encoding: chunked\r\n/i.test(text.slice(0, text.indexOf('\r\n\r\n') + 2))
        resolve({
          status,
          body: chunked
            ? rest
                .split('\r\n')
                .filter((_, i) => i % 2 === 1)
                .join('')
            : rest,
        })
      })
  })
}

const messageOf = (r: Raw): Record<string, any> => (r.body.startsWith('{') ? JSON.parse(r.body) : sseMessages(r.body).at(-1)!)

const MODERN = '2026-07-28'
const META = {
  'io.modelcontextprotocol/protocolVersion': MODERN,
  'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
  'io.modelcontextprotocol/clientCapabilities': {},
}

t.test('session era: a repeated header', async t => {
  const gw = await startGateway(t, { targets: [everythingTarget()] })
  const init = {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  }
  // Accept over two lines: both types are listed.
  const split = await post(
    gw.url,
    [
      ['content-type', 'application/json'],
      ['accept', 'application/json'],
      ['accept', 'text/event-stream'],
    ],
    init
  )
  t.equal(split.status, 200, 'Accept split over two lines is accepted')
  const opened = await fetch(gw.url, { method: 'POST', headers: INIT_HEADERS, body: JSON.stringify(init) })
  const sid = opened.headers.get('mcp-session-id')!
  await opened.text()
  const base: Array<[string, string]> = [
    ['content-type', 'application/json'],
    ['accept', INIT_HEADERS.accept],
    ['mcp-session-id', sid],
  ]
  const ping = { jsonrpc: '2.0', id: 2, method: 'ping' }
  t.equal((await post(gw.url, [...base, ['mcp-protocol-version', '2025-11-25']], ping)).status, 200, 'one MCP-Protocol-Version: served')
  const twice = await post(gw.url, [...base, ['mcp-protocol-version', '2025-11-25'], ['mcp-protocol-version', '2025-11-25']], ping)
  t.equal(twice.status, 400, 'MCP-Protocol-Version twice, even the same value: refused')
  t.same(messageOf(twice), { jsonrpc: '2.0', id: 2, error: { code: -32600, message: 'Bad Request: unsupported MCP-Protocol-Version: 2025-11-25, 2025-11-25' } })
  const sids = await post(gw.url, [...base, ['mcp-session-id', sid]], ping)
  t.equal(sids.status, 400, 'Mcp-Session-Id twice: refused')
  // Refused from the head alone, before the body is parsed: no id.
  t.same(messageOf(sids), { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Bad Request: more than one Mcp-Session-Id header' } })
})

t.test('2026-07-28: a repeated header', async t => {
  const gw = await startGateway(t, { targets: [everythingTarget()] })
  const list = { jsonrpc: '2.0', id: 3, method: 'tools/list', params: { _meta: META } }
  const base: Array<[string, string]> = [
    ['content-type', 'application/json'],
    ['mcp-protocol-version', MODERN],
    ['mcp-method', 'tools/list'],
  ]
  const split = await post(gw.url, [...base, ['accept', 'application/json'], ['accept', 'text/event-stream']], list)
  t.equal(split.status, 200, 'Accept split over two lines is accepted')
  t.ok(Array.isArray(messageOf(split).result?.tools), 'and answered')
  const twice = await post(gw.url, [...base, ['accept', INIT_HEADERS.accept], ['mcp-method', 'tools/list']], list)
  t.equal(twice.status, 400, 'Mcp-Method twice, even the same value: refused')
  t.same(messageOf(twice), {
    jsonrpc: '2.0',
    id: 3,
    error: { code: -32020, message: "Header mismatch: Mcp-Method header value 'tools/list, tools/list' does not match body value 'tools/list'" },
  })
})
