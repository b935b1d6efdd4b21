/**
 * The relay between workers from the outside (issue 22, items 9 and 12): the
 * real CLI with `workers: 2`, strict authentication against the dev IdP, a
 * real server-everything; every request on a fresh TCP connection so the
 * primary's round-robin spreads them over both workers.
 *
 * - item 9: a POST naming a parkable method (`Mcp-Method: tools/call`) is
 *   authenticated before its body is read: without a token it gets its 401
 *   while the client still holds most of its body; a retry carrying a parked
 *   `requestState` still reaches the worker that parked the call;
 * - item 12: a client-set `Mcp-Proxy-Forwarded` header changes nothing (it
 *   used to stop the relay: the session or parked call was "unknown" on the
 *   other worker); a request relayed to an owner that is gone is answered
 *   with the request's JSON-RPC id, not null.
 */
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { configFile, freePort, freshFetch, spawnCli, waitForPort, workersOf } from './helpers/cli.ts'
import { EVERYTHING, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { call, MODERN } from './helpers/conformance-fixture.ts'
import { devIdp } from './helpers/idp.ts'

const fresh = freshFetch as typeof fetch
// A CLI with two workers started once, and both workers killed and replaced once: slow on a busy machine.
t.setTimeout(300_000)
/** Longest one exchange may take before the test counts it as hung (a failure guard, not a measurement). */
const GUARD_MS = 20_000

const idp = await devIdp(t)
const token = await idp.mintToken({ sub: 'alice' })
const bearer = { authorization: `Bearer ${token}` }

/** The CLI with `workers: 2`, strict authentication and server-everything; its /mcp URL once both workers serve. */
async function twoWorkers(t: Test): Promise<{ url: string; port: number; pid: number }> {
  const port = await freePort()
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  targets:',
      `    - { name: everything, stdio: { cmd: "${process.execPath}", args: ["${EVERYTHING}", "stdio"] } }`,
      // No body deadline: before the fix a refusal waited for the whole body (or this deadline, after which
      // the 401 came anyway); with none, a request the gateway reads before authenticating is never answered.
      '  limits: { bodyTimeoutMs: 0 }',
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      `      issuer: "${idp.issuer}"`,
      `      audiences: ["${idp.clientId}"]`,
      '      provider: { oss_idp: {} }',
      `      clientId: "${idp.clientId}"`,
      `      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp", scopesSupported: [openid] }`,
      'workers: 2',
      // No admin listener: test files run in parallel, and two CLIs on the default admin.port (15000) refuse to start.
      'admin: { enabled: false }',
    ].join('\n'),
    'mcpp-workers-edge-'
  )
  const cli = spawnCli(['-f', file])
  t.teardown(async () => {
    if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill('SIGKILL')
    await cli.exited
  })
  const giveUp = Promise.race([cli.exited, new Promise(resolve => setTimeout(resolve, 60_000).unref())])
  await waitForPort(port, giveUp)
  // Both workers up (a failure guard bounds the wait): round-robin then alternates between them.
  for (let i = 0; i < 300 && workersOf(cli.child.pid!).length < 2; i++) await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(workersOf(cli.child.pid!).length, 2, 'two workers')
  return { url: `http://127.0.0.1:${port}/mcp`, port, pid: cli.child.pid! }
}

/**
 * Sends the head of a POST declaring `total` body bytes and the first `sent` of them, then
 * waits for an answer without sending more. Resolves with the status line and the bytes sent.
 */
function partialPost(port: number, headers: string, total: number, sent: number): Promise<{ statusLine: string; sent: number }> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    let received = ''
    const guard = setTimeout(() => {
      socket.destroy()
      reject(new Error('no answer within the guard'))
    }, GUARD_MS)
    socket.on('error', () => {})
    socket.on('data', d => {
      received += d.toString('latin1')
      const end = received.indexOf('\r\n')
      if (end === -1) return
      clearTimeout(guard)
      socket.destroy()
      resolve({ statusLine: received.slice(0, end), sent })
    })
    socket.once('close', () => {
      clearTimeout(guard)
      reject(new Error(`closed without an answer: ${JSON.stringify(received)}`))
    })
    socket.once('connect', () => {
      socket.write(
        'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n' +
          `${headers}Content-Length: ${total}\r\n\r\n`
      )
      socket.write(Buffer.alloc(sent, 0x20))
    })
  })
}

const CAPS = { elicitation: { form: {} } }
const PARAMS = { name: 'trigger-elicitation-request', arguments: {} }

