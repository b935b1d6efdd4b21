/**
 * StdioUpstream against real child processes: server-everything for the happy
 * path, test/fixtures/faulty-server.mjs for every fault (ENOENT, crash, flood,
 * garbage, env allow-list, SIGTERM-ignoring child, grandchildren).
 */
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import type { Logger } from '../core/logger.ts'
import { Writable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { pino } from 'pino'
import { StdioUpstream, killAllChildren, liveChildCount, childEnv, CHILD_ENV_ALLOW_LIST } from '../core/targets/stdio.ts'
import { createUpstreamFactory } from '../core/targets/index.ts'
import { ProxyError } from '../core/errors.ts'
import { Metrics } from '../core/observability/metrics.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { processGone } from './helpers/gateway-harness.ts'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const FIXTURE = join(here, 'fixtures', 'faulty-server.mjs')
const EVERYTHING = join(root, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js')

function memoryLog(): { log: Logger; lines: () => Array<Record<string, unknown>> } {
  const out: string[] = []
  const dest = new Writable({
    write(chunk, _enc, cb) {
      out.push(...String(chunk).split('\n').filter(Boolean))
      cb()
    },
  })
  return { log: pino({ level: 'debug' }, dest) as unknown as Logger, lines: () => out.map(l => JSON.parse(l) as Record<string, unknown>) }
}

/** Polls `fn` until it is true, at most `tries` times `stepMs` apart. */
async function until(fn: () => boolean, tries = 200, stepMs = 25): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    if (fn()) return true
    await new Promise(resolve => setTimeout(resolve, stepMs))
  }
  return fn()
}

interface Harness {
  up: StdioUpstream
  request: (method: string, params?: Record<string, unknown>) => Promise<JsonRpcMessage>
  closed: Promise<Error | undefined>
  messages: JsonRpcMessage[]
  closeCalls: () => number
  lines: () => Array<Record<string, unknown>>
}

function harness(
  t: Test,
  opts: { cmd?: string; args?: string[]; env?: Record<string, string>; maxLineBytes?: number; stageTimeoutMs?: number; cwd?: string; metrics?: Metrics } = {}
): Harness {
  const { log, lines } = memoryLog()
  const up = new StdioUpstream({
    target: 'faulty',
    config: { cmd: opts.cmd ?? process.execPath, args: opts.args ?? [FIXTURE], env: opts.env ?? {}, cwd: opts.cwd },
    baseDir: root,
    maxLineBytes: opts.maxLineBytes ?? 1024 * 1024,
    log,
    metrics: opts.metrics,
    stageTimeoutMs: opts.stageTimeoutMs ?? 500,
  })
  const waiting = new Map<unknown, (m: JsonRpcMessage) => void>()
  const messages: JsonRpcMessage[] = []
  let nextId = 1
  let resolveClosed: (e: Error | undefined) => void = () => {}
  const closed = new Promise<Error | undefined>(resolve => {
    resolveClosed = resolve
  })
  let closeCalls = 0
  up.onMessage = m => {
    messages.push(m)
    const w = waiting.get(m.id)
    if (w !== undefined) {
      waiting.delete(m.id)
      w(m)
    }
  }
  up.onClose = e => {
    closeCalls++
    resolveClosed(e)
  }
  t.teardown(() => up.close())
  return {
    up,
    closed,
    messages,
    lines,
    closeCalls: () => closeCalls,
    request(method, params) {
      const id = nextId++
      const p = new Promise<JsonRpcMessage>(resolve => waiting.set(id, resolve))
      up.send({ jsonrpc: '2.0', id, method, params })
      return p
    },
  }
}

const INIT = { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'test', version: '1' } }

function textOf(m: JsonRpcMessage): string {
  return (m.result as { content: Array<{ text: string }> }).content[0]!.text
}

t.test('talks MCP to server-everything over stdio', async t => {
  const h = harness(t, { args: [EVERYTHING, 'stdio'], stageTimeoutMs: 2000 })
  await h.up.start()
  t.equal(h.up.alive, true)
  t.type(h.up.pid, 'number')
  t.type(h.up.startedAt, 'number')
  const init = await h.request('initialize', INIT)
  t.equal((init.result as { protocolVersion: string }).protocolVersion, '2025-06-18')
  h.up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  const list = await h.request('tools/list', {})
  const names = (list.result as { tools: Array<{ name: string }> }).tools.map(x => x.name)
  t.ok(names.includes('echo'), 'tools/list lists echo')
  const echo = await h.request('tools/call', { name: 'echo', arguments: { message: 'hi there' } })
  t.match(textOf(echo), /hi there/)
  const pid = h.up.pid!
  await h.up.close()
  t.equal(await h.closed, undefined, 'clean close reports no error')
  t.equal(h.up.alive, false)
  t.ok(processGone(pid), 'child is gone after close')
  t.throws(() => h.up.send({ jsonrpc: '2.0', id: 99, method: 'ping' }), { code: 'MCPP_ERR_UPSTREAM' })
})

