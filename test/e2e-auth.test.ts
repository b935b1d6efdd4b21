/**
 * Authentication end to end (issue 4, point 7): the development OpenID
 * provider, a whole gateway (startGateway) with mcpAuthentication (oss_idp)
 * in front of real MCP servers over stdio, and the official SDK client
 * carrying real tokens. Covers: a valid token reaches server-everything; a
 * missing token gets SPEC's 401; a session is bound to its token's subject;
 * no token reaches the upstream (the child's environment, the log).
 */
import t, { type Test } from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { startDevIdp, type DevIdp } from '../bin/dev-idp.ts'
import { everythingTarget, faultyTarget, sseMessages, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { BASE, ossOptions } from './helpers/idp.ts'

// {base_url} (BASE) is deliberately not the listen address: it comes from resourceMetadata.resource, never from Host.
const PRM = `${BASE}/.well-known/oauth-protected-resource/mcp`

async function sdkClient(t: Test, url: string, token: string): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const client = new Client({ name: 'e2e-auth', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } })
  await client.connect(transport)
  t.teardown(() => client.close())
  return { client, transport }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ type: string; text?: string }> }).content.map(c => c.text ?? '').join('\n')
}

async function post(url: string, body: unknown, headers: Record<string, string>): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(url, { method: 'POST', headers: { ...INIT_HEADERS, ...headers }, body: JSON.stringify(body) })
  return { status: res.status, headers: res.headers, text: await res.text() }
}

const initialize = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
}

let idp: DevIdp
let gw: FullGateway

t.before(async () => {
  idp = await startDevIdp()
})
t.teardown(() => idp.close())

t.beforeEach(async t => {
  gw = await fullGateway(t, { targets: [everythingTarget()], policies: { mcpAuthentication: ossOptions(idp) } }, 'debug')
})

t.test('a valid token from the IdP: the SDK client connects, lists and calls echo on server-everything', async t => {
  // SPEC's by-hand request: client_credentials with service-account credentials at the real token endpoint.
  const token = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
  const { client, transport } = await sdkClient(t, gw.url, token)
  t.match(client.getServerVersion(), { name: 'mcp-servers/everything' }, 'initialize reached server-everything')
  t.type(transport.sessionId, 'string')
  const { tools } = await client.listTools()
  t.ok(
    tools.some(x => x.name === 'echo'),
    'tools/list through the gateway'
  )
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'authenticated hello' } })), 'Echo: authenticated hello')
  const sessions = gw.gw.endpoint.sessions()
  t.equal(sessions.length, 1)
  t.equal(sessions[0]!.subject, 'mcp-service', 'the session belongs to the token subject')
  t.notOk(gw.logText().includes(token), 'the token is never logged')
  t.notOk(gw.logText().includes(token.split('.')[2]!), 'not even its signature')
})

t.test('no token: 401 with the SPEC header and body, and nothing is started', async t => {
  const res = await post(gw.url, initialize, {})
  t.equal(res.status, 401)
  const challenge = res.headers.get('www-authenticate') ?? ''
  t.match(challenge, /^Bearer /, 'Bearer challenge')
  t.ok(challenge.includes(`resource_metadata="${PRM}"`), 'resource_metadata names {base_url}/.well-known/oauth-protected-resource/mcp')
  t.notMatch(challenge, /error=/, 'a missing token is not an invalid_token error')
  t.match(res.headers.get('content-type') ?? '', /^application\/json/)
  t.same(JSON.parse(res.text), { error: 'unauthorized', error_description: 'JWT token required' })
  t.equal(gw.gw.endpoint.sessions().length, 0, 'no session, no child process')

  const client = new Client({ name: 'e2e-auth', version: '1.0.0' })
  await t.rejects(client.connect(new StreamableHTTPClientTransport(new URL(gw.url))), /401|nauthorized/, 'the SDK client without a token is refused')

  // A bad token is 401 too, flagged invalid_token, and its text is not echoed.
  const forged = (await idp.mintToken({ sub: 'mallory' })).replace(/\.[^.]+$/, '.AAAA')
  const bad = await post(gw.url, initialize, { authorization: `Bearer ${forged}` })
  t.equal(bad.status, 401)
  t.match(bad.headers.get('www-authenticate') ?? '', /error="invalid_token"/)
  t.notOk(bad.text.includes(forged), 'the token is not echoed')
  t.equal(gw.gw.endpoint.sessions().length, 0)
})

