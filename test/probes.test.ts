// The probe listener (core/probes.ts) through the real CLI: the kubelet's
// /healthz and /readyz without any token while the admin listener keeps its
// token; /metrics with its own token; nothing else; on SIGTERM readiness
// fails first while /mcp is still served, then the drain.
import t from 'tap'
import { spawn } from 'node:child_process'
import { connect } from 'node:net'
import { writeFile, mkdtemp } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { CLI, ROOT, freePort } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/gateway-harness.ts'

const ADMIN_TOKEN = 'admin-token-0123456789abcdef'
const METRICS_TOKEN = 'metrics-token-0123456789abcdef'

function accepts(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.once('error', () => resolve(false))
  })
}

async function untilAccepts(port: number, child: { exitCode: number | null }): Promise<void> {
  // Guard only: start-up of a tsx child takes a second or two.
  for (let i = 0; i < 3000 && child.exitCode === null; i++) {
    if (await accepts(port)) return
    await new Promise(resolve => setTimeout(resolve, 10))
  }
  throw new Error(`port ${port} never accepted (exit code ${child.exitCode})`)
}

const initialize = (port: number): Promise<Response> =>
  fetch(`http://127.0.0.1:${port}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  })

t.test('probes answer without a token on a listener of their own; /metrics has its own token; SIGTERM fails readiness before the drain', async t => {
  const [port, adminPort, probePort] = await Promise.all([freePort(), freePort(), freePort()])
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-probes-'))
  const file = join(dir, 'config.yaml')
  await writeFile(
    file,
    [
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      '  targets:',
      '    - name: everything',
      // The real server-everything as the target (issue 22 item 15): the initialize served during the drain is a real one.
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      `admin: { host: 127.0.0.1, port: ${adminPort}, token: ${ADMIN_TOKEN} }`,
      // A long delay: the test must see /readyz fail and /mcp still served inside it; the guard below ends the run otherwise
      // (60 s: server-everything starts far slower than a hand-written fixture on a loaded host).
      `probes: { host: 127.0.0.1, port: ${probePort}, metricsToken: ${METRICS_TOKEN}, shutdownDelayMs: 1500 }`,
      'logging: { level: info }',
      '',
    ].join('\n')
  )
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, '-f', file], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout.on('data', d => {
    out += d
  })
  child.stderr.on('data', d => {
    out += d
  })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  const guard = setTimeout(() => child.kill('SIGKILL'), 60_000)
  t.teardown(() => {
    clearTimeout(guard)
    child.kill('SIGKILL')
  })

  await untilAccepts(probePort, child)
  const probe = `http://127.0.0.1:${probePort}`
  // Talked to as soon as it accepts: "starting" or ready, never a refusal or a 401.
  let ready = await fetch(`${probe}/readyz`)
  t.ok(ready.status === 200 || ready.status === 503, 'readyz answers from the first accepted connection')
  for (let i = 0; i < 200 && ready.status !== 200; i++) {
    await ready.text()
    await new Promise(resolve => setTimeout(resolve, 25))
    ready = await fetch(`${probe}/readyz`)
  }
  t.equal(ready.status, 200, 'ready without any token')
  t.same(await ready.json(), { status: 'ready', reasons: [] })

  const health = await fetch(`${probe}/healthz`)
  t.equal(health.status, 200)
  t.same(await health.json(), { status: 'ok' })

  // The admin listener keeps its token for everything but /healthz.
  const adminReady = await fetch(`http://127.0.0.1:${adminPort}/readyz`)
  t.equal(adminReady.status, 401, 'the admin listener still wants its token')
  await adminReady.text()

  const anon = await fetch(`${probe}/metrics`)
  t.equal(anon.status, 401, '/metrics needs the metrics token')
  t.equal(((await anon.json()) as { error: string }).error, 'unauthorized')
  const withAdmin = await fetch(`${probe}/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
  t.equal(withAdmin.status, 401, 'the admin token is not the metrics token')
  await withAdmin.text()
  const scraped = await fetch(`${probe}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })
  t.equal(scraped.status, 200)
  t.match(await scraped.text(), /mcp_proxy_ready 1/)

  for (const path of ['/ui', '/api/sessions', '/api/config', '/', '/ui/app.js']) {
    const r = await fetch(`${probe}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
    t.equal(r.status, 404, `${path} is not served on the probe listener`)
    await r.text()
  }
  const del = await fetch(`${probe}/readyz`, { method: 'DELETE' })
  t.equal(del.status, 405)
  await del.text()

  child.kill('SIGTERM')
  let after = await fetch(`${probe}/readyz`)
  for (let i = 0; i < 200 && after.status === 200; i++) {
    await after.text()
    await new Promise(resolve => setTimeout(resolve, 5))
    after = await fetch(`${probe}/readyz`)
  }
  t.equal(after.status, 503, 'readiness fails after SIGTERM')
  t.same(await after.json(), { status: 'not ready', reasons: ['shutting_down'] })
  const served = await initialize(port)
  t.equal(served.status, 200, '/mcp is still served while readiness fails')
  t.ok(served.headers.get('mcp-session-id'))
  await served.text()

  t.equal(await exited, 0, 'then the gateway drains and exits 0')
  t.equal(await accepts(probePort), false, 'the probe listener is closed')
  t.notMatch(out, METRICS_TOKEN, 'the metrics token is never logged')
  t.notMatch(out, ADMIN_TOKEN)
})
