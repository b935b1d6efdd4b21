/**
 * The HTTP edge of the MCP listener from the outside (issue 13, items 6, 7,
 * 8, 9, 21): raw sockets against a whole gateway (startGateway from a
 * validated config, real dev IdP, real server-everything), and the real CLI
 * for the slowloris. Every client here writes as soon as the port accepts.
 */
import t, { type Test } from 'tap'
import { connect, type Socket, type AddressInfo } from 'node:net'
import { createServer } from 'node:http'
import { writeFile, mkdtemp } from 'node:fs/promises'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { spawn } from 'node:child_process'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { DevIdp } from '../bin/dev-idp.ts'
import { everythingTarget, rawInitialize, until, EVERYTHING } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { devIdp, ossOptions } from './helpers/idp.ts'
import { CLI, ROOT, freePort } from './helpers/cli.ts'

/** Longest any exchange here may take before the test counts it as hung (a failure guard, not a measurement). */
const GUARD_MS = 8000

interface RawResponse {
  status: number
  headers: Record<string, string>
  body: string
}

interface RawClient {
  readonly socket: Socket
  /** Resolves with everything received once the server has closed the connection; rejects after GUARD_MS. */
  readonly closed: Promise<string>
  /** Resolves with the first complete response (head and Content-Length body); rejects after GUARD_MS. */
  readonly response: Promise<RawResponse>
}

function parseResponse(text: string): RawResponse | undefined {
  const end = text.indexOf('\r\n\r\n')
  if (end === -1) return undefined
  const [statusLine, ...lines] = text.slice(0, end).split('\r\n')
  const headers: Record<string, string> = {}
  for (const l of lines) {
    const i = l.indexOf(':')
    headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim()
  }
  const length = Number(headers['content-length'] ?? 0)
  const body = Buffer.from(text.slice(end + 4), 'latin1')
  if (body.length < length) return undefined
  return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine!)?.[1]), headers, body: body.subarray(0, length).toString('utf8') }
}

/** `p`, or a rejection naming what did not happen once GUARD_MS passed. */
function withinGuard<T>(p: Promise<T>, what: () => string, guardMs = GUARD_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(what())), guardMs)
  })
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer))
}

/** A raw TCP client to 127.0.0.1:`port`, its socket destroyed in teardown; `guardMs`: the hang guard. */
function rawClient(t: Test, port: number, guardMs = GUARD_MS): RawClient {
  const socket = connect(port, '127.0.0.1')
  t.teardown(() => {
    socket.destroy()
  })
  let received = ''
  let onData: (() => void) | undefined
  socket.on('data', d => {
    received += d.toString('latin1')
    onData?.()
  })
  // A reset after the server closed (we kept writing) is an end like any other.
  socket.on('error', () => {})
  const guard = <T>(what: string, p: Promise<T>): Promise<T> =>
    withinGuard(p, () => `${what} did not happen within the guard; received: ${JSON.stringify(received.slice(0, 300))}`, guardMs)
  const closed = guard('server closing the connection', new Promise<string>(resolve => socket.once('close', () => resolve(received))))
  const response = guard(
    'a response',
    new Promise<RawResponse>((resolve, reject) => {
      onData = () => {
        const r = parseResponse(received)
        if (r !== undefined) resolve(r)
      }
      socket.once('close', () => {
        const r = parseResponse(received)
        if (r !== undefined) resolve(r)
        else reject(new Error(`closed without a response: ${JSON.stringify(received.slice(0, 300))}`))
      })
    })
  )
  // Neither may be left unhandled when a test only awaits one of them.
  closed.catch(() => {})
  response.catch(() => {})
  return { socket, closed, response }
}

/** Writes one byte now and then until the socket closes: a client that never finishes its body. */
function trickle(socket: Socket, everyMs = 50): void {
  const timer = setInterval(() => {
    if (socket.destroyed || !socket.writable) clearInterval(timer)
    else socket.write('x')
  }, everyMs)
  socket.once('close', () => clearInterval(timer))
}

const INIT_BODY = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
})

