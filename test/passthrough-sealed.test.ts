/**
 * Passthrough sessions sealed into their ids (one HTTP target, no
 * per-operation rules), through the real CLI in front of the real
 * server-everything over streamable HTTP: with `workers: 2` and with two
 * replicas sharing `cluster.secret`, a session's requests are served by
 * whichever process gets them, never relayed to the one that made it; the
 * session outlives that process (killed, or stopped with SIGTERM, which
 * must not end the upstream session the others still serve); an altered id
 * is unknown (404). The id never shows the upstream's session id.
 */
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { configFile, eventually, freePort, freshFetch, isAlive, spawnCli, waitForPort, workersOf } from './helpers/cli.ts'
import { ROOT } from './helpers/gateway-harness.ts'
import { foundIn } from './helpers/hidden.ts'

const SECRET = 'sealed-passthrough-secret-0123456789abcdef'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' }
const RELAYED = /forwarded to the session owner/

/**
 * server-everything over streamable HTTP on a port of its own (it keeps each session in memory);
 * `sessionIds()`: the session ids it made, from its own log ("Session initialized with ID: …").
 */
async function everythingHttp(t: Test): Promise<{ url: string; sessionIds: () => string[] }> {
  const port = await freePort()
  const child = spawn(process.execPath, [join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js'), 'streamableHttp'], {
    env: { ...process.env, PORT: String(port) },
    stdio: ['ignore', 'pipe', 'ignore'],
  })
  let out = ''
  child.stdout!.setEncoding('utf8').on('data', (d: string) => {
    out += d
  })
  t.teardown(() => {
    child.kill('SIGKILL')
  })
  await waitForPort(port, new Promise(resolve => child.once('exit', resolve)))
  return { url: `http://127.0.0.1:${port}/mcp`, sessionIds: () => [...out.matchAll(/Session initialized with ID: (\S+)/g)].map(m => m[1]!) }
}

/** The upstream's session ids do not show in the gateway's id, in any encoding (test/helpers/hidden.ts). */
async function upstreamIdHidden(t: Test, sid: string, sessionIds: () => string[]): Promise<void> {
  const upstreamIds = await eventually(sessionIds, ids => ids.length > 0)
  t.ok(upstreamIds.length > 0, 'the upstream made a session, whose id is known to the test', { upstreamIds })
  t.same(foundIn(sid, upstreamIds), [], "the upstream session id does not show in the gateway's id (text, hex, base64, base64url, raw bytes)")
}

/** A tools/call echo over a new connection; the status and the text answered. */
async function echo(url: string, sid: string, message: string): Promise<{ status: number; text: string }> {
  const res = await freshFetch(url, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', arguments: { message } } }),
  })
  const body = await res.text()
  const data = body
    .split('\n')
    .filter(l => l.startsWith('data: '))
    .map(l => JSON.parse(l.slice(6)) as { result?: { content: Array<{ text: string }> } })
  return { status: res.status, text: data.at(-1)?.result?.content[0]?.text ?? body }
}

/** One character of the id's middle changed (still visible ASCII). */
function tamper(id: string): string {
  const i = Math.floor(id.length / 2)
  return id.slice(0, i) + (id[i] === 'A' ? 'B' : 'A') + id.slice(i + 1)
}

function gateway(t: Test, lines: string[]): ReturnType<typeof spawnCli> {
  const cli = spawnCli(['-f', lines[0]!])
  t.teardown(() => {
    if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill('SIGKILL')
  })
  return cli
}

