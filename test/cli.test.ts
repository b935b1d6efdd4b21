import t from 'tap'
import { readFile } from 'node:fs/promises'
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { createServer } from 'node:net'
import { runCli, startCli, freePort, isAlive, eventually, ROOT, configFile, canConnect } from './helpers/cli.ts'

const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js')

function childrenOf(pid: number): number[] {
  try {
    return execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' })
      .split('\n')
      .map(s => Number(s.trim()))
      .filter(Boolean)
  } catch {
    return []
  }
}

t.test('--help and --version exit 0', async t => {
  const help = await runCli(['--help'])
  t.equal(help.code, 0)
  t.match(help.stdout, /Usage: mcp-proxy -f <config\.yaml>/)
  t.match(help.stdout, /Exit codes: 0 ok, 1 invalid configuration, 2 usage error, 3 start-up failure/)
  const version = await runCli(['--version'])
  t.equal(version.code, 0)
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }
  t.equal(version.stdout.trim(), pkg.version)
})

t.test('usage errors exit 2', async t => {
  const none = await runCli([])
  t.equal(none.code, 2)
  t.match(none.stderr, /missing -f <config\.yaml>/)
  const unknown = await runCli(['--frobnicate'])
  t.equal(unknown.code, 2)
  t.match(unknown.stderr, /frobnicate/)
})

t.test('an unset ${NAME} exits 1 with "environment variable not found" and does not listen', async t => {
  const port = await freePort()
  const file = await configFile(
    `mcp:\n  port: ${port}\n  host: 127.0.0.1\n  baseUrl: "\${MCPP_TEST_UNSET_VAR}"\n  targets:\n    - name: a\n      stdio: { cmd: node }\nadmin: { enabled: false }\n`
  )
  const env = { ...process.env }
  delete env.MCPP_TEST_UNSET_VAR
  const r = await runCli(['-f', file], env)
  t.equal(r.code, 1)
  t.match(r.stderr, /environment variable not found/)
  t.match(r.stderr, /MCPP_TEST_UNSET_VAR/)
  t.equal(await canConnect(port), false, 'nothing listens on the configured port')
})

t.test('an invalid config exits 1 naming every path', async t => {
  const file = await configFile('mcp:\n  port: 99999\n  targets: []\n  bogus: 1\n')
  const r = await runCli(['-f', file])
  t.equal(r.code, 1)
  t.match(r.stderr, /mcp\.port: must be <= 65535/)
  t.match(r.stderr, /mcp\.targets: must NOT have fewer than 1 items/)
  t.match(r.stderr, /mcp\.bogus: unknown key/)
  const missing = await runCli(['-f', '/nonexistent/mcpp.yaml'])
  t.equal(missing.code, 1)
  t.match(missing.stderr, /cannot read config file/)
})

t.test('--check validates, prints a summary and exits without listening', async t => {
  const port = await freePort()
  const file = await configFile(
    `mcp:\n  port: ${port}\n  targets:\n    - name: everything\n      stdio: { cmd: node, args: [x.js] }\n    - name: remote\n      mcp: { url: "http://127.0.0.1:1/mcp" }\n  policies:\n    authorization:\n      rules: ['"a" in jwt.groups']\n`
  )
  const ok = await runCli(['-f', file, '--check'])
  t.equal(ok.code, 0, ok.stderr)
  t.match(ok.stdout, /config OK/)
  t.match(ok.stdout, /\n {2}targets:\n {4}everything: stdio node x\.js\n {4}remote: http http:\/\/127\.0\.0\.1:1\/mcp\n/, 'each target, where it runs, no auth')
  t.match(ok.stdout, /pipeline: cors -> authorization/)
  const bad = await configFile(
    `mcp:\n  port: ${port}\n  targets:\n    - name: a\n      stdio: { cmd: node }\n  policies:\n    authorization:\n      rules: ['"a" in jwt.groups', 'jwt.groups ==']\n`
  )
  const r = await runCli(['-f', bad, '--check'])
  t.equal(r.code, 1)
  t.match(r.stderr, /mcp\.policies\.authorization\.rules\[1\]/)
})

