import t from 'tap'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { loadPlugins, engineSatisfied, defaultEntries } from '../core/plugin-loader.ts'
import { validateConfig, type GatewayConfig } from '../core/config.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { memoryLogger } from './helpers/logger.ts'
import type { Plugin, PluginModule, PluginRegistry } from '../core/plugin.ts'
import { createError } from '../core/errors.ts'
import { builtins } from '../plugins/index.ts'

const here = dirname(fileURLToPath(import.meta.url))
const baseDir = join(here, 'fixtures')

async function configWith(plugins: unknown[], policies: Record<string, unknown> = {}): Promise<GatewayConfig> {
  return validateConfig({ mcp: { port: 0, policies, plugins, targets: [{ name: 'a', stdio: { cmd: 'node' } }] } }, builtins)
}

function load(config: GatewayConfig) {
  const { log } = memoryLogger()
  return loadPlugins({ config, baseDir, registry: builtins, env: { log, config: config as never, baseUrl: 'http://localhost:0', metrics: new Metrics() } })
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
  const config = await validateConfig(
    {
      mcp: {
        port: 0,
        targets: [{ name: 'a', stdio: { cmd: 'node' } }],
        policies: {
          authorization: { rules: ['"x" in jwt.groups'] },
          cors: { allowOrigins: ['*'] },
          mcpAuthentication: {
            mode: 'strict',
            issuer: 'https://idp.example/',
            audiences: ['c'],
            clientId: 'c',
            provider: { oss_idp: {} },
            resourceMetadata: { resource: 'https://gw.example/mcp' },
          },
        },
      },
    },
    builtins
  )
  t.same(
    defaultEntries(config, builtins).map(e => e.builtin),
    ['cors', 'mcpAuthentication', 'authorization', 'providerBridge', 'registration']
  )
  const bare = await configWith([])
  t.same(
    defaultEntries({ ...bare, mcp: { ...bare.mcp, plugins: undefined } }, builtins),
    [{ builtin: 'cors' }],
    'cors always runs: it validates Origin (DNS-rebinding protection) even without a cors block'
  )
})

t.test('a missing module names the config path', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/does-not-exist.js' }])), {
    code: 'MCPP_ERR_PLUGIN_LOAD',
    message: /^mcp\.plugins\[0\]: cannot load plugin module "\.\/plugins\/does-not-exist\.js": module not found$/,
  })
  await t.rejects(load(await configWith([{ module: 'no-such-npm-package-mcpp' }])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /module not found/ })
})

t.test('a plugin whose own import is missing is not reported as "module not found"', async t => {
  const err = await load(await configWith([{ module: './plugins/broken-import.js' }])).then(
    () => undefined,
    (e: unknown) => e as Error & { code: string }
  )
  t.equal(err?.code, 'MCPP_ERR_PLUGIN_LOAD')
  t.match(err?.message, /^mcp\.plugins\[0\]: cannot load plugin module "\.\/plugins\/broken-import\.js": Cannot find module .*helper-that-does-not-exist\.js/)
})

t.test('a module that is not a plugin is refused', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/not-a-plugin.js' }])), {
    code: 'MCPP_ERR_PLUGIN_LOAD',
    message: /does not export a plugin module/,
  })
})

t.test('an engine range we do not satisfy is refused', async t => {
  await t.rejects(load(await configWith([{ module: './plugins/future-engine.js' }])), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /needs plugin API \^7/ })
})

t.test('bad options are validated against the module schema, with the config path', async t => {
  const err = await load(await configWith([{ module: '../../examples/plugins/rate-limit.js', options: { requestsPerMinute: 'many', bogus: 1 } }])).then(
    () => undefined,
    (e: unknown) => e as Error & { code: string }
  )
  t.equal(err?.code, 'MCPP_ERR_CONFIG')
  t.match(err?.message, /^\s+mcp\.plugins\[0\]\.options\.requestsPerMinute: must be integer$/m)
  t.match(err?.message, /^\s+mcp\.plugins\[0\]\.options\.bogus: unknown key$/m)
})

t.test('a throwing create() is reported and plugins created before it are closed', async t => {
  const closes = (await import('./fixtures/plugins/closes.js' as string)) as { closed: string[] }
  await t.rejects(load(await configWith([{ module: './plugins/closes.js', options: { tag: 'first' } }, { module: './plugins/throws-on-create.js' }])), {
    code: 'MCPP_ERR_PLUGIN_LOAD',
    message: /^mcp\.plugins\[1\]: plugin throws-on-create failed to start: cannot reach the quota service$/,
  })
  t.same(closes.closed, ['first'])
})

