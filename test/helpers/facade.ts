/**
 * The OAuth facade under test: a whole gateway (startGateway, real
 * server-everything target) whose mcpAuthentication has a `facade` block, a
 * browser stand-in that follows redirects, keeps the gateway's cookies and
 * answers the consent form, an SDK OAuthClientProvider built on it, and an
 * https server for client ID metadata documents (self-signed certificate,
 * trusted through the facade's test-only options).
 */
import type { Test } from 'tap'
import { execFile } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { validateConfig, deepFreeze, type LoadedConfig } from '../../core/config.ts'
import { startGateway, type RunningGateway } from '../../core/gateway.ts'
import { builtins } from '../../plugins/index.ts'
import { memoryLogger } from './logger.ts'
import { freePort } from './cli.ts'
import { startDevIdp, type DevIdp } from '../../bin/dev-idp.ts'

export const EVERYTHING = fileURLToPath(new URL('../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
/** The redirect URI of the test clients (never listened on: the agent stops there). */
export const CALLBACK = 'http://127.0.0.1:53682/callback'
export const FACADE_KEY = { kid: 'k1', secret: 'facade-test-key-0123456789abcdefghijklmnop' }

export interface FacadeGateway {
  gw: RunningGateway
  base: string
  url: URL
  logText: () => string
}

/**
 * `auth(base)` gives mcpAuthentication's options (facade included). `publicBase`
 * lets a second replica share the first one's public URL (as behind a load balancer).
 */
export async function facadeGateway(
  t: Test,
  auth: (base: string) => Record<string, unknown>,
  opts: { port?: number; publicBase?: string; baseUrl?: string; cluster?: Record<string, unknown>; mcp?: Record<string, unknown> } = {}
): Promise<FacadeGateway> {
  const port = opts.port ?? (await freePort())
  // `baseUrl`: mcp.baseUrl, the public URL behind a TLS-terminating proxy (the listener stays http on loopback).
  const base = opts.baseUrl ?? opts.publicBase ?? `http://127.0.0.1:${port}`
  const config = deepFreeze(
    await validateConfig(
      {
        mcp: {
          host: '127.0.0.1',
          port,
          ...(opts.baseUrl !== undefined ? { baseUrl: opts.baseUrl } : {}),
          targets: [{ name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }],
          policies: { mcpAuthentication: { mode: 'strict', ...auth(base) } },
          ...opts.mcp,
        },
        admin: { enabled: false },
        ...(opts.cluster !== undefined ? { cluster: opts.cluster } : {}),
      },
      builtins
    )
  )
  const loaded: LoadedConfig = { config, baseDir: process.cwd(), secretPaths: new Set() }
  const mem = memoryLogger('info')
  const gw = await startGateway(loaded, { log: mem.log, registry: builtins })
  t.teardown(() => gw.close())
  return { gw, base: `http://127.0.0.1:${port}`, url: new URL(`http://127.0.0.1:${port}/mcp`), logText: mem.text }
}

export interface ConsentForm {
  action: string
  tx: string
  csrf: string
  html: string
}

export function consentFormOf(html: string, pageUrl: string): ConsentForm | undefined {
  const action = /<form method="post" action="([^"]+)"/.exec(html)?.[1]
  const tx = /name="tx" value="([^"]+)"/.exec(html)?.[1]
  const csrf = /name="csrf" value="([^"]+)"/.exec(html)?.[1]
  if (action === undefined || tx === undefined || csrf === undefined) return undefined
  return { action: new URL(action.replace(/&amp;/g, '&'), pageUrl).href, tx, csrf, html }
}

/** One Set-Cookie line as a browser reads it (RFC 6265 §5.2): attribute names lower-cased, values as sent. */
export interface SetCookie {
  url: string
  name: string
  value: string
  attributes: Map<string, string>
}