t.test('a port in use exits 3', async t => {
  const blocker = createServer()
  await new Promise<void>(resolve => blocker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => blocker.close(() => resolve())))
  const port = (blocker.address() as import('node:net').AddressInfo).port
  const file = await configFile(`mcp:\n  port: ${port}\n  host: 127.0.0.1\n  targets:\n    - name: a\n      stdio: { cmd: node }\nadmin: { enabled: false }\n`)
  const r = await runCli(['-f', file])
  t.equal(r.code, 3)
  t.match(r.stderr, `mcp-proxy: cannot listen: mcp.port ${port} is already in use (EADDRINUSE) on 127.0.0.1`, 'the message names the setting')
})

t.test('a probes port in use names probes.port', async t => {
  const blocker = createServer()
  await new Promise<void>(resolve => blocker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => blocker.close(() => resolve())))
  const port = (blocker.address() as import('node:net').AddressInfo).port
  const file = await configFile(
    `mcp:\n  port: ${await freePort()}\n  host: 127.0.0.1\n  targets:\n    - name: a\n      stdio: { cmd: node }\nadmin: { enabled: false }\nprobes: { port: ${port}, host: 127.0.0.1 }\n`
  )
  const r = await runCli(['-f', file])
  t.equal(r.code, 3)
  t.match(r.stderr, `cannot listen: probes.port ${port} is already in use (EADDRINUSE) on 127.0.0.1`)
})

t.test('with workers, an admin port in use names admin.port (the primary binds it)', async t => {
  const blocker = createServer()
  await new Promise<void>(resolve => blocker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => blocker.close(() => resolve())))
  const port = (blocker.address() as import('node:net').AddressInfo).port
  const file = await configFile(
    `mcp:\n  port: ${await freePort()}\n  host: 127.0.0.1\n  targets:\n    - name: a\n      stdio: { cmd: node }\nadmin: { port: ${port}, host: 127.0.0.1 }\n`
  )
  const r = await runCli(['-f', file, '--workers', '2'])
  t.equal(r.code, 3)
  t.match(r.stderr, `cannot listen: admin.port ${port} is already in use (EADDRINUSE) on 127.0.0.1`)
})

t.test('--schema prints the editor schema of this install, a file that exists', async t => {
  const r = await runCli(['--schema'])
  t.equal(r.code, 0)
  const path = r.stdout.trim()
  t.equal(path, join(ROOT, 'schemas/editor.schema.json'))
  t.match(JSON.parse(await readFile(path, 'utf8')), { $schema: String })
})

t.test('SIGTERM stops accepting, ends every child process and exits 0', async t => {
  const port = await freePort()
  const adminPort = await freePort()
  const file = await configFile(
    [
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      '  targets:',
      '    - name: everything',
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      `admin: { port: ${adminPort} }`,
      'logging: { level: info }',
      '',
    ].join('\n')
  )
  const { child, output } = await startCli(['-f', file])
  t.match(output(), new RegExp(`UI at http://localhost:${adminPort}/ui`), 'the start-up log reports the UI URL')
  const res = await fetch(`http://127.0.0.1:${port}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  })
  t.equal(res.status, 200)
  t.ok(res.headers.get('mcp-session-id'))
  await res.text()
  const kids = await eventually(
    () => childrenOf(child.pid!),
    k => k.length > 0
  )
  t.ok(kids.length > 0, 'a child process serves the session')
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  child.kill('SIGTERM')
  t.equal(await exited, 0)
  const alive = await eventually(
    () => kids.filter(isAlive),
    a => a.length === 0
  )
  t.same(alive, [], 'no child process is left')
  t.equal(await canConnect(port), false)
})
