/**
 * Test wrappers around bin/dev-idp.ts and a minimal authenticated gateway:
 * a real GatewayServer on 127.0.0.1:0 whose pipeline is [cors, mcpAuthentication]
 * and whose /mcp endpoint answers 200 with what authentication learned.
 */
import type { Test } from 'tap'
import { createHash, randomBytes } from 'node:crypto'
import { startDevIdp, type DevIdp, type DevIdpOptions } from '../../bin/dev-idp.ts'
import { GatewayServer, sendReply, type McpEndpoint } from '../../core/server.ts'
import { Pipeline } from '../../core/pipeline.ts'
import { RouteTable } from '../../core/routes.ts'
import { Metrics } from '../../core/observability/metrics.ts'
import { createAjv, validateConfig } from '../../core/config.ts'
import { loadPlugins } from '../../core/plugin-loader.ts'
import type { Plugin, PluginEnv } from '../../core/plugin.ts'
import mcpAuthentication, { type McpAuthenticationOptions } from '../../plugins/mcp-authentication/index.ts'
import cors, { type CorsOptions } from '../../plugins/cors/index.ts'
import { memoryLogger } from './logger.ts'

export async function devIdp(t: Test, opts: DevIdpOptions = {}): Promise<DevIdp> {
  const idp = await startDevIdp(opts)
  t.teardown(() => idp.close())
  return idp
}

/**
 * An access token for a configured interactive user, by the real authorization-code + PKCE flow of the
 * public client (`login_hint` picks the user; every call is a fresh browser, so two users never share a
 * session). The token is what a client of the gateway holds after logging in: `aud` = the client id.
 */
export async function loginToken(idp: DevIdp, user: string, scope = 'openid profile email'): Promise<string> {
  const verifier = randomBytes(32).toString('base64url')
  const redirectUri = 'http://127.0.0.1:1/callback'
  const authorize = new URL(idp.authorizationEndpoint)
  for (const [k, v] of Object.entries({
    client_id: idp.clientId,
    response_type: 'code',
    redirect_uri: redirectUri,
    scope,
    login_hint: user,
    state: randomBytes(8).toString('hex'),
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
  }))
    authorize.searchParams.set(k, v)
  let next = authorize.href
  const cookies = new Map<string, string>()
  for (let hop = 0; !next.startsWith(redirectUri); hop++) {
    if (hop === 10) throw new Error('loginToken: too many redirects')
    const res = await fetch(next, { redirect: 'manual', headers: { cookie: [...cookies].map(([k, v]) => `${k}=${v}`).join('; ') } })
    for (const c of res.headers.getSetCookie()) {
      const [pair = ''] = c.split(';')
      const eq = pair.indexOf('=')
      cookies.set(pair.slice(0, eq), pair.slice(eq + 1))
    }
    const location = res.headers.get('location')
    if (location === null) throw new Error(`loginToken: authorize stopped with ${res.status}: ${(await res.text()).slice(0, 300)}`)
    next = new URL(location, next).href
  }
  const code = new URL(next).searchParams.get('code')
  if (code === null) throw new Error(`loginToken: no code in ${next}`)
  const res = await fetch(idp.tokenEndpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', client_id: idp.clientId, code, redirect_uri: redirectUri, code_verifier: verifier }),
  })
  const body = (await res.json()) as { access_token?: string; error?: string }
  if (typeof body.access_token !== 'string') throw new Error(`loginToken: token request failed: ${res.status} ${body.error ?? ''}`)
  return body.access_token
}

/** Validates options against the plugin's schema (defaults applied), like the plugin loader does. */
export function validated<O>(schema: Record<string, unknown> | undefined, options: O): O {
  const copy = structuredClone(options)
  const validate = createAjv().compile(schema ?? {})
  if (!validate(copy)) throw new Error('invalid options: ' + JSON.stringify(validate.errors))
  return copy
}

export interface AuthGateway {
  url: string
  origin: string
  auth: Plugin
  metrics: Metrics
  logText: () => string
  /** What the /mcp endpoint saw on its last request. */
  lastSeen: () => { authorization: string | undefined; rawAuthorization: boolean; subject: string | undefined } | undefined
}