export function parseSetCookie(url: string, line: string): SetCookie {
  const [pair, ...rest] = line.split(';')
  const i = pair!.indexOf('=')
  const attributes = new Map<string, string>()
  for (const part of rest) {
    const j = part.indexOf('=')
    const key = (j < 0 ? part : part.slice(0, j)).trim().toLowerCase()
    if (key !== '') attributes.set(key, j < 0 ? '' : part.slice(j + 1).trim())
  }
  return { url, name: pair!.slice(0, i).trim(), value: pair!.slice(i + 1).trim(), attributes }
}

/** The facade's own cookies (consent CSRF, remembered consent), whatever prefix (`__Host-` on https) they carry. */
export const FACADE_COOKIE = /mcp_facade_(csrf|consent)$/

/**
 * What a facade cookie lacks for a browser (issue 22 item 15): HttpOnly and SameSite always;
 * Secure exactly when the page was https (a Secure cookie set over http is dropped by browsers);
 * a `__Host-` name with Secure, Path=/ and no Domain (RFC 6265bis §4.1.3.2).
 */
export function cookieProblems(c: SetCookie): string[] {
  const https = new URL(c.url).protocol === 'https:'
  const problems: string[] = []
  if (!c.attributes.has('httponly')) problems.push('HttpOnly missing')
  if (!/^(lax|strict)$/i.test(c.attributes.get('samesite') ?? '')) problems.push('SameSite=Lax or Strict missing')
  if (https && !c.attributes.has('secure')) problems.push('Secure missing on https')
  if (!https && c.attributes.has('secure')) problems.push('Secure on http (a browser drops it)')
  if (c.name.startsWith('__Host-') && (!c.attributes.has('secure') || c.attributes.get('path') !== '/' || c.attributes.has('domain')))
    problems.push('__Host- without Secure, Path=/ or with Domain')
  return problems
}

/**
 * A browser stand-in: follows redirects by hand, keeps cookies per origin,
 * and answers a consent page with `decision`. Stops at `stopAt` (the
 * client's redirect URI) and returns that URL. Every Set-Cookie is kept
 * with its attributes (`setCookies`); a facade cookie a browser would
 * mishandle (cookieProblems, judged on the URL as the browser saw it,
 * before `route`) fails the fetch that received it.
 */
export class Agent {
  readonly jar = new Map<string, Map<string, string>>()
  readonly setCookies: SetCookie[] = []
  decision: 'approve' | 'deny' = 'approve'
  consentPages = 0
  lastConsent: ConsentForm | undefined
  hops: string[] = []
  /** Rewrites a URL before it is fetched (a load balancer sending it to another replica). */
  route: (url: string) => string = u => u

  cookieHeader(url: string): string | undefined {
    const c = this.jar.get(new URL(url).origin)
    return c === undefined || c.size === 0 ? undefined : [...c].map(([k, v]) => `${k}=${v}`).join('; ')
  }

  /** `url`: where the browser thinks it is (judges Secure); `target`: where the request went (keys the jar). */
  keep(url: string, res: Response, target = url): void {
    const origin = new URL(target).origin
    for (const line of res.headers.getSetCookie()) {
      const c = parseSetCookie(url, line)
      this.setCookies.push(c)
      const problems = FACADE_COOKIE.test(c.name) ? cookieProblems(c) : []
      if (problems.length > 0) throw new Error(`cookie ${c.name} from ${new URL(url).pathname}: ${problems.join(', ')} (${line})`)
      const jar = this.jar.get(origin) ?? new Map<string, string>()
      if (c.attributes.get('max-age') === '0' || c.value === '') jar.delete(c.name)
      else jar.set(c.name, c.value)
      this.jar.set(origin, jar)
    }
  }

  async fetch(url: string, init: RequestInit = {}): Promise<Response> {
    const target = this.route(url)
    const cookie = this.cookieHeader(target)
    const res = await fetch(target, {
      ...init,
      redirect: 'manual',
      headers: { ...((init.headers as Record<string, string>) ?? {}), ...(cookie !== undefined ? { cookie } : {}) },
    })
    this.keep(url, res, target)
    return res
  }