function postHead(extra: string, contentLength: number): string {
  return (
    'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n' +
    `${extra}Content-Length: ${contentLength}\r\n\r\n`
  )
}

function portOf(url: string): number {
  return Number(new URL(url).port)
}

let idp: DevIdp
let alice: string
let mallory: string

t.before(async () => {
  idp = await devIdp(t)
  alice = await idp.mintToken({ sub: 'alice' })
  mallory = await idp.mintToken({ sub: 'mallory' })
})

t.test("item 6: more header fields than mcp.limits.maxHeaders is 431, so a second Authorization cannot hide past Node's count", async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()], policies: { mcpAuthentication: ossOptions(idp) } })
  // Short fillers keep the head under maxHeaderSize: only the count is over.
  const fillers = 'a:1\r\n'.repeat(2100)
  const c = rawClient(t, portOf(gw.url))
  c.socket.write(postHead(`Authorization: Bearer ${alice}\r\n${fillers}Authorization: Bearer ${mallory}\r\n`, Buffer.byteLength(INIT_BODY)) + INIT_BODY)
  const res = await c.response
  t.equal(res.status, 431, 'refused: too many header fields')
  t.equal(res.headers.connection, 'close')
  t.match(JSON.parse(res.body), { jsonrpc: '2.0', id: null, error: { message: /more than 100 header fields/ } }, 'a JSON-RPC error body on /mcp')
  await c.closed
  t.equal(gw.gw.endpoint.sessions().length, 0, 'no session was opened for either subject')
  t.match(gw.logText(), /"status":431/, 'the refusal is logged')

  // Within the limit the duplicate is seen wherever it stands.
  const near = rawClient(t, portOf(gw.url))
  near.socket.write(
    postHead(`Authorization: Bearer ${alice}\r\n${'a:1\r\n'.repeat(90)}authorization: Bearer ${mallory}\r\n`, Buffer.byteLength(INIT_BODY)) + INIT_BODY
  )
  const dup = await near.response
  t.equal(dup.status, 400)
  t.same(JSON.parse(dup.body), { error: 'invalid_request', error_description: 'more than one Authorization header' })
})

t.test("item 6: with maxHeaders raised past Node's default 2000, the second Authorization after 2100 fields is still 400", async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()], policies: { mcpAuthentication: ossOptions(idp) }, limits: { maxHeaders: 3000 } })
  const c = rawClient(t, portOf(gw.url))
  c.socket.write(
    postHead(`Authorization: Bearer ${alice}\r\n${'a:1\r\n'.repeat(2100)}Authorization: Bearer ${mallory}\r\n`, Buffer.byteLength(INIT_BODY)) + INIT_BODY
  )
  const res = await c.response
  t.equal(res.status, 400, 'the duplicate is seen: Node keeps every field up to the configured count')
  t.same(JSON.parse(res.body), { error: 'invalid_request', error_description: 'more than one Authorization header' })
  t.equal(gw.gw.endpoint.sessions().length, 0)
})

t.test('item 7: request bodies have a deadline; an unauthenticated request is answered and closed without waiting for its body; SSE is untouched', async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()], policies: { mcpAuthentication: ossOptions(idp) }, limits: { bodyTimeoutMs: 300 } })
  const port = portOf(gw.url)

  await t.test('no token: 401 at once, then the connection is closed while the body still trickles', async t => {
    const c = rawClient(t, port)
    c.socket.write(postHead('', 100000) + '{')
    trickle(c.socket)
    const res = await c.response
    t.equal(res.status, 401)
    t.same(JSON.parse(res.body), { error: 'unauthorized', error_description: 'JWT token required' })
    t.equal(res.headers.connection, 'close')
    await c.closed
  })

  await t.test('valid token: the body deadline answers 408 with a JSON-RPC body and closes the connection', async t => {
    const c = rawClient(t, port)
    c.socket.write(postHead(`Authorization: Bearer ${alice}\r\n`, 100000) + '{')
    trickle(c.socket)
    const res = await c.response
    t.equal(res.status, 408)
    t.equal(res.headers.connection, 'close')
    t.match(JSON.parse(res.body), { jsonrpc: '2.0', id: null, error: { message: /request body not received within 300 ms/ } })
    await c.closed
    t.equal(gw.gw.endpoint.sessions().length, 0)
    t.match(gw.logText(), /"status":408/, 'logged')
  })

  await t.test('a complete body on a kept-alive connection is unaffected, and so is an SSE answer that outlasts the deadline', async t => {
    const client = new Client({ name: 'edge', version: '1.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(gw.url), { requestInit: { headers: { Authorization: `Bearer ${alice}` } } }))
    t.teardown(() => client.close())
    const progress: number[] = []
    // Longer than several deadlines: the POST's SSE answer and the session's GET stream stay open throughout.
    const long = await client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 1.2, steps: 4 } }, undefined, {
      onprogress: p => {
        progress.push(p.progress)
      },
    })
    t.same(progress, [1, 2, 3, 4], 'every progress event arrived')
    t.match(JSON.stringify(long), /Long running operation completed/)
    t.equal(gw.gw.endpoint.sessions()[0]?.getStream, true, 'the GET stream is still open')
  })
})

