/**
 * OpenTelemetry tracing (issue 18 item 1) end to end: the development OpenID
 * provider, a whole gateway (startGateway) with mcpAuthentication in front of
 * a real MCP SDK streamable-HTTP server that records what it receives, the
 * official SDK client sending a W3C traceparent, and an OTLP/HTTP receiver
 * run by the test. One tools/call must give one connected span tree (client
 * context -> server span -> verification span and client span), with the
 * client span's context passed upstream in the traceparent header and in
 * params._meta. With tracing off, nothing of OpenTelemetry is loaded.
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { randomUUID } from 'node:crypto'
import { spawn } from 'node:child_process'
import { pathToFileURL } from 'node:url'
import { join } from 'node:path'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { startDevIdp, type DevIdp } from '../bin/dev-idp.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { ossOptions } from './helpers/idp.ts'
import { ROOT } from './helpers/gateway-harness.ts'

interface OtlpSpan {
  traceId: string
  spanId: string
  parentSpanId?: string
  name: string
  kind: number
  attributes?: Array<{ key: string; value: Record<string, unknown> }>
  status?: { code?: number }
}

/** A collector stand-in: accepts OTLP/HTTP JSON exports and keeps them. */
async function otlpReceiver(t: Test): Promise<{ url: string; bodies: string[]; spans: () => OtlpSpan[] }> {
  const bodies: string[] = []
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      if (req.url === '/v1/traces' && req.method === 'POST') bodies.push(Buffer.concat(chunks).toString('utf8'))
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  const spans = (): OtlpSpan[] =>
    bodies.flatMap(b => {
      const doc = JSON.parse(b) as { resourceSpans: Array<{ scopeSpans: Array<{ spans: OtlpSpan[] }> }> }
      return doc.resourceSpans.flatMap(r => r.scopeSpans.flatMap(s => s.spans))
    })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`, bodies, spans }
}

interface Seen {
  method: string
  headers: IncomingHttpHeaders
  meta: Record<string, unknown> | undefined
}

/**
 * A real MCP SDK server over streamable HTTP with an `echo` tool; records the headers and _meta of
 * every request it receives, and every POST body as it arrived (`bodies`). A body that is not JSON
 * is left to the SDK, which answers it itself.
 */
async function recordingUpstream(
  t: Test
): Promise<{ url: string; calls: Seen[]; received: Seen[]; bodies: Array<{ body: string; headers: IncomingHttpHeaders }> }> {
  const received: Seen[] = []
  const bodies: Array<{ body: string; headers: IncomingHttpHeaders }> = []
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  const servers: Server[] = []
  const http = createServer((req, res) => {
    void (async () => {
      let parsed: unknown
      if (req.method === 'POST') {
        const chunks: Buffer[] = []
        for await (const c of req) chunks.push(c as Buffer)
        const raw = Buffer.concat(chunks)
        bodies.push({ body: raw.toString('utf8'), headers: { ...req.headers } })
        try {
          parsed = JSON.parse(raw.toString('utf8'))
        } catch {
          // The SDK's transport (@hono/node-server) reads `rawBody` when the stream has been read.
          Object.assign(req, { rawBody: raw })
        }
        for (const m of (Array.isArray(parsed) ? parsed : parsed === undefined ? [] : [parsed]) as Array<{
          method?: string
          params?: { _meta?: Record<string, unknown> }
        }>) {
          if (m?.method !== undefined) received.push({ method: m.method, headers: { ...req.headers }, meta: m.params?._meta })
        }
      }
      const sid = req.headers['mcp-session-id']
      if (typeof sid === 'string') {
        const transport = sessions.get(sid)
        if (transport === undefined) {
          res.writeHead(404).end()
          return
        }
        await transport.handleRequest(req, res, parsed)
        return
      }
      const server = new Server({ name: 'recording', version: '1.0.0' }, { capabilities: { tools: {} } })
      servers.push(server)
      server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: [{ name: 'echo', inputSchema: { type: 'object' } }] }))
      server.setRequestHandler(CallToolRequestSchema, async req => {
        return { content: [{ type: 'text', text: `echo: ${String(req.params.arguments?.message)}` }] }
      })
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: true,
        onsessioninitialized: id => {
          sessions.set(id, transport)
        },
      })
      await server.connect(transport)
      await transport.handleRequest(req, res, parsed)
    })().catch(err => {
      res.destroy(err as Error)
    })
  })
  await new Promise<void>(resolve => http.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    for (const s of servers) await s.close().catch(() => {})
    http.closeAllConnections()
    await new Promise<void>(resolve => http.close(() => resolve()))
  })
  return {
    url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`,
    get calls() {
      return received.filter(r => r.method === 'tools/call')
    },
    received,
    bodies,
  }
}

