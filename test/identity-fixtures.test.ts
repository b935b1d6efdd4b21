/**
 * The identity fixtures themselves (test/fixtures/identity-server.mjs, test/fixtures/env-server.mjs),
 * talked to with the official SDK client: the identity server verifies its own bearer (JWKS, issuer,
 * audience, scope) and reports whom it saw and every bearer that ever arrived; the env server reports
 * its environment. The gateway tests of issue 25 rely on both telling the truth.
 */
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { devIdp, loginToken } from './helpers/idp.ts'
import { ENV_SERVER, IDENTITY_SERVER, identityServer, jwtArgs, sha256, type Whoami } from './helpers/identity-fixture.ts'
import type { DevIdp } from '../bin/dev-idp.ts'

const SECRET = 'fixture-exchange-secret'
const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
})

async function connected(t: Parameters<typeof devIdp>[0], url: string, headers: Record<string, string>): Promise<Client> {
  const client = new Client({ name: 'identity-fixtures-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }))
  t.teardown(() => client.close())
  return client
}

async function whoami(client: Client): Promise<Whoami> {
  const res = (await client.callTool({ name: 'whoami', arguments: {} })) as { content: Array<{ text: string }> }
  return JSON.parse(res.content[0]!.text) as Whoami
}

async function raw(url: string, headers: Record<string, string>) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: INIT,
  })
  return { status: res.status, challenge: res.headers.get('www-authenticate'), body: await res.text() }
}

async function exchanged(idp: DevIdp, subjectToken: string, audience: string, scope?: string): Promise<string> {
  const res = await fetch(idp.tokenEndpoint, {
    method: 'POST',
    headers: { authorization: `Basic ${Buffer.from(`mcp-gateway:${SECRET}`).toString('base64')}` },
    body: new URLSearchParams({
      grant_type: 'urn:ietf:params:oauth:grant-type:token-exchange',
      subject_token: subjectToken,
      subject_token_type: 'urn:ietf:params:oauth:token-type:access_token',
      audience,
      ...(scope === undefined ? {} : { scope }),
    }),
  })
  return ((await res.json()) as { access_token: string }).access_token
}

t.test('identity server (JWT): verifies its own audience, reports the user and the bearer, and remembers every bearer', async t => {
  const idp = await devIdp(t, {
    users: { alice: { groups: ['sales'] }, bob: {} },
    tokenExchange: { clients: { 'mcp-gateway': { secret: SECRET, audiences: ['crm', 'tickets'], scopes: ['crm.read', 'crm.write'] } } },
  })
  const server = await identityServer(t, jwtArgs(idp, 'crm', 'crm.read'))
  const [aliceLogin, bobLogin] = await Promise.all([loginToken(idp, 'alice'), loginToken(idp, 'bob')])
  const [aliceCrm, bobCrm] = await Promise.all([exchanged(idp, aliceLogin, 'crm', 'crm.read'), exchanged(idp, bobLogin, 'crm', 'crm.read')])

  const [alice, bob] = await Promise.all([
    connected(t, server.url, { authorization: `Bearer ${aliceCrm}`, 'x-user': 'alice', 'x-groups': 'sales' }),
    connected(t, server.url, { authorization: `Bearer ${bobCrm}`, 'x-api-key': 'k-bob' }),
  ])
  const [a, b] = await Promise.all([whoami(alice), whoami(bob)])
  t.match(a, { sub: 'alice', aud: 'crm', iss: idp.issuer, scope: 'crm.read', act: { sub: 'mcp-gateway' }, client_id: 'mcp-gateway' })
  t.same(a.headers, { 'x-user': 'alice', 'x-groups': 'sales' }, 'x-* request headers echoed')
  t.equal(a.bearerSha256, sha256(aliceCrm))
  t.match(b, { sub: 'bob', headers: { 'x-api-key': 'k-bob' }, bearerSha256: sha256(bobCrm) }, 'two users at once, each sees their own')
  t.same((await alice.listTools()).tools.map(x => x.name).sort(), ['dangerous', 'whoami'])

  const none = await raw(server.url, {})
  t.equal(none.status, 401)
  t.equal(none.challenge, 'Bearer realm="identity-server"')
  const login = await raw(server.url, { authorization: `Bearer ${aliceLogin}` })
  t.equal(login.status, 401, "the client's own login token is not for this server")
  t.match(login.challenge, /^Bearer realm="identity-server", error="invalid_token", error_description="ERR_JWT_CLAIM_VALIDATION_FAILED"$/)
  const tickets = await raw(server.url, { authorization: `Bearer ${await exchanged(idp, aliceLogin, 'tickets')}` })
  t.equal(tickets.status, 401, "a token minted for another target's audience")
  const forged = await raw(server.url, { authorization: `Bearer ${aliceCrm.slice(0, -4)}AAAA` })
  t.equal(forged.status, 401, 'a bad signature')
  const writeOnly = await raw(server.url, { authorization: `Bearer ${await exchanged(idp, aliceLogin, 'crm', 'crm.write')}` })
  t.equal(writeOnly.status, 403)
  t.equal(writeOnly.challenge, 'Bearer realm="identity-server", error="insufficient_scope", scope="crm.read"')

  const seen = await server.seen()
  t.ok(seen.includes(sha256(aliceCrm)) && seen.includes(sha256(bobCrm)), 'accepted bearers are listed')
  t.ok(seen.includes(sha256(aliceLogin)), 'refused ones too: a test can prove a token arrived')
  t.notOk(seen.includes(sha256(bobLogin)), "and one that never arrived is absent (bob's login token was never sent)")
  t.equal(new Set(seen).size, seen.length, 'each bearer once')
  t.ok((await server.requests()) > seen.length, 'requests counted')
})

