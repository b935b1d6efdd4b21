/**
 * README "Security notes", gateway-wide claims without a test of their own
 * (issue 22 item 18), from the outside: whole gateways (core/gateway.ts from a
 * config) in front of server-everything over stdio, real sockets. The admin
 * listener's default address; `mcp.trustedProxies` deciding who the anonymous
 * subject is behind a proxy; `mcp.limits.maxToolLabels` bounding tool labels
 * on /metrics.
 */
import t from 'tap'
import { connect } from 'node:net'
import { fullGateway } from './helpers/full-gateway.ts'
import { freePort, runCli, configFile } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/facade.ts'
import { parsePrometheus } from './helpers/admin.ts'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
})
const everything = { name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }

/** Whether `host:port` accepts a TCP connection now. */
const accepts = (host: string, port: number): Promise<boolean> =>
  new Promise(resolve => {
    const s = connect(port, host)
    s.once('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.once('error', () => resolve(false))
  })

async function post(url: string, body: string, headers: Record<string, string> = {}): Promise<{ status: number; sid: string | null; text: string }> {
  const res = await fetch(url, { method: 'POST', headers: { ...HEADERS, ...headers }, body })
  return { status: res.status, sid: res.headers.get('mcp-session-id'), text: await res.text() }
}

t.test('the admin listener binds 127.0.0.1 by default: another local address cannot reach it', async t => {
  const port = await freePort()
  const g = await fullGateway(t, { targets: [everything] }, 'info', { admin: { port } })
  t.equal(new URL(g.gw.adminUrl!).port, String(port))
  t.equal(await accepts('127.0.0.1', port), true, 'reachable on 127.0.0.1')
  t.equal(await accepts('127.0.0.2', port), false, 'not on 127.0.0.2 (Linux routes all of 127/8 to lo: only the bind address decides)')
  // Control: exposed on purpose, the same check reaches it.
  const exposedPort = await freePort()
  const exposed = await fullGateway(t, { targets: [everything] }, 'info', { admin: { host: '0.0.0.0', port: exposedPort } })
  t.equal(await accepts('127.0.0.2', exposedPort), true, 'control: admin.host 0.0.0.0 is reachable from 127.0.0.2')
  t.match(exposed.logText(), /admin listener is exposed/, 'and that is warned about')
})

t.test(
  "mcp.trustedProxies: behind a listed proxy anonymous callers are one subject per forwarded address; behind an unlisted one they share the proxy's",
  async t => {
    const session = { maxSessionsPerSubject: 1 }
    const listed = await fullGateway(t, { targets: [everything], session, trustedProxies: ['127.0.0.1'] })
    const unlisted = await fullGateway(t, { targets: [everything], session })
    const alice = { 'x-forwarded-for': '203.0.113.10' }
    const bob = { 'x-forwarded-for': '203.0.113.20' }

    const a = await post(listed.url, INIT, alice)
    t.equal(a.status, 200, 'listed proxy: alice opens a session')
    t.equal((await post(listed.url, INIT, bob)).status, 200, 'listed proxy: bob is another subject (his own cap)')
    t.equal((await post(listed.url, INIT, alice)).status, 429, "listed proxy: alice's cap of 1 holds")
    const list = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    t.equal((await post(listed.url, list, { ...bob, 'mcp-session-id': a.sid! })).status, 404, "alice's session does not answer bob's address")
    t.equal((await post(listed.url, list, { ...alice, 'mcp-session-id': a.sid! })).status, 200, "it answers alice's")

    t.equal((await post(unlisted.url, INIT, alice)).status, 200, 'unlisted proxy: the first caller opens a session')
    t.equal((await post(unlisted.url, INIT, bob)).status, 429, "unlisted proxy: X-Forwarded-For is not believed, every caller is the proxy's one subject")
  }
)

t.test('mcp.limits.maxToolLabels: only that many advertised tool names become labels; the rest, and made-up names, are other', async t => {
  const probesPort = await freePort()
  const g = await fullGateway(t, { targets: [everything], limits: { maxToolLabels: 2 } }, 'info', { probes: { host: '127.0.0.1', port: probesPort } })
  const init = await post(g.url, INIT)
  const headers = { 'mcp-session-id': init.sid!, 'mcp-protocol-version': '2025-06-18' }
  await post(g.url, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), headers)
  const listed = await post(g.url, JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }), headers)
  // An SSE answer may carry the server's notifications before the response: take the message with id 1.
  const messages = (
    listed.text.startsWith('{')
      ? [listed.text]
      : listed.text
          .split('\n')
          .filter(l => l.startsWith('data: '))
          .map(l => l.slice(6))
  ).map(m => JSON.parse(m) as { id?: number; result?: { tools: Array<{ name: string }> } })
  const names = messages.find(m => m.id === 1)?.result?.tools.map(x => x.name) ?? []
  t.ok(names.length > 2, `the target advertises ${names.length} tools`)
  t.ok(names.includes('echo') && names.includes('get-sum'))
  const call = (id: number, name: string, args: Record<string, unknown>) =>
    post(g.url, JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }), headers)
  const labelled = names.slice(0, 2)
  const beyond = names.includes('get-sum') && !labelled.includes('get-sum') ? 'get-sum' : undefined
  t.ok(beyond, 'get-sum is advertised beyond the first two')
  await call(2, labelled.includes('echo') ? 'echo' : labelled[0]!, { message: 'hi' })
  await call(3, 'get-sum', { a: 1, b: 2 })
  await call(4, 'made-up-tool-name-7f3', {})
  const metrics = await (await fetch(`${g.gw.probesUrl}/metrics`)).text()
  const tools = new Set<string>()
  for (const s of parsePrometheus(metrics).get('mcp_proxy_tool_calls_total')?.samples ?? []) if (s.labels.tool !== undefined) tools.add(s.labels.tool)
  t.ok(tools.size > 0, 'tool calls were counted')
  t.ok(
    [...tools].every(x => labelled.includes(x) || x === 'other'),
    `labels ${[...tools].join(', ')} are among the first two advertised names or other`
  )
  t.ok(tools.has('other'), 'the advertised name beyond the limit and the made-up name are other')
  t.notOk(metrics.includes('made-up-tool-name-7f3'), 'a made-up name is never a label')
  t.notOk(tools.has('get-sum'), 'an advertised name beyond maxToolLabels is not a label')
})

t.test('a ${NAME} value bound for an HTTP header that holds a newline is refused at load, naming its path (real CLI)', async t => {
  const file = await configFile(
    [
      'mcp:',
      '  port: 0',
      '  host: 127.0.0.1',
      '  targets:',
      '    - name: everything',
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      '      issuer: "https://idp.example.test/app/"',
      '      audiences: [gw]',
      '      clientId: gw',
      '      provider: { oss_idp: {} }',
      '      resourceMetadata: { resource: "https://gw.example.test/mcp", scopesSupported: [openid, "${SCOPE}"] }',
      'admin: { enabled: false }',
    ].join('\n') + '\n',
    'mcpp-header-value-'
  )
  const [bad, good] = await Promise.all([
    runCli(['-f', file, '--check'], { SCOPE: 'profile\r\nx-injected: 1' }),
    runCli(['-f', file, '--check'], { SCOPE: 'profile' }),
  ])
  t.not(bad.code, 0, 'refused')
  t.match(bad.stdout + bad.stderr, /mcp\.policies\.mcpAuthentication\.resourceMetadata\.scopesSupported(\.|\[|\/)1/, 'the path is named')
  t.match(bad.stdout + bad.stderr, /control characters/)
  t.equal(good.code, 0, `control: the same file with a plain value passes: ${good.stderr}`)
})