t.test('item 7: the body deadline also holds when the body is piped to an HTTP target, and the upstream request is ended', async t => {
  let upstreamSaw: ((complete: boolean) => void) | undefined
  const upstreamEnded = new Promise<boolean>(resolve => {
    upstreamSaw = resolve
  })
  const upstream = createServer((req, res) => {
    req.resume()
    req.once('close', () => {
      upstreamSaw!(req.complete)
    })
    req.once('end', () => {
      res.writeHead(202).end()
    })
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    upstream.closeAllConnections()
    upstream.close()
  })
  const upstreamPort = (upstream.address() as AddressInfo).port
  const gw = await fullGateway(t, { targets: [{ name: 'remote', mcp: { url: `http://127.0.0.1:${upstreamPort}/mcp` } }], limits: { bodyTimeoutMs: 300 } })
  const c = rawClient(t, portOf(gw.url))
  c.socket.write(postHead('', 100000) + '{')
  trickle(c.socket)
  const res = await c.response
  t.equal(res.status, 408)
  t.equal(res.headers.connection, 'close')
  t.match(JSON.parse(res.body), { jsonrpc: '2.0', error: { message: /request body not received within 300 ms/ } })
  await c.closed
  t.equal(await withinGuard(upstreamEnded, () => 'the upstream request did not end'), false, 'the upstream request was ended before its body was complete')
})

t.test('item 8: parser errors: oversized headers 431, malformed 400, each with a small JSON body and Connection: close', async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()] })
  const port = portOf(gw.url)

  const big = rawClient(t, port)
  big.socket.write(`GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'b'.repeat(20000)}\r\n\r\n`)
  const r431 = await big.response
  t.equal(r431.status, 431)
  t.equal(r431.headers.connection, 'close')
  // On /mcp a JSON-RPC error, as every refusal there (no request was parsed, so id null).
  t.match(JSON.parse(r431.body), { jsonrpc: '2.0', id: null, error: { code: -32600, message: /header fields too large/ } })
  await big.closed
  const elsewhere = rawClient(t, port)
  elsewhere.socket.write(`GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'b'.repeat(20000)}\r\n\r\n`)
  const other431 = await elsewhere.response
  t.equal(other431.status, 431)
  t.match(JSON.parse(other431.body), { error: 'invalid_request', error_description: /header/i }, 'elsewhere an OAuth-style error body')
  await elsewhere.closed

  const bad = rawClient(t, port)
  bad.socket.write('NOT HTTP AT ALL\r\n\r\n')
  const r400 = await bad.response
  t.equal(r400.status, 400)
  t.equal(r400.headers.connection, 'close')
  t.match(JSON.parse(r400.body), { error: 'invalid_request' })
  await bad.closed
})