/** The mcpAuthentication options of an oss_idp configuration for `idp`. */
export function ossOptions(idp: DevIdp, extra: Partial<McpAuthenticationOptions> = {}): McpAuthenticationOptions {
  return {
    mode: 'strict',
    issuer: idp.issuer,
    audiences: [idp.clientId],
    provider: { oss_idp: {} },
    clientId: idp.clientId,
    resourceMetadata: { resource: `${BASE}/mcp`, scopesSupported: ['openid', 'profile'] },
    ...extra,
  }
}

/** Public base URL of the test gateway: deliberately not its listen address ({base_url} never comes from Host). */
export const BASE = 'https://gateway.example.test'

/**
 * Waits until the plugin's first key-set fetch has settled (keys loaded, or
 * an error): create() starts it in the background, and the drills here
 * start from a known state.
 */
export async function firstKeyFetch(auth: Plugin): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const ks = (auth.describe?.() as { keySet?: { loaded: boolean; lastError?: string } } | undefined)?.keySet
    if (ks === undefined || ks.loaded || ks.lastError !== undefined) return
    await new Promise(resolve => setTimeout(resolve, 25))
  }
  throw new Error('the first key-set fetch did not settle')
}

/** Starts the gateway on 127.0.0.1:0 with [cors?, mcpAuthentication]. */
/**
 * `corsModule`: load CORS as a third-party plugin from this path (`mcp.plugins:
 * [{ module, options }]` through the plugin loader) instead of the built-in.
 */
/** `extra.now`: the clock handed to the plugins (PluginEnv.now), so a test moves the key set's time instead of sleeping. */
export async function authGateway(
  t: Test,
  authOptions: McpAuthenticationOptions,
  corsOptions?: CorsOptions,
  corsModule?: string,
  extra: { now?: () => number } = {}
): Promise<AuthGateway> {
  const { log, text } = memoryLogger('debug')
  const metrics = new Metrics()
  let seen: ReturnType<AuthGateway['lastSeen']>
  const endpoint: McpEndpoint = {
    async handle(ctx) {
      seen = {
        authorization: ctx.req.headers.authorization,
        rawAuthorization: ctx.req.rawHeaders.some(h => h.toLowerCase() === 'authorization'),
        subject: ctx.auth?.subject,
      }
      await sendReply(ctx, { status: 200, body: { subject: ctx.auth?.subject ?? null, groups: ctx.auth?.claims.groups ?? null } })
    },
    async close() {},
  }
  const env = (configPath: string): PluginEnv => ({
    log,
    config: {},
    baseUrl: BASE,
    configPath,
    metrics,
    provided: {},
    ...(extra.now !== undefined ? { now: extra.now } : {}),
  })
  const plugins: Plugin[] = []
  t.teardown(async () => {
    for (const p of plugins) await p.close?.()
  })
  if (corsOptions !== undefined && corsModule !== undefined) {
    const config = await validateConfig({
      mcp: { port: 0, baseUrl: BASE, targets: [{ name: 'a', stdio: { cmd: 'node' } }], plugins: [{ module: corsModule, options: corsOptions }] },
    })
    plugins.push(...(await loadPlugins({ config, baseDir: process.cwd(), env: { log, config: config as never, baseUrl: BASE, metrics } })))
  } else if (corsOptions !== undefined) {
    plugins.push(await cors.create(validated(cors.optionsSchema, corsOptions), env('mcp.policies.cors')))
  }
  const authPlugin = await mcpAuthentication.create(validated(mcpAuthentication.optionsSchema, authOptions), env('mcp.policies.mcpAuthentication'))
  plugins.push(authPlugin)
  await firstKeyFetch(authPlugin)
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: endpoint,
    log,
    metrics,
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 10000, requestTimeoutMs: 30000, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close(100))
  const origin = `http://127.0.0.1:${port}`
  return { url: `${origin}/mcp`, origin, auth: authPlugin, metrics, logText: text, lastSeen: () => seen }
}
