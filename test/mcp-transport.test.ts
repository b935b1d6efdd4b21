/**
 * The /mcp endpoint (core/mcp/) in front of real MCP servers over stdio:
 * the official SDK client against server-everything and server-memory, raw
 * HTTP for the transport rules, session caps, idle expiry, upstream faults
 * (test/fixtures/faulty-server.mjs), multiplexing and per-operation filtering.
 */
import t from 'tap'
import { rm } from 'node:fs/promises'
import { request as httpRequest } from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema, ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import type { Plugin } from '../core/plugin.ts'
import {
  startGateway,
  everythingTarget,
  memoryTarget,
  faultyTarget,
  processGone,
  until,
  sseMessages,
  rawInitialize,
  INIT_HEADERS,
} from './helpers/gateway-harness.ts'
import { outcome } from './helpers/outcome.ts'
import { realAuth } from './helpers/real-auth.ts'

type Msg = Record<string, any> // eslint-disable-line @typescript-eslint/no-explicit-any

async function rawPost(
  url: string,
  sessionId: string | null,
  body: unknown,
  headers: Record<string, string> = {},
  signal?: AbortSignal
): Promise<{ status: number; headers: Headers; text: string; messages: Msg[] }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, ...(sessionId === null ? {} : { 'mcp-session-id': sessionId }), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  })
  const text = await res.text()
  const ct = res.headers.get('content-type') ?? ''
  const messages = text === '' ? [] : ct.startsWith('text/event-stream') ? sseMessages(text) : [JSON.parse(text) as Msg]
  return { status: res.status, headers: res.headers, text, messages }
}

function ping(id: number): Msg {
  return { jsonrpc: '2.0', id, method: 'ping' }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ type: string; text?: string }> }).content.map(c => c.text ?? '').join('\n')
}

/** Denies one tool of each target and one prompt; rules see upstream names and the target. */
const denyPlugin: Plugin = {
  name: 'deny-some',
  allowMcpOperation(_ctx, op) {
    if (op.tool !== undefined)
      return !((op.tool.target === 'everything' && op.tool.name === 'get-env') || (op.tool.target === 'memory' && op.tool.name === 'delete_entities'))
    if (op.prompt !== undefined) return op.prompt.name !== 'args-prompt'
    return true
  },
}