function attr(span: OtlpSpan, key: string): unknown {
  const v = span.attributes?.find(a => a.key === key)?.value
  return v === undefined ? undefined : Object.values(v)[0]
}

const SERVER = 2
const CLIENT = 3

let idp: DevIdp
t.before(async () => {
  idp = await startDevIdp()
})
t.teardown(() => idp.close())

/**
 * `sessionLayer`: a per-operation rule (one that reads `mcp.*`) makes the
 * gateway serve the single HTTP target through its session layer instead of
 * the passthrough; both paths must trace alike.
 */
async function tracedCall(t: Test, tracing: Record<string, unknown>, sessionLayer = false) {
  const receiver = await otlpReceiver(t)
  const upstream = await recordingUpstream(t)
  const gw = await fullGateway(
    t,
    {
      targets: [{ name: 'remote', mcp: { url: upstream.url } }],
      policies: {
        mcpAuthentication: ossOptions(idp),
        ...(sessionLayer ? { authorization: { rules: ['mcp.tool.name != "forbidden"'] } } : {}),
      },
    },
    'info',
    { tracing: { enabled: true, endpoint: receiver.url, ...tracing } }
  )
  const token = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
  // The caller's own trace: the gateway's server spans must continue it.
  const traceId = randomUUID().replaceAll('-', '')
  const callerSpan = randomUUID().replaceAll('-', '').slice(0, 16)
  const client = new Client({ name: 'tracing', version: '1.0.0' })
  await client.connect(
    new StreamableHTTPClientTransport(new URL(gw.url), {
      requestInit: { headers: { authorization: `Bearer ${token}`, traceparent: `00-${traceId}-${callerSpan}-01` } },
    })
  )
  const result = await client.callTool({ name: 'echo', arguments: { message: 'traced' } })
  t.same(result.content, [{ type: 'text', text: 'echo: traced' }], 'the call went through')
  // The session layer lists its sessions; the passthrough keeps none of its own.
  const layerSessions = gw.gw.endpoint.sessions().length
  await client.close()
  // Closing flushes the batch: every span is exported by the time close() returns.
  await gw.gw.close()
  return { receiver, upstream, layerSessions, token, traceId, callerSpan, spans: receiver.spans() }
}

for (const sessionLayer of [false, true]) {
  t.test(
    `one tools/call (${sessionLayer ? 'session layer' : 'passthrough'}): one connected span tree, and its context reaches the HTTP upstream in the header and in _meta`,
    async t => {
      const { receiver, upstream, layerSessions, token, traceId, callerSpan, spans } = await tracedCall(t, {}, sessionLayer)
      t.equal(layerSessions, sessionLayer ? 1 : 0, sessionLayer ? 'served by the session layer' : 'served by the passthrough')
      const server = spans.find(s => s.kind === SERVER && attr(s, 'mcp.method.name') === 'tools/call')
      t.ok(server, 'a server span for the tools/call request')
      if (server === undefined) return
      t.equal(server.name, 'tools/call echo', 'named {mcp.method.name} {target}')
      t.equal(server.traceId, traceId, "in the caller's trace")
      t.equal(server.parentSpanId, callerSpan, "child of the caller's span (traceparent header)")
      t.equal(attr(server, 'gen_ai.tool.name'), 'echo')
      t.equal(attr(server, 'http.response.status_code'), 200)
      t.type(attr(server, 'mcp.session.id'), 'string', 'the session (its first 8 characters)')
      t.equal((attr(server, 'mcp.session.id') as string).length, 8)
      t.equal(attr(server, 'user.id'), undefined, 'no subject unless tracing.recordSubject')

      const children = spans.filter(s => s.parentSpanId === server.spanId)
      const verify = children.find(s => s.name === 'verify token')
      t.ok(verify, 'a verification span under the server span')
      const call = children.find(s => s.kind === CLIENT)
      t.ok(call, 'a client span under the server span')
      if (call === undefined) return
      t.equal(call.name, 'tools/call echo')
      t.equal(call.traceId, traceId)
      t.equal(attr(call, 'mcp.method.name'), 'tools/call')
      t.equal(attr(call, 'gen_ai.tool.name'), 'echo')
      t.equal(attr(call, 'mcp_proxy.target'), 'remote')

      t.equal(upstream.calls.length, 1, 'the upstream saw one tools/call')
      const seen = upstream.calls[0]!
      const expected = `00-${traceId}-${call.spanId}-01`
      t.equal(seen.headers.traceparent, expected, "traceparent header: the client span's context")
      t.equal(seen.meta?.traceparent, expected, 'params._meta.traceparent: the same context')
      t.equal(seen.headers.authorization, undefined, 'the token is not forwarded')

      // Every request of the exchange is in the one trace, each server span a child of the caller's span.
      const servers = spans.filter(s => s.kind === SERVER)
      t.ok(servers.length >= 3, 'initialize, notifications/initialized and tools/call each have a server span')
      t.ok(
        servers.every(s => s.traceId === traceId && s.parentSpanId === callerSpan),
        "all in the caller's trace"
      )
      // The upstream handshake of the client's initialize is in the trace too (session layer: the gateway's own request).
      const init = spans.find(s => s.kind === SERVER && attr(s, 'mcp.method.name') === 'initialize')
      const initCall = spans.find(s => s.kind === CLIENT && s.name === 'initialize' && s.parentSpanId === init?.spanId)
      t.ok(initCall, 'a client span for the upstream initialize under the initialize server span')
      t.equal(
        upstream.received.find(r => r.method === 'initialize')?.meta?.traceparent,
        `00-${traceId}-${initCall?.spanId}-01`,
        'the upstream initialize carries its context in _meta'
      )
      const exported = receiver.bodies.join('\n')
      t.notOk(exported.includes(token), 'the token is never exported')
      t.notOk(exported.includes(token.split('.')[2]!), 'nor its signature')
    }
  )
}