t.test('the example rate limiter loads from the config as a third party would, and answers 429 with Retry-After', async t => {
  const config = await configWith([{ module: '../../examples/plugins/rate-limit.js', options: { requestsPerMinute: 60, burst: 2 } }])
  const plugins = await load(config)
  t.same(
    plugins.map(p => p.name),
    ['rate-limit']
  )
  const { log } = memoryLogger()
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
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
  const statuses: number[] = []
  let retryAfter: string | null = null
  for (let i = 0; i < 3; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/mcp`, { method: 'POST', body: '{}' })
    statuses.push(r.status)
    if (r.status === 429) {
      retryAfter = r.headers.get('retry-after')
      t.match(await r.json(), { error: { code: -32000 } })
    } else await r.text()
  }
  t.same(statuses, [200, 200, 429])
  t.match(retryAfter, /^\d+$/)
})

t.test("a built-in's inline options are validated against its own schema, like a module's", async t => {
  await t.rejects(load(await configWith([{ builtin: 'cors', options: { tyypo: 1, allowOrigins: 'x' } }])), {
    code: 'MCPP_ERR_CONFIG',
    message: /mcp\.plugins\[0\]\.options\.tyypo: unknown key[\s\S]*mcp\.plugins\[0\]\.options\.allowOrigins: must be array/,
  })
  await t.rejects(configWith([{ builtin: 'corz' }]), { code: 'MCPP_ERR_CONFIG', message: /mcp\.plugins\[0\]\.builtin: must be one of "cors", / })
  await t.rejects(
    configWith([], { corz: {} }),
    { code: 'MCPP_ERR_CONFIG', message: /mcp\.policies\.corz: unknown key/ },
    'a policy no built-in claims is an unknown key'
  )
})

/** A registry of stand-in modules, to drive the loader's dependency and error-code checks. */
function registryOf(...modules: PluginModule<any>[]): PluginRegistry {
  return { modules: Object.fromEntries(modules.map(m => [m.name, m])), defaultPipeline: () => modules.map(m => m.name) }
}
const created: string[] = []
const stub = (name: string, extra: Partial<PluginModule<any>> = {}): PluginModule<any> => ({
  name,
  engine: '^1',
  create(_o, env) {
    created.push(`${name}:${Object.keys(env.provided).join(',')}`)
    return { name }
  },
  ...extra,
})

async function loadWith(registry: PluginRegistry, plugins: unknown[] | undefined): Promise<Plugin[]> {
  const config = await validateConfig({ mcp: { port: 0, plugins, targets: [{ name: 'a', stdio: { cmd: 'node' } }] } }, registry)
  return loadPlugins({
    config,
    baseDir,
    registry,
    env: { log: memoryLogger().log, config: config as never, baseUrl: 'http://localhost:0', metrics: new Metrics() },
  })
}

t.test('provides and needs: a dependency is met by a plugin listed before, and the value reaches create()', async t => {
  const provider = stub('provider', { provides: ['thing'], check: () => ({ thing: { n: 1 } }) })
  const consumer = stub('consumer', {
    needs: ['thing'],
    create(_o, env) {
      created.push(`consumer:${JSON.stringify(env.provided.thing)}`)
      return { name: 'consumer' }
    },
  })
  const registry = registryOf(provider, consumer)
  created.length = 0
  t.same(
    (await loadWith(registry, undefined)).map(p => p.name),
    ['provider', 'consumer']
  )
  t.same(created, ['provider:', 'consumer:{"n":1}'])
  await t.rejects(
    loadWith(registry, [{ builtin: 'consumer' }]),
    {
      code: 'MCPP_ERR_CONFIG',
      message: /^mcp\.plugins\[0\]: plugin consumer needs "thing", provided by provider, which is not in the pipeline$/,
    },
    'a missing dependency names both plugins'
  )
  await t.rejects(loadWith(registry, [{ builtin: 'consumer' }, { builtin: 'provider' }]), {
    code: 'MCPP_ERR_CONFIG',
    message: /^mcp\.plugins\[0\]: plugin consumer needs "thing" from plugin provider, which must be listed before it$/,
  })
  await t.rejects(loadWith(registryOf(stub('liar', { provides: ['thing'] })), undefined), {
    code: 'MCPP_ERR_PLUGIN_LOAD',
    message: /liar declares that it provides "thing"/,
  })
})

t.test('the built-ins: bridge and registration need mcpAuthentication listed before them', async t => {
  const auth = {
    mode: 'strict',
    issuer: 'https://idp.example/',
    audiences: ['c'],
    clientId: 'c',
    provider: { oss_idp: {} },
    resourceMetadata: { resource: 'https://gw.example/mcp' },
  }
  const config = await configWith([{ builtin: 'registration' }], { mcpAuthentication: auth })
  await t.rejects(
    loadPlugins({
      config,
      baseDir,
      registry: builtins,
      dryRun: true,
      env: { log: memoryLogger().log, config: config as never, baseUrl: '', metrics: new Metrics() },
    }),
    {
      code: 'MCPP_ERR_CONFIG',
      message: /^mcp\.plugins\[0\]: plugin registration needs "idp", provided by mcpAuthentication, which is not in the pipeline$/,
    }
  )
})

t.test('error codes: each declared once, upper-case', async t => {
  const A = createError('MCPP_ERR_A_THING', 409, 'a thing')
  await t.rejects(loadWith(registryOf(stub('one', { errors: [A] }), stub('two', { errors: [A] })), undefined), {
    code: 'MCPP_ERR_PLUGIN_LOAD',
    message: /plugin two declares error code MCPP_ERR_A_THING, already declared by one/,
  })
  const shadow = createError('MCPP_ERR_CONFIG', 400, 'not mine')
  await t.rejects(loadWith(registryOf(stub('three', { errors: [shadow] })), undefined), { code: 'MCPP_ERR_PLUGIN_LOAD', message: /already declared by core/ })
  const ok = await loadWith(registryOf(stub('four', { errors: [A] })), undefined)
  t.same(
    ok.map(p => p.name),
    ['four']
  )
})
