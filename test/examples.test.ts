import t from 'tap'
import { readFile, readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { join } from 'node:path'
import { loadConfig } from '../core/config.ts'
import { loadPlugins } from '../core/plugin-loader.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { memoryLogger } from './helpers/logger.ts'
import { builtins } from '../plugins/index.ts'

const dir = fileURLToPath(new URL('../examples', import.meta.url))
const env = {
  AUTHENTIK_CLIENT_ID: 'client-1',
  TENANT_ID: 'tenant-1',
  CLIENT_ID: 'client-1',
  CLIENT_SECRET: 'secret',
  UPSTREAM_API_KEY: 'k',
  DEMO_IDP_ISSUER: 'http://127.0.0.1:9400/application/o/mcp/',
  KEYCLOAK_CLIENT_ID: 'mcp-gateway',
  EXCHANGE_SECRET: 'exchange-secret',
  LEGACY_API_KEY: 'legacy-key',
  SEARCH_API_KEY: 'search-key',
  CRM_API_APP_ID: '00000000-0000-4000-8000-000000000001',
}

t.test('every bundled example config is valid and its pipeline checks out', async t => {
  const files = [...(await readdir(dir)).filter(f => f.endsWith('.yaml')).map(f => join(dir, f)), join(dir, 'demo/config.yaml'), join(dir, 'demo/facade.yaml')]
  t.ok(files.length >= 5)
  for (const file of files) {
    const loaded = await loadConfig(file, env, builtins)
    const plugins = await loadPlugins({
      config: loaded.config,
      baseDir: loaded.baseDir,
      registry: builtins,
      env: { log: memoryLogger().log, config: loaded.config as never, baseUrl: '', metrics: new Metrics() },
      dryRun: true,
    })
    t.ok(loaded.config.mcp.targets.length > 0, file)
    if ((loaded.config.mcp.policies.mcpAuthentication as { facade?: unknown } | undefined)?.facade !== undefined) {
      t.same(plugins.map(p => p.name).slice(-1), ['oauthFacade'], `${file}: the facade instead of the bridge plugins`)
    } else if ((loaded.config.mcp.policies.mcpAuthentication as { provider?: unknown } | undefined)?.provider !== undefined) {
      t.same(plugins.map(p => p.name).slice(-2), ['providerBridge', 'registration'], `${file}: bridge plugins in the pipeline`)
    }
  }
})

/** What a shipped example (examples/*.yaml, in the package) may not rely on: a clone's layout or a download at run time. */
function portabilityProblems(text: string, stdio: ReadonlyArray<{ cmd: string; args?: readonly string[]; cwd?: string }>): string[] {
  const problems: string[] = []
  if (/\bnpx\b/.test(text)) problems.push('mentions npx (a download at run time)')
  if (text.includes('node_modules/')) problems.push('names a node_modules/ path (exists only in a clone)')
  for (const s of stdio) {
    if (s.args?.some(a => a === '-y' || a === '--yes') === true) problems.push(`${s.cmd}: -y (a download at run time)`)
    if (s.cwd !== undefined && (s.cwd === '..' || s.cwd.startsWith('../'))) problems.push(`${s.cmd}: cwd ${s.cwd} leaves the examples folder`)
    if (s.cmd.includes('/') && !s.cmd.startsWith('/')) problems.push(`${s.cmd}: a relative command path`)
  }
  return problems
}

t.test('the shipped examples work wherever the package is installed: no npx, no -y, no node_modules/ path; loopback only with a reason', async t => {
  const files = (await readdir(dir)).filter(f => f.endsWith('.yaml'))
  t.ok(files.length >= 4)
  for (const f of files) {
    const text = await readFile(join(dir, f), 'utf8')
    const { config } = await loadConfig(join(dir, f), env, builtins)
    const stdio = config.mcp.targets.flatMap(x => (x.stdio === undefined ? [] : [x.stdio]))
    t.same(portabilityProblems(text, stdio), [], f)
    if (config.mcp.host !== '0.0.0.0') {
      // Loopback is unreachable from outside a container: only an example without authentication binds it, and says why.
      t.equal(config.mcp.policies.mcpAuthentication, undefined, `${f}: binds ${config.mcp.host} only without authentication`)
      t.match(text, /^#.*loopback/m, `${f}: its comment says why it binds loopback`)
    }
  }
  // The check itself catches what the examples used to do.
  t.same(portabilityProblems('cmd: npx', [{ cmd: 'npx', args: ['-y', 'x'] }]).length, 2)
  t.same(portabilityProblems('args: [node_modules/x/dist/index.js]', [{ cmd: 'node', args: ['node_modules/x/dist/index.js'], cwd: '..' }]).length, 2)
})
