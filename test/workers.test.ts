/**
 * `workers: 2` through the real CLI (core/workers.ts): a primary and two
 * workers on one MCP port. Every request goes over a fresh TCP connection,
 * so the primary's round-robin spreads them over both workers: SDK 1.x
 * sessions are served wherever their requests land (relayed to the owner),
 * 2026-07-28 calls by any worker, the per-subject cap holds across workers.
 * The probe listener (one, the primary's) reports every worker; the admin
 * listener (one) relays to the worker asked for. A worker killed with
 * SIGKILL: its stdio child is gone, it is replaced, its sessions get 404
 * and their clients initialize again, the other worker's sessions go on.
 * SIGTERM: readiness fails first, the MCP port serves through the delay,
 * then everything exits, children included.
 */
import t from 'tap'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Client as Client2, StreamableHTTPClientTransport as Transport2 } from '@modelcontextprotocol/client'
import { configFile, eventually, freePort, freshFetch, isAlive, parentOf, runCli, spawnCli, waitForPort, workersOf } from './helpers/cli.ts'
import { EVERYTHING, FAULTY } from './helpers/gateway-harness.ts'

const CAP = 4
const MODERN = '2026-07-28'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
}

async function post(url: string, body: unknown, sid?: string): Promise<{ status: number; sid: string | null }> {
  const res = await freshFetch(url, {
    method: 'POST',
    headers: { ...HEADERS, ...(sid !== undefined ? { 'mcp-session-id': sid } : {}) },
    body: JSON.stringify(body),
  })
  await res.text()
  return { status: res.status, sid: res.headers.get('mcp-session-id') }
}