t.test('item 9: two Mcp-Session-Id headers, or an id with space, tab or non-ASCII, is 400 with a JSON-RPC error', async t => {
  const gw = await fullGateway(t, { targets: [everythingTarget()] })
  const init = await rawInitialize(gw.url)
  t.equal(init.status, 200)
  const sid = init.sessionId!
  const port = portOf(gw.url)
  const ping = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'ping' })
  const cases: Array<[string, string]> = [
    ['two headers', `Mcp-Session-Id: ${sid}\r\nMcp-Session-Id: ${sid}\r\n`],
    ['a space', `Mcp-Session-Id: ${sid.slice(0, 10)} ${sid.slice(10)}\r\n`],
    ['a tab', `Mcp-Session-Id: ${sid.slice(0, 10)}\t${sid.slice(10)}\r\n`],
    ['a non-ASCII byte', `Mcp-Session-Id: ${sid}\u00e9\r\n`],
  ]
  for (const [what, header] of cases) {
    const c = rawClient(t, port)
    c.socket.write(Buffer.from(postHead(header, Buffer.byteLength(ping)) + ping, 'latin1'))
    const res = await c.response
    t.equal(res.status, 400, what)
    t.match(JSON.parse(res.body), { jsonrpc: '2.0', id: null, error: { code: -32600, message: /Mcp-Session-Id/ } }, `${what}: JSON-RPC error`)
  }
  const ok = rawClient(t, port)
  ok.socket.write(postHead(`Mcp-Session-Id: ${sid}\r\n`, Buffer.byteLength(ping)) + ping)
  t.equal((await ok.response).status, 200, 'the same session id, once and intact, still works')
})

t.test("item 21 (real CLI): a slowloris is cut at headersTimeoutMs, not at Node's 30 s check, and answered 408", async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-edge-'))
  const file = join(dir, 'config.yaml')
  const port = await freePort()
  await writeFile(
    file,
    `mcp:\n  port: ${port}\n  host: 127.0.0.1\n  limits:\n    headersTimeoutMs: 1000\n  targets:\n    - name: everything\n      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] }\nadmin: { enabled: false }\nlogging: { level: info }\n`
  )
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, '-f', file], { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] })
  let log = ''
  child.stdout!.setEncoding('utf8').on('data', (d: string) => {
    log += d
  })
  t.teardown(() => {
    child.kill('SIGKILL')
  })
  // Talk as soon as the port accepts.
  let socket: Socket | undefined
  for (let i = 0; i < 400 && socket === undefined; i++) {
    socket = await new Promise<Socket | undefined>(resolve => {
      const s = connect(port, '127.0.0.1')
      s.once('connect', () => resolve(s))
      s.once('error', () => {
        s.destroy()
        setTimeout(() => resolve(undefined), 25)
      })
    })
  }
  t.ok(socket !== undefined, 'the CLI listens')
  socket!.destroy()
  // The hang guard is past Node's own 30 s check: what tells the two apart is counted below, not timed.
  const c = rawClient(t, port, 60_000)
  c.socket.write('POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n')
  // One header line every 200 ms of the client's own pacing: the head never ends.
  let n = 0
  const timer = setInterval(() => {
    if (c.socket.writable) c.socket.write(`X-Slow-${n++}: 1\r\n`)
  }, 200)
  t.teardown(() => clearInterval(timer))
  const res = await c.response
  const linesIn = n
  clearInterval(timer)
  t.equal(res.status, 408)
  t.equal(res.headers.connection, 'close')
  t.same(JSON.parse(res.body), { error: 'invalid_request', error_description: 'request not received in time' }, 'the head-timeout answer')
  await c.closed
  // The reason, as the gateway records it: Node's request timeout on a head that never ended.
  t.ok(await until(() => /"msg":"client error"/.test(log)), 'the client error is logged')
  const line = JSON.parse(log.split('\n').find(l => l.includes('"msg":"client error"'))!) as Record<string, unknown>
  t.match(line, { code: 'ERR_HTTP_REQUEST_TIMEOUT', status: 408 }, 'logged with its reason code and status')
  // 1 s headersTimeoutMs checked every 250 ms lets about 6 lines in; Node's default 30 s check
  // would let about 150 in. Counted in the client's own pace, which load slows too.
  t.ok(linesIn < 60, `cut at headersTimeoutMs, not at Node's 30 s check: ${linesIn} header lines got in`)
})