  async follow(start: string, stopAt: string): Promise<URL> {
    let next = start
    let init: RequestInit = {}
    for (let i = 0; i < 12; i++) {
      this.hops.push(next)
      if (next.startsWith(stopAt)) return new URL(next)
      const res = await this.fetch(next, init)
      init = {}
      const location = res.headers.get('location')
      if (res.status >= 300 && res.status < 400 && location !== null) {
        next = new URL(location, next).href
        continue
      }
      const html = await res.text()
      const form = res.status === 200 ? consentFormOf(html, next) : undefined
      if (form === undefined) throw new Error(`stopped at ${new URL(next).pathname} with ${res.status}: ${html.slice(0, 300)}`)
      this.consentPages++
      this.lastConsent = form
      next = form.action
      init = {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ tx: form.tx, csrf: form.csrf, decision: this.decision }).toString(),
      }
    }
    throw new Error('too many redirects')
  }
}

/** OAuthClientProvider for both SDK majors, "opening the browser" with an Agent. */
export class FacadeProvider {
  readonly redirectUrl: string
  readonly agent: Agent
  callback: URL | undefined
  #client: unknown
  #tokens: unknown
  #verifier = ''
  #discovery: unknown
  readonly clientMetadataUrl: string | undefined
  constructor(o: { agent?: Agent; redirectUrl?: string; clientMetadataUrl?: string; clientId?: string } = {}) {
    this.agent = o.agent ?? new Agent()
    this.redirectUrl = o.redirectUrl ?? 'http://127.0.0.1:53682/callback'
    this.clientMetadataUrl = o.clientMetadataUrl
    if (o.clientId !== undefined) this.#client = { client_id: o.clientId }
  }
  get clientMetadata() {
    return {
      client_name: 'facade test client',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    }
  }
  clientInformation() {
    return this.#client as never
  }
  saveClientInformation(info: unknown) {
    this.#client = info
  }
  tokens() {
    return this.#tokens as never
  }
  saveTokens(tokens: unknown) {
    this.#tokens = tokens
  }
  saveCodeVerifier(v: string) {
    this.#verifier = v
  }
  codeVerifier() {
    return this.#verifier
  }
  saveDiscoveryState(state: unknown) {
    this.#discovery = state
  }
  discoveryState() {
    return this.#discovery as never
  }
  get registered() {
    return this.#client as { client_id: string } | undefined
  }
  get accessToken() {
    return (this.#tokens as { access_token?: string } | undefined)?.access_token
  }
  get refreshToken() {
    return (this.#tokens as { refresh_token?: string } | undefined)?.refresh_token
  }
  async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    this.callback = await this.agent.follow(authorizationUrl.href, this.redirectUrl)
  }
  code(): string {
    const code = this.callback?.searchParams.get('code')
    if (code === null || code === undefined) throw new Error(`callback without code: ${this.callback?.search}`)
    return code
  }
}

/** A self-signed certificate for 127.0.0.1 (openssl, P-256: fast). */
export async function selfSigned(): Promise<{ key: string; cert: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'facade-cert-'))
  try {
    await new Promise<void>((resolve, reject) =>
      execFile(
        'openssl',
        [
          'req',
          '-x509',
          '-newkey',
          'ec',
          '-pkeyopt',
          'ec_paramgen_curve:prime256v1',
          '-nodes',
          '-days',
          '1',
          '-keyout',
          join(dir, 'key.pem'),
          '-out',
          join(dir, 'cert.pem'),
          '-subj',
          '/CN=127.0.0.1',
          '-addext',
          'subjectAltName=IP:127.0.0.1',
        ],
        err => (err ? reject(err) : resolve())
      )
    )
    return { key: await readFile(join(dir, 'key.pem'), 'utf8'), cert: await readFile(join(dir, 'cert.pem'), 'utf8') }
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}