/** `name{worker="N",…} value` lines of the probe listener's /metrics, summed per worker. */
async function perWorker(probes: number, name: string, match = ''): Promise<Record<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${probes}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{worker="`) || !line.includes(match)) continue
    const w = line.slice(name.length + 9, line.indexOf('"', name.length + 9))
    out[w] = (out[w] ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return out
}

const textOf = (r: unknown): string => (r as { content: Array<{ text: string }> }).content[0]!.text

t.test('two workers on one port: sessions across workers, 2026-07-28, the cap, probes and admin, a worker killed, SIGTERM', async t => {
  const [port, admin, probes] = await Promise.all([freePort(), freePort(), freePort()])
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  targets:',
      // The real server-everything (issue 22 item 15): a happy path on a real MCP server, not the fault fixture.
      `    - { name: everything, stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] } }`,
      `  session: { maxSessionsPerSubject: ${CAP} }`,
      `admin: { port: ${admin} }`,
      `probes: { host: 127.0.0.1, port: ${probes}, shutdownDelayMs: 1500 }`,
      'workers: 2',
      'logging: { level: debug }',
    ].join('\n'),
    'mcpp-workers-'
  )
  const cli = spawnCli(['-f', file])
  t.teardown(() => {
    if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill('SIGKILL')
  })
  const giveUp = Promise.race([cli.exited, new Promise(resolve => setTimeout(resolve, 60_000))])
  const url = `http://127.0.0.1:${port}/mcp`

  // Talks as soon as the port accepts: the first worker holds the request until its pipeline is in place.
  await waitForPort(port, giveUp)
  const first = await post(url, INIT)
  t.equal(first.status, 200, 'served as soon as the port accepts')
  t.equal((await freshFetch(url, { method: 'DELETE', headers: { 'mcp-session-id': first.sid! } })).status, 200, 'and its slot freed again')
  const ready = await eventually(
    async () => (await fetch(`http://127.0.0.1:${probes}/readyz`).catch(() => undefined))?.status,
    s => s === 200,
    600,
    100
  )
  t.equal(ready, 200, "the primary's /readyz: ready once both workers are")

  // SDK 1.x clients from 127.0.0.1 up to the cap, until both workers hold sessions (which worker
  // got the initialize is read from the per-worker request counters; a client that landed where
  // the others are is closed, its slot freed, and one more connection shifts the round-robin).
  const legacy: Array<{ client: Client1; transport: Transport1; worker: string }> = []
  for (let attempt = 0; attempt < 12 && legacy.length < CAP; attempt++) {
    const before = await perWorker(probes, 'mcp_proxy_requests_total', 'method="initialize"')
    const transport = new Transport1(new URL(url), { fetch: freshFetch })
    const client = new Client1({ name: `sdk1-${attempt}`, version: '1.0.0' })
    t.teardown(() => client.close().catch(() => {}))
    await client.connect(transport)
    const after = await perWorker(probes, 'mcp_proxy_requests_total', 'method="initialize"')
    const worker = Object.keys(after).find(w => after[w] !== before[w])!
    const owners = new Set(legacy.map(l => l.worker))
    if (legacy.length === CAP - 1 && owners.size === 1 && owners.has(worker)) {
      await transport.terminateSession()
      await client.close()
      if (attempt % 2 === 0) await freshFetch(`http://127.0.0.1:${port}/no-such-path`).then(r => r.text())
      continue
    }
    legacy.push({ client, transport, worker })
  }
  t.equal(legacy.length, CAP, `${CAP} SDK 1.x sessions`)
  t.same(new Set(legacy.map(l => l.worker)), new Set(['1', '2']), 'the sessions live on both workers')
  const sessions = await perWorker(probes, 'mcp_proxy_sessions')
  t.equal((sessions['1'] ?? 0) + (sessions['2'] ?? 0), CAP, `/metrics: every worker's sessions (${JSON.stringify(sessions)})`)

  const round = (tag: string, clients: typeof legacy): Promise<unknown> =>
    Promise.all(
      clients.map(async ({ client }, n) => {
        const { tools } = await client.listTools()
        t.ok(
          tools.some(x => x.name === 'echo'),
          `${tag}: client ${n} lists tools`
        )
        for (let i = 0; i < 3; i++)
          t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `${tag}-${n}-${i}` } })), `Echo: ${tag}-${n}-${i}`)
      })
    )
  await round('spread', legacy)
  t.match(cli.output(), /"worker":1,[^\n]*forwarded to the session owner/, "worker 1 relayed requests to worker 2's sessions")
  t.match(cli.output(), /"worker":2,[^\n]*forwarded to the session owner/, "worker 2 relayed requests to worker 1's sessions")

  // The per-subject cap counts the sessions of both workers: wherever the next initialize lands, it is refused.
  for (let i = 0; i < 2; i++) t.equal((await post(url, INIT)).status, 429, `initialize over the cap (${i + 1}): 429`)

  // Revision 2026-07-28: stateless, served by whichever worker the connection lands on.
  const modernBefore = await perWorker(probes, 'mcp_proxy_requests_total', 'method="tools/call"')
  const modern = new Client2({ name: 'sdk2', version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
  t.teardown(() => modern.close().catch(() => {}))
  await modern.connect(new Transport2(new URL(url), { fetch: freshFetch }))
  for (let i = 0; i < 10; i++) t.equal(textOf(await modern.callTool({ name: 'echo', arguments: { message: `m${i}` } })), `Echo: m${i}`)
  const modernAfter = await perWorker(probes, 'mcp_proxy_requests_total', 'method="tools/call"')
  const modernServed = ['1', '2'].map(w => (modernAfter[w] ?? 0) - (modernBefore[w] ?? 0))
  t.ok(
    modernServed.every(n => n > 0),
    `2026-07-28 calls served by both workers (${modernServed.join(', ')})`
  )

  // One admin listener: relayed to the worker asked for, each with its own sessions.
  const listed = await Promise.all(
    ['1', '2'].map(async w => {
      const res = await fetch(`http://127.0.0.1:${admin}/api/sessions?worker=${w}`)
      t.equal(res.headers.get('mcp-proxy-worker'), w, `admin request relayed to worker ${w}`)
      return (await res.json()) as Array<{ id: string; handle: string; pids: number[] }>
    })
  )
  t.equal(listed[0]!.length + listed[1]!.length, CAP, 'the admin API of both workers lists every session once')
  for (const bad of ['3', '0', 'x']) t.equal((await fetch(`http://127.0.0.1:${admin}/api/sessions?worker=${bad}`)).status, 400, `no worker "${bad}": 400`)

  // Kill -9 the worker that holds the first client's session.
  const victim = legacy[0]!
  const victimSessions = listed[Number(victim.worker) - 1]!
  const childPid = victimSessions.find(s => victim.transport.sessionId!.startsWith(s.handle))!.pids[0]!
  const workerPid = parentOf(childPid)
  t.not(workerPid, cli.child.pid, 'the stdio child belongs to a worker, not the primary')
  process.kill(workerPid, 'SIGKILL')
  t.equal(
    await eventually(
      () => isAlive(childPid),
      alive => !alive,
      100,
      50
    ),
    false,
    "the killed worker's stdio child is gone (no orphan)"
  )
  const restarted = await eventually(
    async () => {
      const text = await (await fetch(`http://127.0.0.1:${probes}/metrics`)).text()
      return /^mcp_proxy_worker_restarts_total 1$/m.test(text) && (await fetch(`http://127.0.0.1:${probes}/readyz`)).status === 200
    },
    ok => ok,
    600,
    100
  )
  t.ok(restarted, 'the dead worker was replaced and the gateway is ready again')
  t.match(cli.output(), /worker died: its sessions are gone/, 'the death is logged')

  const survivors = legacy.filter(l => l.worker !== victim.worker)
  const lost = legacy.filter(l => l.worker === victim.worker)
  await round('after', survivors)
  for (const l of lost) {
    const gone = await post(url, { jsonrpc: '2.0', id: 9, method: 'tools/list' }, l.transport.sessionId)
    t.equal(gone.status, 404, 'a session of the killed worker: 404, wherever the request lands')
    await l.client.close()
    const again = new Client1({ name: 'sdk1-again', version: '1.0.0' })
    t.teardown(() => again.close().catch(() => {}))
    await again.connect(new Transport1(new URL(url), { fetch: freshFetch }))
    t.equal(
      textOf(await again.callTool({ name: 'echo', arguments: { message: 'again' } })),
      'Echo: again',
      "its client initializes again (the dead worker's cap slots are free)"
    )
  }

  // SIGTERM: /readyz fails at once, the MCP port keeps serving through shutdownDelayMs, then all exit.
  const pids = (
    await Promise.all(
      ['1', '2'].map(async w => (await (await fetch(`http://127.0.0.1:${admin}/api/sessions?worker=${w}`)).json()) as Array<{ pids: number[] }>)
    )
  )
    .flat()
    .flatMap(s => s.pids)
  const workers = workersOf(cli.child.pid!)
  t.equal(workers.length, 2, 'two worker processes')
  cli.child.kill('SIGTERM')
  const draining = await eventually(
    async () => (await fetch(`http://127.0.0.1:${probes}/readyz`)).status,
    s => s === 503,
    50,
    20
  )
  t.equal(draining, 503, 'readiness fails first')
  t.equal(
    textOf(await modern.callTool({ name: 'echo', arguments: { message: 'during the delay' } })),
    'Echo: during the delay',
    'the MCP port still serves during the delay'
  )
  const exit = await Promise.race([cli.exited, new Promise(resolve => setTimeout(resolve, 30_000, 'timeout'))])
  t.same(exit, { code: 0, signal: null }, 'the primary exits 0 after the workers drained')
  // Bounded wait: an exited process stays visible until its parent (or init) reaps it.
  t.ok(
    await eventually(
      () => [...workers, ...pids].every(p => !isAlive(p)),
      ok => ok,
      40,
      50
    ),
    'no worker and no stdio child is left'
  )
})

