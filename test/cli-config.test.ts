/**
 * The real CLI against configurations that must fail (or pass) the same way
 * in --check and at start-up: plugin options validated by each plugin's own
 * schema, dependencies between plugins, values bound for headers, the one
 * issuer parser (issue 13 items 13-15, issue 14 items 1-2).
 */
import t from 'tap'
import { runCli, spawnCli, waitForPort, freePort, configFile, canConnect } from './helpers/cli.ts'

t.test('inline options of a built-in are validated against its schema: exit 1 naming the path, in --check and at start-up', async t => {
  const port = await freePort()
  const file = await configFile(
    `mcp:\n  port: ${port}\n  host: 127.0.0.1\n  plugins:\n    - builtin: cors\n      options: { tyypo: 1 }\n  targets:\n    - name: a\n      stdio: { cmd: node }\nadmin: { enabled: false }\n`
  )
  for (const args of [
    ['-f', file, '--check'],
    ['-f', file],
  ]) {
    const r = await runCli(args, {}, 15000)
    t.equal(r.code, 1, `${args.join(' ')}: ${r.stderr}`)
    t.match(r.stderr, /mcp\.plugins\[0\]\.options\.tyypo: unknown key/)
    t.notMatch(r.stderr, /is not a function/)
  }
  t.equal(await canConnect(port), false)
})

t.test('a plugin whose dependency is not in the pipeline fails --check, naming both plugins', async t => {
  const file = await configFile(
    [
      'mcp:',
      '  port: 0',
      '  plugins:',
      '    - builtin: registration',
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      '      issuer: https://idp.example.test/app/',
      '      audiences: [c1]',
      '      clientId: c1',
      '      provider: { oss_idp: {} }',
      '      resourceMetadata: { resource: "https://gw.example.test/mcp" }',
      '  targets:',
      '    - name: a',
      '      stdio: { cmd: node }',
      '',
    ].join('\n')
  )
  const r = await runCli(['-f', file, '--check'], {}, 15000)
  t.equal(r.code, 1, r.stderr)
  t.match(r.stderr, /mcp\.plugins\[0\]: plugin registration needs "idp", provided by mcpAuthentication, which is not in the pipeline/)
})

t.test('a ${NAME} value bound for a response header is checked at load: exit 1 naming the path', async t => {
  const port = await freePort()
  const file = await configFile(
    [
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      '  policies:',
      '    cors: { allowOrigins: ["https://app.example"], exposeHeaders: ["${MCPP_TEST_HEADER}"] }',
      '    mcpAuthentication:',
      '      mode: strict',
      '      issuer: https://idp.example.test/app/',
      '      audiences: [c1]',
      '      jwks: https://idp.example.test/app/jwks/',
      '      resourceMetadata: { resource: "http://127.0.0.1:1/mcp", scopesSupported: ["${MCPP_TEST_SCOPE}"] }',
      '  targets:',
      '    - name: a',
      '      stdio: { cmd: node }',
      'admin: { enabled: false }',
      '',
    ].join('\n')
  )
  const env = { MCPP_TEST_SCOPE: 'openid\r\nset-cookie: x=1', MCPP_TEST_HEADER: 'Mcp-Session-Id\nX' }
  for (const args of [
    ['-f', file, '--check'],
    ['-f', file],
  ]) {
    const r = await runCli(args, env, 15000)
    t.equal(r.code, 1, `${args.join(' ')}: ${r.stderr}`)
    t.match(r.stderr, /mcp\.policies\.mcpAuthentication\.resourceMetadata\.scopesSupported\[0\]: must not contain control characters/)
    t.match(r.stderr, /mcp\.policies\.cors\.exposeHeaders\[0\]: must not contain control characters/)
    t.notMatch(r.stderr, /set-cookie/, 'the value itself is not echoed')
  }
  t.equal(await canConnect(port), false)
})

t.test('one issuer parser: --check and start-up give the same verdict for a v1 cloud issuer', async t => {
  const port = await freePort()
  const file = await configFile(
    [
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      '      issuer: https://sts.microsoftonline.de/t1/',
      '      audiences: [c1]',
      '      clientId: c1',
      '      provider: { cloud_idp: {} }',
      // Nothing is reachable from the tests: fail fast instead of waiting for the defaults.
      '      keySet: { timeoutMs: 200 }',
      '      discovery: { timeoutMs: 200 }',
      `      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp" }`,
      '  targets:',
      '    - name: a',
      '      stdio: { cmd: node }',
      'admin: { enabled: false }',
      '',
    ].join('\n')
  )
  const check = await runCli(['-f', file, '--check'])
  t.equal(check.code, 0, check.stderr)
  const run = spawnCli(['-f', file])
  let exit: { code: number | null } | undefined
  void run.exited.then(e => {
    exit = e
  })
  t.teardown(async () => {
    if (exit === undefined) {
      run.child.kill('SIGTERM')
      await run.exited
    }
  })
  await waitForPort(port, run.exited).catch(() => {})
  // Asked as soon as the port accepts: the gateway holds it until start-up is done (or dies at it, as it did).
  const prm = await fetch(`http://127.0.0.1:${port}/.well-known/oauth-protected-resource/mcp`).catch(() => undefined)
  t.equal(exit, undefined, `start-up agrees with --check: ${run.output()}`)
  t.equal(prm?.status, 200)
  t.equal(((await prm?.json()) as { resource: string } | undefined)?.resource, `http://127.0.0.1:${port}/mcp`)
})
