/**
 * Start-up, readiness and shutdown of the real CLI, black-box (issue 13
 * items 1, 17, 22, 23): requests that arrive the moment the port accepts get
 * normal answers; an unreachable IdP does not hold up what does not need it;
 * /readyz reports targets that cannot start; SIGTERM does not wait for idle
 * GET or listen streams.
 */
import t from 'tap'
import type { Test } from 'tap'
import { join } from 'node:path'
import { createServer as createHttpServer } from 'node:http'
import { createServer as createTcpServer, type Socket } from 'node:net'
import { spawnCli, waitForPort, freePort, eventually, ROOT, configFile as writeConfig } from './helpers/cli.ts'
import { devIdp } from './helpers/idp.ts'

const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js')
const SLOW_PLUGIN = join(ROOT, 'test/fixtures/plugins/slow-create.js')
const ORIGIN = 'http://app.example.test'
const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
})
const MCP_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

function configFile(lines: string[]): Promise<string> {
  return writeConfig(lines.join('\n') + '\n', 'mcpp-startup-')
}

/** The CLI as a child process, SIGKILLed in teardown if the test left it running. */
function cli(t: Test, file: string): ReturnType<typeof spawnCli> {
  const run = spawnCli(['-f', file])
  t.teardown(() => {
    if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGKILL')
  })
  return run
}

/** Resolves when the process exits: a start-up failure ends the wait for the port instead of a timeout. */
const guard = (run: ReturnType<typeof spawnCli>): Promise<unknown> => run.exited

const targetLines = (name = 'everything'): string[] => [`    - name: ${name}`, `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`]

t.test('requests that arrive the moment the port accepts get normal answers (slow plugin, slow IdP keys)', async t => {
  const idp = await devIdp(t)
  // The real IdP's key set behind a hop that answers after a while: start-up that waits for it is slow.
  const slowJwks = createHttpServer((_req, res) => {
    setTimeout(() => {
      fetch(idp.jwksUrl).then(
        async r => {
          res.writeHead(r.status, { 'content-type': 'application/json' })
          res.end(await r.text())
        },
        () => {
          res.writeHead(502)
          res.end()
        }
      )
    }, 1500)
  })
  await new Promise<void>(resolve => slowJwks.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    slowJwks.closeAllConnections()
    slowJwks.close()
  })
  const jwks = `http://127.0.0.1:${(slowJwks.address() as import('node:net').AddressInfo).port}/jwks/`
  const port = await freePort()
  const adminPort = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    '  policies:',
    `    cors: { allowOrigins: ["${ORIGIN}"] }`,
    '    mcpAuthentication:',
    '      mode: strict',
    `      issuer: "${idp.issuer}"`,
    `      audiences: ["${idp.clientId}"]`,
    `      jwks: "${jwks}"`,
    `      clientId: "${idp.clientId}"`,
    '      provider: { oss_idp: {} }',
    `      resourceMetadata: { resource: "http://localhost:${port}/mcp" }`,
    '  plugins:',
    '    - builtin: cors',
    '    - builtin: mcpAuthentication',
    '    - builtin: providerBridge',
    '    - builtin: registration',
    `    - module: "${SLOW_PLUGIN}"`,
    '      options: { delayMs: 2500 }',
    `admin: { port: ${adminPort} }`,
  ])
  const token = await idp.mintToken({ sub: 'alice', groups: ['mcp-users'] })
  const run = cli(t, file)
  await waitForPort(port, guard(run))
  // The admin listener is bound right after the MCP port, before the (slow) plugins exist.
  await waitForPort(adminPort, guard(run))
  const [health, early] = await Promise.all([fetch(`http://127.0.0.1:${adminPort}/healthz`), fetch(`http://127.0.0.1:${adminPort}/readyz`)])
  t.equal(health.status, 200, '/healthz answers during start-up')
  t.equal(early.status, 503, '/readyz is not ready during start-up')
  t.same(await early.json(), { status: 'not ready', reasons: ['the gateway is starting'] })
  const base = `http://127.0.0.1:${port}`
  const [init, prm, asm, preflight] = await Promise.all([
    fetch(`${base}/mcp`, { method: 'POST', headers: { ...MCP_HEADERS, authorization: `Bearer ${token}` }, body: INIT }),
    fetch(`${base}/.well-known/oauth-protected-resource/mcp`),
    fetch(`${base}/.well-known/oauth-authorization-server`),
    fetch(`${base}/mcp`, {
      method: 'OPTIONS',
      headers: { origin: ORIGIN, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
    }),
  ])
  const initBody = await init.text()
  t.equal(init.status, 200, init.status === 200 ? 'initialize' : `initialize: ${initBody}`)
  t.ok(init.headers.get('mcp-session-id'), 'a session was opened')
  t.match(initBody, /"protocolVersion":"2025-06-18"/)
  t.equal(prm.status, 200, 'protected resource metadata')
  t.equal(((await prm.json()) as { resource: string }).resource, `http://localhost:${port}/mcp`)
  t.equal(asm.status, 200, 'authorization server metadata')
  t.equal(((await asm.json()) as { issuer: string }).issuer, idp.issuer)
  t.equal(preflight.status, 204, 'CORS preflight')
  t.equal(preflight.headers.get('access-control-allow-origin'), ORIGIN)
  t.notMatch(run.output(), /"level":50/, 'nothing logged at error level')
  const ready = await fetch(`http://127.0.0.1:${adminPort}/readyz`)
  t.equal(ready.status, 200, 'ready once started and the keys are loaded')
  await ready.text()
  run.child.kill('SIGTERM')
  t.equal((await run.exited).code, 0)
})