t.test('--check and --workers validate the setting; config errors name the path', async t => {
  const base = ['mcp:', '  port: 0', '  targets:', `    - { name: faulty, stdio: { cmd: "${process.execPath}", args: ["${FAULTY}"] } }`]
  const ok = await runCli(['-f', await configFile([...base, 'workers: auto'].join('\n')), '--check'])
  t.equal(ok.code, 0)
  t.match(ok.stdout, /workers: \d+ \(auto: one per core\)|workers: 1 \(one process\)/)
  const two = await runCli(['-f', await configFile(base.join('\n')), '--check', '--workers', '2'])
  t.match(two.stdout, /workers: 2, behind one primary/)
  for (const bad of ['0', '"two"']) {
    const r = await runCli(['-f', await configFile([...base, `workers: ${bad}`].join('\n')), '--check'])
    t.equal(r.code, 1, `workers: ${bad} is a config error`)
    t.match(r.stderr, /workers: must be an integer from 1 to 64 or "auto"/)
  }
  const flag = await runCli(['-f', await configFile(base.join('\n')), '--check', '--workers', 'many'])
  t.equal(flag.code, 2, 'a bad --workers is a usage error')
  t.match(flag.stderr, /--workers: must be an integer from 1 to 64 or "auto"/)
  const restarts = await runCli(['-f', await configFile([...base, 'workerRestartsPerMinute: 0'].join('\n')), '--check'])
  t.equal(restarts.code, 1)
  t.match(restarts.stderr, /workerRestartsPerMinute/)
})