t.test('SDK client through the gateway to server-everything (one target)', async t => {
  const gw = await startGateway(t, { targets: [everythingTarget()], plugins: [denyPlugin] })
  const client = new Client({ name: 'transport-test', version: '1.0.0' }, { capabilities: { sampling: {}, elicitation: {}, roots: { listChanged: true } } })
  client.setRequestHandler(CreateMessageRequestSchema, async req => ({
    model: 'test-model',
    role: 'assistant',
    content: { type: 'text', text: `sampled: ${(req.params.messages[0]!.content as { text: string }).text.slice(-10)}` },
  }))
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { name: 'Ada Lovelace' } }))
  client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [{ uri: 'file:///tmp/gateway-root', name: 'gateway-root' }] }))
  const transport = new StreamableHTTPClientTransport(new URL(gw.url))
  await client.connect(transport)
  t.teardown(() => client.close())

  t.match(client.getServerVersion(), { name: 'mcp-servers/everything' }, 'one target: the upstream serverInfo passes through')
  t.ok(transport.sessionId !== undefined && /^[\x21-\x7e]{32,}$/.test(transport.sessionId), 'session id is long visible ASCII')
  t.equal(gw.endpoint.sessions().length, 1)
  t.equal(gw.endpoint.sessions()[0]!.id, transport.sessionId!.slice(0, 8), 'admin summary shows only the id prefix')

  const { tools } = await client.listTools()
  const names = tools.map(x => x.name)
  for (const n of ['echo', 'get-sum', 'trigger-long-running-operation']) t.ok(names.includes(n), `lists ${n}`)
  t.notOk(names.includes('get-env'), 'a denied tool is filtered out of tools/list')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'hello gateway' } })), 'Echo: hello gateway')
  t.match(textOf(await client.callTool({ name: 'get-sum', arguments: { a: 2, b: 40 } })), /is 42/)
  t.equal(
    await outcome(() => client.callTool({ name: 'get-env', arguments: {} }), ['get-env']),
    await outcome(() => client.callTool({ name: 'no-such-tool', arguments: {} }), ['no-such-tool']),
    'a denied call is answered exactly like a call to a tool that does not exist'
  )

  const progress: number[] = []
  let resultSeen = false
  const long = await client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 0.3, steps: 3 } }, undefined, {
    onprogress: p => {
      t.notOk(resultSeen, 'progress arrives before the result')
      progress.push(p.progress)
    },
  })
  resultSeen = true
  t.same(progress, [1, 2, 3], 'every progress notification arrived on the request stream')
  t.match(textOf(long), /Long running operation completed/)

  const { resources } = await client.listResources()
  t.ok(resources.length > 0, 'resources listed')
  const first = resources[0]!
  const read = await client.readResource({ uri: first.uri })
  t.equal(read.contents[0]!.uri, first.uri, 'resource read by its unchanged URI')
  const { resourceTemplates } = await client.listResourceTemplates()
  t.ok(resourceTemplates.length > 0, 'resource templates listed')
  t.same(await client.subscribeResource({ uri: first.uri }), {}, 'subscribe answered')
  t.same(await client.unsubscribeResource({ uri: first.uri }), {}, 'unsubscribe answered')

  const { prompts } = await client.listPrompts()
  t.ok(
    prompts.some(p => p.name === 'simple-prompt'),
    'prompts listed'
  )
  t.notOk(
    prompts.some(p => p.name === 'args-prompt'),
    'a denied prompt is filtered out'
  )
  const prompt = await client.getPrompt({ name: 'simple-prompt' })
  t.ok(prompt.messages.length > 0, 'prompt fetched')
  t.equal(
    await outcome(() => client.getPrompt({ name: 'args-prompt', arguments: { city: 'x' } }), ['args-prompt']),
    await outcome(() => client.getPrompt({ name: 'no-such-prompt', arguments: { city: 'x' } }), ['no-such-prompt']),
    'a denied prompt is answered exactly like a prompt that does not exist'
  )

  // Conditional tools are registered once the upstream saw the client's capabilities.
  const sampled = await client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'ping-pong', maxTokens: 5 } })
  t.match(textOf(sampled), /sampled: /, 'sampling request reached the client and its answer reached the upstream')
  const elicited = await client.callTool({ name: 'trigger-elicitation-request', arguments: {} })
  t.match(textOf(elicited), /Ada Lovelace/, 'elicitation round trip')
  const roots = await client.callTool({ name: 'get-roots-list', arguments: {} })
  t.match(textOf(roots), /gateway-root/, 'roots/list (sent on the GET stream after initialize) was answered')
  t.same(await client.ping(), {}, 'ping')
})