t.test('ENOENT: start rejects with MCPP_ERR_UPSTREAM and leaves nothing', async t => {
  const before = liveChildCount()
  const h = harness(t, { cmd: 'mcpp-no-such-command-xyz', args: [] })
  const err = await h.up.start().then(
    () => undefined,
    (e: unknown) => e
  )
  t.ok(ProxyError.is(err), 'a ProxyError')
  t.match(err, { code: 'MCPP_ERR_UPSTREAM', statusCode: 502, message: /^target faulty failed to start: .*ENOENT/ })
  t.equal(h.up.alive, false)
  t.equal(h.up.pid, undefined, 'no process')
  t.match(h.up.lastError, /ENOENT/)
  t.equal(liveChildCount(), before, 'nothing registered')
  t.throws(() => h.up.send({ jsonrpc: '2.0', id: 1, method: 'ping' }), { code: 'MCPP_ERR_UPSTREAM' })
})

t.test('a missing working directory fails start the same way', async t => {
  const h = harness(t, { cwd: 'no/such/dir' })
  await t.rejects(h.up.start(), { code: 'MCPP_ERR_UPSTREAM', message: /failed to start: working directory .*ENOENT/ })
  t.equal(h.up.pid, undefined)
})

t.test('cwd is relative to the config base dir', async t => {
  const h = harness(t, { cwd: 'test/fixtures', env: {} })
  await h.up.start()
  const env = JSON.parse(textOf(await h.request('tools/call', { name: 'env' }))) as Record<string, string>
  t.ok(env.PATH !== undefined)
  const cwdProbe = new StdioUpstream({
    target: 'cwd',
    config: {
      cmd: process.execPath,
      args: ['-e', 'process.stdout.write(JSON.stringify({jsonrpc:"2.0",id:1,result:{cwd:process.cwd()}})+"\\n")'],
      env: {},
      cwd: 'test/fixtures',
    },
    baseDir: root,
    maxLineBytes: 65536,
    log: pino({ level: 'silent' }),
  })
  const got = new Promise<JsonRpcMessage>(resolve => {
    cwdProbe.onMessage = resolve
  })
  await cwdProbe.start()
  t.equal((await got).result && ((await got).result as { cwd: string }).cwd, join(root, 'test/fixtures'))
  await cwdProbe.close()
})

t.test('a crash mid-request reports onClose(error) and the child is gone', async t => {
  const h = harness(t)
  await h.up.start()
  await h.request('initialize', INIT)
  const gc = Number(textOf(await h.request('tools/call', { name: 'spawn-grandchild' })))
  t.notOk(processGone(gc), 'grandchild running')
  const pid = h.up.pid!
  h.up.send({ jsonrpc: '2.0', id: 'c1', method: 'tools/call', params: { name: 'crash' } })
  const err = await h.closed
  t.match(err, { message: /target faulty exited unexpectedly \(code 1\)/ })
  t.equal(h.up.alive, false)
  t.match(h.up.lastError, /exited unexpectedly/)
  t.notOk(
    h.messages.some(m => m.id === 'c1'),
    'no answer to the crashing call'
  )
  t.throws(() => h.up.send({ jsonrpc: '2.0', id: 2, method: 'ping' }), { code: 'MCPP_ERR_UPSTREAM' })
  t.ok(processGone(pid), 'child gone')
  t.ok(await until(() => processGone(gc)), 'orphaned grandchild reaped with the group')
})

t.test('exit right after start reports onClose(error)', async t => {
  const h = harness(t, { args: [FIXTURE, '--exit-now=3'] })
  await h.up.start()
  t.match(await h.closed, { message: /code 3/ })
})

t.test('a flood without newline ends that child, not the gateway', async t => {
  const metrics = new Metrics()
  const h = harness(t, { maxLineBytes: 256 * 1024, metrics })
  await h.up.start()
  await h.request('initialize', INIT)
  const pid = h.up.pid!
  h.up.send({ jsonrpc: '2.0', id: 'f', method: 'tools/call', params: { name: 'flood' } })
  const err = await h.closed
  t.match(err, { message: /stdout line longer than 262144 bytes/ })
  t.equal(h.up.alive, false)
  t.ok(await until(() => processGone(pid)), 'flooding child killed')
  t.ok(
    h.lines().some(l => l.level === 50 && l.target === 'faulty' && /longer than/.test(String(l.msg))),
    'logged as an error with the target name'
  )
  t.equal(metrics.counter('mcp_proxy_upstream_exits_total', '').get({ target: 'faulty', reason: 'line_too_long' }), 1)
  // The gateway process is fine: another child works.
  const h2 = harness(t)
  await h2.up.start()
  t.equal(textOf(await h2.request('tools/call', { name: 'echo', arguments: { message: 'still here' } })), 'still here')
})