t.test('tracing.recordSubject: the token subject is recorded as user.id', async t => {
  const { spans } = await tracedCall(t, { recordSubject: true })
  const server = spans.find(s => s.kind === SERVER && attr(s, 'mcp.method.name') === 'tools/call')
  t.equal(server === undefined ? undefined : attr(server, 'user.id'), 'mcp-service')
})

t.test("revision 2026-07-28: a traceparent in _meta only is linked, the rest of _meta goes upstream with the call's own context", async t => {
  const receiver = await otlpReceiver(t)
  const upstream = await recordingUpstream(t)
  const gw = await fullGateway(
    t,
    {
      targets: [{ name: 'remote', mcp: { url: upstream.url } }],
      policies: { mcpAuthentication: ossOptions(idp) },
    },
    'info',
    { tracing: { enabled: true, endpoint: receiver.url } }
  )
  const token = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
  const traceId = randomUUID().replaceAll('-', '')
  const callerSpan = randomUUID().replaceAll('-', '').slice(0, 16)
  const meta = {
    'io.modelcontextprotocol/protocolVersion': '2026-07-28',
    'io.modelcontextprotocol/clientCapabilities': {},
    'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
    traceparent: `00-${traceId}-${callerSpan}-01`,
  }
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${token}`,
      'mcp-protocol-version': '2026-07-28',
      'mcp-method': 'tools/call',
      'mcp-name': 'echo',
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { message: 'modern' }, _meta: meta } }),
  })
  t.equal(res.status, 200)
  t.match(await res.text(), /echo: modern/)
  await gw.gw.close()
  const spans = receiver.spans()
  const server = spans.find(s => s.kind === SERVER && attr(s, 'mcp.method.name') === 'tools/call')
  t.ok(server, 'a server span')
  if (server === undefined) return
  t.equal(attr(server, 'jsonrpc.request.id'), '7')
  t.equal(attr(server, 'mcp.protocol.version'), '2026-07-28')
  const link = (server as OtlpSpan & { links?: Array<{ traceId: string; spanId: string }> }).links?.[0]
  t.same(
    link === undefined ? undefined : { traceId: link.traceId, spanId: link.spanId },
    { traceId, spanId: callerSpan },
    "linked to the caller's _meta context"
  )
  // The call's own client span (the gateway may first list the target's tools to check Mcp-Param-* headers).
  const call = spans.find(s => s.kind === CLIENT && s.parentSpanId === server.spanId && attr(s, 'mcp.method.name') === 'tools/call')
  t.ok(call, 'a client span under the server span')
  if (call === undefined) return
  const seen = upstream.calls.findLast(c => c.method === 'tools/call')!
  const expected = `00-${server.traceId}-${call.spanId}-01`
  t.equal(seen.meta?.traceparent, expected, "_meta.traceparent is the client span's context, not the caller's")
  t.equal(seen.headers.traceparent, expected, 'and so is the header')
})

t.test("a POST body that is not JSON-RPC goes to the passthrough's upstream unchanged, traced or not: the upstream answers it", async t => {
  const token = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
  const sent = ['{"jsonrpc":"2.0","id":1,"method":"tools/list"', '{"hello":"world"}', 'not json at all']
  const answers: Record<string, Array<{ status: number; body: string }>> = {}
  for (const tracing of [false, true]) {
    const receiver = await otlpReceiver(t)
    const upstream = await recordingUpstream(t)
    const gw = await fullGateway(
      t,
      {
        targets: [{ name: 'remote', mcp: { url: upstream.url } }],
        policies: { mcpAuthentication: ossOptions(idp) },
      },
      'info',
      tracing ? { tracing: { enabled: true, endpoint: receiver.url } } : {}
    )
    const mode = tracing ? 'tracing on' : 'tracing off'
    answers[mode] = []
    for (const body of sent) {
      const res = await fetch(gw.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${token}` },
        body,
      })
      answers[mode].push({ status: res.status, body: await res.text() })
      const seen = upstream.bodies.at(-1)
      t.equal(seen?.body, body, `${mode}: ${body}: reached the upstream byte for byte`)
      t.equal(seen?.headers.authorization, undefined, `${mode}: without the token`)
      if (tracing) t.match(seen?.headers.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$/, `${mode}: ${body}: with the client span's context in the header`)
    }
    t.equal(upstream.bodies.length, sent.length, `${mode}: each body went up once`)
    await gw.gw.close()
    if (tracing) t.equal(receiver.spans().filter(s => s.kind === CLIENT).length, sent.length, 'each exchange has its client span')
  }
  t.ok(
    answers['tracing off']!.every(a => a.status === 400 && /-32700/.test(a.body)),
    'the upstream (the MCP SDK) answered each with its parse error'
  )
  t.same(answers['tracing on'], answers['tracing off'], 'tracing changes nothing the client sees')
})

