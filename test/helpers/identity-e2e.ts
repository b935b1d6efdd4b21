/**
 * For the black-box tests of issue 25 (test/identity-exchange*.test.ts): the
 * real CLI started from a YAML text, the official SDK clients logging in
 * through the gateway (full OAuth flow against the dev IdP, one user per
 * `login_hint`), raw JSON-RPC with a bearer in both protocol eras, and what
 * the fixtures report (whoami, env, GET /seen), read from the outside.
 */
import type { Test } from 'tap'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import {
  Client as Client2,
  StreamableHTTPClientTransport as Transport2,
  UnauthorizedError as Unauthorized2,
  type OAuthClientProvider as Provider2,
} from '@modelcontextprotocol/client'
import { configFile, freePort, spawnCli, waitForPort } from './cli.ts'
import { HeadlessProvider } from './oauth-client.ts'
import { INIT_HEADERS, sseMessages } from './gateway-harness.ts'
import { parsePrometheus, sampleSum } from './admin.ts'
import { startDevIdp, type DevIdp } from '../../bin/dev-idp.ts'
import { identityServer, jwtArgs, type IdentityServer, type Whoami } from './identity-fixture.ts'

export { ENV_SERVER, identityServer, sha256, type IdentityServer, type Whoami } from './identity-fixture.ts'

export const MODERN = '2026-07-28'
export const SESSION_ERA = '2025-11-25'

export type Message = Record<string, any>

/** The payload of a JWT, unverified (what the test reads of a token it was handed). */
export function claimsOf(jwt: string): Record<string, any> {
  return JSON.parse(Buffer.from(jwt.split('.')[1]!, 'base64url').toString()) as Record<string, any>
}

/** `aud` as a list. */
export const audOf = (claims: { aud?: unknown }): unknown[] => (Array.isArray(claims.aud) ? claims.aud : [claims.aud])

// ---- the gateway ------------------------------------------------------------

export interface CliGateway {
  /** http://127.0.0.1:<port>/mcp */
  url: URL
  /** http://127.0.0.1:<admin port> */
  admin: string
  port: number
  pid: number
  /** Everything the CLI wrote on stdout and stderr so far. */
  output: () => string
  /** SIGTERM, and resolves once the CLI exited (its whole output read). */
  stop: () => Promise<void>
}

/** Ports first: the gateway's resource (and so the OAuth flow) names its port. */
export async function gatewayPorts(): Promise<{ port: number; admin: number; probes: number }> {
  const [port, admin, probes] = await Promise.all([freePort(), freePort(), freePort()])
  return { port, admin, probes }
}

/** The head of a gateway config on loopback: its port, mcpAuthentication trusting `idp`, and the `targets:` key. */
export function gatewayHeadYaml(idp: { issuer: string; clientId: string }, ports: { port: number }): string[] {
  return ['mcp:', '  host: 127.0.0.1', `  port: ${ports.port}`, '  policies:', ...authPolicyYaml(idp, ports.port), '  targets:']
}

/** The `mcp.policies.mcpAuthentication` block for the dev IdP, as YAML lines (indented for `policies:`). */
export function authPolicyYaml(idp: { issuer: string; clientId: string }, port: number): string[] {
  return [
    '    mcpAuthentication:',
    '      mode: strict',
    `      issuer: ${JSON.stringify(idp.issuer)}`,
    `      audiences: [${JSON.stringify(idp.clientId)}]`,
    '      provider: { oss_idp: {} }',
    `      clientId: ${JSON.stringify(idp.clientId)}`,
    `      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp", scopesSupported: [openid, profile] }`,
  ]
}

/**
 * Starts the real CLI on `yaml` (which names `ports.port`) and resolves as soon
 * as the MCP port accepts. Stopped with SIGTERM at teardown (SIGKILL if it hangs).
 */
