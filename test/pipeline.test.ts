import t, { type Test } from 'tap'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { ProxyError } from '../core/errors.ts'
import type { Plugin } from '../core/plugin.ts'
import type { McpEndpoint } from '../core/server.ts'
import { memoryLogger } from './helpers/logger.ts'

const limits = { maxBodyBytes: 2048, headersTimeoutMs: 5000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 }

async function start(t: Test, plugins: Plugin[], mcp?: McpEndpoint) {
  const { log, text } = memoryLogger()
  const endpoint: McpEndpoint = mcp ?? {
    async handle(ctx) {
      const info = await ctx.readMcpMessage()
      await ctx.writeHead(200, { 'content-type': 'application/json' })
      ctx.res.end(JSON.stringify({ jsonrpc: '2.0', id: (info.body as { id: number }).id, result: { ok: true } }))
    },
    async close() {},
  }
  const server = new GatewayServer({ pipeline: new Pipeline(plugins), routes: new RouteTable(plugins), mcp: endpoint, log, limits, metrics: new Metrics() })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close(0))
  return { url: `http://127.0.0.1:${port}`, logs: text, server }
}

const rpc = (body: unknown) => ({
  method: 'POST',
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
  body: typeof body === 'string' ? body : JSON.stringify(body),
})

function recorder(name: string, calls: string[], opts: { reply?: boolean; throws?: unknown } = {}): Plugin {
  return {
    name,
    onRequest() {
      calls.push(`req:${name}`)
      if (opts.throws !== undefined) throw opts.throws
      if (opts.reply === true) return { status: 418, body: { by: name } }
      return undefined
    },
    onResponse(rctx) {
      calls.push(`res:${name}`)
      rctx.headers[`x-${name}`] = 'seen'
    },
  }
}

t.test('onRequest runs in order, onResponse in reverse, then the terminal handler answers', async t => {
  const calls: string[] = []
  const { url } = await start(t, [recorder('a', calls), recorder('b', calls), recorder('c', calls)])
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 7, method: 'ping' }))
  t.equal(res.status, 200)
  t.same(await res.json(), { jsonrpc: '2.0', id: 7, result: { ok: true } })
  t.same(calls, ['req:a', 'req:b', 'req:c', 'res:c', 'res:b', 'res:a'])
  t.equal(res.headers.get('x-a'), 'seen')
})

t.test('a Reply short-circuits: later hooks and the handler are skipped, onResponse still runs for those that ran', async t => {
  const calls: string[] = []
  let handled = false
  const { url } = await start(t, [recorder('a', calls), recorder('b', calls, { reply: true }), recorder('c', calls)], {
    async handle() {
      handled = true
    },
    async close() {},
  })
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 1, method: 'ping' }))
  t.equal(res.status, 418)
  t.same(await res.json(), { by: 'b' })
  t.same(calls, ['req:a', 'req:b', 'res:b', 'res:a'])
  t.equal(handled, false)
  t.equal(res.headers.get('x-c'), null)
})

t.test('a thrown ProxyError is written by the error writer; onResponse runs for the plugins that ran', async t => {
  const calls: string[] = []
  const err = new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, 'JWT token required', {
    oauthError: 'unauthorized',
    headers: { 'www-authenticate': 'Bearer resource_metadata="x"' },
  })
  const { url } = await start(t, [recorder('a', calls), recorder('b', calls, { throws: err }), recorder('c', calls)])
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 1, method: 'ping' }))
  t.equal(res.status, 401)
  t.equal(res.headers.get('www-authenticate'), 'Bearer resource_metadata="x"')
  t.equal(res.headers.get('x-a'), 'seen')
  t.same(await res.json(), { error: 'unauthorized', error_description: 'JWT token required' })
  t.same(calls, ['req:a', 'req:b', 'res:b', 'res:a'])
})

t.test('an unexpected error becomes a generic 500; the cause is logged, never sent', async t => {
  const calls: string[] = []
  const { url, logs } = await start(t, [recorder('a', calls, { throws: new Error('db password is hunter2') })])
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 3, method: 'ping' }))
  t.equal(res.status, 500)
  const body = (await res.json()) as { error: { message: string } }
  t.same(body, { jsonrpc: '2.0', id: null, error: { code: -32603, message: 'internal error' } })
  t.notMatch(JSON.stringify(body), /hunter2/)
  t.match(logs(), /hunter2/, 'the cause is in the log')
  t.same(calls, ['req:a', 'res:a'])
})

t.test('JSON-RPC errors on /mcp carry the request id', async t => {
  const { url } = await start(t, [], {
    async handle(ctx) {
      await ctx.readMcpMessage()
      throw new ProxyError('MCPP_ERR_SESSION_NOT_FOUND', 404, 'Session not found', { rpcCode: -32001 })
    },
    async close() {},
  })
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 'abc', method: 'tools/list' }))
  t.equal(res.status, 404)
  t.same(await res.json(), { jsonrpc: '2.0', id: 'abc', error: { code: -32001, message: 'Session not found' } })
})

t.test('invalid JSON is -32700 and an invalid message -32600, both 400', async t => {
  const { url } = await start(t, [])
  let res = await fetch(`${url}/mcp`, rpc('{"jsonrpc":'))
  t.equal(res.status, 400)
  t.same(await res.json(), { jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error: body is not valid JSON' } })
  for (const bad of [
    { id: 1, method: 'x' },
    { jsonrpc: '2.0', id: {}, method: 'x' },
    { jsonrpc: '2.0', method: 5 },
    [],
    { jsonrpc: '2.0', id: 1, result: 1, error: {} },
  ]) {
    res = await fetch(`${url}/mcp`, rpc(bad))
    t.equal(res.status, 400, JSON.stringify(bad))
    t.equal(((await res.json()) as { error: { code: number } }).error.code, -32600)
  }
})

t.test('a body over the limit gets 413', async t => {
  const { url } = await start(t, [])
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 1, method: 'x', params: { pad: 'x'.repeat(5000) } }))
  t.equal(res.status, 413)
  t.equal(((await res.json()) as { error: { code: number } }).error.code, -32600)
})