/**
 * Runs a gateway in a child process whose module loader refuses every
 * `@opentelemetry/*` import, sends it one request, and reports what happened.
 */
function gatewayWithoutOtel(tracing: boolean): Promise<{ code: number | null; output: string }> {
  const refuse =
    'data:text/javascript,' +
    encodeURIComponent('export async function resolve (s, c, next) { if (s.startsWith("@opentelemetry/")) throw new Error("loaded " + s); return next(s, c) }')
  const gateway = pathToFileURL(join(ROOT, 'core/gateway.ts')).href
  const config = pathToFileURL(join(ROOT, 'core/config.ts')).href
  const script = `
    import { register } from 'node:module'
    // Before the gateway's modules load: a static @opentelemetry import anywhere would fail too.
    register(${JSON.stringify(refuse)})
    const { startGateway } = await import(${JSON.stringify(gateway)})
    const { validateConfig, deepFreeze } = await import(${JSON.stringify(config)})
    const config = deepFreeze(await validateConfig({
      mcp: { host: '127.0.0.1', port: 0, targets: [{ name: 'remote', mcp: { url: 'http://127.0.0.1:9/mcp' } }] },
      admin: { enabled: false }, logging: { level: 'silent' }, tracing: { enabled: ${tracing} },
    }))
    const gw = await startGateway({ config, baseDir: process.cwd(), secretPaths: new Set() })
    const res = await fetch(gw.mcpUrl.replace('localhost', '127.0.0.1'), { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' })
    await res.text()
    await gw.close()
    console.log('served', res.status)
  `
  return new Promise(resolve => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (c: Buffer) => {
      output += c.toString()
    })
    child.stderr.on('data', (c: Buffer) => {
      output += c.toString()
    })
    child.on('exit', code => resolve({ code, output }))
  })
}

t.test('tracing off: a gateway starts and serves without loading any @opentelemetry module', async t => {
  const off = await gatewayWithoutOtel(false)
  t.equal(off.code, 0, off.output)
  t.match(off.output, /served \d+/, 'it answered a request')
  // The same child with tracing on fails: the loader hook does catch OpenTelemetry.
  const on = await gatewayWithoutOtel(true)
  t.not(on.code, 0)
  t.match(on.output, /loaded @opentelemetry\//)
})

t.test('config: tracing defaults, a bad value names its path, export headers are redacted in the admin view', async t => {
  const { validateConfig } = await import('../core/config.ts')
  const { redactConfig } = await import('../core/admin/redact.ts')
  const base = { mcp: { port: 0, targets: [{ name: 'remote', mcp: { url: 'http://127.0.0.1:9/mcp' } }] } }
  const config = await validateConfig(base)
  t.same(
    config.tracing,
    {
      enabled: false,
      endpoint: 'http://localhost:4318/v1/traces',
      headers: {},
      samplingRatio: 1,
      serviceName: 'mcp-proxy',
      recordSubject: false,
      maxQueueSize: 2048,
      batchDelayMs: 5000,
      exportTimeoutMs: 10000,
    },
    'off, with the documented defaults'
  )
  await t.rejects(validateConfig({ ...base, tracing: { enabled: true, samplingRatio: 2 } }), /tracing\.samplingRatio/)
  await t.rejects(validateConfig({ ...base, tracing: { endpoint: 'collector:4318' } }), /tracing\.endpoint/)
  const shown = JSON.stringify(
    redactConfig(await validateConfig({ ...base, tracing: { enabled: true, headers: { 'x-api-key': 'collector-secret-123' } } }), new Set())
  )
  t.notOk(shown.includes('collector-secret-123'), 'the collector credential is not shown')
})