t.test('IdP unreachable at start (connections hang): what does not need it is served, /readyz explains the rest', async t => {
  // Accepts and never answers, like an IdP whose packets are dropped.
  const held = new Set<Socket>()
  const hang = createTcpServer(s => {
    held.add(s)
    s.on('close', () => held.delete(s))
  })
  await new Promise<void>(resolve => hang.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    for (const s of held) s.destroy()
    hang.close()
  })
  const issuer = `http://127.0.0.1:${(hang.address() as import('node:net').AddressInfo).port}/application/o/mcp/`
  const port = await freePort()
  const adminPort = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    '  policies:',
    '    mcpAuthentication:',
    '      mode: strict',
    `      issuer: "${issuer}"`,
    '      audiences: ["mcp-gateway-dev"]',
    '      clientId: "mcp-gateway-dev"',
    '      provider: { oss_idp: {} }',
    `      resourceMetadata: { resource: "http://localhost:${port}/mcp" }`,
    // Key fetches give up after a second; discovery would hang for a minute.
    '      keySet: { timeoutMs: 1000 }',
    '      discovery: { timeoutMs: 60000 }',
    `admin: { port: ${adminPort} }`,
  ])
  const idp = await devIdp(t)
  const token = await idp.mintToken({ sub: 'alice', iss: issuer })
  const run = cli(t, file)
  await waitForPort(port, guard(run))
  const base = `http://127.0.0.1:${port}`
  const prm = await fetch(`${base}/.well-known/oauth-protected-resource/mcp`)
  t.equal(prm.status, 200, 'protected resource metadata needs no IdP')
  t.equal(((await prm.json()) as { resource: string }).resource, `http://localhost:${port}/mcp`)
  const noToken = await fetch(`${base}/mcp`, { method: 'POST', headers: MCP_HEADERS, body: INIT })
  t.equal(noToken.status, 401, 'a request without a token is answered as always')
  t.equal(((await noToken.json()) as { error_description: string }).error_description, 'JWT token required')
  await waitForPort(adminPort, guard(run))
  const admin = `http://127.0.0.1:${adminPort}`
  const health = await fetch(`${admin}/healthz`)
  t.equal(health.status, 200, '/healthz')
  const ready = await fetch(`${admin}/readyz`)
  t.equal(ready.status, 503, '/readyz is not ready')
  const reasons = ((await ready.json()) as { reasons: string[] }).reasons
  t.match(reasons.join('\n'), /mcpAuthentication: signing keys not loaded/)
  t.match(reasons.join('\n'), /providerBridge: identity provider discovery document not fetched/)
  const withToken = await fetch(`${base}/mcp`, { method: 'POST', headers: { ...MCP_HEADERS, authorization: `Bearer ${token}` }, body: INIT })
  t.equal(withToken.status, 503, 'a token that needs the keys: 503, never 401')
  t.ok(withToken.headers.get('retry-after'), 'with Retry-After')
  await withToken.text()
  run.child.kill('SIGTERM')
  t.equal((await run.exited).code, 0)
})

t.test('SIGTERM ends idle GET streams at once and exits without waiting for shutdownGraceMs', async t => {
  const port = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    // A wait for the idle stream would outlast the test's timeout by far.
    '  limits: { shutdownGraceMs: 3600000 }',
    'admin: { enabled: false }',
  ])
  const run = cli(t, file)
  await waitForPort(port, guard(run))
  const base = `http://127.0.0.1:${port}`
  const init = await fetch(`${base}/mcp`, { method: 'POST', headers: MCP_HEADERS, body: INIT })
  t.equal(init.status, 200)
  await init.text()
  const sid = init.headers.get('mcp-session-id')!
  const initialized = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { ...MCP_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  })
  t.equal(initialized.status, 202)
  const stream = await fetch(`${base}/mcp`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' } })
  t.equal(stream.status, 200)
  t.equal(stream.headers.get('content-type'), 'text/event-stream')
  const ended = stream.text().then(
    () => 'ended',
    (err: Error) => `cut: ${err.message}`
  )
  run.child.kill('SIGTERM')
  t.equal((await run.exited).code, 0, 'exits 0')
  t.equal(await ended, 'ended', 'the GET stream was ended cleanly')
})

