/**
 * The parts of the on-behalf-of end-to-end tests (test/identity-obo*.test.ts),
 * all real and all on 127.0.0.1: the Entra emulator (the IdP of the gateway's
 * cloud_idp login and of the OBO exchange), identity servers (official-SDK
 * MCP servers that validate the downstream token themselves: the emulator's
 * keys, its issuer, their own audience), the real CLI, the official SDK
 * clients 1.x and 2.x through the gateway's full authorization flow, and raw
 * requests in both protocol eras that see exactly what a client sees (status,
 * `WWW-Authenticate`, body).
 */
import type { Test } from 'tap'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { auth as auth1, UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import {
  Client as Client2,
  StreamableHTTPClientTransport as Transport2,
  UnauthorizedError as Unauthorized2,
  type OAuthClientProvider as Provider2,
} from '@modelcontextprotocol/client'
import { spawnCli, waitForPort, freePort, configFile } from './cli.ts'
import { HeadlessProvider } from './oauth-client.ts'
import { INIT_HEADERS, sseMessages } from './gateway-harness.ts'
import { MODERN } from './raw-mcp.ts'
import type { EntraEmulator, RecordedRequest } from './entra-emulator.ts'
import type { Whoami } from './identity-fixture.ts'

export { MODERN }
export type Message = Record<string, any>

/** The gateway app's client secret (its cloud_idp login and its OBO client authentication). */
export const SECRET = 'gateway-app-secret-9f4c1d'

export { sha256, identityServer, jwtArgs, type IdentityServer, type Whoami } from './identity-fixture.ts'

/** The claims of a JWT, unverified (the tests compare what each side saw). */
export function claimsOf(jwt: string): Record<string, unknown> {
  return JSON.parse(Buffer.from(jwt.split('.')[1] ?? '', 'base64url').toString('utf8')) as Record<string, unknown>
}

// ---------------------------------------------------------------------------
// The gateway (real CLI)

export interface Gateway {
  /** `http://127.0.0.1:<port>` */
  readonly base: string
  readonly mcp: URL
  /** `<base>/.well-known/oauth-protected-resource/mcp`: what every challenge must point at. */
  readonly prm: string
  /** The Prometheus text of the probe listener's /metrics. */
  metrics(): Promise<string>
  /** Everything the gateway wrote to stdout and stderr. */
  output(): string
}

/**
 * Starts the CLI with a cloud_idp login against `emu` (the gateway app is the
 * emulator's client id, a confidential app) and the given `targets` YAML (a
 * block under `mcp.targets`, indented four spaces). `env` carries the secrets
 * the YAML references as `${NAME}`.
 */
export async function startGateway(t: Test, emu: EntraEmulator, targets: string, o: { rules?: string[]; env?: Record<string, string> } = {}): Promise<Gateway> {
  const [port, probes] = await Promise.all([freePort(), freePort()])
  const base = `http://127.0.0.1:${port}`
  const yaml = `mcp:
  host: 127.0.0.1
  port: ${port}
  targets:
${targets}
  policies:
    mcpAuthentication:
      mode: strict
      issuer: "${emu.issuerV2}"
      audiences: ["${emu.clientId}", "api://${emu.clientId}"]
      clientId: "${emu.clientId}"
      clientSecret: \${OBO_GATEWAY_SECRET}
      provider: { cloud_idp: {} }
      resourceMetadata: { resource: "${base}/mcp", scopesSupported: ${JSON.stringify(emu.apiScopes)} }
${o.rules === undefined ? '' : `    authorization: { rules: ${JSON.stringify(o.rules)} }\n`}probes: { host: 127.0.0.1, port: ${probes} }
admin: { enabled: false }
logging: { level: debug }
`
  const cli = spawnCli(['-f', await configFile(yaml, 'mcpp-obo-')], { OBO_GATEWAY_SECRET: SECRET, ...o.env })
  t.teardown(async () => {
    cli.child.kill('SIGTERM')
    await cli.exited
  })
  await waitForPort(port, cli.exited).catch(err => {
    throw new Error(`${(err as Error).message}\n${cli.output()}`)
  })
  return {
    base,
    mcp: new URL(`${base}/mcp`),
    prm: `${base}/.well-known/oauth-protected-resource/mcp`,
    metrics: async () => (await fetch(`http://127.0.0.1:${probes}/metrics`)).text(),
    output: cli.output,
  }
}

/** The value of one sample of a Prometheus text exposition (0 when absent). */
export function sample(text: string, name: string, labels: Record<string, string>): number {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue
    const inner = line.slice(name.length + 1, line.indexOf('}'))
    const have = new Map([...inner.matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map(m => [m[1]!, m[2]!]))
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) return Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return 0
}

// ---------------------------------------------------------------------------
// Logging in with the official SDK clients

/**
 * The headless provider of the existing OAuth tests, signing in as one of the
 * emulator's users (`login_hint`, passed on by the gateway's authorize proxy),
 * and a client that follows a claims challenge: the transports fetch through
 * `fetch`, which keeps the last Bearer challenge of the MCP endpoint, and the
 * next authorization request carries its `claims` (OIDC Core §5.5, what MSAL
 * does with Entra's challenge), the challenge's base64 decoded.
 */
export class UserProvider extends HeadlessProvider {
  readonly loginHint: string | undefined
  /** Authorization URLs the SDK opened (the first hop of each), to see what it asked for. */
  readonly authorizations: URL[] = []
  /** Runs before each sign-in: what the user does at the IdP this time (e.g. consents). */
  onAuthorize: ((url: URL) => void | Promise<void>) | undefined
  /** The last challenge of a 401 or 403 answer from the MCP endpoint. */
  challenge: Record<string, string> | undefined
  readonly fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const res = await fetch(input, init)
    if (res.status === 401 || res.status === 403) this.challenge = bearerChallenge(res.headers.get('www-authenticate'))
    return res
  }
  constructor(loginHint?: string, scope?: string) {
    super(scope)
    this.loginHint = loginHint
  }
  override async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    const u = new URL(authorizationUrl.href)
    if (this.loginHint !== undefined) u.searchParams.set('login_hint', this.loginHint)
    const claims = this.challenge?.error === 'insufficient_claims' ? claimsChallenge(this.challenge.claims) : undefined
    if (claims !== undefined) u.searchParams.set('claims', JSON.stringify(claims))
    this.authorizations.push(u)
    this.callback = undefined
    await this.onAuthorize?.(u)
    await super.redirectToAuthorization(u)
  }
}