t.test('raw HTTP: negotiation, transport rules, batches, DELETE', async t => {
  const gw = await startGateway(t, { targets: [faultyTarget()] })
  const url = gw.url

  const old = await rawInitialize(url, '2024-11-05')
  t.equal(old.status, 200)
  t.match(old.response.headers.get('content-type'), /^text\/event-stream/)
  t.ok(old.sessionId !== null, 'mcp-session-id header')
  const [oldResult] = sseMessages(old.body)
  t.match(
    oldResult,
    { jsonrpc: '2.0', id: 1, result: { protocolVersion: '2024-11-05', serverInfo: { name: 'faulty-server' } } },
    '2024-11-05 is answered with 2024-11-05'
  )
  const unknown = await rawInitialize(url, '1999-01-01')
  t.equal((sseMessages(unknown.body)[0] as Msg).result.protocolVersion, '2025-11-25', 'an unknown revision gets our latest')
  t.not(unknown.sessionId, old.sessionId, 'a new session per initialize')

  // Accept / Content-Type / body rules (no session needed).
  let r = await rawPost(url, null, ping(1), { accept: 'application/json' })
  t.equal(r.status, 406, 'Accept without text/event-stream -> 406')
  t.equal(r.messages[0]!.error.code, -32600)
  r = await rawPost(url, null, ping(1), { 'content-type': 'text/plain' })
  t.equal(r.status, 415, 'non-JSON Content-Type -> 415')
  r = await rawPost(url, null, '{"jsonrpc": "2.0", "id": 1, "method": ')
  t.equal(r.status, 400)
  t.equal(r.messages[0]!.error.code, -32700, 'invalid JSON -> -32700')
  r = await rawPost(url, null, { jsonrpc: '1.0', id: 1, method: 'ping' })
  t.equal(r.status, 400)
  t.equal(r.messages[0]!.error.code, -32600, 'not JSON-RPC 2.0 -> -32600')
  r = await rawPost(url, null, ping(7))
  t.equal(r.status, 400, 'a non-initialize request without a session id -> 400')
  t.equal(r.messages[0]!.id, 7)
  r = await rawPost(url, 'no-such-session', ping(8))
  t.equal(r.status, 404, 'unknown session -> 404')
  t.match(r.messages[0], { id: 8, error: { code: -32001, message: 'Session not found' } })
  r = await rawPost(url, old.sessionId, {
    jsonrpc: '2.0',
    id: 2,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
  })
  t.equal(r.status, 400, 'initialize with a session id -> 400')
  r = await rawPost(url, null, { jsonrpc: '2.0', method: 'notifications/initialized' })
  t.equal(r.status, 400, 'a notification without a session id -> 400')

  // Within a session.
  const sid = old.sessionId!
  r = await rawPost(url, sid, { jsonrpc: '2.0', method: 'notifications/initialized' })
  t.equal(r.status, 202, 'notification -> 202')
  t.equal(r.text, '', '202 has no body')
  r = await rawPost(url, sid, ping(3), { 'mcp-protocol-version': '2099-01-01' })
  t.equal(r.status, 400, 'unsupported MCP-Protocol-Version -> 400')
  r = await rawPost(url, sid, ping(3), { 'mcp-protocol-version': '2026-07-28' })
  // The 2026-07-28 header selects the stateless revision (test/mcp-modern.test.ts); without its _meta the body is invalid.
  t.equal(r.status, 400, "a 2026-07-28 request without the revision's _meta -> 400")
  t.equal(r.messages[0]!.error.code, -32602)
  r = await rawPost(url, sid, ping(4), { 'mcp-protocol-version': '2024-11-05' })
  t.equal(r.status, 200)
  t.match(r.messages, [{ jsonrpc: '2.0', id: 4, result: {} }], 'ping answered on an SSE stream')
  r = await rawPost(url, sid, { jsonrpc: '2.0', id: 'call-1', method: 'tools/call', params: { name: 'echo', arguments: { message: 'through' } } })
  t.match(r.messages, [{ id: 'call-1', result: { content: [{ text: 'through' }] } }], 'the client id comes back unchanged')
  r = await rawPost(url, sid, [ping(5), ping(6)])
  t.equal(r.status, 400, 'batches are rejected after 2025-03-26 (and before)')
  t.equal(r.messages[0]!.error.code, -32600)

  // 2025-03-26 allows batches.
  const b = await rawInitialize(url, '2025-03-26')
  const bsid = b.sessionId!
  r = await rawPost(url, bsid, [
    { jsonrpc: '2.0', method: 'notifications/initialized' },
    ping(10),
    { jsonrpc: '2.0', id: 11, method: 'tools/call', params: { name: 'echo', arguments: { message: 'b' } } },
  ])
  t.equal(r.status, 200)
  t.same(r.messages.map(m => m.id).sort(), [10, 11], 'every request of the batch answered on one stream')
  r = await rawPost(url, bsid, [{ jsonrpc: '2.0', method: 'notifications/roots/list_changed' }])
  t.equal(r.status, 202, 'a batch of notifications -> 202')
  r = await rawPost(url, bsid, [{ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }])
  t.equal(r.status, 400, 'initialize inside a batch -> 400')

  // GET stream: one at a time.
  const ac = new AbortController()
  const get1 = await fetch(url, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal })
  t.equal(get1.status, 200)
  t.match(get1.headers.get('content-type'), /^text\/event-stream/)
  const get2 = await fetch(url, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid } })
  t.equal(get2.status, 409, 'a second GET stream -> 409')
  await get2.text()
  const get3 = await fetch(url, { headers: { accept: 'application/json', 'mcp-session-id': sid } })
  t.equal(get3.status, 406, 'GET without text/event-stream -> 406')
  await get3.text()
  ac.abort()
  t.ok(await until(() => gw.endpoint.sessions().every(s => !s.getStream)), 'GET stream released when the client goes away')

  // DELETE ends the session and its child.
  const summary = gw.endpoint.sessions().find(s => sid.startsWith(s.id))!
  const [pid] = summary.pids
  t.ok(pid !== undefined && !processGone(pid), 'the session has a running child')
  const del = await fetch(url, { method: 'DELETE', headers: { 'mcp-session-id': sid } })
  t.equal(del.status, 200, 'DELETE -> 200')
  t.ok(await until(() => processGone(pid!)), 'the child is gone')
  r = await rawPost(url, sid, ping(12))
  t.equal(r.status, 404, 'an ended session -> 404')
  const del2 = await fetch(url, { method: 'DELETE', headers: { 'mcp-session-id': sid } })
  t.equal(del2.status, 404, 'DELETE of an unknown session -> 404')
  r = await rawPost(url, bsid, ping(13))
  t.equal(r.status, 200, 'other sessions are untouched')
})