t.test('SIGTERM ends an idle subscriptions/listen stream (revision 2026-07-28) with its result and exits', async t => {
  const port = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    '  limits: { shutdownGraceMs: 3600000 }',
    'admin: { enabled: false }',
  ])
  const run = cli(t, file)
  await waitForPort(port, guard(run))
  const meta = {
    'io.modelcontextprotocol/protocolVersion': '2026-07-28',
    'io.modelcontextprotocol/clientCapabilities': {},
    'io.modelcontextprotocol/clientInfo': { name: 't', version: '1' },
  }
  const res = await fetch(`http://127.0.0.1:${port}/mcp`, {
    method: 'POST',
    headers: { ...MCP_HEADERS, 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'subscriptions/listen' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 'listen-1',
      method: 'subscriptions/listen',
      params: { notifications: { toolsListChanged: true }, _meta: meta },
    }),
  })
  t.equal(res.status, 200)
  const reader = res.body!.getReader()
  let text = ''
  while (!text.includes('\n\n')) {
    const { value, done } = await reader.read()
    if (done) break
    text += Buffer.from(value).toString('utf8')
  }
  t.match(text, /notifications\/subscriptions\/acknowledged/, 'the stream is open and acknowledged')
  run.child.kill('SIGTERM')
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    text += Buffer.from(value).toString('utf8')
  }
  t.match(text, /"id":"listen-1","result"/, 'the listen request got its result and the stream ended')
  t.equal((await run.exited).code, 0, 'exits 0')
})

interface ReadyBody {
  status: string
  reasons: string[]
  targets: Array<{ name: string; ok: boolean; error?: string }>
}

t.test('/readyz reports a target that cannot start; mcp.readiness.targets decides whether that is not ready', async t => {
  const broken = ['    - name: broken', '      stdio: { cmd: mcpp-no-such-command-7f3a, args: [] }']
  const cases: Array<{ name: string; targets: string[]; readiness?: string; status: number; listed: Array<[string, boolean]> }> = [
    { name: 'the only target cannot start: not ready (default)', targets: broken, status: 503, listed: [['broken', false]] },
    {
      name: 'one of two cannot start: sessions still open, ready (default any)',
      targets: [...targetLines(), ...broken],
      status: 200,
      listed: [
        ['everything', true],
        ['broken', false],
      ],
    },
    {
      name: 'one of two cannot start, readiness.targets: all',
      targets: [...targetLines(), ...broken],
      readiness: 'all',
      status: 503,
      listed: [
        ['everything', true],
        ['broken', false],
      ],
    },
  ]
  for (const c of cases) {
    const port = await freePort()
    const adminPort = await freePort()
    const file = await configFile([
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      '  targets:',
      ...c.targets,
      ...(c.readiness === undefined ? [] : [`  readiness: { targets: ${c.readiness} }`]),
      `admin: { port: ${adminPort} }`,
    ])
    const run = cli(t, file)
    await waitForPort(adminPort, guard(run))
    // The admin port answers "starting" until the gateway has started.
    const readyz = async (): Promise<{ r: Response; body: ReadyBody }> => {
      const r = await fetch(`http://127.0.0.1:${adminPort}/readyz`)
      return { r, body: (await r.json()) as ReadyBody }
    }
    const { r, body } = await eventually(readyz, x => !x.body.reasons.includes('the gateway is starting'))
    t.equal(r.status, c.status, c.name)
    t.same(
      body.targets.map(x => [x.name, x.ok]),
      c.listed,
      'every target is reported'
    )
    t.match(body.targets.find(x => x.name === 'broken')!.error, /mcpp-no-such-command-7f3a: command not found/)
    if (c.status === 503) t.match(body.reasons.join('\n'), /target broken: mcpp-no-such-command-7f3a: command not found/)
    else t.same(body.reasons, [])
    if (c.targets === broken) {
      const init = await fetch(`http://127.0.0.1:${port}/mcp`, { method: 'POST', headers: MCP_HEADERS, body: INIT })
      t.equal(init.status, 502, 'and indeed initialize fails')
      await init.text()
    }
    run.child.kill('SIGTERM')
    t.equal((await run.exited).code, 0)
  }
})

t.test('an admin port in use still exits 3', async t => {
  const blocker = createTcpServer()
  await new Promise<void>(resolve => blocker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    blocker.close()
  })
  const port = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    `admin: { port: ${(blocker.address() as import('node:net').AddressInfo).port} }`,
  ])
  const run = cli(t, file)
  t.equal((await run.exited).code, 3)
  t.match(
    run.output(),
    `cannot listen: admin.port ${(blocker.address() as import('node:net').AddressInfo).port} is already in use (EADDRINUSE)`,
    'the message names the setting'
  )
})

t.test('a plugin that fails to start still exits 3', async t => {
  const port = await freePort()
  const file = await configFile([
    'mcp:',
    `  port: ${port}`,
    '  host: 127.0.0.1',
    '  targets:',
    ...targetLines(),
    '  plugins:',
    `    - module: "${join(ROOT, 'test/fixtures/plugins/throws-on-create.js')}"`,
    'admin: { enabled: false }',
  ])
  const run = cli(t, file)
  const { code } = await run.exited
  t.equal(code, 3)
  t.match(run.output(), /throws-on-create failed to start: cannot reach the quota service/)
})