/** A claims challenge as sent: the IdP's JSON, raw or base64 (Microsoft's convention for `WWW-Authenticate`). */
export function claimsChallenge(value: string | undefined): Record<string, unknown> | undefined {
  if (value === undefined) return undefined
  for (const text of [value, Buffer.from(value, 'base64').toString('utf8')]) {
    try {
      const json = JSON.parse(text) as unknown
      if (json !== null && typeof json === 'object') return json as Record<string, unknown>
    } catch {}
  }
  return undefined
}

export interface Session1 {
  client: Client1
  transport: Transport1
  provider: UserProvider
}

/** SDK 1.x (a session, 2025-11-25): 401, authorization through the gateway, connect. */
export async function login1(t: Test, mcp: URL, loginHint?: string): Promise<Session1> {
  const provider = new UserProvider(loginHint)
  const first = await new Client1({ name: 'sdk1', version: '1.0.0' })
    .connect(new Transport1(mcp, { authProvider: provider as unknown as Provider1, fetch: provider.fetch }))
    .then(
      () => undefined,
      (e: unknown) => e
    )
  if (!(first instanceof Unauthorized1)) throw new Error(`sdk1: expected the first connect to need authorization, got ${String(first)}`)
  const transport = new Transport1(mcp, { authProvider: provider as unknown as Provider1, fetch: provider.fetch })
  await transport.finishAuth(provider.code())
  const client = new Client1({ name: 'sdk1', version: '1.0.0' })
  await client.connect(transport)
  t.teardown(() => client.close().catch(() => {}))
  return { client, transport, provider }
}