t.test('workers: 2 — a passthrough session is served by either worker without a relay, and outlives the worker that made it', async t => {
  const everything = await everythingHttp(t)
  const upstream = everything.url
  const [port, probes] = await Promise.all([freePort(), freePort()])
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      `  targets: [{ name: everything, mcp: { url: "${upstream}" } }]`,
      `probes: { host: 127.0.0.1, port: ${probes} }`,
      'admin: { enabled: false }',
      'workers: 2',
      'workerRestartsPerMinute: 5',
      'logging: { level: debug }',
    ].join('\n'),
    'mcpp-sealed-workers-'
  )
  const cli = gateway(t, [file])
  const url = `http://127.0.0.1:${port}/mcp`
  await waitForPort(port, cli.exited)

  // Every request on a connection of its own: the primary deals them to both workers in turn.
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: freshFetch })
  const client = new Client({ name: 'sealed', version: '1.0.0' })
  t.teardown(() => client.close().catch(() => {}))
  await client.connect(transport)
  const sid = transport.sessionId!
  t.ok(sid.length > 0)
  await upstreamIdHidden(t, sid, everything.sessionIds)
  t.equal(
    await eventually(
      async () => (await fetch(`http://127.0.0.1:${probes}/readyz`).catch(() => undefined))?.status,
      s => s === 200,
      600,
      100
    ),
    200,
    'both workers serve'
  )
  for (let i = 0; i < 4; i++) {
    const r = await client.callTool({ name: 'echo', arguments: { message: `call ${i}` } })
    t.match(JSON.stringify(r.content), `call ${i}`, `call ${i} answered`)
  }
  t.notMatch(cli.output(), RELAYED, 'no request was relayed to another worker')

  // Each worker killed in turn (the second after the first is replaced): the session goes on.
  for (const n of [0, 1]) {
    const before = workersOf(cli.child.pid!).sort()
    t.equal(before.length, 2, 'two workers')
    process.kill(before[n]!, 'SIGKILL')
    t.equal(
      await eventually(
        () => isAlive(before[n]!),
        alive => !alive,
        100,
        50
      ),
      false,
      'a worker killed'
    )
    for (let i = 0; i < 2; i++) {
      const r = await echo(url, sid, `after kill ${n}.${i}`)
      t.equal(r.status, 200, 'the session is served by the survivor (or the replacement)')
      t.match(r.text, `after kill ${n}.${i}`)
    }
    t.ok(
      await eventually(
        () => workersOf(cli.child.pid!).length === 2,
        ok => ok,
        600,
        100
      ),
      'the worker was replaced'
    )
  }
  t.notMatch(cli.output(), RELAYED, 'still no relay')

  const forged = await echo(url, tamper(sid), 'forged')
  t.equal(forged.status, 404, 'an altered id is unknown')
})

t.test('two replicas (cluster.secret) — either serves a passthrough session; it outlives the replica that made it, stopped with SIGTERM', async t => {
  const everything = await everythingHttp(t)
  const upstream = everything.url
  const [pa, pb] = await Promise.all([freePort(), freePort()])
  const start = async (port: number, name: string): Promise<{ cli: ReturnType<typeof spawnCli>; url: string }> => {
    const file = await configFile(
      [
        'mcp:',
        '  host: 127.0.0.1',
        `  port: ${port}`,
        `  targets: [{ name: everything, mcp: { url: "${upstream}" } }]`,
        'admin: { enabled: false }',
        `cluster: { secret: ${SECRET}, advertiseUrl: "http://127.0.0.1:${port}" }`,
        'logging: { level: debug }',
      ].join('\n'),
      `mcpp-sealed-${name}-`
    )
    const cli = gateway(t, [file])
    await waitForPort(port, cli.exited)
    return { cli, url: `http://127.0.0.1:${port}/mcp` }
  }
  const [a, b] = await Promise.all([start(pa, 'a'), start(pb, 'b')])

  const transport = new StreamableHTTPClientTransport(new URL(a.url))
  const client = new Client({ name: 'sealed', version: '1.0.0' })
  await client.connect(transport)
  const sid = transport.sessionId!
  await upstreamIdHidden(t, sid, everything.sessionIds)

  const viaB = await echo(b.url, sid, 'through B')
  t.equal(viaB.status, 200, 'B serves the session A made')
  t.match(viaB.text, 'through B')
  t.notMatch(b.cli.output(), RELAYED, 'B answered it itself: no relay to A')

  // A stops gracefully: its shutdown must not end the upstream session B still serves.
  a.cli.child.kill('SIGTERM')
  await a.cli.exited
  const afterA = await echo(b.url, sid, 'A is gone')
  t.equal(afterA.status, 200, 'the session outlives the replica that made it')
  t.match(afterA.text, 'A is gone')
  await client.close().catch(() => {})

  t.equal((await echo(b.url, tamper(sid), 'forged')).status, 404, 'an altered id is unknown')
  t.notMatch(b.cli.output(), RELAYED, 'nothing relayed')
})
