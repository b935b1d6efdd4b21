/**
 * core/mcp/session.ts: one session-era session over in-memory upstreams
 * (test/helpers/memory-upstream.ts): the id mapping both ways, routing over
 * the shared router, fan-out lists, timeouts, server-to-client requests and
 * upstream loss. A bare node:http server stands in for the endpoint.
 */
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { RequestContext } from '../core/context.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { Session, type SessionEnv } from '../core/mcp/legacy/session.ts'
import { GATEWAY_INFO } from '../core/mcp/protocol.ts'
import { streamLimits } from '../core/mcp/sse.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { memoryFactory } from './helpers/memory-upstream.ts'
import { memoryLogger } from './helpers/logger.ts'
import { eventually } from './helpers/cli.ts'

async function open(t: Test, targets: string[], env: Partial<SessionEnv> = {}) {
  const factories = targets.map(name => memoryFactory(name))
  const { log } = memoryLogger()
  const ended: string[] = []
  const session = new Session({
    id: 'session-id-0123456789',
    subject: 'alice',
    subjectKey: 'alice',
    version: '2025-06-18',
    factories,
    env: {
      log,
      streams: streamLimits({ log, metrics: new Metrics() }),
      requestTimeoutMs: 60_000,
      failClosed: false,
      maxTasks: 100,
      checkers: [],
      onEnd: (_s, reason) => ended.push(reason),
      ...env,
    },
  })
  t.teardown(() => session.end('test over'))
  const init = await session.start({ protocolVersion: '2025-06-18', capabilities: { sampling: {} }, clientInfo: { name: 'c', version: '1' } })
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
        writeHead(status: number, headers: Record<string, string | number>) {
          sent = true
          res.writeHead(status, headers)
          return Promise.resolve()
        },
      } as unknown as RequestContext
      void session.receive(ctx, JSON.parse(Buffer.concat(chunks).toString('utf8')) as JsonRpcMessage)
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
  const post = (body: unknown): Promise<Response> => fetch(url, { method: 'POST', body: JSON.stringify(body) })
  /** One request, its SSE events until the stream ends. */
  const rpc = async (id: number | string, method: string, params: Record<string, unknown> = {}): Promise<JsonRpcMessage[]> =>
    events(await post({ jsonrpc: '2.0', id, method, params }))
  return { session, init, factories, ended, post, rpc }
}

async function events(res: Response): Promise<JsonRpcMessage[]> {
  const text = await res.text()
  return text
    .split('\n')
    .filter(l => l.startsWith('data: '))
    .map(l => JSON.parse(l.slice(6)) as JsonRpcMessage)
}

t.test('one target: its initialize result; ids mapped both ways', async t => {
  const s = await open(t, ['a'])
  t.match(s.init, { protocolVersion: '2025-06-18', serverInfo: { name: 'memory-a' }, instructions: 'instructions of a' })
  const [answer] = await s.rpc('client-7', 'tools/call', { name: 'echo', arguments: { message: 'hi' } })
  t.same(answer, { jsonrpc: '2.0', id: 'client-7', result: { content: [{ type: 'text', text: 'hi' }] } }, "answered under the client's id")
  const up = s.factories[0]!.server.received.find(m => m.method === 'tools/call')!
  t.type(up.id, 'number', "the upstream sees the session's own id")
  t.same(up.params, { name: 'echo', arguments: { message: 'hi' } }, 'one target: nothing renamed')
  const before = s.factories[0]!.server.received.length
  t.same(await s.rpc(8, 'ping'), [{ jsonrpc: '2.0', id: 8, result: {} }], "ping is the gateway's")
  t.same(await s.rpc(9, 'initialize'), [{ jsonrpc: '2.0', id: 9, error: { code: -32600, message: 'session already initialized' } }])
  t.equal(s.factories[0]!.server.received.length, before, 'neither reached the upstream')
  t.same(
    await s.rpc(10, 'custom/method'),
    [{ jsonrpc: '2.0', id: 10, error: { code: -32601, message: 'Method not found: custom/method' } }],
    'one target: any other method goes to it'
  )
  t.ok(
    s.factories[0]!.server.received.some(m => m.method === 'custom/method'),
    '... and the upstream answered it'
  )
})