t.test('DELETE answers before the child has exited; close() still waits for it', async t => {
  // This child ignores stdin EOF and SIGTERM: only SIGKILL, two stage timeouts after close starts, ends it.
  const gw = await startGateway(t, { targets: [faultyTarget('faulty', ['--ignore-sigterm'])] })
  const s = await rawInitialize(gw.url, '2025-06-18')
  t.equal(s.status, 200)
  const [pid] = gw.endpoint.sessions()[0]!.pids
  t.ok(pid !== undefined && !processGone(pid))
  const del = await fetch(gw.url, { method: 'DELETE', headers: { 'mcp-session-id': s.sessionId! } })
  t.equal(del.status, 200)
  t.same(gw.endpoint.sessions(), [], 'the session is gone from the registry when DELETE answers')
  t.notOk(processGone(pid!), 'DELETE did not wait for the child to exit')
  t.equal((await rawPost(gw.url, s.sessionId, ping(2))).status, 404, 'the ended session is unknown at once')
  await gw.endpoint.close()
  t.ok(processGone(pid!), 'the child is gone when close() resolves')
})

t.test('session caps and subject binding (subjects from real dev-IdP tokens)', async t => {
  const auth = await realAuth(t, ['alice', 'bob', 'carol'])
  const gw = await startGateway(t, { targets: [faultyTarget()], plugins: [auth.plugin], session: { maxSessions: 2, maxSessionsPerSubject: 1 } })
  const [alice, bob, carol] = [await auth.as('alice'), await auth.as('bob'), await auth.as('carol')]
  const a = await rawInitialize(gw.url, '2025-06-18', alice)
  t.equal(a.status, 200)
  const a2 = await rawInitialize(gw.url, '2025-06-18', alice)
  t.equal(a2.status, 429, 'per-subject cap -> 429')
  t.ok(Number(a2.response.headers.get('retry-after')) > 0, 'with Retry-After')
  const b = await rawInitialize(gw.url, '2025-06-18', bob)
  t.equal(b.status, 200)
  const c = await rawInitialize(gw.url, '2025-06-18', carol)
  t.equal(c.status, 503, 'global cap -> 503')
  t.ok(Number(c.response.headers.get('retry-after')) > 0, 'with Retry-After')

  let r = await rawPost(gw.url, a.sessionId, ping(1), bob)
  t.equal(r.status, 404, "another subject presenting alice's session id -> 404")
  r = await rawPost(gw.url, a.sessionId, ping(2), alice)
  t.equal(r.status, 200, "alice's session keeps working")
  t.equal(gw.endpoint.sessions().find(s => a.sessionId!.startsWith(s.id))?.subject, 'alice')

  const del = await fetch(gw.url, { method: 'DELETE', headers: { 'mcp-session-id': b.sessionId!, ...bob } })
  t.equal(del.status, 200)
  const again = await rawInitialize(gw.url, '2025-06-18', carol)
  t.equal(again.status, 200, 'caps free up when sessions end')
})

