/**
 * HTTP targets against a real MCP SDK streamable-HTTP server on loopback:
 * HttpUpstream (JSON and SSE answers, server-to-client GET stream, upstream
 * session loss, HTTP errors, DELETE on close) and the http-proxy passthrough
 * behind a real GatewayServer with the official SDK client.
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingHttpHeaders, type Server as HttpServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { randomUUID } from 'node:crypto'
import { pino } from 'pino'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { ListToolsRequestSchema, CallToolRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Logger } from '../core/logger.ts'
import { HttpUpstream } from '../core/targets/http.ts'
import { SseParser, type SseEvent } from '../core/targets/sse-parser.ts'
import { createHttpPassthrough } from '../core/mcp/legacy/passthrough.ts'
import { createUpstreamFactory } from '../core/targets/index.ts'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { Metrics } from '../core/observability/metrics.ts'
import type { Plugin } from '../core/plugin.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { realAuth, type RealAuth } from './helpers/real-auth.ts'

const log = pino({ level: 'silent' }) as unknown as Logger

interface Upstream {
  url: string
  seen: Array<{ method: string; headers: IncomingHttpHeaders }>
  sessions: Map<string, { transport: StreamableHTTPServerTransport; server: Server }>
  /** Resolves the `slow` tool's wait. */
  release: () => void
  close: () => Promise<void>
}

