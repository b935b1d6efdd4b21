import t from 'tap'
import { readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { join } from 'node:path'
import { loadConfig } from '../core/config.ts'
import { loadPlugins } from '../core/plugin-loader.ts'
import { Metrics } from '../core/metrics.ts'
import { memoryLogger } from './helpers/logger.ts'
import { builtins } from '../plugins/index.ts'

const dir = fileURLToPath(new URL('../examples', import.meta.url))
const env = { AUTHENTIK_CLIENT_ID: 'client-1', TENANT_ID: 'tenant-1', CLIENT_ID: 'client-1', CLIENT_SECRET: 'secret', UPSTREAM_API_KEY: 'k', DEMO_IDP_ISSUER: 'http://127.0.0.1:9400/application/o/mcp/' }

t.test('every bundled example config is valid and its pipeline checks out', async t => {
  const files = [...(await readdir(dir)).filter(f => f.endsWith('.yaml')).map(f => join(dir, f)), join(dir, 'demo/config.yaml'), join(dir, 'demo/facade.yaml')]
  t.ok(files.length >= 5)
  for (const file of files) {
    const loaded = await loadConfig(file, env, builtins)
    const plugins = await loadPlugins({ config: loaded.config, baseDir: loaded.baseDir, registry: builtins, env: { log: memoryLogger().log, config: loaded.config as never, baseUrl: '', metrics: new Metrics() }, dryRun: true })
    t.ok(loaded.config.mcp.targets.length > 0, file)
    if ((loaded.config.mcp.policies.mcpAuthentication as { facade?: unknown } | undefined)?.facade !== undefined) {
      t.same(plugins.map(p => p.name).slice(-1), ['oauthFacade'], `${file}: the facade instead of the bridge plugins`)
    } else if ((loaded.config.mcp.policies.mcpAuthentication as { provider?: unknown } | undefined)?.provider !== undefined) {
      t.same(plugins.map(p => p.name).slice(-2), ['providerBridge', 'registration'], `${file}: bridge plugins in the pipeline`)
    }
  }
})