export async function startCliGateway(t: Test, yaml: string, env: Record<string, string>, ports: { port: number; admin: number }): Promise<CliGateway> {
  const file = await configFile(yaml, 'mcpp-identity-')
  const cli = spawnCli(['-f', file], env)
  const closed = new Promise<void>(resolve => cli.child.once('close', () => resolve()))
  const stop = async (): Promise<void> => {
    if (cli.child.exitCode === null && cli.child.signalCode === null) {
      cli.child.kill('SIGTERM')
      const timer = setTimeout(() => cli.child.kill('SIGKILL'), 10_000)
      await cli.exited
      clearTimeout(timer)
    }
    await closed
  }
  t.teardown(stop)
  const giveUp = Promise.race([cli.exited, new Promise(resolve => setTimeout(resolve, 60_000).unref())])
  try {
    await waitForPort(ports.port, giveUp)
  } catch (err) {
    throw new Error(`${(err as Error).message}\n${cli.output()}`)
  }
  return {
    url: new URL(`http://127.0.0.1:${ports.port}/mcp`),
    admin: `http://127.0.0.1:${ports.admin}`,
    port: ports.port,
    pid: cli.child.pid!,
    output: cli.output,
    stop,
  }
}

/** One Prometheus sample sum from a /metrics URL. */
export async function metric(metricsUrl: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const res = await fetch(metricsUrl)
  return sampleSum(parsePrometheus(await res.text()), name, labels)
}

// ---- the SDK clients, logged in through the gateway ---------------------------

/** The headless provider, logging in as `user` at the dev IdP (`login_hint`). */
export class UserProvider extends HeadlessProvider {
  readonly user: string
  constructor(user: string) {
    super()
    this.user = user
  }
  override async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    const u = new URL(authorizationUrl)
    u.searchParams.set('login_hint', this.user)
    return super.redirectToAuthorization(u)
  }
}

export interface LoggedIn<C> {
  client: C
  /** The access token the client got from the IdP through the gateway's OAuth flow. */
  token: string
}

/** SDK 1.x: 401, the authorization flow as `user`, then a connected client (session era). */
export async function loginSdk1(t: Test, url: URL, user: string, fetchFn?: typeof fetch): Promise<LoggedIn<Client1>> {
  const provider = new UserProvider(user)
  const opts = { authProvider: provider as unknown as Provider1, ...(fetchFn !== undefined ? { fetch: fetchFn } : {}) }
  const first = await new Client1({ name: `sdk1-${user}`, version: '1.0.0' }).connect(new Transport1(url, opts)).then(
    () => undefined,
    (e: unknown) => e
  )
  if (!(first instanceof Unauthorized1)) throw new Error(`sdk1 ${user}: expected the first connect to need authorization, got ${String(first)}`)
  const transport = new Transport1(url, opts)
  await transport.finishAuth(provider.code())
  const client = new Client1({ name: `sdk1-${user}`, version: '1.0.0' })
  t.teardown(() => client.close().catch(() => {}))
  await client.connect(transport)
  return { client, token: provider.accessToken! }
}

/** SDK 2.x: the same flow; pinned to 2026-07-28 when `modern`. */
export async function loginSdk2(t: Test, url: URL, user: string, modern = true, fetchFn?: typeof fetch): Promise<LoggedIn<Client2>> {
  const provider = new UserProvider(user)
  const opts = { authProvider: provider as unknown as Provider2, ...(fetchFn !== undefined ? { fetch: fetchFn } : {}) }
  const options = modern ? { versionNegotiation: { mode: { pin: MODERN } } } : {}
  const first = await new Client2({ name: `sdk2-${user}`, version: '2.0.0' }, options as never).connect(new Transport2(url, opts)).then(
    () => undefined,
    (e: unknown) => e
  )
  if (!(first instanceof Unauthorized2)) throw new Error(`sdk2 ${user}: expected the first connect to need authorization, got ${String(first)}`)
  const transport = new Transport2(url, opts)
  await transport.finishAuth(provider.callback!.searchParams)
  const client = new Client2({ name: `sdk2-${user}`, version: '2.0.0' }, options as never)
  t.teardown(() => client.close().catch(() => {}))
  await client.connect(transport)
  return { client, token: provider.accessToken! }
}

