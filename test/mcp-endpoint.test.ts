/**
 * core/mcp/endpoint.ts: the streamable-HTTP rules of /mcp, the session
 * registry (caps, subject binding, drain, admin view) and the era dispatch,
 * over in-memory upstreams (test/helpers/memory-upstream.ts); subjects are
 * told apart by real tokens (dev IdP, mcpAuthentication). The
 * end-to-end files with real servers are test/mcp-transport.test.ts and
 * test/mcp-modern.test.ts.
 */
import t, { type Test } from 'tap'
import { startGateway, rawInitialize, sseMessages, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { memoryFactory } from './helpers/memory-upstream.ts'
import { realAuth, type RealAuth } from './helpers/real-auth.ts'

/** `auth`: the real mcpAuthentication plugin (dev IdP tokens) where a test tells subjects apart; else anonymous. */
async function gateway(t: Test, session: Record<string, number> = {}, auth?: RealAuth) {
  return startGateway(t, { targets: [], factories: [memoryFactory('a')], plugins: auth === undefined ? [] : [auth.plugin], session })
}

async function send(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
  method = 'POST'
): Promise<{ status: number; json: Record<string, unknown> | undefined; res: Response; text: string }> {
  const res = await fetch(url, { method, headers: { ...INIT_HEADERS, ...headers }, body: method === 'POST' ? JSON.stringify(body) : undefined })
  const text = await res.text()
  const json = res.headers.get('content-type')?.startsWith('application/json') === true ? (JSON.parse(text) as Record<string, unknown>) : undefined
  return { status: res.status, json, res, text }
}

const list = { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} }

t.test('transport rules: Accept, Content-Type, methods', async t => {
  const gw = await gateway(t)
  const accept = await send(gw.url, list, { accept: 'application/json' })
  t.equal(accept.status, 406)
  t.match(
    accept.json,
    { jsonrpc: '2.0', id: null, error: { code: -32600, message: /Accept must list application\/json and text\/event-stream/ } },
    'refused before the body is read: id null'
  )
  const ct = await send(gw.url, list, { 'content-type': 'text/plain' })
  t.equal(ct.status, 415)
  const put = await send(gw.url, undefined, {}, 'PUT')
  t.equal(put.status, 405)
  t.equal(put.res.headers.get('allow'), 'GET, POST, DELETE')
  t.equal((await send(gw.url, undefined, { accept: 'application/json' }, 'GET')).status, 406, 'a GET must accept text/event-stream')
  const get = await send(gw.url, undefined, { accept: 'text/event-stream' }, 'GET')
  t.equal(get.status, 400, 'a GET without a session id')
})

t.test("sessions: initialize mints an id; requests need it; another subject's id is not found", async t => {
  const auth = await realAuth(t, ['alice', 'bob'])
  const gw = await gateway(t, {}, auth)
  const [alice, bob] = [await auth.as('alice'), await auth.as('bob')]
  const init = await rawInitialize(gw.url, '2025-06-18', alice)
  t.equal(init.status, 200)
  t.match(sseMessages(init.body)[0], { id: 1, result: { protocolVersion: '2025-06-18', serverInfo: { name: 'memory-a' } } })
  const sid = init.sessionId!
  t.match(sid, /^[A-Za-z0-9_-]{32}$/, '24 random bytes, base64url')
  const missing = await send(gw.url, list, alice)
  t.equal(missing.status, 400)
  t.match(missing.json, { error: { message: 'Bad Request: Mcp-Session-Id header is required' } })
  const ok = await send(gw.url, list, { ...alice, 'mcp-session-id': sid })
  t.equal(ok.status, 200)
  t.match(sseMessages(ok.text)[0], { id: 2, result: { tools: [{ name: 'echo' }, { name: 'hang' }] } })
  const stolen = await send(gw.url, list, { ...bob, 'mcp-session-id': sid })
  t.equal(stolen.status, 404, "bob cannot use alice's session")
  t.match(stolen.json, { error: { code: -32001, message: 'Session not found' } })
  const version = await send(gw.url, list, { ...alice, 'mcp-session-id': sid, 'mcp-protocol-version': '1999-01-01' })
  t.equal(version.status, 400)
  const reinit = await send(gw.url, { jsonrpc: '2.0', id: 3, method: 'initialize', params: {} }, { ...alice, 'mcp-session-id': sid })
  t.equal(reinit.status, 400, 'initialize must not carry a session id')
  const notification = await send(gw.url, { jsonrpc: '2.0', method: 'notifications/initialized' }, { ...alice, 'mcp-session-id': sid })
  t.equal(notification.status, 202)
  t.same(
    gw.endpoint.sessions().map(s => ({ id: s.id, subject: s.subject, targets: s.targets })),
    [{ id: sid.slice(0, 8), subject: 'alice', targets: ['a'] }],
    'the admin sees 8 characters of the id'
  )
  const del = await send(gw.url, undefined, { ...alice, 'mcp-session-id': sid }, 'DELETE')
  t.equal(del.status, 200)
  t.equal((await send(gw.url, list, { ...alice, 'mcp-session-id': sid })).status, 404, 'gone after DELETE')
})

