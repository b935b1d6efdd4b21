/**
 * core/mcp/modern.ts, the 2026-07-28 handler, over pooled in-memory
 * upstreams (test/helpers/memory-upstream.ts): header validation throws
 * ProxyError like the rest of the gateway, results are routed by the shared
 * router and decorated for the revision. The end-to-end file with real
 * servers and SDK clients is test/mcp-modern.test.ts.
 */
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { RequestContext } from '../core/context.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { createModernHandler } from '../core/mcp/modern/handler.ts'
import { UpstreamPool } from '../core/mcp/upstreams/pool.ts'
import { streamLimits } from '../core/mcp/sse.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { ProxyError } from '../core/errors.ts'
import { memoryFactory } from './helpers/memory-upstream.ts'
import { memoryLogger } from './helpers/logger.ts'

const V = '2026-07-28'
/**
 * The expectations come from docs/protocol.md ("Revision 2026-07-28"), not from core/mcp/modern.ts: its error
 * table's codes (-32020 HeaderMismatch, -32022 unsupported version, -32021 missing client capability) and
 * server/discover's supportedVersions; the _meta keys as the revision spells them.
 */
const PROTOCOL_DOC = readFileSync(new URL('../docs/protocol.md', import.meta.url), 'utf8')
const DOC_SUPPORTED = JSON.parse(/`supportedVersions` = `(\[[^\]]*\])`/.exec(PROTOCOL_DOC)![1]!) as string[]
const docCode = (row: RegExp): number => Number(new RegExp(row.source + '[^\\n]*\\| (-320\\d\\d)').exec(PROTOCOL_DOC)?.[1])
const HEADER_MISMATCH = docCode(/\| `MCP-Protocol-Version` missing \|/)
const UNSUPPORTED_VERSION = docCode(/\| version header not 2026-07-28/)
const MISSING_CAPABILITY = -32021
const GATEWAY = { name: 'mcp-proxy', version: (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version }

const meta = { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': {} }

function handler(t: Test, targets: string[], maxInputsPerRound?: number) {
  const log = memoryLogger().log
  const factories = targets.map(name => memoryFactory(name))
  const pool = new UpstreamPool({ log, perKeyMax: 2, globalMax: 10, idleMs: 60_000, requestTimeoutMs: 5_000 })
  const h = createModernHandler({
    targets: factories,
    checkers: [],
    pool,
    log,
    failClosed: false,
    streams: streamLimits({ log, metrics: new Metrics() }),
    maxInputsPerRound,
  })
  t.teardown(async () => {
    h.close()
    await pool.close()
  })
  return { h, factories }
}

function headers(method: string, name?: string): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = { 'mcp-protocol-version': V, 'mcp-method': method }
  if (name !== undefined) out['mcp-name'] = name
  return out
}

/** A context without a response: enough for what is refused before anything is written. */
function bare(h: IncomingHttpHeaders): RequestContext {
  return { req: { headers: h }, state: new Map() } as unknown as RequestContext
}

async function refused(t: Test, post: Promise<void>, code: string, rpcCode: number, message: RegExp | string, data?: unknown): Promise<void> {
  let err: unknown
  try {
    await post
  } catch (e) {
    err = e
  }
  t.ok(ProxyError.is(err), 'a ProxyError, written by the one error writer')
  t.match(err, { code, statusCode: 400, rpcCode, message })
  if (data !== undefined) t.same((err as ProxyError).data, data)
}

t.test('what the revision refuses is thrown as ProxyError', async t => {
  const { h } = handler(t, ['a'])
  const call = (extra: Record<string, unknown> = {}) => ({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', _meta: meta, ...extra } })
  await refused(t, h.post(bare(headers('tools/list')), [call()]), 'MCPP_ERR_INVALID_REQUEST', -32600, /batches are not part of protocol revision 2026-07-28/)
  await refused(
    t,
    h.post(bare(headers('tools/list')), { jsonrpc: '2.0', id: 1, result: {} }),
    'MCPP_ERR_INVALID_REQUEST',
    -32600,
    /clients send no JSON-RPC responses/
  )
  await refused(
    t,
    h.post(bare({ 'mcp-method': 'tools/call', 'mcp-name': 'echo' }), call()),
    'MCPP_ERR_HEADER_MISMATCH',
    HEADER_MISMATCH,
    'Header mismatch: required MCP-Protocol-Version header is missing'
  )
  await refused(
    t,
    h.post(bare({ ...headers('tools/call', 'echo'), 'mcp-protocol-version': '2030-01-01' }), call()),
    'MCPP_ERR_PROTOCOL_VERSION',
    UNSUPPORTED_VERSION,
    'Unsupported protocol version',
    { supported: DOC_SUPPORTED, requested: '2030-01-01' }
  )
  await refused(
    t,
    h.post(bare(headers('tools/call', 'echo')), { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo' } }),
    'MCPP_ERR_INVALID_REQUEST',
    -32602,
    /_meta\["io.modelcontextprotocol\/protocolVersion"\] is required/
  )
  await refused(
    t,
    h.post(bare(headers('tools/list')), call()),
    'MCPP_ERR_HEADER_MISMATCH',
    HEADER_MISMATCH,
    /Mcp-Method header value 'tools\/list' does not match body value 'tools\/call'/
  )
  await refused(t, h.post(bare(headers('tools/call')), call()), 'MCPP_ERR_HEADER_MISMATCH', HEADER_MISMATCH, /required Mcp-Name header is missing/)
  await refused(
    t,
    h.post(bare(headers('tools/call', 'other')), call()),
    'MCPP_ERR_HEADER_MISMATCH',
    HEADER_MISMATCH,
    /Mcp-Name header value 'other' does not match body value 'echo'/
  )
  await refused(t, h.post(bare(headers('tools/call', '=?base64?!!?=')), call()), 'MCPP_ERR_HEADER_MISMATCH', HEADER_MISMATCH, /not a valid Base64 sentinel/)
})

async function serve(t: Test, h: ReturnType<typeof createModernHandler>) {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      let sent = false
      const ctx = {
        req,
        res,
        state: new Map(),
        log: memoryLogger().log,
        get headersSent() {
          return sent
        },
        writeHead(status: number, hs: Record<string, string | number>) {
          sent = true
          res.writeHead(status, hs)
          return Promise.resolve()
        },
      } as unknown as RequestContext
      h.post(ctx, JSON.parse(Buffer.concat(chunks).toString('utf8'))).catch((err: unknown) => {
        res.writeHead(599)
        res.end(String(err))
      })
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
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
  return async (
    method: string,
    params: Record<string, unknown>,
    name?: string,
    extraMeta: Record<string, unknown> = {}
  ): Promise<{ status: number; body: JsonRpcMessage }> => {
    const res = await fetch(url, {
      method: 'POST',
      headers: headers(method, name) as Record<string, string>,
      body: JSON.stringify({ jsonrpc: '2.0', id: 5, method, params: { ...params, _meta: { ...meta, ...extraMeta } } }),
    })
    return { status: res.status, body: (await res.json()) as JsonRpcMessage }
  }
}

t.test("one target: answered as JSON, decorated, the revision's _meta stripped upstream", async t => {
  const { h, factories } = handler(t, ['a'])
  const rpc = await serve(t, h)
  const list = await rpc('tools/list', {})
  t.match(
    list.body.result,
    { tools: [{ name: 'echo' }, { name: 'hang' }], nextCursor: 'page2', resultType: 'complete', ttlMs: 0, cacheScope: 'public' },
    'one target: its page as it is, with its serverInfo'
  )
  t.same((list.body.result as { _meta: Record<string, unknown> })._meta['io.modelcontextprotocol/serverInfo'], { name: 'memory-a', version: '1.0.0' })
  const r = await rpc('tools/call', { name: 'echo', arguments: { message: 'hi' } }, 'echo')
  t.equal(r.status, 200)
  t.same(r.body, {
    jsonrpc: '2.0',
    id: 5,
    result: {
      content: [{ type: 'text', text: 'hi' }],
      resultType: 'complete',
      _meta: { 'io.modelcontextprotocol/serverInfo': { name: 'memory-a', version: '1.0.0' } },
    },
  })
  const up = factories[0]!.server.received.find(m => m.method === 'tools/call')!
  t.same(up.params, { name: 'echo', arguments: { message: 'hi' } }, 'no io.modelcontextprotocol/* keys upstream')
  const missing = await rpc('ping', {})
  t.equal(missing.status, 404)
  t.same(missing.body.error, { code: -32601, message: 'Method not found: ping' })
})

t.test('two targets: routed and merged by the shared router', async t => {
  const { h, factories } = handler(t, ['a', 'b'])
  const rpc = await serve(t, h)
  const list = await rpc('tools/list', {})
  const result = list.body.result as { tools: Array<{ name: string }>; nextCursor?: string; _meta: Record<string, unknown> }
  t.same(
    result.tools.map(x => x.name),
    ['a_echo', 'a_hang', 'a_progress', 'a_ask', 'b_echo', 'b_hang', 'b_progress', 'b_ask']
  )
  t.equal(result.nextCursor, undefined)
  t.same(result._meta['io.modelcontextprotocol/serverInfo'], GATEWAY)
  const call = await rpc('tools/call', { name: 'b_echo', arguments: { message: 'to b' } }, 'b_echo')
  t.match(call.body.result, { content: [{ text: 'to b' }] })
  t.match(factories[1]!.server.received.find(m => m.method === 'tools/call')!.params, { name: 'echo' })
  const unknown = await rpc('tools/call', { name: 'c_echo' }, 'c_echo')
  t.same(unknown.body, { jsonrpc: '2.0', id: 5, error: { code: -32602, message: 'Unknown tool: c_echo' } })
  const resource = await rpc('resources/read', { uri: 'x://1' }, 'x://1')
  t.same(resource.body.error, { code: -32602, message: 'Resource not found: x://1' }, '-32002 is reserved in this revision: -32602')
  const read = await rpc('resources/read', { uri: 'mcp-proxy://a/x://1' }, 'mcp-proxy://a/x://1')
  t.match(read.body.result, { contents: [{ uri: 'mcp-proxy://a/x://1', text: 'contents of x://1' }] })
  const discover = await rpc('server/discover', {})
  t.match(discover.body.result, { supportedVersions: DOC_SUPPORTED, instructions: '[a] instructions of a\n\n[b] instructions of b' })
})

t.test('an input-required result: no upstream progress token, the serverInfo of every result (issue 15)', async t => {
  const { h } = handler(t, ['a'])
  const rpc = await serve(t, h)
  const r = await rpc('tools/call', { name: 'ask', arguments: {} }, 'ask', {
    'io.modelcontextprotocol/clientCapabilities': { sampling: {} },
    progressToken: 'tok',
  })
  const result = r.body.result as {
    resultType: string
    inputRequests: Record<string, { method: string; params: Record<string, unknown> }>
    _meta?: Record<string, unknown>
  }
  t.equal(result?.resultType, 'input_required', { got: r.body })
  const [request] = Object.values(result.inputRequests)
  t.equal(request!.method, 'sampling/createMessage')
  t.equal(
    (request!.params._meta as Record<string, unknown> | undefined)?.progressToken,
    undefined,
    "the upstream's (gateway-mapped) progress token is not the client's business"
  )
  t.same(result._meta?.['io.modelcontextprotocol/serverInfo'], { name: 'memory-a', version: '1.0.0' }, 'serverInfo as on every result')
})

t.test('session-era upstream: every input request of one round in one input-required result, answered together', async t => {
  const { h } = handler(t, ['a'])
  const rpc = await serve(t, h)
  const caps = { 'io.modelcontextprotocol/clientCapabilities': { sampling: {}, elicitation: {} } }
  const first = await rpc('tools/call', { name: 'ask2', arguments: {} }, 'ask2', caps)
  const result = first.body.result as { resultType: string; inputRequests: Record<string, { method: string }>; requestState: string }
  t.equal(result?.resultType, 'input_required', { got: first.body })
  const methods = Object.fromEntries(Object.entries(result.inputRequests).map(([k, v]) => [v.method, k]))
  t.same(Object.keys(methods).sort(), ['elicitation/create', 'sampling/createMessage'], 'both requests of the round')
  const retry = await rpc(
    'tools/call',
    {
      name: 'ask2',
      arguments: {},
      requestState: result.requestState,
      inputResponses: {
        [methods['sampling/createMessage']!]: { model: 'm', role: 'assistant', content: { type: 'text', text: 'S' } },
        [methods['elicitation/create']!]: { action: 'accept', content: { n: 'E' } },
        unasked: { action: 'decline' },
      },
    },
    'ask2',
    caps
  )
  const text = (retry.body.result as { content: Array<{ text: string }> } | undefined)?.content[0]?.text ?? ''
  t.match(text, /"text":"S"/, 'the sampling answer reached the upstream', { got: retry.body })
  t.match(text, /"n":"E"/, 'the elicitation answer too (a key the gateway did not ask for is ignored)')
  const without = await rpc('tools/call', { name: 'ask2', arguments: {} }, 'ask2', { 'io.modelcontextprotocol/clientCapabilities': { sampling: {} } })
  t.equal(without.status, 400)
  t.match(
    without.body.error,
    { code: MISSING_CAPABILITY, data: { requiredCapabilities: { elicitation: {} } } },
    'one undeclared capability in the round: -32021 naming it'
  )
})

t.test('mcp.limits.maxInputRequestsPerRound: a round past the bound is cut there, the rest refused upstream', async t => {
  const { h, factories } = handler(t, ['a'], 1)
  const rpc = await serve(t, h)
  const first = await rpc('tools/call', { name: 'ask2', arguments: {} }, 'ask2', {
    'io.modelcontextprotocol/clientCapabilities': { sampling: {}, elicitation: {} },
  })
  const result = first.body.result as { inputRequests: Record<string, unknown> }
  t.equal(Object.keys(result?.inputRequests ?? {}).length, 1, 'one input request, as configured', { got: first.body })
  const refusedUp = factories[0]!.server.received.find(m => m.method === undefined && m.error?.message === 'too many input requests in one round')
  t.ok(refusedUp, 'the other refused to the upstream')
})

t.test('session-era upstream: a first call carrying inputResponses is served as new, the responses ignored (MCP 2026-07-28 MRTR)', async t => {
  const { h, factories } = handler(t, ['a'])
  const rpc = await serve(t, h)
  const r = await rpc('tools/call', { name: 'echo', arguments: { message: 'fresh' }, inputResponses: { 'input-1': { action: 'accept', content: {} } } }, 'echo')
  t.match(r.body.result, { content: [{ text: 'fresh' }] })
  const up = factories[0]!.server.received.find(m => m.method === 'tools/call')!
  t.same(up.params, { name: 'echo', arguments: { message: 'fresh' } }, 'nothing of them upstream')
  const forged = await rpc('tools/call', { name: 'echo', arguments: {}, requestState: 'never-minted' }, 'echo')
  t.same(
    forged.body.error,
    { code: -32602, message: 'Invalid params: unknown or expired requestState' },
    'a requestState the gateway never minted fails verification (MRTR: MUST reject)'
  )
})