export interface Session2 {
  client: Client2
  transport: Transport2
  provider: UserProvider
}

/**
 * SDK 2.x, in a session (2025-11-25) or pinned to 2026-07-28 (no session); `onInsufficientScope`
 * `'throw'`: the host drives a step-up itself (InsufficientScopeError) instead of the transport.
 */
export async function login2(
  t: Test,
  mcp: URL,
  era: 'session' | 'modern',
  loginHint?: string,
  onInsufficientScope: 'reauthorize' | 'throw' = 'reauthorize'
): Promise<Session2> {
  const options = era === 'modern' ? { versionNegotiation: { mode: { pin: MODERN } } } : {}
  const provider = new UserProvider(loginHint)
  const first = await new Client2({ name: 'sdk2', version: '2.0.0' }, options as never)
    .connect(new Transport2(mcp, { authProvider: provider as unknown as Provider2, fetch: provider.fetch }))
    .then(
      () => undefined,
      (e: unknown) => e
    )
  if (!(first instanceof Unauthorized2)) throw new Error(`sdk2: expected the first connect to need authorization, got ${String(first)}`)
  const transport = new Transport2(mcp, { authProvider: provider as unknown as Provider2, fetch: provider.fetch, onInsufficientScope })
  await transport.finishAuth(provider.callback!.searchParams)
  const client = new Client2({ name: 'sdk2', version: '2.0.0' }, options as never)
  await client.connect(transport)
  t.teardown(() => client.close().catch(() => {}))
  return { client, transport, provider }
}

/**
 * A user's token from the full authorization flow through the gateway (the
 * SDK's own auth()), without a single MCP request: nothing reached a target yet.
 */
export async function tokenFor(mcp: URL, loginHint?: string): Promise<string> {
  const provider = new UserProvider(loginHint)
  const started = await auth1(provider as unknown as Provider1, { serverUrl: mcp })
  if (started !== 'REDIRECT') throw new Error(`expected a redirect to the authorization endpoint, got ${started}`)
  const done = await auth1(provider as unknown as Provider1, { serverUrl: mcp, authorizationCode: provider.code() })
  if (done !== 'AUTHORIZED' || provider.accessToken === undefined) throw new Error(`the code was not redeemed: ${done}`)
  return provider.accessToken
}

/** The on-behalf-of requests the emulator received, by the assertion's user (`oid`) and the requested scope. */
export function oboRequests(emu: EntraEmulator, o: { oid?: string; scope?: string } = {}): RecordedRequest[] {
  const tokenPath = new URL(emu.tokenUrl).pathname
  return emu.requests.filter(r => {
    if (r.path !== tokenPath) return false
    const p = new Map(r.params)
    if (p.get('grant_type') !== 'urn:ietf:params:oauth:grant-type:jwt-bearer' || p.get('requested_token_use') !== 'on_behalf_of') return false
    if (o.scope !== undefined && p.get('scope') !== o.scope) return false
    return o.oid === undefined || claimsOf(p.get('assertion') ?? '').oid === o.oid
  })
}

/** What the identity server's `whoami` answered: the claims it verified and the hash of the bearer it got. */
export function whoamiOf(result: object): Whoami {
  const { content, isError } = result as { content?: Array<{ type: string; text?: string }>; isError?: boolean }
  const text = content?.find(c => c.type === 'text')?.text
  if (isError === true || text === undefined) throw new Error(`whoami failed: ${JSON.stringify(result).slice(0, 500)}`)
  return JSON.parse(text) as Whoami
}

// ---------------------------------------------------------------------------
// Raw requests: what a client sees

export interface Answer {
  status: number
  headers: Headers
  text: string
  /** The JSON-RPC messages (JSON or SSE), or the JSON error body. */
  messages: Message[]
}

async function post(url: URL, token: string, body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  const res = await fetch(url, { method: 'POST', headers: { ...INIT_HEADERS, authorization: `Bearer ${token}`, ...headers }, body: JSON.stringify(body) })
  const text = await res.text()
  let messages: Message[] = []
  if ((res.headers.get('content-type') ?? '').startsWith('text/event-stream')) messages = sseMessages(text)
  else if (text !== '') {
    const json = JSON.parse(text) as Message | Message[]
    messages = Array.isArray(json) ? json : [json]
  }
  return { status: res.status, headers: res.headers, text, messages }
}