export interface CimdServer {
  origin: string
  cert: string
  requests: string[]
  docs: Map<string, (url: string) => { status?: number; headers?: Record<string, string>; body?: string; hang?: boolean }>
}

/** An https server for client ID metadata documents; `docs` maps a path to its answer. */
export async function cimdServer(t: Test): Promise<CimdServer> {
  const { key, cert } = await selfSigned()
  const requests: string[] = []
  const docs: CimdServer['docs'] = new Map()
  const hanging: ServerResponse[] = []
  const server: HttpsServer = createHttpsServer({ key, cert }, (req: IncomingMessage, res: ServerResponse) => {
    requests.push(req.url ?? '')
    const handler = docs.get(req.url ?? '')
    const origin = `https://127.0.0.1:${(server.address() as AddressInfo).port}`
    if (handler === undefined) {
      res.writeHead(404).end()
      return
    }
    const a = handler(origin + (req.url ?? ''))
    if (a.hang === true) {
      hanging.push(res)
      return
    }
    res.writeHead(a.status ?? 200, { 'content-type': 'application/json', ...a.headers }).end(a.body ?? '')
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        for (const r of hanging) r.destroy()
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  return { origin: `https://127.0.0.1:${(server.address() as AddressInfo).port}`, cert, requests, docs }
}

/** Client-side PKCE pair (RFC 7636 S256). */
export function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url')
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') }
}

export async function register(base: string, redirectUris: string[] = [CALLBACK]): Promise<string> {
  const res = await fetch(`${base}/.well-known/oauth-authorization-server/client-registration`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ client_name: 'manual client', redirect_uris: redirectUris, token_endpoint_auth_method: 'none' }),
  })
  if (res.status !== 201) throw new Error(`registration answered ${res.status}: ${await res.text()}`)
  return ((await res.json()) as { client_id: string }).client_id
}

export function authorizeUrl(base: string, clientId: string, challenge: string, extra: Record<string, string> = {}): string {
  const u = new URL(`${base}/oauth/authorize`)
  for (const [k, v] of Object.entries({
    response_type: 'code',
    client_id: clientId,
    redirect_uri: CALLBACK,
    code_challenge: challenge,
    code_challenge_method: 'S256',
    state: 'client-state-1',
    scope: 'openid profile',
    ...extra,
  }))
    u.searchParams.set(k, v)
  return u.href
}

export async function redeem(base: string, form: Record<string, string>): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${base}/oauth/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams(form).toString(),
  })
  return { status: res.status, body: (await res.json()) as Record<string, unknown> }
}

export async function devIdpFor(t: Test, callbacks: () => string[], extra: { rotateRefreshTokens?: boolean } = {}): Promise<DevIdp> {
  // Only the gateway's callback is registered at the IdP: no loopback wildcard.
  const idp = await startDevIdp({ allowLoopbackRedirects: false, redirectUris: callbacks(), ...extra })
  t.teardown(() => idp.close())
  return idp
}

export function ossAuth(idp: { issuer: string; clientId: string }, facade: Record<string, unknown> = { keys: [FACADE_KEY] }) {
  return (base: string) => ({
    issuer: idp.issuer,
    audiences: [idp.clientId],
    clientId: idp.clientId,
    provider: { oss_idp: {} },
    resourceMetadata: { resource: `${base}/mcp`, scopesSupported: ['openid', 'profile'] },
    facade,
  })
}

/** Dev IdP + facade gateway whose callback is the one redirect URI at the IdP (`mcp`: more of the gateway's mcp block). */
export async function ossSetup(
  t: Test,
  facade?: Record<string, unknown>,
  mcp?: Record<string, unknown>,
  idpExtra?: { rotateRefreshTokens?: boolean }
): Promise<{ idp: DevIdp; g: FacadeGateway }> {
  const port = await freePort()
  const idp = await devIdpFor(t, () => [`http://127.0.0.1:${port}/oauth/callback`], idpExtra)
  return { idp, g: await facadeGateway(t, ossAuth(idp, facade), { port, mcp }) }
}
