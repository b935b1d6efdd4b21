/**
 * README "Security notes", workers (issue 22 item 18), black-box against the
 * real CLI with `workers: 2`: every port a worker listens on (its relay and
 * admin ports) is bound to 127.0.0.1 even when the MCP port is elsewhere, and
 * the secret the primary draws for the run is not in a worker's environment
 * (it goes over the IPC channel). Linux /proc tells which sockets a process
 * listens on and what its environment is.
 */
import t from 'tap'
import { readdirSync, readFileSync, readlinkSync } from 'node:fs'
import { freePort, configFile, spawnCli, eventually, workersOf } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/facade.ts'

/** Variables a worker may have that its primary has not: node:cluster's, tap's own, and the worker's slot. */
const BOOKKEEPING = new Set(['NODE_UNIQUE_ID', 'NODE_CHANNEL_FD', 'NODE_CHANNEL_SERIALIZATION_MODE', '_TAPJS_PROCESSINFO_PARENT_', 'MCP_PROXY_WORKER'])

/** The listening TCP sockets (IPv4 and IPv6) a process holds: `address:port`, addresses in /proc/net/tcp hex. */
function listeningSockets(pid: number): string[] {
  const inodes = new Set<string>()
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (m !== null) inodes.add(m[1]!)
    } catch {
      /* closed meanwhile */
    }
  }
  const out: string[] = []
  for (const table of ['tcp', 'tcp6']) {
    for (const line of readFileSync(`/proc/${pid}/net/${table}`, 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/)
      // local_address st ... inode: LISTEN is 0A.
      if (f.length > 9 && f[3] === '0A' && inodes.has(f[9]!)) out.push(f[1]!)
    }
  }
  return out
}

t.test("workers: every port a worker listens on is bound to 127.0.0.1, and the run's secret is not in a worker's environment (real CLI)", async t => {
  const [port, probes] = await Promise.all([freePort(), freePort()])
  const file = await configFile(
    [
      // The MCP port on another loopback address, so that "127.0.0.1" below is the workers' own choice.
      'mcp:',
      '  host: 127.0.0.3',
      `  port: ${port}`,
      '  targets:',
      '    - name: everything',
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      'admin: { enabled: false }',
      `probes: { host: 127.0.0.1, port: ${probes} }`,
      'workers: 2',
    ].join('\n') + '\n',
    'mcpp-workers-bind-'
  )
  const run = spawnCli(['-f', file])
  t.teardown(async () => {
    if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGTERM')
    await run.exited
  })
  const ready = await eventually(
    async () => (await fetch(`http://127.0.0.1:${probes}/readyz`).catch(() => undefined))?.status,
    s => s === 200 || run.child.exitCode !== null,
    600,
    100
  )
  if (ready !== 200) t.comment(run.output().slice(-2000))
  t.equal(ready, 200, 'both workers ready')
  const workers = workersOf(run.child.pid!)
  t.equal(workers.length, 2, 'two workers')
  const LOOPBACK_1 = /^0100007F:[0-9A-F]{4}$/
  for (const w of workers) {
    const sockets = listeningSockets(w)
    t.ok(sockets.length > 0, `worker ${w} listens (its relay port): ${sockets.join(' ')}`)
    t.ok(
      sockets.every(s => LOOPBACK_1.test(s)),
      `worker ${w}: every listener on 127.0.0.1`
    )
    const primaryEnv = new Set(readFileSync(`/proc/${run.child.pid}/environ`, 'latin1').split('\0'))
    const added = readFileSync(`/proc/${w}/environ`, 'latin1')
      .split('\0')
      .filter(kv => kv !== '' && !primaryEnv.has(kv))
    const names = added.map(kv => kv.slice(0, kv.indexOf('=')))
    t.ok(
      names.every(n => BOOKKEEPING.has(n)),
      `worker ${w}: only node:cluster's, tap's and the slot variable were added to its environment (${names.join(', ')})`
    )
    t.match(
      added.find(kv => kv.startsWith('MCP_PROXY_WORKER=')),
      /^MCP_PROXY_WORKER=[12]$/,
      'the slot variable holds the slot only'
    )
  }
})