async function startUpstream(t: Test, opts: { json?: boolean } = {}): Promise<Upstream> {
  const seen: Upstream['seen'] = []
  const sessions: Upstream['sessions'] = new Map()
  let releaseSlow: () => void = () => {}
  let slowGate = new Promise<void>(resolve => {
    releaseSlow = resolve
  })

  function makeServer(): Server {
    const server = new Server({ name: 'upstream', version: '1.0.0' }, { capabilities: { tools: { listChanged: true } } })
    server.setRequestHandler(ListToolsRequestSchema, async () => ({
      tools: [
        { name: 'echo', description: 'echo', inputSchema: { type: 'object', properties: { message: { type: 'string' } } } },
        { name: 'slow', description: 'progress, then waits for the test', inputSchema: { type: 'object' } },
      ],
    }))
    server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
      if (req.params.name === 'echo') return { content: [{ type: 'text', text: `echo: ${String(req.params.arguments?.message)}` }] }
      const token = req.params._meta?.progressToken
      if (token !== undefined) await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: 1, total: 2 } })
      // Only a streamed (unbuffered) progress event lets the client release us.
      const released = await Promise.race([slowGate.then(() => 'released'), new Promise(resolve => setTimeout(resolve, 5000, 'not released'))])
      slowGate = new Promise<void>(resolve => {
        releaseSlow = resolve
      })
      return { content: [{ type: 'text', text: String(released) }] }
    })
    return server
  }

  const http = createServer((req, res) => {
    seen.push({ method: req.method ?? '', headers: { ...req.headers } })
    if (req.url === '/fail') {
      res.writeHead(500).end('boom')
      return
    }
    void (async () => {
      const sid = req.headers['mcp-session-id']
      if (typeof sid === 'string') {
        const s = sessions.get(sid)
        if (s === undefined) {
          res.writeHead(404, { 'content-type': 'application/json' }).end('{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}')
          return
        }
        await s.transport.handleRequest(req, res)
        return
      }
      const server = makeServer()
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: opts.json === true,
        onsessioninitialized: id => {
          sessions.set(id, { transport, server })
        },
      })
      transport.onclose = () => {
        if (transport.sessionId !== undefined) sessions.delete(transport.sessionId)
      }
      await server.connect(transport)
      await transport.handleRequest(req, res)
    })().catch(err => {
      res.destroy(err as Error)
    })
  })
  await new Promise<void>(resolve => http.listen(0, '127.0.0.1', resolve))
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`
  const close = async (): Promise<void> => {
    for (const s of sessions.values()) await s.server.close().catch(() => {})
    http.closeAllConnections()
    await new Promise<void>(resolve => http.close(() => resolve()))
  }
  t.teardown(close)
  return { url, seen, sessions, release: () => releaseSlow(), close }
}

async function until(fn: () => boolean, tries = 200, stepMs = 25): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    if (fn()) return true
    await new Promise(resolve => setTimeout(resolve, stepMs))
  }
  return fn()
}

const INIT = { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'test', version: '1' } }

function client(t: Test, url: string, headers: Record<string, string> = {}, maxReconnects?: number) {
  const up = new HttpUpstream({ target: 'remote', url, headers, log, maxReconnects })
  const messages: JsonRpcMessage[] = []
  const waiting = new Map<unknown, (m: JsonRpcMessage) => void>()
  let closeErr: (e: Error | undefined) => void = () => {}
  let closeCalls = 0
  const closed = new Promise<Error | undefined>(resolve => {
    closeErr = resolve
  })
  up.onMessage = m => {
    messages.push(m)
    const w = waiting.get(m.id)
    if (w !== undefined && m.method === undefined) {
      waiting.delete(m.id)
      w(m)
    }
  }
  up.onClose = e => {
    closeCalls++
    closeErr(e)
  }
  t.teardown(() => up.close())
  let next = 1
  return {
    up,
    messages,
    closed,
    closeCalls: () => closeCalls,
    request(method: string, params: Record<string, unknown> = {}): Promise<JsonRpcMessage> {
      const id = next++
      const p = new Promise<JsonRpcMessage>(resolve => waiting.set(id, resolve))
      up.send({ jsonrpc: '2.0', id, method, params })
      return p
    },
  }
}

t.test('SseParser handles chunking, CRLF, multi-line data, ids, retry and comments', async t => {
  const events: SseEvent[] = []
  const p = new SseParser(e => events.push(e))
  const text = ': comment\r\nretry: 1500\r\nid: 7\r\nevent: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\ndata: second\n\nevent: other\ndata: x\n\n'
  for (const ch of text) p.feed(ch)
  t.same(events, [
    { event: 'message', data: '{"a":\n1}', id: '7' },
    { event: 'message', data: 'second', id: '7' },
    { event: 'other', data: 'x', id: '7' },
  ])
  t.equal(p.retry, 1500)
  const small = new SseParser(() => {}, 100)
  t.throws(() => small.feed('data: ' + 'x'.repeat(200) + '\n'), /larger than 100 bytes/)
})

for (const json of [false, true]) {
  t.test(`HttpUpstream speaks streamable HTTP (${json ? 'JSON' : 'SSE'} answers)`, async t => {
    const u = await startUpstream(t, { json })
    const c = client(t, u.url, { 'x-upstream-key': 'k1', 'mcp-session-id': 'must-not-override' })
    await c.up.start()
    t.equal(u.seen.length, 0, 'start() does no network I/O')
    t.equal(c.up.alive, true)
    const init = await c.request('initialize', INIT)
    t.equal((init.result as { protocolVersion: string }).protocolVersion, '2025-06-18')
    t.ok(c.up.upstreamSessionId !== undefined && u.sessions.has(c.up.upstreamSessionId), 'upstream session id captured')
    t.equal(c.up.protocolVersion, '2025-06-18')
    c.up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
    const list = await c.request('tools/list')
    t.same(
      (list.result as { tools: Array<{ name: string }> }).tools.map(x => x.name),
      ['echo', 'slow']
    )
    const echo = await c.request('tools/call', { name: 'echo', arguments: { message: 'hi' } })
    t.same(echo.result, { content: [{ type: 'text', text: 'echo: hi' }] })
    const after = u.seen.filter(s => s.method === 'POST').slice(1)
    t.ok(
      after.every(s => s.headers['mcp-session-id'] === c.up.upstreamSessionId),
      'session id on every later request'
    )
    t.ok(
      after.every(s => s.headers['mcp-protocol-version'] === '2025-06-18'),
      'protocol version on every later request'
    )
    t.ok(
      u.seen.every(s => s.headers['x-upstream-key'] === 'k1'),
      'static headers sent'
    )
    t.ok(
      u.seen.every(s => s.headers.authorization === undefined),
      'no authorization header'
    )

    // The server-to-client GET stream opens after notifications/initialized.
    t.ok(await until(() => u.seen.some(s => s.method === 'GET')), 'GET stream opened')
    const s = u.sessions.get(c.up.upstreamSessionId!)!
    await until(() => false, 4)
    await s.server.sendToolListChanged()
    t.ok(await until(() => c.messages.some(m => m.method === 'notifications/tools/list_changed')), 'server-initiated notification delivered')

    // Progress notifications arrive before the result (SSE mode streams them).
    const slow = c.request('tools/call', { name: 'slow', _meta: { progressToken: 'p1' } })
    if (!json) {
      t.ok(await until(() => c.messages.some(m => m.method === 'notifications/progress')), 'progress streamed before the result')
      u.release()
      t.same((await slow).result, { content: [{ type: 'text', text: 'released' }] })
    } else {
      u.release()
      await slow
    }

    const sid = c.up.upstreamSessionId!
    await c.up.close()
    t.equal(await c.closed, undefined)
    t.equal(c.closeCalls(), 1)
    t.ok(
      u.seen.some(x => x.method === 'DELETE' && x.headers['mcp-session-id'] === sid),
      'DELETE sent on close'
    )
    t.ok(await until(() => !u.sessions.has(sid)), 'upstream session ended')
    t.throws(() => c.up.send({ jsonrpc: '2.0', id: 99, method: 'ping' }), { code: 'MCPP_ERR_UPSTREAM' })
  })
}

t.test('HttpUpstream: upstream session gone (404) -> error for the request and onClose(error)', async t => {
  const u = await startUpstream(t)
  // No GET reconnects: the POST below is what must discover the loss.
  const c = client(t, u.url, {}, 0)
  await c.up.start()
  await c.request('initialize', INIT)
  c.up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  t.ok(await until(() => u.seen.some(s => s.method === 'GET')), 'initialized processed, GET stream open')
  const sid = c.up.upstreamSessionId!
  await u.sessions.get(sid)!.transport.close()
  t.ok(await until(() => !u.sessions.has(sid)))
  const r = await c.request('tools/list')
  t.match(r.error, { code: -32000, message: /upstream session not found/ })
  t.match(await c.closed, { message: /upstream session ended \(HTTP 404\)/ })
  t.equal(c.up.alive, false)
})

t.test('HttpUpstream: HTTP errors and unreachable servers answer the request with a JSON-RPC error', async t => {
  const u = await startUpstream(t)
  const c = client(t, u.url.replace(/\/mcp$/, '/fail'))
  await c.up.start()
  const r = await c.request('initialize', INIT)
  t.match(r, { jsonrpc: '2.0', id: 1, error: { code: -32603, message: /target remote: upstream answered HTTP 500/ } })
  t.match(c.up.lastError, /HTTP 500/)
  t.equal(c.up.alive, true, 'one failed request does not end the upstream')

  const dead = createServer()
  await new Promise<void>(resolve => dead.listen(0, '127.0.0.1', resolve))
  const port = (dead.address() as AddressInfo).port
  await new Promise<void>(resolve => dead.close(() => resolve()))
  const c2 = client(t, `http://127.0.0.1:${port}/mcp`)
  await c2.up.start()
  const r2 = await c2.request('initialize', INIT)
  t.match(r2.error, { message: /upstream request failed/ })
  await t.rejects(new HttpUpstream({ target: 'x', url: 'ftp://example.invalid/', log }).start(), { code: 'MCPP_ERR_UPSTREAM' })
})

