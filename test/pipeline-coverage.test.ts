/**
 * Issue 22 item 1, through the real CLI: with an explicit `mcp.plugins` list,
 * a configured block that no listed stage acts on is a config error naming
 * both paths (exit 1, nothing served), and `--check` prints the pipeline that
 * will actually run, stage by stage. Before: `plugins: [cors]` with a
 * `mcpAuthentication` block started, served `initialize` without a token,
 * and `--check` said `authentication: strict`.
 */
import t from 'tap'
import { fileURLToPath } from 'node:url'
import { canConnect, configFile, freePort, runCli, spawnCli, waitForPort } from './helpers/cli.ts'

// Real CLI processes (and IdP logins): seconds each on a loaded machine, past the 120 s default.
t.setTimeout(300_000)

const EVERYTHING = fileURLToPath(new URL('../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const AUTH = [
  '    mcpAuthentication:',
  '      mode: strict',
  '      issuer: https://idp.example.test/app/',
  '      audiences: [c1]',
  '      resourceMetadata: { resource: "https://gw.example.test/mcp" }',
]
const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'anonymous', version: '1' } },
}

function config(port: number, plugins: string[], policies: string[]): Promise<string> {
  return configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      ...(plugins.length > 0 ? ['  plugins:', ...plugins.map(p => `    - ${p}`)] : []),
      '  policies:',
      ...policies,
      '  targets:',
      `    - { name: everything, stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] } }`,
      'admin: { enabled: false }',
      '',
    ].join('\n'),
    'mcpp-coverage-'
  )
}

t.test('plugins: [cors] with a mcpAuthentication block: refused at start and by --check, never served without a token', async t => {
  const port = await freePort()
  const file = await config(port, ['builtin: cors'], AUTH)
  const message = /mcp\.policies\.mcpAuthentication: configured, but the pipeline mcp\.plugins does not include builtin mcpAuthentication/

  const check = await runCli(['-f', file, '--check'], {}, 20000)
  t.equal(check.code, 1, `--check exits 1: ${check.stdout}${check.stderr}`)
  t.match(check.stderr, message)
  t.notMatch(check.stdout, /authentication: strict/, '--check does not claim authentication')

  const run = spawnCli(['-f', file])
  t.teardown(() => {
    if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGKILL')
  })
  // waitForPort gives up (rejects) once the process has exited without the port ever accepting.
  const listening = await waitForPort(port, run.exited).then(
    () => true,
    () => false
  )
  if (listening) {
    // The fault: the gateway serves. Show what it does with an anonymous initialize.
    const res = await fetch(`http://127.0.0.1:${port}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify(INIT),
    }).catch(() => undefined)
    await res?.text()
    t.fail(`the gateway started and answered an initialize without a token with ${res?.status}`)
    return
  }
  t.equal((await run.exited).code, 1, 'exit code 1: invalid configuration')
  t.match(run.output(), message)
  t.equal(await canConnect(port), false, 'nothing listens')
})

t.test('every configured block needs its stage: authorization rules, the facade block, a provider, inline options over a block', async t => {
  const cases: Array<{ name: string; plugins: string[]; policies: string[]; error: RegExp }> = [
    {
      name: 'authorization rules without the authorization stage',
      plugins: ['builtin: cors', 'builtin: mcpAuthentication'],
      policies: [...AUTH, '    authorization:', '      rules: [\'"mcp-users" in jwt.groups\']'],
      error: /mcp\.policies\.authorization: configured, but the pipeline mcp\.plugins does not include builtin authorization/,
    },
    {
      name: 'a facade block without oauthFacade',
      plugins: ['builtin: cors', 'builtin: mcpAuthentication'],
      policies: [...AUTH, '      clientId: c1', '      provider: { oss_idp: {} }', '      facade: {}'],
      error: /mcp\.policies\.mcpAuthentication\.facade: configured, but the pipeline mcp\.plugins does not include builtin oauthFacade/,
    },
    {
      name: 'a provider without the bridge and registration',
      plugins: ['builtin: cors', 'builtin: mcpAuthentication'],
      policies: [...AUTH, '      clientId: c1', '      provider: { oss_idp: {} }'],
      error:
        /mcp\.policies\.mcpAuthentication\.provider: configured, but the pipeline mcp\.plugins does not include builtin providerBridge\n\s+mcp\.policies\.mcpAuthentication\.provider: configured, but the pipeline mcp\.plugins does not include builtin registration/,
    },
    {
      name: 'a cors block while the listed cors has inline options',
      plugins: ['{ builtin: cors, options: { allowOrigins: ["https://a.example"] } }'],
      policies: ['    cors: { allowOrigins: ["https://b.example"] }'],
      error: /mcp\.policies\.cors: configured, but mcp\.plugins\[0\] gives builtin cors its options inline, which win; keep one of the two/,
    },
  ]
  for (const c of cases) {
    const file = await config(await freePort(), c.plugins, c.policies)
    const r = await runCli(['-f', file, '--check'], {}, 20000)
    t.equal(r.code, 1, `${c.name}: exit 1 (${r.stdout}${r.stderr})`)
    t.match(r.stderr, c.error, c.name)
  }
})

t.test('--check prints the pipeline that will run, in order, with what each stage enforces', async t => {
  const explicit = await config(
    await freePort(),
    ['builtin: cors', 'builtin: mcpAuthentication', 'builtin: authorization'],
    [...AUTH, '    authorization:', '      rules: [\'"mcp-users" in jwt.groups\']']
  )
  const r = await runCli(['-f', explicit, '--check'], {}, 20000)
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /pipeline: cors -> mcpAuthentication -> authorization \(mcp\.plugins\)/)
  t.match(r.stdout, /\n {4}1\. cors \(mcp\.plugins\[0\]\.options\): Origin checked/)
  t.match(
    r.stdout,
    /\n {4}2\. mcpAuthentication \(mcp\.policies\.mcpAuthentication\): strict: a valid bearer token required on every request; issuer https:\/\/idp\.example\.test\/app\/, audiences c1/
  )
  t.match(r.stdout, /\n {4}3\. authorization \(mcp\.policies\.authorization\): 1 rule over the token claims/)
  t.match(r.stdout, /authentication: strict, issuer https:\/\/idp\.example\.test\/app\//)

  const open = await config(await freePort(), [], ['    cors: {}'])
  const o = await runCli(['-f', open, '--check'], {}, 20000)
  t.equal(o.code, 0, o.stderr)
  t.match(o.stdout, /pipeline: cors \(default, from mcp\.policies\)/)
  t.match(o.stdout, /authentication: off \(no mcpAuthentication stage in the pipeline\)/)
})