t.test('a valid but giant JSON line over the limit ends the child', async t => {
  const h = harness(t, { maxLineBytes: 64 * 1024 })
  await h.up.start()
  h.up.send({ jsonrpc: '2.0', id: 'g', method: 'tools/call', params: { name: 'giant-line', arguments: { bytes: 200000 } } })
  t.match(await h.closed, { message: /longer than 65536 bytes/ })
  t.notOk(h.messages.some(m => m.id === 'g'))
})

t.test('lines up to the limit pass', async t => {
  const h = harness(t, { maxLineBytes: 300000 })
  await h.up.start()
  const r = await h.request('tools/call', { name: 'giant-line', arguments: { bytes: 200000 } })
  t.equal(textOf(r).length, 200000)
  t.equal(h.up.alive, true)
})

t.test('garbage lines are logged and dropped; valid answers still arrive', async t => {
  const metrics = new Metrics()
  const h = harness(t, { args: [FIXTURE, '--garbage-first'], metrics })
  await h.up.start()
  const r = await h.request('tools/call', { name: 'garbage' })
  t.equal(textOf(r), 'after garbage')
  t.equal(h.up.alive, true)
  t.ok(
    h.messages.every(m => m.jsonrpc === '2.0'),
    'only JSON-RPC messages delivered'
  )
  const dropped = h.lines().filter(l => /dropped stdout line/.test(String(l.msg)))
  t.ok(dropped.length >= 4, 'dropped lines logged')
  t.ok(
    dropped.some(l => l.line === 'this is not json'),
    'with an excerpt'
  )
  t.ok(metrics.counter('mcp_proxy_upstream_dropped_lines_total', '').get({ target: 'faulty' }) >= 4)
  t.equal(textOf(await h.request('tools/call', { name: 'echo', arguments: { message: 'ok' } })), 'ok')
})

t.test('multi-byte UTF-8 split across chunks is decoded intact', async t => {
  const h = harness(t)
  await h.up.start()
  t.equal(textOf(await h.request('tools/call', { name: 'split-utf8' })), 'héllo ✓ 𝄞 ünïcode')
})

t.test('the child environment is an allow-list plus the target env', async t => {
  process.env.MCPP_TEST_SECRET = 'super-secret-value'
  t.teardown(() => {
    delete process.env.MCPP_TEST_SECRET
  })
  const h = harness(t, { env: { TARGET_VAR: 'from-target', HOME: '/target/home' } })
  await h.up.start()
  const env = JSON.parse(textOf(await h.request('tools/call', { name: 'env' }))) as Record<string, string>
  t.equal(env.MCPP_TEST_SECRET, undefined, 'gateway secret not visible')
  t.equal(env.TARGET_VAR, 'from-target', 'target env visible')
  t.equal(env.HOME, '/target/home', 'target env overrides the allow-list')
  t.equal(env.PATH, process.env.PATH, 'PATH inherited')
  // The allow-list written out (README "Targets": PATH, HOME, USER, LOGNAME, SHELL, TERM, LANG, LC_*, TMPDIR,
  // TZ, …; the rest are the temp, XDG, npm cache and CA variables and their Windows counterparts), not read
  // back from core/targets/stdio.ts.
  const allowed = new Set([
    'PATH',
    'HOME',
    'USER',
    'LOGNAME',
    'SHELL',
    'TERM',
    'LANG',
    'LC_ALL',
    'LC_CTYPE',
    'TZ',
    'TMPDIR',
    'TEMP',
    'TMP',
    'XDG_CACHE_HOME',
    'XDG_CONFIG_HOME',
    'XDG_DATA_HOME',
    'npm_config_cache',
    'NODE_EXTRA_CA_CERTS',
    'SYSTEMROOT',
    'SYSTEMDRIVE',
    'WINDIR',
    'COMSPEC',
    'PATHEXT',
    'APPDATA',
    'LOCALAPPDATA',
    'USERPROFILE',
    'HOMEDRIVE',
    'HOMEPATH',
    'USERNAME',
    'PROGRAMFILES',
    'PROCESSOR_ARCHITECTURE',
    'TARGET_VAR',
  ])
  const readme = readFileSync(new URL('../docs/targets.md', import.meta.url), 'utf8')
  const named = [...(/environment is an allow-list \(([^)]*)\)/.exec(readme)?.[1] ?? '').matchAll(/`([A-Z_*]+)`/g)].map(m => m[1]!)
  t.ok(
    named.length >= 8 && named.every(n => (n.endsWith('*') ? [...allowed].some(a => a.startsWith(n.slice(0, -1))) : allowed.has(n))),
    `every variable docs/targets.md names is in the list: ${named.join(' ')}`
  )
  t.same(
    CHILD_ENV_ALLOW_LIST.filter(n => !allowed.has(n)),
    [],
    'the implementation allows nothing the list above does not'
  )
  // tap's process-info hook patches child_process.spawn in test runs only and
  // adds its own variables (and a NODE_OPTIONS loading itself); ignore exactly those.
  // Node itself passes NODE_V8_COVERAGE on to every child while it is set (CI measures coverage with it).
  const injectedByTap = (k: string): boolean =>
    k.startsWith('_TAPJS_PROCESSINFO_') ||
    (k === 'NODE_OPTIONS' && env[k]!.includes('@tapjs/processinfo')) ||
    (k === 'NODE_V8_COVERAGE' && env[k] === process.env.NODE_V8_COVERAGE)
  const extra = Object.keys(env).filter(k => !allowed.has(k) && !injectedByTap(k))
  t.same(extra, [], 'nothing beyond the allow-list and the target env')
})