t.test('a session is bound to the subject of the token that opened it', async t => {
  const alice = await idp.mintToken({ sub: 'alice', groups: ['mcp-users'] })
  const bob = await idp.mintToken({ sub: 'bob', groups: ['mcp-users'] })
  const { client, transport } = await sdkClient(t, gw.url, alice)
  const sessionId = transport.sessionId!

  const asBob = { authorization: `Bearer ${bob}`, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
  const stolen = await post(gw.url, { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { message: 'bob' } } }, asBob)
  t.equal(stolen.status, 404, 'another subject presenting the session id gets 404')
  t.match(JSON.parse(stolen.text), { jsonrpc: '2.0', id: 7, error: { code: -32001, message: 'Session not found' } })
  const get = await fetch(gw.url, { headers: { ...asBob, accept: 'text/event-stream' } })
  await get.body?.cancel()
  t.equal(get.status, 404, 'GET (the server-to-client stream) as another subject: 404')
  const del = await fetch(gw.url, { method: 'DELETE', headers: asBob })
  t.equal(del.status, 404, 'DELETE as another subject: 404, and the session is not ended')

  const noToken = await post(gw.url, { jsonrpc: '2.0', id: 8, method: 'ping' }, { 'mcp-session-id': sessionId })
  t.equal(noToken.status, 401, 'the session id alone, without a token, is 401')

  t.equal(gw.gw.endpoint.sessions().length, 1, "the owner's session is still there")
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'still mine' } })), 'Echo: still mine', "the owner's session still works")

  // The same subject with a fresh token (e.g. after a refresh) keeps using its session.
  const alice2 = await idp.mintToken({ sub: 'alice', groups: ['mcp-users'], jti: 'second' })
  t.not(alice2, alice)
  const again = await post(
    gw.url,
    { jsonrpc: '2.0', id: 9, method: 'ping' },
    { authorization: `Bearer ${alice2}`, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
  )
  t.equal(again.status, 200)
  t.match(sseMessages(again.text), [{ id: 9, result: {} }])
})

t.test('no token reaches the upstream: the stdio child environment never holds it', async t => {
  // The secret-looking variable is in the gateway's own environment while the child starts.
  process.env.E2E_GATEWAY_SECRET = 'gateway-own-secret-value'
  t.teardown(() => {
    delete process.env.E2E_GATEWAY_SECRET
  })
  const faulty = await fullGateway(t, { targets: [faultyTarget()], policies: { mcpAuthentication: ossOptions(idp) } }, 'debug')
  const token = await idp.clientCredentialsToken('mcp-service', 'mcp-service-dev-password')
  const { client } = await sdkClient(t, faulty.url, token)
  const env = JSON.parse(textOf(await client.callTool({ name: 'env', arguments: {} }))) as Record<string, string>
  t.ok(Object.keys(env).length > 0 && 'PATH' in env, 'the fixture reported its environment')
  const dump = JSON.stringify(env)
  t.notOk(dump.includes(token), 'the token is not in the child environment')
  t.notOk(dump.includes(token.split('.')[2]!), 'nor its signature')
  t.notOk(
    Object.keys(env).some(k => /authorization|token|bearer/i.test(k)),
    'no authorization-like variable'
  )
  t.notOk(/Bearer /i.test(dump), 'no Bearer value')
  t.notOk(dump.includes('gateway-own-secret-value'), "the gateway's own secrets stay out too")
  t.notOk(faulty.logText().includes(token), 'the token is never logged')
})

t.test('tokens without sub never share a session through the client id (issue 13 item 3)', async t => {
  // Two users of the same client: no sub, different oid, the same azp/client_id.
  const a = await idp.mintToken({ oid: 'user-a', client_id: idp.clientId })
  const b = await idp.mintToken({ oid: 'user-b', client_id: idp.clientId })
  const refused = await post(gw.url, initialize, { authorization: `Bearer ${a}` })
  t.equal(refused.status, 401, 'by default a token without sub opens nothing')
  t.match(JSON.parse(refused.text), { error: 'invalid_token', error_description: 'token has no subject' })
  t.equal(gw.gw.endpoint.sessions().length, 0)

  const byOid = await fullGateway(t, { targets: [everythingTarget()], policies: { mcpAuthentication: ossOptions(idp, { subjectClaim: 'oid' }) } })
  const opened = await post(byOid.url, initialize, { authorization: `Bearer ${a}` })
  t.equal(opened.status, 200)
  const sessionId = opened.headers.get('mcp-session-id')!
  const asB = await post(
    byOid.url,
    { jsonrpc: '2.0', id: 2, method: 'ping' },
    { authorization: `Bearer ${b}`, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
  )
  t.equal(asB.status, 404, "user B with user A's session id does not reach it")
  const asA = await post(
    byOid.url,
    { jsonrpc: '2.0', id: 3, method: 'ping' },
    { authorization: `Bearer ${a}`, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
  )
  t.equal(asA.status, 200)
  t.same(
    byOid.gw.endpoint.sessions().map(s => s.subject),
    ['user-a']
  )
})