/** A raw POST sent from a given loopback address (Linux routes all of 127.0.0.0/8 to lo). */
function postFrom(
  url: string,
  localAddress: string,
  body: unknown,
  headers: Record<string, string> = {}
): Promise<{ status: number; sessionId: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'POST', localAddress, headers: { ...INIT_HEADERS, ...headers } }, res => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode ?? 0, sessionId: res.headers['mcp-session-id'] as string | undefined }))
    })
    req.on('error', reject)
    req.end(JSON.stringify(body))
  })
}

t.test('without authentication, anonymous callers are one subject per client address (issue 13 item 24)', async t => {
  const gw = await startGateway(t, { targets: [faultyTarget()], session: { maxSessions: 4, maxSessionsPerSubject: 1 } })
  const init = {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'anon', version: '1' } },
  }
  const a = await postFrom(gw.url, '127.0.0.2', init)
  t.equal(a.status, 200)
  const b = await postFrom(gw.url, '127.0.0.3', init)
  t.equal(b.status, 200, "another caller is not counted against the first one's cap")
  const a2 = await postFrom(gw.url, '127.0.0.2', init)
  t.equal(a2.status, 429, 'the per-subject cap holds per client address')
  const stolen = await postFrom(gw.url, '127.0.0.3', ping(2), { 'mcp-session-id': a.sessionId!, 'mcp-protocol-version': '2025-06-18' })
  t.equal(stolen.status, 404, 'a session is bound to the address that opened it')
  const mine = await postFrom(gw.url, '127.0.0.2', ping(3), { 'mcp-session-id': a.sessionId!, 'mcp-protocol-version': '2025-06-18' })
  t.equal(mine.status, 200)
  t.same(
    gw.endpoint.sessions().map(s => s.subject),
    [undefined, undefined],
    'anonymous sessions show no subject'
  )
})

t.test('idle sessions expire', async t => {
  const gw = await startGateway(t, { targets: [faultyTarget()], session: { idleTimeoutSeconds: 1 } })
  const a = await rawInitialize(gw.url, '2025-06-18')
  t.equal(a.status, 200)
  const pids = gw.endpoint.sessions().flatMap(s => s.pids)
  t.equal(pids.length, 1)
  t.ok(await until(() => gw.endpoint.sessions().length === 0, 200, 50), 'the idle session is ended')
  const r = await rawPost(gw.url, a.sessionId, ping(3))
  t.equal(r.status, 404, 'an expired session -> 404')
  t.ok(await until(() => pids.every(processGone)), 'expired sessions leave no child behind')
})

