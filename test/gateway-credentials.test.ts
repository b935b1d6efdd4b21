/**
 * The whole gateway (core/gateway.ts) with targets that have `auth` blocks: the broker built from the
 * config (core/credentials/) reaches every target through the MCP layer, in both eras: a static bearer
 * and claim headers to an HTTP target (the conformance fixture behind a recording hop), claims in a
 * stdio child's environment (env-server.mjs), and a caller whose claims cannot make the credential
 * refused with the layer's error. Tokens are the dev IdP's, verified by mcpAuthentication.
 */
import t from 'tap'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { validateConfig } from '../core/config.ts'
import { startGateway } from '../core/gateway.ts'
import { builtins } from '../plugins/index.ts'
import { call } from './helpers/conformance-fixture.ts'
import { fixtureHttp } from './helpers/conformance-fixture.ts'
import { recordingProxy } from './helpers/recording-proxy.ts'
import { devIdp, ossOptions } from './helpers/idp.ts'
import { ROOT } from './helpers/gateway-harness.ts'
import { memoryLogger } from './helpers/logger.ts'

const STATIC_KEY = 'crm-static-key-0123456789'

t.test('the broker built from the config reaches every target, in both eras', async t => {
  const idp = await devIdp(t)
  const proxy = await recordingProxy(t, await fixtureHttp(t))
  const config = await validateConfig(
    {
      mcp: {
        port: 0,
        host: '127.0.0.1',
        policies: { mcpAuthentication: ossOptions(idp) },
        targets: [
          { name: 'crm', mcp: { url: proxy.url('crm'), headers: {} }, auth: { bearer: STATIC_KEY, headers: { 'X-User': '{sub}', 'X-Mail': '{email}' } } },
          {
            name: 'tools',
            stdio: { cmd: process.execPath, args: [join(ROOT, 'test/fixtures/env-server.mjs'), 'USER_ID'], env: {} },
            auth: { env: { USER_ID: '{sub}' } },
          },
        ],
      },
    },
    builtins
  )
  const { log, text } = memoryLogger('debug')
  const gw = await startGateway({ config, baseDir: ROOT, secretPaths: new Set() }, { mcpPort: 0, log, registry: builtins })
  t.teardown(() => gw.close())
  const url = gw.mcpUrl.replace('localhost', '127.0.0.1')
  const alice = await idp.mintToken({ sub: 'alice', email: 'alice@example.test', groups: ['mcp-users'] })

  const client = new Client({ name: 'gateway-credentials', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${alice}` } } })
  await client.connect(transport)
  t.teardown(() => client.close().catch(() => {}))
  const simple = (await client.callTool({ name: 'crm_test_simple_text', arguments: {} })) as { content: Array<{ text: string }> }
  t.match(simple.content[0]!.text, /simple text/)
  const env = (await client.callTool({ name: 'tools_env', arguments: {} })) as { content: Array<{ text: string }> }
  t.match(JSON.parse(env.content[0]!.text), { env: { USER_ID: 'alice' } }, "the stdio child runs with the caller's claim")

  const modern = await call(url, 'tools/call', { name: 'crm_test_simple_text', arguments: {} }, {}, { authorization: `Bearer ${alice}` })
  t.equal(modern.status, 200, '2026-07-28 too')

  const seen = proxy.of('crm')
  t.ok(
    seen.some(r => r.body?.method === 'tools/call'),
    'the calls reached the target'
  )
  for (const r of seen) {
    t.equal(r.headers.authorization, `Bearer ${STATIC_KEY}`, `${r.method} ${r.body?.method ?? ''}: the static bearer of this target`)
    t.equal(r.headers['x-user'], 'alice')
    t.equal(r.headers['x-mail'], 'alice@example.test')
  }
  t.notOk(JSON.stringify(seen).includes(alice), "the client's token never reached the target")

  const mallory = await idp.mintToken({ sub: 'mallory', groups: ['mcp-users'] })
  const refused = await call(url, 'tools/call', { name: 'crm_test_simple_text', arguments: {} }, {}, { authorization: `Bearer ${mallory}` })
  t.equal(refused.status, 403, 'a caller without the claim a header needs: refused')
  t.match(refused.json, { error: { message: /crm/ } })
  t.notOk(
    proxy.of('crm').some(r => r.headers['x-user'] === 'mallory'),
    'nothing reached the target for mallory'
  )
  t.notOk(text().includes(alice), "the caller's token is in no log line")
  t.notOk(text().includes(STATIC_KEY), "nor the target's secret")
})