t.test('restarts are bounded (workerRestartsPerMinute), and a primary killed with SIGKILL leaves no worker and no stdio child', async t => {
  const start = async (name: string): Promise<{ cli: ReturnType<typeof spawnCli>; url: string; admin: number; probes: number }> => {
    const [port, admin, probes] = await Promise.all([freePort(), freePort(), freePort()])
    const file = await configFile(
      [
        'mcp:',
        '  host: 127.0.0.1',
        `  port: ${port}`,
        '  targets:',
        `    - { name: faulty, stdio: { cmd: "${process.execPath}", args: ["${FAULTY}"] } }`,
        `admin: { port: ${admin} }`,
        `probes: { host: 127.0.0.1, port: ${probes} }`,
        'workers: 2',
        'workerRestartsPerMinute: 1',
      ].join('\n'),
      `mcpp-workers-${name}-`
    )
    const cli = spawnCli(['-f', file])
    t.teardown(() => {
      if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill('SIGKILL')
    })
    const ready = await eventually(
      async () => (await fetch(`http://127.0.0.1:${probes}/readyz`).catch(() => undefined))?.status,
      s => s === 200,
      600,
      100
    )
    t.equal(ready, 200, `${name}: ready`)
    return { cli, url: `http://127.0.0.1:${port}/mcp`, admin, probes }
  }
  /** A session with its stdio child on every worker: sessions until both workers hold one (fresh connections alternate). */
  const children = async (g: { url: string; admin: number }): Promise<number[]> => {
    for (let i = 0; i < 8; i++) {
      t.equal((await post(g.url, INIT)).status, 200)
      const pids = (
        await Promise.all(
          ['1', '2'].map(async w => (await (await fetch(`http://127.0.0.1:${g.admin}/api/sessions?worker=${w}`)).json()) as Array<{ pids: number[] }>)
        )
      ).map(list => list.flatMap(s => s.pids))
      if (pids.every(p => p.length > 0)) return pids.flat()
    }
    throw new Error('the sessions never spread over both workers')
  }
  const [a, b] = await Promise.all([start('limit'), start('primary-killed')])

  // Limit 1 a minute: the first dead worker is replaced, the second stops the gateway (exit 1), children and all.
  const aChildren = await children(a)
  const aWorkers = workersOf(a.cli.child.pid!)
  process.kill(aWorkers[0]!, 'SIGKILL')
  t.ok(
    await eventually(
      async () => /^mcp_proxy_worker_restarts_total 1$/m.test(await (await fetch(`http://127.0.0.1:${a.probes}/metrics`)).text()),
      ok => ok,
      600,
      100
    ),
    'the first dead worker is replaced'
  )
  process.kill(aWorkers[1]!, 'SIGKILL')
  const aExit = await Promise.race([a.cli.exited, new Promise(resolve => setTimeout(resolve, 30_000, 'timeout'))])
  t.same(aExit, { code: 1, signal: null }, 'the second death within the minute stops the gateway with exit 1')
  t.match(a.cli.output(), /workerRestartsPerMinute reached/)
  t.ok(
    await eventually(
      () => [...aWorkers, ...aChildren, ...workersOf(a.cli.child.pid!)].every(p => !isAlive(p)),
      ok => ok,
      40,
      50
    ),
    'nothing of it is left'
  )

  // The primary itself killed: the workers see their channel close, drain and exit, ending their children.
  const bChildren = await children(b)
  const bWorkers = workersOf(b.cli.child.pid!)
  t.equal(bWorkers.length, 2)
  b.cli.child.kill('SIGKILL')
  await b.cli.exited
  t.ok(
    await eventually(
      () => [...bWorkers, ...bChildren].every(p => !isAlive(p)),
      ok => ok,
      200,
      50
    ),
    'no worker and no stdio child outlives a killed primary'
  )
})

t.test("mergeMetrics: every worker's series labelled, each family's HELP and TYPE once, the primary's own unlabelled", async t => {
  const { mergeMetrics } = await import('../core/cluster/metrics-merge.ts')
  const worker = [
    '# HELP mcp_proxy_sessions Open MCP sessions',
    '# TYPE mcp_proxy_sessions gauge',
    'mcp_proxy_sessions 2',
    '# HELP d Duration',
    '# TYPE d histogram',
    'd_bucket{route="mcp",le="0.1"} 1',
    'd_sum{route="mcp"} 0.05',
    'd_count{route="mcp"} 1',
    '',
  ].join('\n')
  const merged = mergeMetrics(
    [
      { worker: 1, text: worker },
      { worker: 2, text: worker.replace('sessions 2', 'sessions 3') },
    ],
    '# HELP mcp_proxy_workers Live worker processes\n# TYPE mcp_proxy_workers gauge\nmcp_proxy_workers 2\n'
  )
  t.equal(
    merged,
    [
      '# HELP mcp_proxy_workers Live worker processes',
      '# TYPE mcp_proxy_workers gauge',
      'mcp_proxy_workers 2',
      '# HELP mcp_proxy_sessions Open MCP sessions',
      '# TYPE mcp_proxy_sessions gauge',
      'mcp_proxy_sessions{worker="1"} 2',
      'mcp_proxy_sessions{worker="2"} 3',
      '# HELP d Duration',
      '# TYPE d histogram',
      'd_bucket{worker="1",route="mcp",le="0.1"} 1',
      'd_sum{worker="1",route="mcp"} 0.05',
      'd_count{worker="1",route="mcp"} 1',
      'd_bucket{worker="2",route="mcp",le="0.1"} 1',
      'd_sum{worker="2",route="mcp"} 0.05',
      'd_count{worker="2",route="mcp"} 1',
      '',
    ].join('\n')
  )
})