t.test('childEnv never passes exported shell functions and lets the target win', async t => {
  const env = childEnv({ A: '1' }, { PATH: '/bin', HOME: '() { :; }', SECRET_TOKEN: 'x' })
  t.same(env, { PATH: '/bin', A: '1' })
})

t.test('stderr goes to the log with the target name', async t => {
  const h = harness(t, { args: [FIXTURE, '--stderr'] })
  await h.up.start()
  await h.request('tools/call', { name: 'stderr', arguments: { message: 'hello from stderr' } })
  t.ok(await until(() => h.lines().some(l => l.stderr === 'hello from stderr' && l.target === 'faulty')))
  t.ok(h.lines().some(l => l.stderr === 'faulty-server starting'))
})

t.test('close escalates to SIGKILL for a child that ignores stdin end and SIGTERM', async t => {
  const h = harness(t, { args: [FIXTURE, '--ignore-sigterm'], stageTimeoutMs: 200 })
  await h.up.start()
  await h.request('initialize', INIT)
  const pid = h.up.pid!
  await h.up.close()
  t.ok(processGone(pid), 'child gone when close() resolves')
  t.equal(await h.closed, undefined)
  t.ok(
    h.lines().some(l => /ignored SIGTERM; sending SIGKILL/.test(String(l.msg))),
    'escalation logged'
  )
  t.ok(await until(() => h.lines().some(l => l.stderr === 'ignoring SIGTERM')), 'the child did receive SIGTERM first')
})

t.test('close kills grandchildren with the process group', async t => {
  const h = harness(t)
  await h.up.start()
  const gc = Number(textOf(await h.request('tools/call', { name: 'spawn-grandchild' })))
  t.notOk(processGone(gc))
  await h.up.close()
  t.ok(processGone(gc), 'grandchild gone when close() resolves')
  t.ok(processGone(h.up.pid!))
  await h.up.close()
})

t.test('close before start, and close while starting', async t => {
  const a = harness(t)
  await a.up.close()
  t.equal(await a.closed, undefined)
  await t.rejects(a.up.start())
  const b = harness(t)
  const starting = b.up.start().then(
    () => 'started',
    () => 'rejected'
  )
  const closing = b.up.close()
  t.equal(await starting, 'rejected', 'start() rejects when close() won')
  await closing
  if (b.up.pid !== undefined) t.ok(processGone(b.up.pid), 'no process left')
  t.equal(b.up.alive, false)
})

t.test('killAllChildren ends every live child', async t => {
  const hs = [harness(t), harness(t, { args: [FIXTURE, '--ignore-sigterm'], stageTimeoutMs: 150 })]
  for (const h of hs) await h.up.start()
  const gc = Number(textOf(await hs[0]!.request('tools/call', { name: 'spawn-grandchild' })))
  const pids = hs.map(h => h.up.pid!)
  await killAllChildren()
  for (const pid of pids) t.ok(processGone(pid))
  t.ok(processGone(gc))
  t.equal(liveChildCount(), 0)
  for (const h of hs) t.equal(await h.closed, undefined)
})

t.test('createUpstreamFactory builds stdio upstreams', async t => {
  const f = createUpstreamFactory(
    { name: 'fx', stdio: { cmd: process.execPath, args: [FIXTURE], env: {} } },
    {
      log: pino({ level: 'silent' }),
      baseDir: root,
      maxLineBytes: 65536,
      metrics: new Metrics(),
    }
  )
  t.equal(f.target, 'fx')
  t.equal(f.kind, 'stdio')
  const up = f.create()
  t.equal(up.kind, 'stdio')
  const got = new Promise<JsonRpcMessage>(resolve => {
    up.onMessage = resolve
  })
  await up.start()
  up.send({ jsonrpc: '2.0', id: 1, method: 'ping' })
  t.same((await got).result, {})
  await up.close()
  t.equal(up.alive, false)
})