t.test('createUpstreamFactory builds HTTP upstreams', async t => {
  const u = await startUpstream(t)
  const f = createUpstreamFactory({ name: 'remote', mcp: { url: u.url, headers: {} } }, { log, baseDir: '.', maxLineBytes: 1 << 20, metrics: new Metrics() })
  t.equal(f.kind, 'http')
  const up = f.create()
  t.equal(up.kind, 'http')
  const got = new Promise<JsonRpcMessage>(resolve => {
    up.onMessage = resolve
  })
  await up.start()
  up.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT })
  t.equal(((await got).result as { serverInfo: { name: string } }).serverInfo.name, 'upstream')
  await up.close()
})

/** A gateway in front of one remote target; `auth`: behind real authentication (mcpAuthentication, dev IdP tokens). */
async function startGateway(t: Test, upstreamUrl: string, auth?: RealAuth): Promise<{ url: string; passthrough: ReturnType<typeof createHttpPassthrough> }> {
  const metrics = new Metrics()
  const passthrough = createHttpPassthrough({ name: 'remote', mcp: { url: upstreamUrl, headers: { 'x-upstream-key': 'gw-key' } } }, { log, metrics })
  const gw = new GatewayServer({
    pipeline: new Pipeline(auth === undefined ? [] : [auth.plugin]),
    routes: new RouteTable([]),
    mcp: passthrough,
    log,
    metrics,
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 10000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await gw.listen(0, '127.0.0.1')
  t.teardown(async () => {
    await passthrough.close()
    await gw.close(0)
  })
  return { url: `http://127.0.0.1:${port}/mcp`, passthrough }
}

t.test('passthrough: the SDK client through the gateway to a remote server', async t => {
  const u = await startUpstream(t)
  const auth = await realAuth(t, ['alice', 'mallory'])
  const gw = await startGateway(t, u.url, auth)
  const alice = await auth.as('alice')
  const transport = new StreamableHTTPClientTransport(new URL(gw.url), {
    requestInit: { headers: { ...alice, cookie: 'c=1' } },
  })
  const mcp = new Client({ name: 'sdk-client', version: '1.0.0' })
  await mcp.connect(transport)
  t.teardown(() => mcp.close())
  const gatewayId = transport.sessionId!
  t.type(gatewayId, 'string')
  t.match(gatewayId, /^[\x21-\x7e]+$/, 'visible ASCII')
  t.notOk(u.sessions.has(gatewayId), 'the client sees a gateway id, not the upstream one')
  t.equal(u.sessions.size, 1)
  const upstreamId = [...u.sessions.keys()][0]!

  const tools = await mcp.listTools()
  t.same(
    tools.tools.map(x => x.name),
    ['echo', 'slow']
  )
  const echo = await mcp.callTool({ name: 'echo', arguments: { message: 'through' } })
  t.same(echo.content, [{ type: 'text', text: 'echo: through' }])

  // SSE is streamed: the tool only finishes after the client saw its progress.
  const order: string[] = []
  const slow = await mcp.callTool({ name: 'slow', arguments: {} }, undefined, {
    onprogress: () => {
      order.push('progress')
      u.release()
    },
  })
  order.push('result')
  t.same(order, ['progress', 'result'])
  t.same(slow.content, [{ type: 'text', text: 'released' }])

  t.ok(u.seen.length > 0)
  t.ok(
    u.seen.every(s => s.headers.authorization === undefined),
    'no Authorization header reached the upstream'
  )
  const signature = (await auth.token('alice')).split('.')[2]!
  t.notOk(
    u.seen.some(s => JSON.stringify(s.headers).includes(signature)),
    "the client's token is in no upstream header"
  )
  t.ok(
    u.seen.every(s => s.headers.cookie === undefined),
    'no Cookie header reached the upstream'
  )
  t.ok(
    u.seen.every(s => s.headers['x-upstream-key'] === 'gw-key'),
    'target static header added'
  )
  t.ok(
    u.seen.slice(1).every(s => s.headers['mcp-session-id'] === upstreamId),
    'upstream sees its own session id'
  )
  t.same(
    gw.passthrough.sessions().map(s => [s.id, s.subject]),
    [[gatewayId.slice(0, 8), 'alice']]
  )

  // Another subject presenting alice's id gets 404; alice is untouched.
  const stolen = await fetch(gw.url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': gatewayId,
      'mcp-protocol-version': '2025-06-18',
      ...(await auth.as('mallory')),
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/list' }),
  })
  t.equal(stolen.status, 404)
  t.match(await stolen.json(), { jsonrpc: '2.0', error: { code: -32001 } })
  const unknown = await fetch(gw.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': upstreamId, ...alice },
    body: JSON.stringify({ jsonrpc: '2.0', id: 6, method: 'tools/list' }),
  })
  t.equal(unknown.status, 404, 'the upstream id itself is not a valid gateway id')
  t.same((await mcp.listTools()).tools.length, 2, 'owner still served')

  // DELETE ends the session both here and upstream.
  await transport.terminateSession()
  t.ok(await until(() => !u.sessions.has(upstreamId)), 'upstream session deleted')
  t.same(gw.passthrough.sessions(), [])
  const after = await fetch(gw.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': gatewayId, ...alice },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }),
  })
  t.equal(after.status, 404)
})