export interface RawSession {
  readonly id: string
  /** One request POST inside the session. */
  call(method: string, params?: Record<string, unknown>): Promise<Answer>
  /** One tools/call POST inside the session. */
  callTool(name: string, args?: Record<string, unknown>): Promise<Answer>
  /** Opens the session's GET stream; `messages`: everything it carried, once it ends (the session's end). */
  listen(): Promise<{ messages: Promise<Message[]> }>
  close(): Promise<void>
}

/** A session (2025-11-25) opened with `token`: initialize, initialized. */
export async function rawSession(url: URL, token: string): Promise<RawSession> {
  const init = await post(url, token, {
    jsonrpc: '2.0',
    id: 0,
    method: 'initialize',
    params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  })
  const id = init.headers.get('mcp-session-id')
  if (init.status !== 200 || id === null) throw new Error(`initialize failed: ${init.status} ${init.text.slice(0, 500)}`)
  const headers = { 'mcp-session-id': id, 'mcp-protocol-version': '2025-11-25' }
  await post(url, token, { jsonrpc: '2.0', method: 'notifications/initialized' }, headers)
  let seq = 0
  const call = (method: string, params: Record<string, unknown> = {}): Promise<Answer> =>
    post(url, token, { jsonrpc: '2.0', id: ++seq, method, params }, headers)
  return {
    id,
    call,
    callTool: (name, args = {}) => call('tools/call', { name, arguments: args }),
    async listen() {
      const res = await fetch(url, { headers: { ...headers, accept: 'text/event-stream', authorization: `Bearer ${token}` } })
      if (res.status !== 200) throw new Error(`GET stream refused: ${res.status} ${await res.text()}`)
      const messages = res.text().then(text => sseMessages(text) as Message[])
      messages.catch(() => {})
      return { messages }
    },
    async close() {
      await fetch(url, { method: 'DELETE', headers: { ...headers, authorization: `Bearer ${token}` } }).then(r => r.arrayBuffer())
    },
  }
}

/** One 2026-07-28 tools/call (no session; headers mirroring the body). */
export function modernToolCall(url: URL, token: string, name: string, args: Record<string, unknown> = {}, id = 1): Promise<Answer> {
  const body = {
    jsonrpc: '2.0',
    id,
    method: 'tools/call',
    params: {
      name,
      arguments: args,
      _meta: {
        'io.modelcontextprotocol/protocolVersion': MODERN,
        'io.modelcontextprotocol/clientCapabilities': {},
        'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
      },
    },
  }
  return post(url, token, body, { 'mcp-protocol-version': MODERN, 'mcp-method': 'tools/call', 'mcp-name': name })
}

/** The result of a successful tools/call answer (the message with `result`). */
export function resultOf(a: Answer): { content?: unknown; isError?: boolean } {
  const m = a.messages.findLast(x => x.result !== undefined || x.error !== undefined)
  if (a.status !== 200 || m?.result === undefined) throw new Error(`tools/call failed: ${a.status} ${a.text.slice(0, 500)}`)
  return m.result as { content?: unknown; isError?: boolean }
}

// ---------------------------------------------------------------------------
// WWW-Authenticate (RFC 9110 §11.6.1: auth-params, quoted-string with quoted-pairs)

export function bearerChallenge(header: string | null): Record<string, string> | undefined {
  if (header === null) return undefined
  const m = /^\s*Bearer(?:\s+|$)/i.exec(header)
  if (m === null) return undefined
  const out: Record<string, string> = {}
  const re = /\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([!#$%&'*+.^_`|~0-9A-Za-z-]+))\s*(?:,|$)/gy
  re.lastIndex = m[0].length
  for (let p = re.exec(header); p !== null; p = re.exec(header)) {
    out[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!
    if (re.lastIndex >= header.length) break
  }
  return out
}
