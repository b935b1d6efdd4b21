/**
 * The whole MCP authorization flow with the official SDK clients
 * (`@modelcontextprotocol/sdk` 1.x and `@modelcontextprotocol/client` 2.x),
 * starting from nothing but the gateway URL: protected resource metadata ->
 * authorization server metadata -> registration -> authorization code + PKCE
 * (headless: the authorize redirects are followed until the redirect URI) ->
 * token -> tools/list and tools/call through the gateway to server-everything.
 * (a) oss_idp against the development OpenID provider; (b) cloud_idp against
 * the Entra emulator (confidential app, v2 and v1 tokens).
 */
import t, { type Test } from 'tap'
import { fileURLToPath } from 'node:url'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import {
  Client as Client2,
  StreamableHTTPClientTransport as Transport2,
  UnauthorizedError as Unauthorized2,
  type OAuthClientProvider as Provider2,
} from '@modelcontextprotocol/client'
import { validateConfig, deepFreeze, type LoadedConfig } from '../core/config.ts'
import { startGateway, type RunningGateway } from '../core/gateway.ts'
import { startDevIdp } from '../bin/dev-idp.ts'
import { startEntraEmulator, type EntraEmulator } from './helpers/entra-emulator.ts'
import { memoryLogger } from './helpers/logger.ts'
import { freePort } from './helpers/cli.ts'
import { builtins } from '../plugins/index.ts'
import { HeadlessProvider } from './helpers/oauth-client.ts'

