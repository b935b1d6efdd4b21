/**
 * The access log and request ids, black-box through the real CLI: every
 * answer carries X-Request-ID (the client's, or one the gateway made); log
 * lines have level names and ISO times by default (numbers and epoch millis
 * when configured); the access line of a tools/call names the tool, the
 * target, the client address (from X-Forwarded-For only through a trusted
 * proxy), the user agent and the outcome.
 */
import t, { type Test } from 'tap'
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { connect } from 'node:net'
import { join } from 'node:path'
import { spawnCli, waitForPort, freePort } from './helpers/cli.ts'
import { EVERYTHING, INIT_HEADERS, sseMessages } from './helpers/gateway-harness.ts'

interface Cli {
  mcp: string
  lines: () => Array<Record<string, unknown>>
  raw: () => string
}

async function startCli(t: Test, extra: string): Promise<Cli> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-access-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const port = await freePort()
  const file = join(dir, 'config.yaml')
  await writeFile(
    file,
    `mcp:
  port: ${port}
  host: 127.0.0.1
  targets:
    - name: everything
      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] }
${extra}`
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
  return { mcp: `http://127.0.0.1:${port}/mcp`, lines, raw: cli.output }
}

async function post(url: string, body: unknown, headers: Record<string, string>): Promise<Response> {
  return fetch(url, { method: 'POST', headers: { ...INIT_HEADERS, ...headers }, body: JSON.stringify(body) })
}

/** The first request, sent as soon as the port accepts (a gateway still starting holds it). */
function initialize(url: string, headers: Record<string, string>): Promise<Response> {
  return post(
    url,
    {
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'access-log', version: '1' } },
    },
    headers
  )
}

/** Polls the CLI's output for a line matching `pred` (the access line is written when the response ends). */
async function lineWhere(cli: Cli, pred: (l: Record<string, unknown>) => boolean): Promise<Record<string, unknown> | undefined> {
  for (let i = 0; i < 200; i++) {
    const hit = cli.lines().find(pred)
    if (hit !== undefined) return hit
    await new Promise(resolve => setTimeout(resolve, 25))
  }
  return undefined
}

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

t.test('default logging: level names, ISO times; access line with tool, target, client, user agent, outcome; X-Request-ID on every answer', async t => {
  const adminPort = await freePort()
  const cli = await startCli(
    t,
    `  trustedProxies: [127.0.0.1/32, "::1"]
admin: { host: 0.0.0.0, port: ${adminPort} }
`
  )
  const init = await initialize(cli.mcp, { 'x-request-id': 'client-chosen.id-42', 'user-agent': 'access-log-test/1.0', 'x-forwarded-for': '203.0.113.7' })
  t.equal(init.status, 200)
  t.equal(init.headers.get('x-request-id'), 'client-chosen.id-42', "the client's request id is echoed")
  await init.text()
  const sid = init.headers.get('mcp-session-id')!
  // Without authentication a session is bound to its client address: the same client, through the proxy.
  const session = { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18', 'x-forwarded-for': '203.0.113.7' }
  await (await post(cli.mcp, { jsonrpc: '2.0', method: 'notifications/initialized' }, session)).text()

  // Through the trusted proxy (127.0.0.1): the rightmost address it did not write itself is the client;
  // the leftmost entry is whatever the client claimed and is not believed.
  const call = await post(
    cli.mcp,
    { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'echo', arguments: { message: 'hi' } } },
    { ...session, 'user-agent': 'access-log-test/1.0', 'x-forwarded-for': '198.51.100.66, 203.0.113.7, 127.0.0.1' }
  )
  t.equal(call.status, 200)
  const callId = call.headers.get('x-request-id')
  t.match(callId, /^[\w.-]{4,64}$/, 'a request id is made when the client sends none')
  const text = await call.text()
  t.same(sseMessages(text).find(m => m.id === 2)?.result, { content: [{ type: 'text', text: 'Echo: hi' }] }, 'the call went through')

  const evil = await post(
    cli.mcp,
    { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'echo', arguments: { message: 'x' } } },
    { ...session, 'x-request-id': 'bad\u00e9id with spaces' }
  )
  await evil.text()
  t.equal(evil.headers.get('x-request-id'), 'badidwithspaces', 'an id with other characters is cleaned before it is echoed or logged')

  const missing = await fetch(cli.mcp.replace('/mcp', '/nowhere'))
  t.equal(missing.status, 404)
  t.match(missing.headers.get('x-request-id'), /^[\w.-]+$/, 'errors carry a request id too')
  const unauth = await post(cli.mcp, { jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'echo' } }, { 'mcp-session-id': 'no-such-session' })
  t.equal(unauth.status, 404)
  t.ok(unauth.headers.get('x-request-id'))
  await Promise.all([missing.text(), unauth.text()])
  // A request the HTTP parser refuses has no request object: the gateway's answer still names one.
  const raw = await new Promise<string>((resolve, reject) => {
    const s = connect(Number(new URL(cli.mcp).port), '127.0.0.1', () => s.write('NOT HTTP AT ALL\r\n\r\n'))
    let got = ''
    s.on('data', d => {
      got += String(d)
    })
    s.on('close', () => resolve(got))
    s.on('error', reject)
  })
  t.match(raw, /^HTTP\/1\.1 400 [^\r]*\r\nx-request-id: [\w-]+\r\n/, 'a malformed request gets 400 with a request id')

  const access = await lineWhere(cli, l => l.msg === 'request' && l.reqId === callId)
  t.ok(access, 'the tools/call has an access line under its request id')
  t.match(access, {
    level: 'info',
    method: 'POST',
    path: '/mcp',
    status: 200,
    mcpMethod: 'tools/call',
    tool: 'echo',
    target: 'everything',
    client: '203.0.113.7',
    userAgent: 'access-log-test/1.0',
    outcome: 'allowed',
  })
  t.match(access!.time, ISO, 'times are ISO 8601')
  const initLine = await lineWhere(cli, l => l.msg === 'request' && l.reqId === 'client-chosen.id-42' && l.status === 200)
  t.match(initLine, { mcpMethod: 'initialize', client: '203.0.113.7', userAgent: 'access-log-test/1.0' })
  const notFound = await lineWhere(cli, l => l.msg === 'request' && l.path === '/nowhere')
  t.match(notFound, { status: 404, outcome: 'error', client: '127.0.0.1' }, 'without X-Forwarded-For the client is the peer')

  const warn = cli.lines().find(l => typeof l.msg === 'string' && l.msg.includes('admin listener is exposed'))
  t.equal(warn?.level, 'warn', 'a warning says "warn", so grep -i warn finds it')
  t.match(warn?.time, ISO)
  t.notOk(
    cli.lines().some(l => typeof l.level === 'number' || typeof l.time === 'number'),
    'no numeric levels or epoch times'
  )
})

t.test('X-Forwarded-For from a peer that is not a trusted proxy is ignored; logging.levels/time: number/epoch', async t => {
  const cli = await startCli(
    t,
    `  trustedProxies: [10.0.0.0/8]
admin: { enabled: false }
logging: { levels: number, time: epoch }
`
  )
  const init = await initialize(cli.mcp, { 'x-forwarded-for': '203.0.113.9', 'x-request-id': 'spoof-1' })
  t.equal(init.status, 200)
  await init.text()
  const line = await lineWhere(cli, l => l.msg === 'request' && l.reqId === 'spoof-1' && l.status === 200)
  t.match(line, { client: '127.0.0.1', level: 30 }, 'the peer, not the claimed address; level as a number')
  t.type(line?.time, 'number', 'time in epoch milliseconds')
})
