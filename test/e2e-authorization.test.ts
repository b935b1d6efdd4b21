/**
 * Authorization end to end (issue 6, point 4): real tokens from the real
 * development OpenID provider (its token endpoint, service accounts with
 * groups), a whole gateway (startGateway) with mcpAuthentication (oss_idp) and
 * authorization rules, two real targets over stdio (server-everything and
 * server-memory) and the official SDK client. An endpoint rule gives 200 or
 * 403; per-operation rules filter tools/list and refuse calls with the error
 * of an unknown tool. (`roles` for cloud_idp: test/oauth-flow.test.ts.)
 */
import t, { type Test } from 'tap'
import { rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { startDevIdp, type DevIdp } from '../bin/dev-idp.ts'
import { everythingTarget, memoryTarget, sseMessages, INIT_HEADERS } from './helpers/gateway-harness.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { outcome } from './helpers/outcome.ts'

const BASE = 'https://gateway.example.test'

const RULES = ['"mcp-users" in jwt.groups', 'mcp.tool.name != "echo" || "admins" in jwt.groups', 'mcp.tool.target != "memory" || "memory-users" in jwt.groups']

const ACCOUNTS = {
  'admin-svc': { password: 'admin-svc-password', groups: ['mcp-users', 'admins', 'memory-users'] },
  'user-svc': { password: 'user-svc-password', groups: ['mcp-users'] },
  'memory-svc': { password: 'memory-svc-password', groups: ['mcp-users', 'memory-users'] },
  'outsider-svc': { password: 'outsider-svc-password', groups: ['sales'] },
} as const
type Account = keyof typeof ACCOUNTS

const FORBIDDEN = { error: 'forbidden', error_description: 'access denied by authorization policy' }
const memoryFile = join(tmpdir(), `mcp-proxy-memory-${process.pid}-e2e-authz.jsonl`)

let idp: DevIdp
let gw: FullGateway

t.before(async () => {
  idp = await startDevIdp({ serviceAccounts: ACCOUNTS })
  const memory = memoryTarget('memory')
  gw = await fullGateway(t, {
    targets: [everythingTarget('everything'), { ...memory, stdio: { ...memory.stdio, env: { MEMORY_FILE_PATH: memoryFile } } }],
    policies: {
      mcpAuthentication: {
        mode: 'strict',
        issuer: idp.issuer,
        audiences: [idp.clientId],
        provider: { oss_idp: {} },
        clientId: idp.clientId,
        resourceMetadata: { resource: `${BASE}/mcp`, scopesSupported: ['openid', 'profile'] },
      },
      authorization: { rules: RULES },
    },
  })
})
t.teardown(async () => {
  await idp?.close()
  await rm(memoryFile, { force: true })
})

/** A token from the IdP's token endpoint (client_credentials + service-account credentials); `profile` puts `groups` in it. */
function token(account: Account, scope = 'openid profile'): Promise<string> {
  return idp.clientCredentialsToken(account, ACCOUNTS[account].password, scope)
}

async function connect(t: Test, account: Account): Promise<Client> {
  const client = new Client({ name: `e2e-authz-${account}`, version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(gw.url), { requestInit: { headers: { Authorization: `Bearer ${await token(account)}` } } }))
  t.teardown(() => client.close())
  return client
}

async function initialize(bearer: string): Promise<{ status: number; text: string; sessionId: string | null }> {
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, authorization: `Bearer ${bearer}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    }),
  })
  const text = await res.text()
  const sessionId = res.headers.get('mcp-session-id')
  if (sessionId !== null) await fetch(gw.url, { method: 'DELETE', headers: { authorization: `Bearer ${bearer}`, 'mcp-session-id': sessionId } })
  return { status: res.status, text, sessionId }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ type: string; text?: string }> }).content.map(c => c.text ?? '').join('\n')
}

async function callError(client: Client, name: string): Promise<McpError> {
  const err = await client.callTool({ name, arguments: { message: 'x' } }).then(
    () => undefined,
    (e: unknown) => e
  )
  if (!(err instanceof McpError)) throw new Error(`expected a JSON-RPC error for ${name}, got ${String(err)}`)
  return err
}

t.test('endpoint rule: group present -> 200, group absent -> 403 with the documented body', async t => {
  const ok = await initialize(await token('user-svc'))
  t.equal(ok.status, 200, 'mcp-users member: initialize answered')
  t.type(ok.sessionId, 'string')
  t.match(sseMessages(ok.text), [{ id: 1, result: { protocolVersion: '2025-11-25' } }])

  const before = gw.gw.endpoint.sessions().length
  const denied = await initialize(await token('outsider-svc'))
  t.equal(denied.status, 403, 'not in mcp-users: 403')
  t.same(JSON.parse(denied.text), FORBIDDEN)
  t.notOk(denied.text.includes('mcp-users') || denied.text.includes('jwt'), 'the 403 body does not reveal the rule')
  t.equal(denied.sessionId, null)
  t.equal(gw.gw.endpoint.sessions().length, before, 'no session was created for the denied caller')

  // Without the profile scope the IdP puts no groups claim in the token: a missing claim denies.
  const noGroups = await token('admin-svc', 'openid')
  t.notOk('groups' in (JSON.parse(Buffer.from(noGroups.split('.')[1]!, 'base64url').toString()) as object), 'token without groups')
  const missing = await initialize(noGroups)
  t.equal(missing.status, 403, 'a token without groups is denied, not let through')
  t.same(JSON.parse(missing.text), FORBIDDEN)

  const client = new Client({ name: 'e2e-authz', version: '1.0.0' })
  await t.rejects(
    client.connect(
      new StreamableHTTPClientTransport(new URL(gw.url), { requestInit: { headers: { Authorization: `Bearer ${await token('outsider-svc')}` } } })
    ),
    /access denied by authorization policy/,
    'the SDK client of a denied caller cannot connect'
  )
})

t.test('per-operation rules: tools/list is filtered per caller, across two targets', async t => {
  const names = async (account: Account): Promise<string[]> => (await (await connect(t, account)).listTools()).tools.map(x => x.name)
  const admin = await names('admin-svc')
  const user = await names('user-svc')
  const memory = await names('memory-svc')

  t.ok(admin.includes('everything_echo'), 'admins see echo')
  t.ok(admin.includes('memory_read_graph') && admin.includes('memory_create_entities'), 'memory-users see the memory tools')
  t.ok(admin.includes('everything_get-sum'))

  t.notOk(user.includes('everything_echo'), 'echo is hidden from non-admins')
  t.notOk(
    user.some(n => n.startsWith('memory_')),
    'every memory tool is hidden from non-members of memory-users'
  )
  t.ok(user.includes('everything_get-sum'), 'tools no rule restricts stay visible')
  t.same(user.sort(), admin.filter(n => n !== 'everything_echo' && !n.startsWith('memory_')).sort(), 'exactly the restricted tools are removed')

  t.notOk(memory.includes('everything_echo'))
  t.ok(memory.includes('memory_read_graph'), 'memory-users without admins: memory tools but no echo')

  const prompts = (await (await connect(t, 'user-svc')).listPrompts()).prompts.map(p => p.name)
  t.ok(prompts.includes('everything_simple-prompt'), 'tool rules leave prompts alone')
})

t.test('per-operation rules: a refused call is indistinguishable from a call to an unknown tool', async t => {
  const admin = await connect(t, 'admin-svc')
  t.equal(textOf(await admin.callTool({ name: 'everything_echo', arguments: { message: 'admin echo' } })), 'Echo: admin echo', 'admins may call echo')
  t.match(textOf(await admin.callTool({ name: 'memory_read_graph', arguments: {} })), /entities/, 'memory-users may call memory tools')

  const user = await connect(t, 'user-svc')
  // Refused and nonexistent tools of the same target get the very same answer (the upstream's own answer to
  // an unknown name), so a caller cannot tell that a refused tool exists.
  const refused = await outcome(() => user.callTool({ name: 'everything_echo', arguments: { message: 'x' } }), ['everything_echo', 'echo'])
  const missing = await outcome(
    () => user.callTool({ name: 'everything_no-such-tool', arguments: { message: 'x' } }),
    ['everything_no-such-tool', 'no-such-tool']
  )
  t.equal(refused, missing, 'a refused call is answered exactly like a call to a tool that does not exist')
  t.match(refused, /<name>/, 'the answer names the tool the caller asked for')
  const refusedMemory = await outcome(() => user.callTool({ name: 'memory_read_graph', arguments: {} }), ['memory_read_graph', 'read_graph'])
  const missingMemory = await outcome(() => user.callTool({ name: 'memory_no_such_tool', arguments: {} }), ['memory_no_such_tool', 'no_such_tool'])
  t.equal(refusedMemory, missingMemory, 'the same on the second target')
  t.notMatch(refused + refusedMemory, /denied|forbidden|admins|rule|policy|mcp-proxy-denied/i, 'nothing hints at a rule or at the stand-in name')
  const unknownTarget = await callError(user, 'nosuchtarget_echo')
  t.equal(unknownTarget.code, -32602, "an unknown target prefix is the gateway's own namespace")
  t.match(unknownTarget.message, /Unknown tool: nosuchtarget_echo$/)

  t.match(textOf(await user.callTool({ name: 'everything_get-sum', arguments: { a: 1, b: 2 } })), /3/, 'allowed tools still work for the same caller')
  t.match(gw.logText(), /rule\[1\]/, 'the gateway log says which rule refused the call')
})
