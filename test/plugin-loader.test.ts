import t from 'tap'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { loadPlugins, engineSatisfied, defaultEntries } from '../core/plugin-loader.ts'
import { validateConfig, type GatewayConfig } from '../core/config.ts'
import { Metrics } from '../core/metrics.ts'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { memoryLogger } from './helpers/logger.ts'

const here = dirname(fileURLToPath(import.meta.url))
const baseDir = join(here, 'fixtures')

async function configWith (plugins: unknown[], policies: Record<string, unknown> = {}): Promise<GatewayConfig> {
  return validateConfig({ mcp: { port: 0, policies, plugins, targets: [{ name: 'a', stdio: { cmd: 'node' } }] } })
}

function load (config: GatewayConfig) {
  const { log } = memoryLogger()
  return loadPlugins({ config, baseDir, env: { log, config: config as never, baseUrl: 'http://localhost:0', metrics: new Metrics() } })
}

t.test('engine ranges', async t => {
  t.ok(engineSatisfied('^1', '1.0.0'))
  t.ok(engineSatisfied('^1.0', '1.2.0'))
  t.notOk(engineSatisfied('^1.3', '1.2.0'))
  t.notOk(engineSatisfied('^2', '1.0.0'))
  t.ok(engineSatisfied('>=1.0.0', '2.0.0'))
  t.ok(engineSatisfied('1.x', '1.9.9'))
  t.ok(engineSatisfied('*', '1.0.0'))
  t.notOk(engineSatisfied('~1', '1.0.0'), 'unsupported range syntax is refused, not guessed')
})

t.test('default pipeline: built-ins whose policy is configured, in the fixed order', async t => {
  const config = await validateConfig({
    mcp: {
      port: 0,
      targets: [{ name: 'a', stdio: { cmd: 'node' } }],
      policies: {
        authorization: { rules: ['"x" in jwt.groups'] },
        cors: { allowOrigins: ['*'] },
        mcpAuthentication: { mode: 'strict', issuer: 'https://idp.example/', audiences: ['c'], clientId: 'c', provider: { oss_idp: {} }, resourceMetadata: { resource: 'https://gw.example/mcp' } },
      },
    },
  })
  t.same(defaultEntries(config).map(e => e.builtin), ['cors', 'mcpAuthentication', 'authorization', 'providerBridge', 'registration'])
  const bare = await configWith([])
  t.same(defaultEntries({ ...bare, mcp: { ...bare.mcp, plugins: undefined } }), [{ builtin: 'cors' }],
    'cors always runs: it validates Origin (DNS-rebinding protection) even without a cors block')
})

t.test('a missing module names the config path', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/does-not-exist.js' }])), {
    code: 'MCPP_ERR_PLUGIN_LOAD', message: /^mcp\.plugins\[0\]: cannot load plugin module "\.\/plugins\/does-not-exist\.js": module not found$/,
  })
  await t.rejects(load(await configWith([{ module: 'no-such-npm-package-mcpp' }])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /module not found/ })
})

t.test('a plugin whose own import is missing is not reported as "module not found"', async t => {
  const err = await load(await configWith([{ module: './plugins/broken-import.js' }])).then(() => undefined, (e: unknown) => e as Error & { code: string })
  t.equal(err?.code, 'MCPP_ERR_PLUGIN_LOAD')
  t.match(err?.message, /^mcp\.plugins\[0\]: cannot load plugin module "\.\/plugins\/broken-import\.js": Cannot find module .*helper-that-does-not-exist\.js/)
})

t.test('a module that is not a plugin is refused', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/not-a-plugin.js' }])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /does not export a plugin module/ })
})

t.test('an engine range we do not satisfy is refused', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/future-engine.js' }])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /needs plugin API \^7/ })
})

t.test('bad options are validated against the module schema, with the config path', async t => {
  const err = await load(await configWith([{ module: '../../examples/plugins/rate-limit.js', options: { requestsPerMinute: 'many', bogus: 1 } }])).then(() => undefined, (e: unknown) => e as Error & { code: string })
  t.equal(err?.code, 'MCPP_ERR_CONFIG')
  t.match(err?.message, /^\s+mcp\.plugins\[0\]\.options\.requestsPerMinute: must be integer$/m)
  t.match(err?.message, /^\s+mcp\.plugins\[0\]\.options\.bogus: unknown key$/m)
})

t.test('a throwing create() is reported and plugins created before it are closed', async t => {
  const closes = await import('./fixtures/plugins/closes.js' as string) as { closed: string[] }
  await t.rejects(load(await configWith([
    { module: './plugins/closes.js', options: { tag: 'first' } },
    { module: './plugins/throws-on-create.js' },
  ])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /^mcp\.plugins\[1\]: plugin throws-on-create failed to start: cannot reach the quota service$/ })
  t.same(closes.closed, ['first'])
})

t.test('the example rate limiter loads from the config as a third party would, and answers 429 with Retry-After', async t => {
  const config = await configWith([{ module: '../../examples/plugins/rate-limit.js', options: { requestsPerMinute: 60, burst: 2 } }])
  const plugins = await load(config)
  t.same(plugins.map(p => p.name), ['rate-limit'])
  const { log } = memoryLogger()
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins), routes: new RouteTable(plugins), log, metrics: new Metrics(),
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 5000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
    mcp: { async handle (ctx) { await ctx.writeHead(200); ctx.res.end('ok') }, async close () {} },
  })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close(0))
  const statuses: number[] = []
  let retryAfter: string | null = null
  for (let i = 0; i < 3; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/mcp`, { method: 'POST', body: '{}' })
    statuses.push(r.status)
    if (r.status === 429) { retryAfter = r.headers.get('retry-after'); t.match(await r.json(), { error: { code: -32000 } }) } else await r.text()
  }
  t.same(statuses, [200, 200, 429])
  t.match(retryAfter, /^\d+$/)
})
