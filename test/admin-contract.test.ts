/**
 * The admin view through the plugin contract only: a third-party plugin
 * loaded from a path shows its state (describe(), including the keySet
 * section), its metric (env.metrics) and its structured denial on the admin
 * listener exactly as a built-in would; the admin looks no plugin up by name.
 */
import t from 'tap'
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { loadConfig } from '../core/config.ts'
import { startGateway } from '../core/gateway.ts'
import { builtins } from '../plugins/index.ts'
import { memoryLogger } from './helpers/logger.ts'
import { EVERYTHING } from './helpers/gateway-harness.ts'
import { parsePrometheus } from './helpers/admin.ts'

const PLUGIN = fileURLToPath(new URL('./fixtures/plugins/admin-view.js', import.meta.url))

t.test('a path-loaded plugin reaches the admin view through describe(), env.metrics and ctx.denial', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcp-proxy-admin-contract-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'gateway.yaml')
  await writeFile(
    file,
    `
mcp:
  port: 0
  host: 127.0.0.1
  plugins:
    - builtin: cors
    - module: ${JSON.stringify(PLUGIN)}
      options: { limit: 5 }
  targets:
    - name: everything
      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] }
admin:
  host: 127.0.0.1
  port: 0
`
  )
  const loaded = await loadConfig(file, {}, builtins)
  const { log } = memoryLogger('debug')
  const gw = await startGateway(loaded, { mcpPort: 0, adminPort: 0, log, registry: builtins })
  t.teardown(() => gw.close())
  const admin = gw.adminUrl!.replace('localhost', '127.0.0.1')
  const mcp = gw.mcpUrl.replace('localhost', '127.0.0.1')

  const refused = await fetch(mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-over-quota': '1' },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  t.equal(refused.status, 429)

  const requests = (await (await fetch(`${admin}/api/requests`)).json()) as Array<{ status: number; reason: string | null; denial?: unknown }>
  const rec = requests.find(r => r.status === 429)
  t.match(rec, { reason: 'rule[2]: over quota (5)', denial: { rule: 2, reason: 'over quota (5)' } }, 'the structured denial, shown as the plugin gave it')

  const oauth = (await (await fetch(`${admin}/api/oauth`)).json()) as { keySet: unknown; discovery: unknown }
  t.same(oauth.keySet, { kids: ['third-party-kid'], loaded: true }, "the keySet section of any plugin's describe() feeds the Authentication panel")
  t.equal(oauth.discovery, null, 'no plugin describes a discovery document')

  const plugins = (await (await fetch(`${admin}/api/plugins`)).json()) as Array<{ name: string; state: unknown }>
  t.match(
    plugins.find(p => p.name === 'quota'),
    { state: { limit: 5 } }
  )

  const targets = (await (await fetch(`${admin}/api/targets`)).json()) as Array<{ name: string; credentials: unknown }>
  t.match(targets, [{ name: 'everything', credentials: null }], 'a target without auth: no credentials in the targets view')

  const m = parsePrometheus(await (await fetch(`${admin}/metrics`)).text())
  t.equal(m.get('quota_refusals_total')?.samples[0]?.value, 1, "a metric registered through env.metrics is scraped with the gateway's")
})