t.test('plugin routes: exact match, 405 with Allow, 404 elsewhere, OAuth-shaped errors', async t => {
  const calls: string[] = []
  const plugin: Plugin = {
    ...recorder('r', calls),
    routes: [{ methods: ['GET'], path: '/.well-known/thing', handler: () => ({ status: 200, body: { thing: true } }) }],
  }
  const { url } = await start(t, [plugin])
  let res = await fetch(`${url}/.well-known/thing`)
  t.equal(res.status, 200)
  t.same(await res.json(), { thing: true })
  t.equal(res.headers.get('x-r'), 'seen', 'onResponse decorates route answers')
  res = await fetch(`${url}/.well-known/thing`, { method: 'POST' })
  t.equal(res.status, 405)
  t.equal(res.headers.get('allow'), 'GET')
  t.equal(((await res.json()) as { error: string }).error, 'invalid_request')
  res = await fetch(`${url}/.well-known/thing/extra`)
  t.equal(res.status, 404)
  t.same(await res.json(), { error: 'not_found', error_description: 'no route for /.well-known/thing/extra' })
})

t.test('request ids: a sane x-request-id is kept, otherwise unique ids; one id on every line of a request', async t => {
  const talker: Plugin = {
    name: 'talker',
    onRequest(ctx) {
      if (ctx.path === '/mcp' && ctx.req.headers['x-talk'] !== undefined) ctx.log.info('plugin line')
    },
  }
  const { url, logs } = await start(t, [talker])
  const ping = (headers: Record<string, string> = {}) =>
    fetch(`${url}/mcp`, { ...rpc({ jsonrpc: '2.0', id: 1, method: 'ping' }), headers: { ...rpc({}).headers, ...headers } })
  await ping({ 'x-request-id': 'abc-123.x<script>' })
  await ping()
  await ping()
  await ping({ 'x-talk': '1' })
  const raw = logs()
    .split('\n')
    .filter(l => l !== '')
  const lines = raw.map(l => JSON.parse(l) as { msg: string; reqId?: string })
  const access = lines.filter(l => l.msg === 'request')
  t.equal(access.length, 4)
  t.equal(access[0]!.reqId, 'abc-123.xscript')
  const generated = access.slice(1).map(l => l.reqId)
  t.equal(new Set(generated).size, 3, 'generated ids differ')
  for (const id of generated) t.match(id, /^[\w.-]{3,64}$/)
  const own = lines.find(l => l.msg === 'plugin line')
  t.equal(own?.reqId, access[3]!.reqId, 'a plugin line and the access line carry the same id')
  for (const l of raw.filter(l => l.includes('"msg":"request"'))) t.equal(l.match(/"reqId"/g)?.length, 1, 'reqId once per access line')
})

t.test('two plugins cannot claim the same route, nor /mcp', async t => {
  const r = { methods: ['GET'], path: '/x', handler: () => ({ status: 200 }) }
  t.throws(
    () =>
      new RouteTable([
        { name: 'a', routes: [r] },
        { name: 'b', routes: [r] },
      ]),
    /already taken/
  )
  t.throws(() => new RouteTable([{ name: 'a', routes: [{ ...r, path: '/mcp' }] }]), /reserved/)
})

t.test('one access-log line per request, without the token', async t => {
  const { url, logs } = await start(t, [])
  await fetch(`${url}/mcp`, {
    ...rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    headers: { ...rpc({}).headers, authorization: 'Bearer sekrit-token-value' },
  })
  const lines = logs()
    .split('\n')
    .filter(l => l.includes('"msg":"request"'))
  t.equal(lines.length, 1)
  const rec = JSON.parse(lines[0]!)
  t.equal(rec.method, 'POST')
  t.equal(rec.path, '/mcp')
  t.equal(rec.status, 200)
  t.equal(rec.mcpMethod, 'tools/list')
  t.type(rec.durationMs, 'number')
  t.type(rec.reqId, 'string')
  t.notMatch(logs(), /sekrit/)
})

t.test('a hook returning a non-native thenable is awaited like a promise, in onRequest and onResponse', async t => {
  const calls: string[] = []
  /** A thenable that settles later, as another promise library's would. */
  function later<T>(value: T, what: string): PromiseLike<T> {
    return {
      then(ok) {
        setTimeout(() => {
          calls.push(what)
          ok?.(value)
        }, 5)
        return undefined as never
      },
    }
  }
  const slow: Plugin = {
    name: 'slow',
    onRequest() {
      return later(undefined, 'req:slow settled') as PromiseLike<undefined> as never
    },
    onResponse() {
      return later(undefined, 'res:slow settled') as never
    },
  }
  const { url } = await start(t, [recorder('a', calls), slow, recorder('c', calls)])
  const res = await fetch(`${url}/mcp`, rpc({ jsonrpc: '2.0', id: 8, method: 'ping' }))
  t.equal(res.status, 200)
  t.same(calls, ['req:a', 'req:slow settled', 'req:c', 'res:c', 'res:slow settled', 'res:a'], 'each thenable settled before the next hook ran')
})