t.test('passthrough: a body already read by a plugin is replayed upstream', async t => {
  const u = await startUpstream(t)
  const reader: Plugin = {
    name: 'reader',
    async onRequest(ctx) {
      if (ctx.method === 'POST') await ctx.readMcpMessage()
    },
  }
  const metrics = new Metrics()
  const passthrough = createHttpPassthrough({ name: 'remote', mcp: { url: u.url, headers: {} } }, { log, metrics })
  const gw = new GatewayServer({
    pipeline: new Pipeline([reader]),
    routes: new RouteTable([]),
    mcp: passthrough,
    log,
    metrics,
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 10000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await gw.listen(0, '127.0.0.1')
  t.teardown(async () => {
    await passthrough.close()
    await gw.close(0)
  })
  const mcp = new Client({ name: 'sdk-client', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`)))
  t.teardown(() => mcp.close())
  const echo = await mcp.callTool({ name: 'echo', arguments: { message: 'replayed' } })
  t.same(echo.content, [{ type: 'text', text: 'echo: replayed' }])
})

t.test('passthrough: an unreachable upstream is a 502 JSON-RPC error', async t => {
  const dead = createServer() as HttpServer
  await new Promise<void>(resolve => dead.listen(0, '127.0.0.1', resolve))
  const port = (dead.address() as AddressInfo).port
  await new Promise<void>(resolve => dead.close(() => resolve()))
  const gw = await startGateway(t, `http://127.0.0.1:${port}/mcp`)
  const r = await fetch(gw.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT }),
  })
  t.equal(r.status, 502)
  t.match(await r.json(), { jsonrpc: '2.0', error: { code: -32603, message: /target remote is unreachable/ } })
})

t.test('passthrough: proxyTimeout bounds the wait for the head, not a silent SSE answer after it', async t => {
  // An upstream that sends its SSE head at once and the answer only after a
  // silence longer than the gateway's proxyTimeout; and a path that never answers.
  const slow = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      if (req.url === '/never') return
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
      res.flushHeaders()
      setTimeout(() => res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: 1, result: { late: true } })}\n\n`), 900)
    })
  }) as HttpServer
  await new Promise<void>(resolve => slow.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        slow.closeAllConnections()
        slow.close(() => resolve())
      })
  )
  const port = (slow.address() as AddressInfo).port
  async function gatewayTo(path: string): Promise<string> {
    const metrics = new Metrics()
    const passthrough = createHttpPassthrough(
      { name: 'remote', mcp: { url: `http://127.0.0.1:${port}${path}`, headers: {} } },
      { log, metrics, proxyTimeoutMs: 300 }
    )
    const gw = new GatewayServer({
      pipeline: new Pipeline([]),
      routes: new RouteTable([]),
      mcp: passthrough,
      log,
      metrics,
      limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 10000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
    })
    const { port: gwPort } = await gw.listen(0, '127.0.0.1')
    t.teardown(async () => {
      await gw.close(0)
      await passthrough.close()
    })
    return `http://127.0.0.1:${gwPort}/mcp`
  }
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
  const late = await fetch(await gatewayTo('/mcp'), { method: 'POST', headers, body })
  t.equal(late.status, 200)
  t.match(await late.text(), /"late":true/, 'the answer after a silence longer than proxyTimeout arrived whole')
  const never = await fetch(await gatewayTo('/never'), { method: 'POST', headers, body })
  t.equal(never.status, 502, 'no head within proxyTimeout: 502')
  t.match(await never.json(), { error: { message: /target remote is unreachable/ } })
})
