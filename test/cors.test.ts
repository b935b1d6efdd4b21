/**
 * CORS with real HTTP requests through a gateway whose pipeline is
 * [cors, mcpAuthentication]: preflights need no token, 401s carry the CORS
 * headers, a disallowed Origin on /mcp gets 403, public routes keep `*`.
 */
import t, { type Test } from 'tap'
import { fileURLToPath } from 'node:url'
import { devIdp, authGateway, ossOptions } from './helpers/idp.ts'

/**
 * The built-in's own file, loaded from its path the way a third-party plugin
 * is (`mcp.plugins: [{ module: <path>, options }]`): every case below runs
 * against both, which proves a plugin outside the registry can do all that
 * the built-in does.
 */
const CORS_MODULE = fileURLToPath(new URL('../plugins/cors/index.ts', import.meta.url))

for (const from of ['builtin', 'path'] as const) {
  t.test(`cors loaded as ${from === 'builtin' ? 'the built-in' : 'a third-party module from its path'}`, t =>
    corsCases(t, from === 'path' ? CORS_MODULE : undefined)
  )
}

async function corsCases(t: Test, corsModule: string | undefined): Promise<void> {
  t.test('listed origins', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp), { allowOrigins: ['https://app.example.com'], exposeHeaders: ['Mcp-Session-Id', 'X-Custom'] }, corsModule)
    const origin = 'https://app.example.com'

    t.test('preflight answered 204 without a token', async t => {
      const res = await fetch(gw.url, {
        method: 'OPTIONS',
        headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type, mcp-session-id' },
      })
      t.equal(res.status, 204)
      t.equal(res.headers.get('access-control-allow-origin'), origin)
      t.match(res.headers.get('access-control-allow-methods'), /POST/)
      t.match(res.headers.get('access-control-allow-headers'), /Authorization/)
      t.match(res.headers.get('access-control-allow-headers'), /Mcp-Session-Id/)
      t.equal(res.headers.get('access-control-max-age'), '600')
      t.match(res.headers.get('vary'), /Origin/)
      t.equal(res.headers.get('access-control-allow-credentials'), null)
    })

    t.test('401 carries the CORS headers and exposes WWW-Authenticate', async t => {
      const res = await fetch(gw.url, { method: 'POST', headers: { origin, 'content-type': 'application/json' }, body: '{}' })
      t.equal(res.status, 401)
      t.equal(res.headers.get('access-control-allow-origin'), origin)
      const exposed = (res.headers.get('access-control-expose-headers') ?? '').split(',').map(s => s.trim().toLowerCase())
      t.ok(exposed.includes('www-authenticate'))
      t.ok(exposed.includes('mcp-session-id'))
      t.ok(exposed.includes('x-custom'))
    })

    t.test('a successful request is decorated too', async t => {
      const res = await fetch(gw.url, {
        method: 'POST',
        headers: { origin, authorization: `Bearer ${await idp.mintToken({ sub: 'c1' })}`, 'content-type': 'application/json' },
        body: '{}',
      })
      t.equal(res.status, 200)
      t.equal(res.headers.get('access-control-allow-origin'), origin)
    })

    t.test('disallowed origin: 403 on /mcp, preflight refused, no CORS headers', async t => {
      const res = await fetch(gw.url, {
        method: 'POST',
        headers: { origin: 'https://evil.example', authorization: `Bearer ${await idp.mintToken({ sub: 'c1' })}`, 'content-type': 'application/json' },
        body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
      })
      t.equal(res.status, 403)
      t.equal(res.headers.get('access-control-allow-origin'), null)
      t.match(res.headers.get('content-type'), /application\/json/)
      const body = (await res.json()) as { error: { message: string } }
      t.equal(body.error.message, 'origin not allowed')
      const pre = await fetch(gw.url, { method: 'OPTIONS', headers: { origin: 'https://evil.example', 'access-control-request-method': 'POST' } })
      t.equal(pre.status, 403)
      t.equal(pre.headers.get('access-control-allow-origin'), null)
    })

    t.test('no Origin header: no CORS processing', async t => {
      const res = await fetch(gw.url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
      t.equal(res.status, 401)
      t.equal(res.headers.get('access-control-allow-origin'), null)
    })

    t.test('protected resource metadata keeps `*` for any origin', async t => {
      const res = await fetch(`${gw.origin}/.well-known/oauth-protected-resource/mcp`, { headers: { origin: 'https://elsewhere.example' } })
      t.equal(res.status, 200)
      t.equal(res.headers.get('access-control-allow-origin'), '*')
      const ok = await fetch(`${gw.origin}/.well-known/oauth-protected-resource/mcp`, { headers: { origin } })
      t.equal(ok.headers.get('access-control-allow-origin'), '*')
    })
  })

  t.test('`*` never reflects an origin with credentials', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp), { allowOrigins: ['*'], allowCredentials: true, allowHeaders: ['*'] }, corsModule)
    const origin = 'https://any.example'
    const pre = await fetch(gw.url, {
      method: 'OPTIONS',
      headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, x-trace-id' },
    })
    t.equal(pre.status, 204)
    t.equal(pre.headers.get('access-control-allow-origin'), '*')
    t.equal(pre.headers.get('access-control-allow-credentials'), null)
    t.match(
      pre.headers.get('access-control-allow-headers'),
      /x-trace-id/,
      '`*` headers: the requested ones are listed (a literal * would not cover Authorization)'
    )
    const res = await fetch(gw.url, { method: 'POST', headers: { origin, 'content-type': 'application/json' }, body: '{}' })
    t.equal(res.status, 401)
    t.equal(res.headers.get('access-control-allow-origin'), '*')
    t.equal(res.headers.get('access-control-allow-credentials'), null)
  })

  t.test('listed origins with credentials reflect the origin and vary on it', async t => {
    const idp = await devIdp(t)
    const gw = await authGateway(t, ossOptions(idp), { allowOrigins: ['https://app.example.com/'], allowCredentials: true }, corsModule)
    const res = await fetch(gw.url, { method: 'POST', headers: { origin: 'https://APP.example.com', 'content-type': 'application/json' }, body: '{}' })
    t.equal(res.status, 401)
    t.equal(res.headers.get('access-control-allow-origin'), 'https://APP.example.com')
    t.equal(res.headers.get('access-control-allow-credentials'), 'true')
    t.match(res.headers.get('vary'), /Origin/)
  })

  t.test("without a cors block, Origin is still validated: only the gateway's own origin passes", async t => {
    const { validateConfig } = await import('../core/config.ts')
    const { loadPlugins } = await import('../core/plugin-loader.ts')
    const { GatewayServer } = await import('../core/server.ts')
    const { Pipeline } = await import('../core/pipeline.ts')
    const { RouteTable } = await import('../core/routes.ts')
    const { Metrics } = await import('../core/observability/metrics.ts')
    const { memoryLogger } = await import('./helpers/logger.ts')
    const { builtins } = await import('../plugins/index.ts')
    const config = await validateConfig({ mcp: { port: 0, baseUrl: 'https://gw.example.test', targets: [{ name: 'a', stdio: { cmd: 'node' } }] } }, builtins)
    const { log } = memoryLogger()
    const loaded = await loadPlugins({
      config,
      baseDir: '.',
      registry: builtins,
      env: { log, config: config as never, baseUrl: 'https://gw.example.test', metrics: new Metrics() },
    })
    t.same(
      loaded.map(p => p.name),
      ['cors']
    )
    const server = new GatewayServer({
      pipeline: new Pipeline(loaded),
      routes: new RouteTable(loaded),
      log,
      metrics: new Metrics(),
      limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 5000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
      mcp: {
        async handle(ctx) {
          await ctx.writeHead(200)
          ctx.res.end('ok')
        },
        async close() {},
      },
    })
    const { port } = await server.listen(0, '127.0.0.1')
    t.teardown(() => server.close(0))
    const post = (origin?: string) => fetch(`http://127.0.0.1:${port}/mcp`, { method: 'POST', body: '{}', headers: origin === undefined ? {} : { origin } })
    const foreign = await post('http://evil.example')
    t.equal(foreign.status, 403, 'a foreign Origin is refused')
    t.match(await foreign.json(), { jsonrpc: '2.0', error: { message: 'origin not allowed' } })
    t.equal((await post('https://gw.example.test')).status, 200, "the gateway's own origin passes")
    t.equal((await post()).status, 200, 'no Origin (non-browser clients) passes')
  })
}