t.test('batches: only in 2025-03-26, never with initialize', async t => {
  const gw = await gateway(t)
  const old = await rawInitialize(gw.url, '2025-03-26')
  const batch = await send(gw.url, [list, { ...list, id: 3 }], { 'mcp-session-id': old.sessionId! })
  t.equal(batch.status, 200)
  t.same(
    sseMessages(batch.text).map(m => m.id),
    [2, 3]
  )
  const recent = await rawInitialize(gw.url, '2025-06-18')
  const refused = await send(gw.url, [list], { 'mcp-session-id': recent.sessionId! })
  t.equal(refused.status, 400)
  t.match(refused.json, { error: { message: /batches are not supported in protocol revision 2025-06-18/ } })
  const withInit = await send(gw.url, [{ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }])
  t.equal(withInit.status, 400)
})

t.test('one GET stream per session', async t => {
  const gw = await gateway(t)
  const { sessionId } = await rawInitialize(gw.url)
  const ac = new AbortController()
  t.teardown(() => ac.abort())
  const first = await fetch(gw.url, { headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId! }, signal: ac.signal })
  t.equal(first.status, 200)
  t.equal(first.headers.get('content-type'), 'text/event-stream')
  const second = await send(gw.url, undefined, { accept: 'text/event-stream', 'mcp-session-id': sessionId! }, 'GET')
  t.equal(second.status, 409)
})

t.test('caps: per subject 429, in total and while draining 503, with Retry-After', async t => {
  const auth = await realAuth(t, ['alice', 'bob', 'carol'])
  const gw = await gateway(t, { maxSessionsPerSubject: 1, maxSessions: 2 }, auth)
  const [alice, bob, carol] = [await auth.as('alice'), await auth.as('bob'), await auth.as('carol')]
  t.equal((await rawInitialize(gw.url, undefined, alice)).status, 200)
  const again = await rawInitialize(gw.url, undefined, alice)
  t.equal(again.status, 429)
  t.equal(again.response.headers.get('retry-after'), '10')
  t.equal((await rawInitialize(gw.url, undefined, bob)).status, 200)
  t.equal((await rawInitialize(gw.url, undefined, carol)).status, 503, 'session limit reached')
  const [aliceSession] = gw.endpoint.sessions().filter(s => s.subject === 'alice')
  t.ok(gw.endpoint.endSession(aliceSession!.id), 'the admin ends a session by its 8-character prefix')
  gw.endpoint.drain()
  const draining = await rawInitialize(gw.url, undefined, carol)
  t.equal(draining.status, 503)
  t.match(draining.body, /shutting down/)
})

t.test('era dispatch: 2026-07-28 requests go to the stateless handler on the same endpoint', async t => {
  const gw = await gateway(t)
  const meta = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} }
  const r = await send(
    gw.url,
    { jsonrpc: '2.0', id: 9, method: 'tools/list', params: { _meta: meta } },
    { 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/list' }
  )
  t.equal(r.status, 200)
  t.match(r.json, { id: 9, result: { resultType: 'complete', tools: [{ name: 'echo' }] } })
  const mismatch = await send(
    gw.url,
    { jsonrpc: '2.0', id: 10, method: 'tools/list', params: { _meta: meta } },
    { 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'prompts/list' }
  )
  t.equal(mismatch.status, 400)
  t.same(
    mismatch.json,
    {
      jsonrpc: '2.0',
      id: 10,
      error: { code: -32020, message: "Header mismatch: Mcp-Method header value 'prompts/list' does not match body value 'tools/list'" },
    },
    'the ProxyError written by the one error writer'
  )
  const version = await send(
    gw.url,
    { jsonrpc: '2.0', id: 11, method: 'tools/list', params: { _meta: { ...meta, 'io.modelcontextprotocol/protocolVersion': '2030-01-01' } } },
    { 'mcp-protocol-version': '2030-01-01', 'mcp-method': 'tools/list' }
  )
  t.equal(version.status, 400)
  t.match(
    version.json,
    { id: 11, error: { code: -32022, message: 'Unsupported protocol version', data: { requested: '2030-01-01', supported: ['2026-07-28'] } } },
    'the JSON-RPC error carries data'
  )
  t.equal(version.res.headers.get('cache-control'), 'no-store')
  const del = await send(gw.url, undefined, { 'mcp-protocol-version': '2026-07-28' }, 'DELETE')
  t.equal(del.status, 405)
  t.equal(del.res.headers.get('allow'), 'POST')
  t.equal(gw.endpoint.pooled().length, 1, 'one pooled upstream served it')
})