t.test('identity server (static bearer, no auth): the API-key and header-echo modes', async t => {
  const fixed = await identityServer(t, ['--static-bearer', 'legacy-api-key'])
  const client = await connected(t, fixed.url, { authorization: 'Bearer legacy-api-key', 'x-user': 'u1' })
  const who = await whoami(client)
  t.same(who, { headers: { 'x-user': 'u1' }, bearerSha256: sha256('legacy-api-key') }, 'no claims in this mode')
  const wrong = await raw(fixed.url, { authorization: 'Bearer legacy-api-kez' })
  t.equal(wrong.status, 401)
  t.equal(wrong.challenge, 'Bearer realm="identity-server", error="invalid_token"')
  t.equal((await raw(fixed.url, {})).status, 401)

  const open = await identityServer(t, ['--no-auth'])
  const anyone = await connected(t, open.url, { 'x-api-key': 'k1', 'x-groups': 'a,b' })
  t.same(await whoami(anyone), { headers: { 'x-api-key': 'k1', 'x-groups': 'a,b' }, bearerSha256: null })
  t.same(await open.seen(), [], 'no bearer ever arrived')
  const get = await fetch(open.url, { headers: { accept: 'text/event-stream' } })
  t.equal(get.status, 405, 'stateless: no GET stream')
})

t.test('identity server: an unusable command line exits 2 with its usage', async t => {
  for (const args of [[], ['--jwks', 'http://127.0.0.1:1/jwks'], ['--no-auth', '--static-bearer', 'x']]) {
    const run = spawnSync(process.execPath, [IDENTITY_SERVER, ...args], { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } })
    t.equal(run.status, 2, JSON.stringify(args))
    t.match(run.stderr, /^usage: identity-server\.mjs/)
  }
})

t.test('env server: reports the variables named on its command line, and its pid', async t => {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [ENV_SERVER, 'USER_ID', 'CRM_TOKEN', 'UNSET_ONE'],
    env: { USER_ID: 'alice', CRM_TOKEN: 'minted-token', OTHER: 'not asked' },
    stderr: 'ignore',
  })
  const client = new Client({ name: 'env-test', version: '1.0.0' })
  await client.connect(transport)
  t.teardown(() => client.close())
  const res = (await client.callTool({ name: 'env', arguments: {} })) as { content: Array<{ text: string }> }
  t.same(JSON.parse(res.content[0]!.text), { pid: transport.pid, env: { USER_ID: 'alice', CRM_TOKEN: 'minted-token', UNSET_ONE: null } })
})
