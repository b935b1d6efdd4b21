/**
 * MCP revision 2026-07-28 (stateless) on /mcp beside the session era: the
 * official 2.x client speaking 2026-07-28 and the 1.x client speaking
 * 2025-11-25 at the same time against one gateway (server-everything +
 * server-memory over stdio, authentication against the development IdP, a
 * per-operation rule); the revision's header rules and errors with raw HTTP;
 * per-subject isolation of pooled upstream processes.
 */
import t, { type Test } from 'tap'
import { rm } from 'node:fs/promises'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Client as Client2, StreamableHTTPClientTransport as Transport2 } from '@modelcontextprotocol/client'
import { validateConfig, deepFreeze, type LoadedConfig } from '../core/config.ts'
import { startGateway, type RunningGateway } from '../core/gateway.ts'
import { startDevIdp, type DevIdp } from '../bin/dev-idp.ts'
import { spawn } from 'node:child_process'
import { EVERYTHING, everythingTarget, memoryTarget } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { memoryLogger } from './helpers/logger.ts'
import { freePort } from './helpers/cli.ts'
import { outcome } from './helpers/outcome.ts'
import { builtins } from '../plugins/index.ts'

const MODERN = '2026-07-28'
const V = 'io.modelcontextprotocol/protocolVersion'
const CAPS = 'io.modelcontextprotocol/clientCapabilities'

interface Env {
  gw: RunningGateway
  url: URL
  idp: DevIdp
  alice: string
  bob: string
  admin: string
  logText: () => string
}

/** One gateway: two stdio targets, oss_idp authentication, a rule hiding everything's get-env from non-admins. */
async function setup(t: Test): Promise<Env> {
  const idp = await startDevIdp()
  t.teardown(() => idp.close())
  const memory = memoryTarget(`memory`)
  t.teardown(() => rm(memory.stdio!.env!.MEMORY_FILE_PATH!, { force: true }))
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const config = deepFreeze(
    await validateConfig(
      {
        mcp: {
          host: '127.0.0.1',
          port,
          targets: [everythingTarget(), memory],
          policies: {
            mcpAuthentication: {
              mode: 'strict',
              issuer: idp.issuer,
              audiences: [idp.clientId],
              provider: { oss_idp: {} },
              clientId: idp.clientId,
              resourceMetadata: { resource: `${base}/mcp` },
            },
            authorization: { rules: ['"mcp-users" in jwt.groups', 'mcp.tool.name != "get-env" || "admins" in jwt.groups'] },
          },
        },
        admin: { enabled: false },
      },
      builtins
    )
  )
  const loaded: LoadedConfig = { config, baseDir: process.cwd(), secretPaths: new Set() }
  const mem = memoryLogger('info')
  const gw = await startGateway(loaded, { log: mem.log, registry: builtins })
  t.teardown(() => gw.close())
  return {
    gw,
    idp,
    url: new URL(`${base}/mcp`),
    logText: mem.text,
    alice: await idp.mintToken({ sub: 'alice', groups: ['mcp-users'] }),
    bob: await idp.mintToken({ sub: 'bob', groups: ['mcp-users'] }),
    admin: await idp.mintToken({ sub: 'root', groups: ['mcp-users', 'admins'] }),
  }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ type: string; text?: string }> }).content.map(c => c.text ?? '').join('\n')
}

/** A modern request as the revision wants it: headers mirror the body. */
function modernRequest(
  method: string,
  params: Record<string, unknown> = {},
  id: number | string = 1
): { body: Record<string, unknown>; headers: Record<string, string> } {
  const body = {
    jsonrpc: '2.0',
    id,
    method,
    params: { ...params, _meta: { [V]: MODERN, [CAPS]: {}, 'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' } } },
  }
  const headers: Record<string, string> = { 'mcp-protocol-version': MODERN, 'mcp-method': method }
  const name = params.name ?? params.uri
  if (typeof name === 'string') headers['mcp-name'] = name
  return { body, headers }
}