/** The JSON a fixture tool put in its text content (or its structured content). */
export function toolJson(result: unknown): Record<string, any> {
  const r = result as { structuredContent?: Record<string, any>; content?: Array<{ type: string; text?: string }>; isError?: boolean } | undefined
  if (r === undefined) throw new Error('no tool result')
  if (r.isError === true) throw new Error(`tool error: ${JSON.stringify(r.content)}`)
  if (r.structuredContent !== undefined) return r.structuredContent
  return JSON.parse((r.content ?? []).map(c => c.text ?? '').join('')) as Record<string, any>
}

// ---- raw JSON-RPC with a bearer -----------------------------------------------

export interface RawAnswer {
  status: number
  headers: Headers
  text: string
  /** The JSON-RPC messages of the answer (SSE or JSON); [] for a non-JSON-RPC body. */
  messages: Message[]
  /** The message answering the request, if any. */
  answer: Message | undefined
}

async function rawPost(url: URL | string, headers: Record<string, string>, body: Message, fetchFn: typeof fetch = fetch): Promise<RawAnswer> {
  const res = await fetchFn(url, { method: 'POST', headers: { ...INIT_HEADERS, ...headers }, body: JSON.stringify(body) })
  const text = await res.text()
  let messages: Message[] = []
  try {
    if ((res.headers.get('content-type') ?? '').startsWith('application/json')) {
      const json = JSON.parse(text) as Message | Message[]
      messages = Array.isArray(json) ? json : [json]
    } else if ((res.headers.get('content-type') ?? '').startsWith('text/event-stream')) messages = sseMessages(text)
  } catch {
    messages = []
  }
  const answer = messages.findLast(m => m.id === body.id && ('result' in m || 'error' in m))
  return { status: res.status, headers: res.headers, text, messages, answer }
}

/** The result of a raw answer; throws with what came instead (status, body). */
export function resultOf(r: RawAnswer): unknown {
  if (r.answer?.result === undefined) throw new Error(`no result: HTTP ${r.status} ${r.text.slice(0, 500)}`)
  return r.answer.result
}

/** One 2026-07-28 request with `token` as the bearer. */
export function modernCall(url: URL | string, token: string, method: string, params: Record<string, unknown> = {}, fetchFn?: typeof fetch): Promise<RawAnswer> {
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'mcp-protocol-version': MODERN, 'mcp-method': method }
  const name = params.name ?? params.uri
  if (typeof name === 'string') headers['mcp-name'] = name
  const _meta = {
    'io.modelcontextprotocol/protocolVersion': MODERN,
    'io.modelcontextprotocol/clientCapabilities': {},
    'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
  }
  return rawPost(url, headers, { jsonrpc: '2.0', id: 1, method, params: { ...params, _meta } }, fetchFn)
}

export interface RawSession {
  id: string
  call(method: string, params?: Record<string, unknown>): Promise<RawAnswer>
  close(): Promise<void>
}

