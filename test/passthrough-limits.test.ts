/**
 * core/mcp/legacy/passthrough.ts through the real CLI: sessions of a single
 * HTTP target obey `mcp.session.maxSessions` (an initialize beyond it gets
 * 503 MCPP_ERR_SESSION_LIMIT with Retry-After, a deleted session frees its
 * slot) and `mcp.session.idleTimeoutSeconds` (an idle session is gone: 404),
 * as docs/configuration.md says of every session.
 */
import t, { type Test } from 'tap'
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawnCli, waitForPort, freePort, eventually } from './helpers/cli.ts'
import { fixtureHttp } from './helpers/conformance-fixture.ts'

interface Cli {
  mcp: string
  lines: () => Array<Record<string, unknown>>
}

async function startCli(t: Test, upstream: string, session: string): Promise<Cli> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-passthrough-limits-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const port = await freePort()
  const file = join(dir, 'config.yaml')
  await writeFile(
    file,
    `mcp:
  port: ${port}
  host: 127.0.0.1
  session: ${session}
  targets:
    - name: remote
      mcp: { url: ${JSON.stringify(upstream)} }
admin: { enabled: false }
`
  )
  const cli = spawnCli(['-f', file])
  t.teardown(async () => {
    cli.child.kill('SIGTERM')
    await cli.exited
  })
  await waitForPort(port, cli.exited)
  const lines = (): Array<Record<string, unknown>> =>
    cli
      .output()
      .split('\n')
      .filter(l => l.startsWith('{'))
      .map(l => JSON.parse(l) as Record<string, unknown>)
  return { mcp: `http://127.0.0.1:${port}/mcp`, lines }
}

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const INIT = { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'passthrough-limits', version: '1' } }

async function initialize(url: string): Promise<{ status: number; sid: string | null; retryAfter: string | null; body: string }> {
  const res = await fetch(url, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT }) })
  return { status: res.status, sid: res.headers.get('mcp-session-id'), retryAfter: res.headers.get('retry-after'), body: await res.text() }
}

async function ping(url: string, sid: string): Promise<number> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }),
  })
  await res.arrayBuffer()
  return res.status
}

t.test('passthrough: maxSessions caps initialize (503 MCPP_ERR_SESSION_LIMIT); DELETE frees the slot', async t => {
  const cli = await startCli(t, await fixtureHttp(t), '{ maxSessions: 1 }')
  const first = await initialize(cli.mcp)
  t.equal(first.status, 200, first.body)
  t.ok(first.sid, 'the first session is made')
  const second = await initialize(cli.mcp)
  t.equal(second.status, 503, 'a second session is over maxSessions')
  t.equal(second.sid, null)
  t.ok(second.retryAfter, 'Retry-After')
  // The passthrough pipes bodies and never parses one: its refusals carry id null, as its 404 does.
  t.same(JSON.parse(second.body), { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Service Unavailable: session limit reached' } })
  const line = await eventually(
    () => cli.lines().find(l => l.msg === 'request' && l.status === 503),
    l => l !== undefined
  )
  t.equal(line!.denial, 'MCPP_ERR_SESSION_LIMIT', 'the access log names the code')
  t.equal(await ping(cli.mcp, first.sid!), 200, 'the first session keeps working')
  const del = await fetch(cli.mcp, { method: 'DELETE', headers: { 'mcp-session-id': first.sid!, 'mcp-protocol-version': '2025-06-18' } })
  await del.arrayBuffer()
  t.equal(del.status, 200)
  const third = await initialize(cli.mcp)
  t.equal(third.status, 200, "the deleted session's slot is free again")
  t.ok(third.sid)
})

t.test('passthrough: a session idle for idleTimeoutSeconds is gone (404)', async t => {
  const cli = await startCli(t, await fixtureHttp(t), '{ idleTimeoutSeconds: 1 }')
  const { status, sid } = await initialize(cli.mcp)
  t.equal(status, 200)
  t.equal(await ping(cli.mcp, sid!), 200, 'known while in use')
  // Each probe of a live session renews it: probes further apart than the timeout let it expire.
  const after = await eventually(
    () => ping(cli.mcp, sid!),
    s => s === 404,
    10,
    1500
  )
  t.equal(after, 404, 'the idle session was ended')
  const again = await initialize(cli.mcp)
  t.equal(again.status, 200, 'a new session can be made')
})