async function post(
  url: URL,
  token: string | undefined,
  body: unknown,
  headers: Record<string, string>
): Promise<{ status: number; headers: Headers; json: any; text: string }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      ...headers,
    },
    body: JSON.stringify(body),
  })
  const text = await res.text()
  let json: any
  if ((res.headers.get('content-type') ?? '').startsWith('application/json')) json = JSON.parse(text)
  else {
    const data = text
      .split('\n')
      .filter(l => l.startsWith('data: '))
      .map(l => JSON.parse(l.slice(6)))
    json = data.at(-1)
  }
  return { status: res.status, headers: res.headers, json, text }
}

t.test('2.x client (2026-07-28) and 1.x client (2025-11-25) at the same time, two targets, authentication on', async t => {
  const env = await setup(t)
  const seen: Array<{ method: string; headers: Headers; status: number; sessionHeader: string | null }> = []
  const recordingFetch: typeof fetch = async (input, init) => {
    const res = await fetch(input, init)
    seen.push({ method: init?.method ?? 'GET', headers: new Headers(init?.headers), status: res.status, sessionHeader: res.headers.get('mcp-session-id') })
    return res
  }

  const modern = new Client2({ name: 'sdk2', version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
  const legacy = new Client1({ name: 'sdk1', version: '1.0.0' })
  t.teardown(async () => {
    await modern.close().catch(() => {})
    await legacy.close().catch(() => {})
  })

  // Both clients' server-memory processes share one file and server-memory rewrites it whole on each
  // change, so two concurrent writes could lose one (a property of that server, not of the gateway).
  // Everything else runs concurrently; the write-then-read pairs take turns.
  let memoryTurn: Promise<unknown> = Promise.resolve()
  const inTurn = <T>(fn: () => Promise<T>): Promise<T> => {
    const run = memoryTurn.then(fn)
    memoryTurn = run.catch(() => {})
    return run
  }

  const runModern = async (): Promise<{ names: string[]; echo: string; graph: string }> => {
    await modern.connect(new Transport2(env.url, { requestInit: { headers: { authorization: `Bearer ${env.alice}` } }, fetch: recordingFetch }))
    const { tools } = await modern.listTools()
    const echo = await modern.callTool({ name: 'everything_echo', arguments: { message: 'hello modern' } })
    const graph = await inTurn(async () => {
      await modern.callTool({
        name: 'memory_create_entities',
        arguments: { entities: [{ name: 'modern-entity', entityType: 'test', observations: ['from sdk2'] }] },
      })
      return modern.callTool({ name: 'memory_read_graph', arguments: {} })
    })
    return { names: tools.map(x => x.name), echo: textOf(echo), graph: textOf(graph) }
  }
  const runLegacy = async (): Promise<{ names: string[]; echo: string; graph: string; version: unknown }> => {
    const transport = new Transport1(env.url, { requestInit: { headers: { authorization: `Bearer ${env.bob}` } } })
    await legacy.connect(transport)
    const { tools } = await legacy.listTools()
    const echo = await legacy.callTool({ name: 'everything_echo', arguments: { message: 'hello legacy' } })
    const graph = await inTurn(async () => {
      await legacy.callTool({
        name: 'memory_create_entities',
        arguments: { entities: [{ name: 'legacy-entity', entityType: 'test', observations: ['from sdk1'] }] },
      })
      return legacy.callTool({ name: 'memory_read_graph', arguments: {} })
    })
    return { names: tools.map(x => x.name), echo: textOf(echo), graph: textOf(graph), version: transport.protocolVersion }
  }
  const [m, l] = await Promise.all([runModern(), runLegacy()])

  t.equal(modern.getNegotiatedProtocolVersion(), MODERN, '2.x client negotiated 2026-07-28')
  t.equal(l.version, '2025-11-25', '1.x client negotiated 2025-11-25')
  for (const [who, r] of [
    ['2.x', m],
    ['1.x', l],
  ] as const) {
    t.ok(r.names.includes('everything_echo') && r.names.includes('memory_read_graph'), `${who}: tools of both targets, prefixed`)
    t.notOk(r.names.includes('everything_get-env'), `${who}: get-env filtered by the rule`)
    t.ok(
      r.names.every(n => n.startsWith('everything_') || n.startsWith('memory_')),
      `${who}: every name prefixed`
    )
  }
  t.match(m.echo, /hello modern/, '2.x echo through the gateway')
  t.match(l.echo, /hello legacy/, '1.x echo through the gateway')
  t.match(m.graph, /modern-entity/, '2.x reads what it wrote to server-memory')
  t.match(l.graph, /legacy-entity/, '1.x reads what it wrote to server-memory')

  t.ok(seen.length > 0, 'the 2.x client went through the recording fetch')
  t.ok(
    seen.every(s => s.method === 'POST' || s.status === 405),
    'modern client: only POSTs (a GET would be 405)'
  )
  t.ok(
    seen.every(s => s.sessionHeader === null),
    'no Mcp-Session-Id minted for modern requests'
  )
  const posts = seen.filter(s => s.method === 'POST')
  t.ok(
    posts.every(s => s.headers.get('mcp-protocol-version') === MODERN),
    'every modern POST carries MCP-Protocol-Version 2026-07-28'
  )
  t.ok(
    posts.some(s => s.headers.get('mcp-method') === 'server/discover'),
    'the 2.x client probed with server/discover'
  )
  t.ok(
    posts.some(s => s.headers.get('mcp-method') === 'tools/call' && s.headers.get('mcp-name') === 'everything_echo'),
    'Mcp-Name carried the prefixed tool name'
  )
  t.notOk(
    posts.some(s => s.headers.get('mcp-method') === 'initialize'),
    'no initialize from the modern client'
  )

  // A denied call is refused like an unknown tool, in both eras.
  const names = (n: string): string[] => [`everything_${n}`, n]
  t.equal(
    await outcome(() => modern.callTool({ name: 'everything_get-env', arguments: {} }), names('get-env')),
    await outcome(() => modern.callTool({ name: 'everything_no-such-tool', arguments: {} }), names('no-such-tool')),
    '2.x: a denied tool is answered like a tool that does not exist'
  )
  t.equal(
    await outcome(() => legacy.callTool({ name: 'everything_get-env', arguments: {} }), names('get-env')),
    await outcome(() => legacy.callTool({ name: 'everything_no-such-tool', arguments: {} }), names('no-such-tool')),
    '1.x: a denied tool is answered like a tool that does not exist'
  )
  t.equal(env.gw.endpoint.sessions().length, 1, 'one session (the 1.x client); modern requests made none')
})

t.test('raw HTTP: discover, caching hints, header rules, versions, GET/DELETE, session id ignored', async t => {
  const env = await setup(t)
  const { url, alice, admin } = env

  await t.test('server/discover merged over both targets', async t => {
    const r = modernRequest('server/discover')
    const res = await post(url, alice, r.body, r.headers)
    t.equal(res.status, 200)
    const result = res.json.result
    t.same(result.supportedVersions, [MODERN, '2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'], 'every served revision')
    t.equal(result.resultType, 'complete')
    t.ok(
      result.capabilities.tools !== undefined && result.capabilities.prompts !== undefined && result.capabilities.resources !== undefined,
      'merged capabilities'
    )
    t.equal(result._meta['io.modelcontextprotocol/serverInfo'].name, 'mcp-proxy', 'several targets: the gateway identifies itself')
    t.equal(typeof result.ttlMs, 'number', 'ttlMs present')
    t.equal(res.headers.get('mcp-session-id'), null, 'no session id')
  })

  await t.test('tools/list: filtered per caller, marked private', async t => {
    const r = modernRequest('tools/list')
    const user = await post(url, alice, r.body, r.headers)
    const root = await post(url, admin, r.body, r.headers)
    const names = (x: any): string[] => x.json.result.tools.map((tool: { name: string }) => tool.name)
    t.notOk(names(user).includes('everything_get-env'), 'alice does not see get-env')
    t.ok(names(root).includes('everything_get-env'), 'an admin sees get-env')
    t.equal(user.json.result.cacheScope, 'private', 'cacheScope private')
    t.equal(user.json.result.ttlMs, 0, 'ttlMs 0: freshness unknown to the gateway')
    t.equal(user.json.result.resultType, 'complete')
    t.equal(user.json.result.nextCursor, undefined, 'several targets: merged to the end')
  })

  await t.test('resources/read through the URI marker; unknown resource is -32602', async t => {
    const list = modernRequest('resources/list')
    const res = await post(url, alice, list.body, list.headers)
    const uri = res.json.result.resources[0].uri as string
    t.match(uri, /^mcp-proxy:\/\/everything\//, 'resource URIs carry the target marker')
    const read = modernRequest('resources/read', { uri })
    const got = await post(url, alice, read.body, read.headers)
    t.equal(got.json.result.contents[0].uri, uri, 'contents URIs marked')
    t.equal(got.json.result.cacheScope, 'private')
    const missing = modernRequest('resources/read', { uri: 'mcp-proxy://nope/x' })
    const gone = await post(url, alice, missing.body, missing.headers)
    t.equal(gone.json.error.code, -32602, 'unknown resource: -32602 (not -32002) in this revision')
  })

  await t.test('progress arrives on the request stream before the result', async t => {
    const r = modernRequest('tools/call', { name: 'everything_trigger-long-running-operation', arguments: { duration: 0.3, steps: 3 } })
    ;(r.body.params as any)._meta.progressToken = 'p-1'
    const res = await post(url, alice, r.body, r.headers)
    t.equal(res.status, 200)
    t.match(res.headers.get('content-type'), /text\/event-stream/)
    const events = res.text
      .split('\n')
      .filter(l => l.startsWith('data: '))
      .map(l => JSON.parse(l.slice(6)))
    const progress = events.filter(e => e.method === 'notifications/progress')
    t.ok(progress.length >= 1, 'progress notifications')
    t.ok(
      progress.every(p => p.params.progressToken === 'p-1'),
      "the client's own progress token"
    )
    t.equal(events.at(-1).id, 1, 'result last')
    t.equal(events.at(-1).result.resultType, 'complete')
  })

  await t.test('Mcp-Method mismatch: 400 -32020', async t => {
    const r = modernRequest('tools/list')
    const res = await post(url, alice, r.body, { ...r.headers, 'mcp-method': 'prompts/list' })
    t.equal(res.status, 400)
    t.equal(res.json.error.code, -32020)
    t.equal(res.json.id, 1, 'id of the request')
    t.match(res.json.error.message, /Mcp-Method/)
  })

  await t.test('Mcp-Name mismatch, missing, and the Base64 form', async t => {
    const r = modernRequest('tools/call', { name: 'everything_echo', arguments: { message: 'x' } })
    const wrong = await post(url, alice, r.body, { ...r.headers, 'mcp-name': 'everything_add' })
    t.equal(wrong.status, 400)
    t.equal(wrong.json.error.code, -32020, 'mismatch')
    const { 'mcp-name': _n, ...without } = r.headers
    const missing = await post(url, alice, r.body, without)
    t.equal(missing.status, 400)
    t.equal(missing.json.error.code, -32020, 'missing Mcp-Name')
    const encoded = await post(url, alice, r.body, { ...r.headers, 'mcp-name': `=?base64?${Buffer.from('everything_echo').toString('base64')}?=` })
    t.equal(encoded.status, 200, 'Base64 sentinel decoded before comparing')
    t.match(textOf(encoded.json.result), /x/)
  })

  await t.test('protocol version: header vs _meta, missing header, unknown version', async t => {
    const r = modernRequest('tools/list')
    ;(r.body.params as any)._meta[V] = '2026-07-29'
    const mism = await post(url, alice, r.body, r.headers)
    t.equal(mism.status, 400)
    t.equal(mism.json.error.code, -32020, 'header and _meta disagree')

    const ok = modernRequest('tools/list')
    const { 'mcp-protocol-version': _v, ...noVersion } = ok.headers
    const missing = await post(url, alice, ok.body, noVersion)
    t.equal(missing.status, 400)
    t.equal(missing.json.error.code, -32020, 'missing MCP-Protocol-Version')

    const future = modernRequest('tools/list')
    ;(future.body.params as any)._meta[V] = '2099-01-01'
    const unknown = await post(url, alice, future.body, { ...future.headers, 'mcp-protocol-version': '2099-01-01' })
    t.equal(unknown.status, 400)
    t.equal(unknown.json.error.code, -32022, 'UnsupportedProtocolVersion')
    t.same(unknown.json.error.data, { supported: [MODERN, '2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'], requested: '2099-01-01' })

    const noCaps = modernRequest('tools/list')
    delete (noCaps.body.params as any)._meta[CAPS]
    const invalid = await post(url, alice, noCaps.body, noCaps.headers)
    t.equal(invalid.status, 400)
    t.equal(invalid.json.error.code, -32602, 'missing clientCapabilities: invalid params')
  })

  await t.test('methods outside the revision: 404 -32601', async t => {
    for (const method of ['ping', 'logging/setLevel', 'resources/subscribe']) {
      const r = modernRequest(method, method === 'logging/setLevel' ? { level: 'info' } : {})
      const res = await post(url, alice, r.body, r.headers)
      t.equal(res.status, 404, method)
      t.equal(res.json.error.code, -32601, method)
    }
  })

  await t.test('Mcp-Session-Id is ignored; GET and DELETE are 405', async t => {
    const r = modernRequest('tools/list')
    const res = await post(url, alice, r.body, { ...r.headers, 'mcp-session-id': 'not-a-session' })
    t.equal(res.status, 200, 'served despite an unknown session id')
    t.equal(res.headers.get('mcp-session-id'), null, 'no session id echoed')
    for (const method of ['GET', 'DELETE']) {
      const g = await fetch(url, { method, headers: { authorization: `Bearer ${alice}`, accept: 'text/event-stream', 'mcp-protocol-version': MODERN } })
      t.equal(g.status, 405, method)
      await g.body?.cancel()
    }
  })

  await t.test('authentication applies: no token is 401', async t => {
    const r = modernRequest('tools/list')
    const res = await post(url, undefined, r.body, r.headers)
    t.equal(res.status, 401)
    t.match(res.headers.get('www-authenticate'), /resource_metadata=/)
  })

  await t.test('the session era still works on the same endpoint', async t => {
    const init = await post(
      url,
      alice,
      { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2024-11-05', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } },
      {}
    )
    t.equal(init.status, 200)
    t.equal(init.json.result.protocolVersion, '2024-11-05')
    t.ok(init.headers.get('mcp-session-id'))
  })
})

t.test('pooled upstreams are never shared across subjects', async t => {
  const env = await setup(t)
  const call = (token: string, id: number) => {
    const r = modernRequest('tools/call', { name: 'everything_echo', arguments: { message: `m${id}` } }, id)
    return post(env.url, token, r.body, r.headers)
  }
  // Concurrent requests from two subjects; each subject may get up to two upstreams per target.
  const results = await Promise.all([1, 2, 3, 4].flatMap(i => [call(env.alice, i), call(env.bob, i + 10)]))
  t.ok(
    results.every(r => r.status === 200 && r.json.result !== undefined),
    'every call answered'
  )
  const pooled = env.gw.endpoint.pooled().filter(p => p.target === 'everything')
  const pidsOf = (subject: string): Set<number> => new Set(pooled.filter(p => p.subject === subject).flatMap(p => (p.pid === undefined ? [] : [p.pid])))
  const a = pidsOf('alice')
  const b = pidsOf('bob')
  t.ok(a.size >= 1 && b.size >= 1, 'both subjects have upstreams')
  t.ok(a.size <= 2 && b.size <= 2, 'at most two upstreams per (target, subject)')
  t.notOk(
    [...a].some(pid => b.has(pid)),
    'no upstream pid shared between subjects'
  )
  t.ok(
    pooled.every(p => p.subject === 'alice' || p.subject === 'bob'),
    'every pooled upstream belongs to one subject'
  )
})

t.test('server-to-client requests become multi round-trip results (elicitation)', async t => {
  const env = await setup(t)
  let asked: any
  const client = new Client2(
    { name: 'sdk2-elicit', version: '2.0.0' },
    { versionNegotiation: { mode: { pin: MODERN } }, capabilities: { elicitation: { form: {} } } }
  )
  client.setRequestHandler('elicitation/create', async (request: any) => {
    asked = request.params
    return {
      action: 'accept',
      content: {
        name: 'Ada',
        check: true,
        firstLine: 'Once',
        email: 'ada@example.test',
        homepage: 'https://example.test',
        birthdate: '1815-12-10',
        integer: 1,
        number: 1.5,
        untitledSingleSelectEnum: 'option1',
        untitledMultipleSelectEnum: ['option1'],
        titledSingleSelectEnum: 'option1',
        titledMultipleSelectEnum: ['option1'],
        legacyTitledEnum: 'option1',
      },
    } as never
  })
  t.teardown(() => client.close().catch(() => {}))
  await client.connect(new Transport2(env.url, { requestInit: { headers: { authorization: `Bearer ${env.alice}` } } }))
  const result = await client.callTool({ name: 'everything_trigger-elicitation-request', arguments: {} })
  t.match(asked?.message, /provide inputs/, "the upstream's elicitation reached the client's handler")
  t.match(textOf(result), /Ada/, 'the upstream got the answer and finished the call')

  // Raw: the InputRequiredResult, a forged requestState, and a client without the capability.
  const call = modernRequest('tools/call', { name: 'everything_trigger-elicitation-request', arguments: {} })
  ;(call.body.params as any)._meta[CAPS] = { elicitation: { form: {} } }
  const first = await post(env.url, env.alice, call.body, call.headers)
  t.equal(first.json.result.resultType, 'input_required')
  const [key, input] = Object.entries(first.json.result.inputRequests)[0] as [string, any]
  t.equal(input.method, 'elicitation/create')
  t.type(first.json.result.requestState, 'string')
  const state = first.json.result.requestState as string

  const forged = structuredClone(call.body) as any
  forged.params.requestState = state
  forged.params.inputResponses = { [key]: { action: 'decline' } }
  const bob = await post(env.url, env.bob, forged, call.headers)
  t.equal(bob.json.error.code, -32602, 'another subject cannot use the requestState')
  const done = await post(env.url, env.alice, forged, call.headers)
  t.equal(done.json.result.resultType, 'complete', 'the retry completes the call')
  t.match(textOf(done.json.result), /decline/i)
  const replay = await post(env.url, env.alice, forged, call.headers)
  t.equal(replay.json.error.code, -32602, 'a requestState is single-use')

  // Without the capability the tool does not exist for the client: its upstream was initialized
  // without elicitation (pooled per declared set), so no input request is ever made.
  const noCaps = modernRequest('tools/call', { name: 'everything_trigger-elicitation-request', arguments: {} })
  const refused = await post(env.url, env.alice, noCaps.body, noCaps.headers)
  t.notOk(refused.json.result?.resultType === 'input_required', 'no input request for a client without the capability', { got: refused.json })
  t.ok(refused.json.error !== undefined || refused.json.result?.isError === true, "the upstream's answer for a tool it does not offer")
})

t.test('subscriptions/listen: acknowledged with the agreed filter, tagged, lease released on close', async t => {
  const env = await setup(t)
  const list = modernRequest('resources/list')
  const resources = await post(env.url, env.alice, list.body, list.headers)
  const uri = resources.json.result.resources[0].uri as string
  const r = modernRequest('subscriptions/listen', { notifications: { toolsListChanged: true, resourceSubscriptions: [uri, 'mcp-proxy://nope/x'] } }, 'listen-1')
  const abort = new AbortController()
  const res = await fetch(env.url, {
    method: 'POST',
    signal: abort.signal,
    body: JSON.stringify(r.body),
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${env.alice}`, ...r.headers },
  })
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /text\/event-stream/)
  const reader = res.body!.getReader()
  let buf = ''
  while (!buf.includes('\n\n')) {
    const { value, done } = await reader.read()
    if (done) break
    buf += Buffer.from(value).toString('utf8')
  }
  const ack = JSON.parse(
    buf
      .split('\n')
      .find(l => l.startsWith('data: '))!
      .slice(6)
  )
  t.equal(ack.method, 'notifications/subscriptions/acknowledged', 'the acknowledgment comes first')
  t.equal(ack.params._meta['io.modelcontextprotocol/subscriptionId'], 'listen-1', 'tagged with the listen request id')
  t.same(ack.params.notifications.resourceSubscriptions, [uri], 'only the resource that exists on a target is agreed')
  t.ok(
    env.gw.endpoint.pooled().some(p => p.leases > 0),
    'the stream holds its upstreams'
  )
  abort.abort()
  await reader.cancel().catch(() => {})
  for (let i = 0; i < 100 && env.gw.endpoint.pooled().some(p => p.leases > 0); i++) await new Promise(resolve => setTimeout(resolve, 20))
  t.ok(
    env.gw.endpoint.pooled().every(p => p.leases === 0),
    'closing the stream releases the upstreams'
  )
})

/** server-everything in its own streamable-HTTP mode on 127.0.0.1 (it reads PORT). */
async function startHttpEverything(t: Test): Promise<string> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const child = spawn(process.execPath, [EVERYTHING, 'streamableHttp'], {
      env: { PATH: process.env.PATH ?? '', PORT: String(port) },
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    const listening = await new Promise<boolean>(resolve => {
      let err = ''
      child.stderr!.setEncoding('utf8').on('data', (d: string) => {
        err += d
        if (err.includes('listening on port')) resolve(true)
      })
      child.once('exit', () => resolve(false))
    })
    if (listening) {
      t.teardown(
        () =>
          new Promise<void>(resolve => {
            if (child.exitCode !== null) {
              resolve()
              return
            }
            child.once('exit', () => resolve())
            child.kill('SIGTERM')
          })
      )
      return `http://127.0.0.1:${port}/mcp`
    }
    if (attempt >= 2) throw new Error('server-everything (streamableHttp) did not start')
  }
}

t.test('an HTTP target serves both eras: 2.x (pooled HttpUpstream) and 1.x (passthrough)', async t => {
  const upstream = await startHttpEverything(t)
  const { url, gw, logText } = await fullGateway(t, { targets: [{ name: 'remote', mcp: { url: upstream } }] })
  const modern = new Client2({ name: 'sdk2', version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
  const legacy = new Client1({ name: 'sdk1', version: '1.0.0' })
  t.teardown(async () => {
    await modern.close().catch(() => {})
    await legacy.close().catch(() => {})
  })
  await Promise.all([modern.connect(new Transport2(new URL(url))), legacy.connect(new Transport1(new URL(url)))])
  t.equal(modern.getNegotiatedProtocolVersion(), MODERN)
  const [m, l] = await Promise.all([
    modern.callTool({ name: 'echo', arguments: { message: 'modern over http' } }),
    legacy.callTool({ name: 'echo', arguments: { message: 'legacy over http' } }),
  ])
  t.match(textOf(m), /modern over http/, 'one target: names unchanged, answered through the HTTP upstream')
  t.match(textOf(l), /legacy over http/)
  const tools = await modern.listTools()
  t.ok(
    tools.tools.some(x => x.name === 'echo'),
    'tools listed'
  )
  const pooled = gw.endpoint.pooled()
  t.equal(pooled.length, 1, 'one pooled upstream for the anonymous subject')
  t.equal(pooled[0]!.target, 'remote')
  t.equal(pooled[0]!.pid, undefined, 'an HTTP upstream has no process')
  t.match(
    logText(),
    /"target":"remote","era":"session","msg":"target era found by server\/discover"/,
    'server-everything (SDK 1.x) answered server/discover as a session-era server: translated'
  )
})