/** A session-era session (initialize, initialized) with `token` as the bearer. */
export async function openRawSession(url: URL | string, token: string, protocolVersion = SESSION_ERA): Promise<RawSession> {
  const auth = { authorization: `Bearer ${token}` }
  const init = await rawPost(url, auth, {
    jsonrpc: '2.0',
    id: 0,
    method: 'initialize',
    params: { protocolVersion, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  })
  const id = init.headers.get('mcp-session-id')
  if (id === null || init.answer?.result === undefined) throw new Error(`initialize failed: ${init.status} ${init.text.slice(0, 300)}`)
  const headers = { ...auth, 'mcp-session-id': id, 'mcp-protocol-version': protocolVersion }
  await fetch(url, { method: 'POST', headers: { ...INIT_HEADERS, ...headers }, body: '{"jsonrpc":"2.0","method":"notifications/initialized"}' }).then(r =>
    r.arrayBuffer()
  )
  let seq = 0
  return {
    id,
    call: (method, params = {}) => rawPost(url, headers, { jsonrpc: '2.0', id: ++seq, method, params }),
    async close() {
      await fetch(url, { method: 'DELETE', headers }).then(r => r.arrayBuffer())
    },
  }
}

// ---- the dev IdP with a token-exchange client ------------------------------------

/** The gateway's client at the IdP for the exchange (its secret only ever in the gateway's environment). */
export const EXCHANGE_CLIENT = 'mcp-gateway-exchange'
export const EXCHANGE_SECRET = 'exchange-client-secret-5d1f0a7c9e3b'

export const USERS = {
  alice: { password: 'alice-dev-password', groups: ['mcp-users'], email: 'alice@example.test', name: 'Alice' },
  bob: { password: 'bob-dev-password', groups: ['mcp-users', 'sales'], email: 'bob@example.test', name: 'Bob' },
  carol: { password: 'carol-dev-password', groups: ['mcp-users'], email: 'carol@example.test', name: 'Carol' },
} as const

/** The dev IdP with the users above and the exchange client, allowed to mint for `audiences` only. */
export async function exchangeIdp(t: Test, audiences: string[]): Promise<DevIdp> {
  const idp = await startDevIdp({
    users: USERS,
    tokenExchange: { clients: { [EXCHANGE_CLIENT]: { secret: EXCHANGE_SECRET, audiences, scopes: [] } } },
  })
  t.teardown(() => idp.close())
  return idp
}

/** How many tokens the IdP's exchange grant issued, for `subject` and `audience` when given (refusals are not counted). */
export function exchangeCount(idp: DevIdp, filter: { subject?: string; audience?: string } = {}): number {
  return idp.exchangeLog.filter(
    e =>
      e.error === undefined &&
      (filter.subject === undefined || e.sub === filter.subject) &&
      (filter.audience === undefined || (e.audience ?? []).includes(filter.audience))
  ).length
}

/** An HTTP target `name` at `url` whose `auth` exchanges the caller's token for its audience (more `auth` keys may follow). */
export function exchangeTargetYaml(idp: DevIdp, name: string, url: string): string[] {
  return [`    - name: ${name}`, `      mcp: { url: ${JSON.stringify(url)} }`, '      auth:', ...exchangeYaml(idp, name)]
}

/** The `auth.tokenExchange` block of a target, as YAML lines under `auth:` (indent 8). */
export function exchangeYaml(idp: DevIdp, audience: string, tokenEndpoint = idp.tokenEndpoint): string[] {
  return [
    '        tokenExchange:',
    `          tokenEndpoint: ${JSON.stringify(tokenEndpoint)}`,
    `          clientId: ${EXCHANGE_CLIENT}`,
    '          clientSecret: ${EXCHANGE_SECRET}',
    `          audience: [${audience}]`,
  ]
}

/** The exchange the gateway makes, made by hand at the IdP (client_secret_basic): what the IdP itself answers. */
export async function directExchange(idp: DevIdp, subjectToken: string, audience: string): Promise<{ status: number; body: Record<string, any> }> {
  const res = await fetch(idp.tokenEndpoint, {
    method: 'POST',
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      authorization: `Basic ${Buffer.from(`${encodeURIComponent(EXCHANGE_CLIENT)}:${encodeURIComponent(EXCHANGE_SECRET)}`).toString('base64')}`,
    },
    body: new URLSearchParams({
      grant_type: 'urn:ietf:params:oauth:grant-type:token-exchange',
      subject_token: subjectToken,
      subject_token_type: 'urn:ietf:params:oauth:token-type:access_token',
      audience,
    }),
  })
  return { status: res.status, body: (await res.json()) as Record<string, any> }
}

/** The identity server checking its bearer as a JWT of `idp` for its own `audience`. */
export const jwtServer = (t: Test, idp: DevIdp, audience: string): Promise<IdentityServer> => identityServer(t, jwtArgs(idp, audience))

/** What `whoami` answered (a tool result from any client). */
export const whoamiOf = (result: unknown): Whoami => toolJson(result) as Whoami
