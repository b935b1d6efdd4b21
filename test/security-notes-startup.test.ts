/**
 * README "Security notes", start-up hold limits (issue 22 item 18), black-box
 * against the real CLI: a plugin whose create() takes a minute keeps the
 * gateway starting while its port already accepts. Past
 * `mcp.limits.startupMaxHeldRequests` a request gets 503 with Retry-After at
 * once; a request held longer than `mcp.limits.startupHoldMs` gets 503 with
 * Retry-After. The CLI is killed in teardown (it never finishes starting).
 */
import t from 'tap'
import type { Test } from 'tap'
import { join } from 'node:path'
import { spawnCli, waitForPort, freePort, ROOT, configFile, eventually } from './helpers/cli.ts'

const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js')
const SLOW_PLUGIN = join(ROOT, 'test/fixtures/plugins/slow-create.js')
const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
})

/** The CLI stuck in start-up (the slow plugin waits 60 s); answers its port and its output. */
async function starting(t: Test, limits: string): Promise<{ url: string; output: () => string }> {
  const port = await freePort()
  const file = await configFile(
    [
      'mcp:',
      `  port: ${port}`,
      '  host: 127.0.0.1',
      `  limits: { ${limits} }`,
      '  targets:',
      '    - name: everything',
      `      stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] }`,
      '  plugins:',
      `    - module: "${SLOW_PLUGIN}"`,
      '      options: { delayMs: 60000 }',
      'admin: { enabled: false }',
    ].join('\n') + '\n',
    'mcpp-hold-'
  )
  const run = spawnCli(['-f', file])
  t.teardown(async () => {
    if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGKILL')
    await run.exited
  })
  await waitForPort(port, run.exited)
  return { url: `http://127.0.0.1:${port}/mcp`, output: run.output }
}

interface Outcome {
  status: number
  retryAfter: string | null
  body: string
}

function send(url: string, signal: AbortSignal): Promise<Outcome> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: INIT,
    signal,
  }).then(async res => ({ status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.text() }))
}

t.test('start-up hold limits (real CLI, slow plugin)', async t => {
  const [full, slow] = await Promise.all([starting(t, 'startupMaxHeldRequests: 2, startupHoldMs: 60000'), starting(t, 'startupHoldMs: 300')])
  const abort = new AbortController()
  t.teardown(() => abort.abort())

  t.test('startupMaxHeldRequests: the request beyond it gets 503 + Retry-After at once, the held ones wait', async t => {
    const settled: boolean[] = [false, false, false]
    const all = [0, 1, 2].map(i =>
      send(full.url, abort.signal).then(
        o => {
          settled[i] = true
          return o
        },
        () => undefined
      )
    )
    const first = await Promise.race(all)
    t.ok(first, 'one request was answered')
    t.equal(first!.status, 503)
    t.ok(Number(first!.retryAfter) > 0, 'with Retry-After')
    t.match(first!.body, /starting/)
    t.equal(settled.filter(Boolean).length, 1, 'the two held requests are still waiting (held for 60 s)')
    const TOO_MANY = /start-up: too many requests held; answering 503/
    t.match(await eventually(full.output, o => TOO_MANY.test(o)), TOO_MANY, 'logged')
  })

  t.test('startupHoldMs: a request held longer gets 503 + Retry-After', async t => {
    const res = await send(slow.url, abort.signal)
    t.equal(res.status, 503)
    t.ok(Number(res.retryAfter) > 0, 'with Retry-After')
    t.match(res.body, /starting/)
    const TOO_LONG = /"holdMs":300[^\n]*start-up: request held too long; answering 503/
    t.match(await eventually(slow.output, o => TOO_LONG.test(o)), TOO_LONG, 'logged')
  })
})