const EVERYTHING = fileURLToPath(new URL('../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const SECRET = 'entra-app-secret-value'

async function gateway(
  t: Test,
  auth: (base: string) => Record<string, unknown>,
  rules?: string[]
): Promise<{ gw: RunningGateway; url: URL; logText: () => string }> {
  // The resource (and so {base_url}) contains the port: pick one first.
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const config = deepFreeze(
    await validateConfig(
      {
        mcp: {
          host: '127.0.0.1',
          port,
          targets: [{ name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }],
          policies: {
            mcpAuthentication: { mode: 'strict', ...auth(base) },
            ...(rules !== undefined ? { authorization: { rules } } : {}),
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
  return { gw, url: new URL(`${base}/mcp`), logText: mem.text }
}

/**
 * Headless OAuthClientProvider: keeps everything in memory and "opens the
 * browser" by following the authorize redirects until the redirect URI.
 */
interface Flow {
  tools: string[]
  echo: string
  provider: HeadlessProvider
}

async function flowSdk1(url: URL, provider: HeadlessProvider): Promise<Flow> {
  const first = new Client1({ name: 'sdk1', version: '1.0.0' })
  let unauthorized = false
  try {
    await first.connect(new Transport1(url, { authProvider: provider as unknown as Provider1 }))
  } catch (err) {
    if (!(err instanceof Unauthorized1)) throw err
    unauthorized = true
  }
  if (!unauthorized) throw new Error('expected the first connect to need authorization')
  const transport = new Transport1(url, { authProvider: provider as unknown as Provider1 })
  await transport.finishAuth(provider.code())
  const client = new Client1({ name: 'sdk1', version: '1.0.0' })
  await client.connect(transport)
  try {
    const tools = (await client.listTools()).tools.map(x => x.name)
    const res = await client.callTool({ name: 'echo', arguments: { message: 'hello sdk1' } })
    const echo = (res.content as Array<{ type: string; text?: string }>)[0]?.text ?? ''
    return { tools, echo, provider }
  } finally {
    await client.close()
  }
}

/**
 * `callback: 'params'` is the 2.x SDK's preferred finishAuth form: it also
 * checks the callback's RFC 9207 `iss` against the metadata issuer
 * `{base_url}/mcp`. An IdP that sent `iss` in its redirect could never match
 * it, since that redirect does not pass through the gateway; like Authentik,
 * the dev IdP sends none (see README, "Identity providers").
 */
async function flowSdk2(url: URL, provider: HeadlessProvider, callback: 'params' | 'code' = 'params'): Promise<Flow> {
  const first = new Client2({ name: 'sdk2', version: '2.0.0' })
  let unauthorized = false
  try {
    await first.connect(new Transport2(url, { authProvider: provider as unknown as Provider2 }))
  } catch (err) {
    if (!(err instanceof Unauthorized2)) throw err
    unauthorized = true
  }
  if (!unauthorized) throw new Error('expected the first connect to need authorization')
  const transport = new Transport2(url, { authProvider: provider as unknown as Provider2 })
  if (callback === 'params') await transport.finishAuth(provider.callback!.searchParams)
  else await transport.finishAuth(provider.code())
  const client = new Client2({ name: 'sdk2', version: '2.0.0' })
  await client.connect(transport)
  try {
    const tools = (await client.listTools()).tools.map(x => x.name)
    const res = await client.callTool({ name: 'echo', arguments: { message: 'hello sdk2' } })
    const echo = (res.content as Array<{ type: string; text?: string }>)[0]?.text ?? ''
    return { tools, echo, provider }
  } finally {
    await client.close()
  }
}

function checkFlow(t: Test, f: Flow, expected: { clientId: string; authorizeVia: string; sdk: string }): void {
  t.ok(f.tools.includes('echo'), `${expected.sdk}: tools listed through the gateway`)
  t.match(f.echo, new RegExp(`hello ${expected.sdk}`), `${expected.sdk}: tool called`)
  t.equal(f.provider.registered?.client_id, expected.clientId, `${expected.sdk}: registered with the configured client id`)
  t.ok(f.provider.hops[0]!.startsWith(expected.authorizeVia), `${expected.sdk}: authorize started at ${expected.authorizeVia}`)
  t.type(f.provider.accessToken, 'string')
}

t.test('oss_idp: both SDK clients against the development OpenID provider', async t => {
  const idp = await startDevIdp()
  t.teardown(() => idp.close())
  const { url, logText } = await gateway(
    t,
    base => ({
      issuer: idp.issuer,
      audiences: [idp.clientId],
      clientId: idp.clientId,
      provider: { oss_idp: {} },
      resourceMetadata: { resource: `${base}/mcp`, scopesSupported: ['openid', 'profile'] },
    }),
    ['"mcp-users" in jwt.groups']
  )
  const unauth = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  t.equal(unauth.status, 401)

  const f1 = await flowSdk1(url, new HeadlessProvider())
  checkFlow(t, f1, { clientId: idp.clientId, authorizeVia: idp.authorizationEndpoint, sdk: 'sdk1' })
  const f2 = await flowSdk2(url, new HeadlessProvider(), 'params')
  checkFlow(t, f2, { clientId: idp.clientId, authorizeVia: idp.authorizationEndpoint, sdk: 'sdk2' })
  t.notOk(f2.provider.callback!.searchParams.has('iss'), 'the dev IdP, like Authentik, sends no iss in its redirect')
  const claims = JSON.parse(Buffer.from(f2.provider.accessToken!.split('.')[1]!, 'base64url').toString()) as Record<string, unknown>
  t.equal(claims.aud, idp.clientId)
  t.equal(claims.iss, idp.issuer)
  t.notOk(/"access_token"|eyJ[\w-]+\.eyJ/.test(logText()), 'no tokens in the gateway log')
})

async function entraGateway(t: Test, emu: EntraEmulator, issuer: string, extra: Record<string, unknown> = {}) {
  return gateway(
    t,
    base => ({
      issuer,
      audiences: [`api://${emu.clientId}`, emu.clientId],
      clientId: emu.clientId,
      clientSecret: SECRET,
      provider: { cloud_idp: {} },
      resourceMetadata: { resource: `${base}/mcp`, scopesSupported: [...emu.apiScopes] },
      ...extra,
    }),
    ['"mcp.admin" in jwt.roles']
  )
}

t.test('cloud_idp (v2 tokens): both SDK clients against the Entra emulator', async t => {
  const emu = await startEntraEmulator({ clientSecret: SECRET })
  t.teardown(() => emu.close())
  const { url, logText } = await entraGateway(t, emu, emu.issuerV2)
  const base = url.origin
  for (const [sdk, run] of [
    ['sdk1', flowSdk1],
    ['sdk2', flowSdk2],
  ] as const) {
    const f = await run(url, new HeadlessProvider())
    checkFlow(t, f, { clientId: emu.clientId, authorizeVia: `${base}/oauth2/authorize`, sdk })
    t.notOk(f.provider.callback!.searchParams.has('iss'), 'Entra sends no iss: the full callback form works')
    const claims = JSON.parse(Buffer.from(f.provider.accessToken!.split('.')[1]!, 'base64url').toString()) as Record<string, unknown>
    t.equal(claims.iss, emu.issuerV2)
    t.equal(claims.aud, emu.clientId)
    t.same(claims.roles, ['mcp.admin'])
  }
  const tokenRequests = emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/token'))
  t.ok(tokenRequests.length >= 2)
  for (const r of tokenRequests) {
    const p = new Map(r.params)
    t.notOk(p.has('resource'), 'resource never reached the IdP')
    t.equal(p.get('client_secret'), SECRET, 'secret added by the gateway')
  }
  for (const r of emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/authorize'))) {
    t.notOk(new Map(r.params).has('resource'))
  }
  t.notOk(logText().includes(SECRET), 'secret never logged')
})

t.test('cloud_idp (v1 tokens): the v1 issuer and api:// audience validate', async t => {
  const emu = await startEntraEmulator({ clientSecret: SECRET, tokenVersion: 1, v1Issuer: (origin, tenant) => `${origin}/${tenant}/` })
  t.teardown(() => emu.close())
  const { url } = await entraGateway(t, emu, emu.issuerV1, { jwks: emu.jwksUrl })
  const f = await flowSdk1(url, new HeadlessProvider())
  checkFlow(t, f, { clientId: emu.clientId, authorizeVia: `${url.origin}/oauth2/authorize`, sdk: 'sdk1' })
  const claims = JSON.parse(Buffer.from(f.provider.accessToken!.split('.')[1]!, 'base64url').toString()) as Record<string, unknown>
  t.equal(claims.iss, emu.issuerV1)
  t.equal(claims.aud, `api://${emu.clientId}`)
})

t.test('cloud_idp: a user without the app role is refused after a successful login', async t => {
  const emu = await startEntraEmulator({ clientSecret: SECRET, user: { roles: [] } })
  t.teardown(() => emu.close())
  const { url } = await entraGateway(t, emu, emu.issuerV2)
  const err = await flowSdk1(url, new HeadlessProvider()).then(
    () => undefined,
    (e: unknown) => e as Error
  )
  t.ok(err, 'the flow fails')
  t.match(String(err), /403|Forbidden|forbidden|not allowed|denied/i)
})