t.test('upstream faults: crash mid-request, timeout, client disconnect', async t => {
  const gw = await startGateway(t, { targets: [faultyTarget()], session: { requestTimeoutSeconds: 1 } })
  const s = await rawInitialize(gw.url, '2025-11-25')
  const sid = s.sessionId!
  await rawPost(gw.url, sid, { jsonrpc: '2.0', method: 'notifications/initialized' })

  const timedOut = await rawPost(gw.url, sid, { jsonrpc: '2.0', id: 20, method: 'tools/call', params: { name: 'hang', arguments: {} } })
  t.match(timedOut.messages, [{ id: 20, error: { code: -32001, message: 'Request timed out' } }], 'a hung request times out with a JSON-RPC error')

  const ac = new AbortController()
  const abandoned = rawPost(
    gw.url,
    sid,
    { jsonrpc: '2.0', id: 21, method: 'tools/call', params: { name: 'hang', arguments: { tag: 'abandoned' } } },
    {},
    ac.signal
  ).catch(() => undefined)
  t.ok(await until(() => gw.endpoint.sessions()[0]?.inFlight === 1), 'request in flight')
  ac.abort()
  await abandoned
  // A disconnect is not a cancellation (MCP 2025-11-25 transports): the call goes on until its timeout.
  // The fixture writes every notifications/cancelled it receives on stderr (logged by the gateway) in
  // the order they came down its stdin: a cancel for the disconnect would come before the timeout's.
  t.ok(await until(() => /cancelled abandoned /.test(gw.logText())), 'the server was told when the call timed out')
  t.same(
    [...gw.logText().matchAll(/cancelled abandoned reason=([^"\\]*)/g)].map(m => m[1]),
    ['request timed out'],
    "the only cancellation the server got is the timeout's: the client disconnect did not cancel the call upstream"
  )
  t.ok(await until(() => gw.endpoint.sessions()[0]?.inFlight === 0), 'the request ended at its timeout')

  const [pid] = gw.endpoint.sessions()[0]!.pids
  const hanging = rawPost(gw.url, sid, { jsonrpc: '2.0', id: 22, method: 'tools/call', params: { name: 'hang', arguments: {} } })
  t.ok(await until(() => gw.endpoint.sessions()[0]?.inFlight === 1), 'request in flight')
  const crashing = await rawPost(gw.url, sid, { jsonrpc: '2.0', id: 23, method: 'tools/call', params: { name: 'crash', arguments: {} } })
  t.match(crashing.messages, [{ id: 23, error: { code: -32000, message: 'upstream faulty closed' } }], 'the crashing call gets an error')
  t.match((await hanging).messages, [{ id: 22, error: { code: -32000, message: 'upstream faulty closed' } }], 'the other pending call too')
  const after = await rawPost(gw.url, sid, ping(24))
  t.equal(after.status, 404, 'the session ended with its upstream')
  t.ok(await until(() => processGone(pid!)), 'no child left')
})

t.test('two targets multiplexed: everything + memory', async t => {
  const memory = memoryTarget()
  t.teardown(() => rm(memory.stdio!.env.MEMORY_FILE_PATH!, { force: true }))
  const gw = await startGateway(t, { targets: [everythingTarget(), memory], plugins: [denyPlugin] })
  const client = new Client({ name: 'multi-test', version: '1.0.0' }, { capabilities: {} })
  const updates: string[] = []
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, n => {
    updates.push(n.params.uri)
  })
  const transport = new StreamableHTTPClientTransport(new URL(gw.url))
  await client.connect(transport)
  t.teardown(() => client.close())

  t.match(client.getServerVersion(), { name: 'mcp-proxy' }, 'the gateway speaks for several targets')
  const caps = client.getServerCapabilities()!
  t.ok(caps.tools !== undefined && caps.resources?.subscribe === true && caps.prompts !== undefined, 'capabilities are the union')
  t.equal(gw.endpoint.sessions()[0]!.pids.length, 2, 'one child per target')

  const names = (await client.listTools()).tools.map(x => x.name)
  t.ok(names.includes('everything_echo') && names.includes('memory_read_graph') && names.includes('memory_create_entities'), 'prefixed names from both targets')
  t.notOk(names.includes('everything_get-env') || names.includes('memory_delete_entities'), 'denied tools filtered per target')
  t.notOk(
    names.some(n => !n.startsWith('everything_') && !n.startsWith('memory_')),
    'every name is prefixed'
  )
  t.equal(textOf(await client.callTool({ name: 'everything_echo', arguments: { message: 'routed' } })), 'Echo: routed')
  await client.callTool({
    name: 'memory_create_entities',
    arguments: { entities: [{ name: 'gateway', entityType: 'software', observations: ['multiplexes'] }] },
  })
  const graph = await client.callTool({ name: 'memory_read_graph', arguments: {} })
  t.match(JSON.stringify(graph), /multiplexes/, 'calls routed to the memory target')
  t.equal(
    await outcome(
      () => client.callTool({ name: 'memory_delete_entities', arguments: { entityNames: ['gateway'] } }),
      ['memory_delete_entities', 'delete_entities']
    ),
    await outcome(() => client.callTool({ name: 'memory_no_such_tool', arguments: { entityNames: ['gateway'] } }), ['memory_no_such_tool', 'no_such_tool']),
    'a denied tool of one target is answered like a missing tool of that target'
  )
  await t.rejects(client.callTool({ name: 'nosuch_echo', arguments: {} }), /Unknown tool: nosuch_echo/)

  const { resources } = await client.listResources()
  t.ok(
    resources.length > 0 && resources.every(r => /^mcp-proxy:\/\/(everything|memory)\//.test(r.uri)),
    'resource URIs carry the target marker: ' +
      resources
        .filter(r => !r.uri.startsWith('mcp-proxy://everything/'))
        .map(r => r.uri)
        .join()
  )
  const read = await client.readResource({ uri: resources[0]!.uri })
  t.equal(read.contents[0]!.uri, resources[0]!.uri, 'read by marked URI; contents marked back')
  const { resourceTemplates } = await client.listResourceTemplates()
  t.ok(resourceTemplates.length > 0 && resourceTemplates.every(r => r.uriTemplate.startsWith('mcp-proxy://everything/')), 'templates marked')
  t.same(await client.subscribeResource({ uri: resources[0]!.uri }), {}, 'subscribe routed by marker')

  const prompts = (await client.listPrompts()).prompts.map(p => p.name)
  t.ok(prompts.includes('everything_simple-prompt') && !prompts.includes('everything_args-prompt'), 'prompts prefixed and filtered')
  t.ok((await client.getPrompt({ name: 'everything_simple-prompt' })).messages.length > 0)
  t.same(await client.setLoggingLevel('error'), {}, 'logging/setLevel fanned out')
  t.same(await client.ping(), {}, 'ping answered by the gateway')
})

t.test('several targets: one failing target does not take the others down unless failClosed', async t => {
  const broken = { name: 'broken', stdio: { cmd: '/nonexistent/mcp-server', args: [], env: {} } }
  const open = await startGateway(t, { targets: [faultyTarget(), broken] })
  const s = await rawInitialize(open.url, '2025-06-18')
  t.equal(s.status, 200, 'initialize succeeds with the healthy target')
  const r = await rawPost(open.url, s.sessionId, { jsonrpc: '2.0', id: 2, method: 'tools/list' })
  const names = (r.messages[0]!.result.tools as Array<{ name: string }>).map(x => x.name)
  t.ok(names.includes('faulty_echo') && names.every(n => n.startsWith('faulty_')), 'the healthy target serves')
  const b = await rawPost(open.url, s.sessionId, { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'broken_x', arguments: {} } })
  t.match(b.messages[0], { id: 3, error: { code: -32000, message: 'upstream broken unavailable' } })

  // A target that crashes mid-session: its calls fail, the other target keeps serving.
  const two = await startGateway(t, { targets: [faultyTarget('one'), faultyTarget('two')] })
  const m = await rawInitialize(two.url, '2025-11-25')
  const crash = await rawPost(two.url, m.sessionId, { jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'one_crash', arguments: {} } })
  t.match(crash.messages[0], { id: 4, error: { code: -32000, message: 'upstream one closed' } })
  const still = await rawPost(two.url, m.sessionId, {
    jsonrpc: '2.0',
    id: 5,
    method: 'tools/call',
    params: { name: 'two_echo', arguments: { message: 'alive' } },
  })
  t.match(still.messages[0], { id: 5, result: { content: [{ text: 'alive' }] } }, 'the other target keeps serving')
  const gone = await rawPost(two.url, m.sessionId, { jsonrpc: '2.0', id: 6, method: 'tools/call', params: { name: 'one_echo', arguments: {} } })
  t.match(gone.messages[0], { id: 6, error: { code: -32000, message: 'upstream one unavailable' } })
  const list = await rawPost(two.url, m.sessionId, { jsonrpc: '2.0', id: 7, method: 'tools/list' })
  t.ok(
    (list.messages[0]!.result.tools as Array<{ name: string }>).every(x => x.name.startsWith('two_')),
    'lists omit the crashed target'
  )

  const closed = await startGateway(t, { targets: [faultyTarget(), broken], failClosed: true })
  const c = await rawInitialize(closed.url, '2025-06-18')
  t.equal(c.status, 502, 'fail-closed: initialize fails')
  t.match(JSON.parse(c.body), { jsonrpc: '2.0', id: 1, error: { message: /broken/ } })
  t.equal(closed.endpoint.sessions().length, 0, 'no session left behind')
})