/** A translated call parked on an InputRequiredResult, and the retry that answers it. */
async function park(t: Test, url: string): Promise<Record<string, unknown>> {
  const first = await call(url, 'tools/call', PARAMS, CAPS, bearer, fresh)
  t.equal(first.json.result?.resultType, 'input_required', 'an InputRequiredResult', { got: first.json })
  const key = Object.keys(first.json.result?.inputRequests ?? {})[0]!
  return { ...PARAMS, requestState: first.json.result?.requestState, inputResponses: { [key]: { action: 'decline' } } }
}

t.test('workers: 2', async t => {
  const { url, port, pid } = await twoWorkers(t)

  await t.test('item 9: no token, a parkable method and a large body: 401 before the body is read', async t => {
    const total = 4 * 1024 * 1024 - 1024
    for (const method of ['tools/call', 'prompts/get', 'resources/read', 'tools/call']) {
      const got = await partialPost(port, `Mcp-Method: ${method}\r\nMcp-Protocol-Version: ${MODERN}\r\n`, total, 1024)
      t.equal(got.statusLine, 'HTTP/1.1 401 Unauthorized', `${method}: refused while the client holds ${total - got.sent} of ${total} body bytes`)
    }
  })

  await t.test('item 9: a retry with a parked requestState still reaches the worker that parked the call (token relayed)', async t => {
    for (let round = 1; round <= 3; round++) {
      const done = await call(url, 'tools/call', await park(t, url), CAPS, bearer, fresh)
      t.equal(done.json.result?.resultType, 'complete', `round ${round}: the retry completes the call`, { got: done.json })
    }
    const retry = await park(t, url)
    const noToken = await call(url, 'tools/call', retry, CAPS, {}, fresh)
    t.equal(noToken.status, 401, 'the retry without a token: 401, wherever it lands')
  })

  await t.test('item 12: a client-set Mcp-Proxy-Forwarded changes nothing', async t => {
    const forged = { ...bearer, 'mcp-proxy-forwarded': '1' }
    for (let round = 1; round <= 2; round++) {
      const done = await call(url, 'tools/call', await park(t, url), CAPS, forged, fresh)
      t.equal(done.json.result?.resultType, 'complete', `round ${round}: the parked call is still relayed to its owner`, { got: done.json })
    }
    const init = await fresh(url, {
      method: 'POST',
      headers: { ...INIT_HEADERS, ...bearer },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
      }),
    })
    await init.text()
    const sid = init.headers.get('mcp-session-id')!
    t.type(sid, 'string', 'a session')
    const statuses: number[] = []
    for (let i = 0; i < 4; i++) {
      const res = await fresh(url, {
        method: 'POST',
        headers: { ...INIT_HEADERS, ...forged, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 10 + i, method: 'ping' }),
      })
      await res.text()
      statuses.push(res.status)
    }
    t.same(statuses, [200, 200, 200, 200], 'the session is served through both workers')
  })

  await t.test('item 12: a request relayed to an owner that is gone is answered with its own id', async t => {
    const init = await fresh(url, {
      method: 'POST',
      headers: { ...INIT_HEADERS, ...bearer },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
      }),
    })
    await init.text()
    const sid = init.headers.get('mcp-session-id')!
    const old = workersOf(pid)
    for (const w of old) process.kill(w, 'SIGKILL')
    let now: number[] = []
    for (let i = 0; i < 400 && (now.length < 2 || now.some(w => old.includes(w))); i++) {
      await new Promise(resolve => setTimeout(resolve, 50))
      now = workersOf(pid)
    }
    t.equal(now.filter(w => !old.includes(w)).length, 2, 'two new workers')
    let gone: { status: number; json: any } | undefined
    // A new worker may still be starting (503, a failure guard bounds the wait).
    for (let i = 0; i < 400 && (gone === undefined || gone.status === 503); i++) {
      gone = await fresh(url, {
        method: 'POST',
        headers: { ...INIT_HEADERS, ...bearer, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 42, method: 'ping' }),
      }).then(
        async r => ({ status: r.status, json: JSON.parse(await r.text()) }),
        () => undefined
      )
      if (gone === undefined || gone.status === 503) await new Promise(resolve => setTimeout(resolve, 50))
    }
    t.equal(gone?.status, 404, 'the session is gone with its owner', { got: gone })
    t.same(gone?.json, { jsonrpc: '2.0', id: 42, error: { code: -32001, message: 'Session not found' } }, "answered with the request's id")
  })
})