t.test('two targets: merged capabilities and instructions, prefixed lists, routed calls', async t => {
  const s = await open(t, ['a', 'b'])
  t.match(s.init, { serverInfo: GATEWAY_INFO, instructions: '[a] instructions of a\n\n[b] instructions of b', capabilities: { tools: { listChanged: true } } })
  const [list] = await s.rpc(1, 'tools/list')
  t.same(
    (list!.result as { tools: Array<{ name: string }> }).tools.map(x => x.name),
    ['a_echo', 'a_hang', 'a_progress', 'a_ask', 'b_echo', 'b_hang', 'b_progress', 'b_ask'],
    'both pages of both targets'
  )
  const [call] = await s.rpc(2, 'tools/call', { name: 'b_echo', arguments: { message: 'to b' } })
  t.same(call!.result, { content: [{ type: 'text', text: 'to b' }] })
  t.match(s.factories[1]!.server.received.find(m => m.method === 'tools/call')!.params, { name: 'echo' }, 'b got its own name')
  t.notOk(
    s.factories[0]!.server.received.some(m => m.method === 'tools/call'),
    'a got nothing'
  )
  t.same(await s.rpc(3, 'tools/call', { name: 'c_echo' }), [{ jsonrpc: '2.0', id: 3, error: { code: -32602, message: 'Unknown tool: c_echo' } }])
  const [read] = await s.rpc(4, 'resources/read', { uri: 'mcp-proxy://a/x://1' })
  t.same(read!.result, { contents: [{ uri: 'mcp-proxy://a/x://1', text: 'contents of x://1' }] }, 'contents carry the marker back')
  t.same(await s.rpc(5, 'resources/read', { uri: 'x://1' }), [{ jsonrpc: '2.0', id: 5, error: { code: -32002, message: 'Resource not found: x://1' } }])
  t.same(await s.rpc(6, 'logging/setLevel', { level: 'info' }), [{ jsonrpc: '2.0', id: 6, result: {} }], 'setLevel fans out')
  t.equal(s.factories.filter(f => f.server.received.some(m => m.method === 'logging/setLevel')).length, 2)
  t.same(await s.rpc(7, 'custom/method'), [{ jsonrpc: '2.0', id: 7, error: { code: -32601, message: 'Method not found: custom/method' } }])
})

t.test('calls past their deadline are cancelled upstream and answered -32001', async t => {
  const s = await open(t, ['a'], { requestTimeoutMs: 1 })
  const pending = s.rpc(1, 'tools/call', { name: 'hang' })
  // The endpoint's timer calls expireCalls; here the test does, once the call is out.
  t.ok(
    await eventually(
      () => s.factories[0]!.server.received.some(m => m.method === 'tools/call'),
      ok => ok,
      400,
      5
    ),
    'the call reached the upstream'
  )
  s.session.expireCalls(Date.now() + 1000)
  t.same(await pending, [{ jsonrpc: '2.0', id: 1, error: { code: -32001, message: 'Request timed out' } }])
  await new Promise(resolve => setImmediate(resolve))
  const up = s.factories[0]!.server.received
  t.match(up.find(m => m.method === 'notifications/cancelled')!.params, { requestId: up.find(m => m.method === 'tools/call')!.id, reason: 'request timed out' })
})

t.test("a server-to-client request gets a session id; the client's answer goes back under the upstream's", async t => {
  const s = await open(t, ['a'])
  const res = await s.post({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'ask' } })
  const reader = res.body!.getReader()
  let buf = ''
  const next = async (): Promise<JsonRpcMessage> => {
    for (;;) {
      const i = buf.indexOf('\n\n')
      if (i >= 0) {
        const frame = buf.slice(0, i)
        buf = buf.slice(i + 2)
        const data = frame.split('\n').find(l => l.startsWith('data: '))
        if (data !== undefined) return JSON.parse(data.slice(6)) as JsonRpcMessage
        continue
      }
      const { value, done } = await reader.read()
      if (done === true) throw new Error('stream ended')
      buf += Buffer.from(value).toString('utf8')
    }
  }
  const ask = await next()
  t.match(ask, { method: 'sampling/createMessage' }, 'on the stream of the request that caused it')
  t.type(ask.id, 'number', "under the session's id, not the upstream's")
  const ack = await s.post({ jsonrpc: '2.0', id: ask.id, result: { role: 'assistant', content: { type: 'text', text: 'ok' } } })
  t.equal(ack.status, 202)
  const answer = await next()
  t.match(answer, { id: 1, result: { content: [{ text: /^answered: / }] } })
  t.match(
    s.factories[0]!.server.received.find(m => m.method === undefined),
    { id: 'srv-1' },
    'the upstream got its own id back'
  )
})

t.test('one target: an upstream that crashes ends the session', async t => {
  const s = await open(t, ['a'])
  const pending = s.rpc(1, 'tools/call', { name: 'hang' })
  t.ok(
    await eventually(
      () => s.factories[0]!.server.received.some(m => m.method === 'tools/call'),
      ok => ok,
      400,
      5
    ),
    'the call reached the upstream'
  )
  s.factories[0]!.server.created[0]!.crash()
  t.same(await pending, [{ jsonrpc: '2.0', id: 1, error: { code: -32000, message: 'upstream a closed' } }])
  t.same(s.ended, ['upstream a closed'])
  t.ok(s.session.ended)
})

t.test("a client's cancellation goes upstream under the upstream id with the client's reason, or none", async t => {
  const s = await open(t, ['a'])
  const first = s.rpc(1, 'tools/call', { name: 'hang' })
  const second = s.rpc(2, 'tools/call', { name: 'hang' })
  const up = s.factories[0]!.server.received
  t.ok(
    await eventually(
      () => up.filter(m => m.method === 'tools/call').length === 2,
      ok => ok,
      400,
      5
    ),
    'both calls reached the upstream'
  )
  const [upFirst, upSecond] = up.filter(m => m.method === 'tools/call')
  t.equal((await s.post({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1, reason: 'changed my mind' } })).status, 202)
  t.equal((await s.post({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 2 } })).status, 202)
  await Promise.all([first, second])
  const cancels = up.filter(m => m.method === 'notifications/cancelled').map(m => m.params)
  t.same(
    cancels,
    [{ requestId: upFirst!.id, reason: 'changed my mind' }, { requestId: upSecond!.id }],
    "the client's reason, or none: never one the client did not give"
  )
})
