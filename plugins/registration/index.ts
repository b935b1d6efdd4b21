/**
 * registration: answers RFC 7591 Dynamic Client Registration with the
 * pre-registered `clientId` (README "Identity providers"). No client is created
 * at the identity provider; MCP clients stay public clients using PKCE
 * (`token_endpoint_auth_method: none`). Needs `idp` (provided by
 * mcpAuthentication, listed before it); without a provider family there are
 * no routes. The plugin's own options (schema.json) bound what one request
 * may cost: body size, redirect URI count and length, registrations per
 * client address.
 */
import { definePlugin, ProxyError, createError, type Plugin, type PluginEnv, type RequestContext, type Reply } from '../../core/plugin-api.ts'
import type { IdpIdentity } from '../mcp-authentication/identity.ts'
import schema from './schema.json' with { type: 'json' }
import { RateLimiter, addressKey, type RateLimitOptions, type TakeResult } from './rate-limit.ts'

export const REGISTRATION_PATH = '/.well-known/oauth-authorization-server/client-registration'

export interface RegistrationOptions {
  readonly maxBodyBytes: number
  readonly maxRedirectUris: number
  readonly maxRedirectUriLength: number
  readonly rateLimit: RateLimitOptions
}

/** Registration options as given: any key may be left out. */
export type RegistrationOptionsInput = Partial<Omit<RegistrationOptions, 'rateLimit'>> & { rateLimit?: Partial<RateLimitOptions> }

type Props = Record<string, { default?: unknown; properties?: Props }>
const props = schema.properties as unknown as Props
const rateProps = props.rateLimit!.properties!

/** The defaults, read from schema.json so that they are written down once. */
export const DEFAULT_OPTIONS: RegistrationOptions = Object.freeze({
  maxBodyBytes: props.maxBodyBytes!.default as number,
  maxRedirectUris: props.maxRedirectUris!.default as number,
  maxRedirectUriLength: props.maxRedirectUriLength!.default as number,
  rateLimit: Object.freeze({
    requests: rateProps.requests!.default as number,
    windowSeconds: rateProps.windowSeconds!.default as number,
    maxAddresses: rateProps.maxAddresses!.default as number,
  }),
})
export const MAX_REDIRECT_URIS = DEFAULT_OPTIONS.maxRedirectUris
export const MAX_URI_LENGTH = DEFAULT_OPTIONS.maxRedirectUriLength

/** Fills what the options leave out (when the loader has not applied the schema's defaults). */
export function withDefaults (o: RegistrationOptionsInput = {}): RegistrationOptions {
  return {
    maxBodyBytes: o.maxBodyBytes ?? DEFAULT_OPTIONS.maxBodyBytes,
    maxRedirectUris: o.maxRedirectUris ?? DEFAULT_OPTIONS.maxRedirectUris,
    maxRedirectUriLength: o.maxRedirectUriLength ?? DEFAULT_OPTIONS.maxRedirectUriLength,
    rateLimit: { ...DEFAULT_OPTIONS.rateLimit, ...o.rateLimit },
  }
}

export const SUPPORTED_GRANTS = ['authorization_code', 'refresh_token'] as const

// Schemes that must never be a redirect target (RFC 8252 §8.1 private-use schemes are fine).
const FORBIDDEN_SCHEMES = new Set(['javascript:', 'data:', 'file:', 'vbscript:', 'blob:', 'about:', 'ftp:', 'ws:', 'wss:'])
const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]'])
const SCHEME_RE = /^[A-Za-z][A-Za-z0-9+.-]*:/
// Any C0 control, DEL, whitespace.
const BAD_CHARS_RE = /[\u0000-\u0020\u007f]/

export const InvalidClientMetadata = createError('MCPP_ERR_INVALID_CLIENT_METADATA', 400, 'Client registration request is invalid', {
  oauthError: 'invalid_client_metadata',
})

export const RateLimited = createError('MCPP_ERR_RATE_LIMITED', 429, 'Too many requests from one client address', {
  oauthError: 'temporarily_unavailable',
})

function invalid (message: string, oauthError = 'invalid_client_metadata'): ProxyError {
  return InvalidClientMetadata(message, { oauthError })
}

/**
 * A redirect URI a registering client may use: absolute, no fragment
 * (RFC 6749 §3.1.2), no user info, no whitespace or control characters;
 * https, http on a loopback host (RFC 8252 §7.3), or a private-use scheme for
 * native apps (RFC 8252 §7.1). Returns the reason it is not, or undefined.
 */
export function redirectUriProblem (uri: unknown, maxLength = MAX_URI_LENGTH): string | undefined {
  if (typeof uri !== 'string' || uri === '') return 'must be a non-empty string'
  if (uri.length > maxLength) return `must be at most ${maxLength} characters`
  if (BAD_CHARS_RE.test(uri)) return 'must not contain whitespace or control characters'
  if (uri.includes('#')) return 'must not contain a fragment'
  if (!SCHEME_RE.test(uri)) return 'must be an absolute URI'
  let u: URL
  try { u = new URL(uri) } catch { return 'must be an absolute URI' }
  if (FORBIDDEN_SCHEMES.has(u.protocol)) return `scheme ${u.protocol} is not allowed`
  if (u.username !== '' || u.password !== '') return 'must not contain user information'
  if (u.protocol === 'http:' && !LOOPBACK_HOSTS.has(u.hostname)) return 'http is only allowed for loopback hosts; use https'
  if ((u.protocol === 'http:' || u.protocol === 'https:') && u.hostname === '') return 'must name a host'
  return undefined
}

function stringList (v: unknown, field: string): string[] | undefined {
  if (v === undefined) return undefined
  if (!Array.isArray(v) || !v.every(x => typeof x === 'string')) throw invalid(`${field} must be an array of strings`)
  return v as string[]
}

function optionalString (v: unknown, field: string): string | undefined {
  if (v === undefined) return undefined
  if (typeof v !== 'string' || v.length > 1000 || /[\u0000-\u001f\u007f]/.test(v)) throw invalid(`${field} must be a string without control characters`)
  return v
}

/** Validates a registration request body and builds the RFC 7591 §3.2.1 response. */
export function buildRegistrationResponse (
  body: unknown, clientId: string, now = Date.now(),
  limits: Pick<RegistrationOptions, 'maxRedirectUris' | 'maxRedirectUriLength'> = DEFAULT_OPTIONS,
): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw invalid('the request body must be a JSON object')
  const req = body as Record<string, unknown>
  const redirectUris = req.redirect_uris
  if (!Array.isArray(redirectUris) || redirectUris.length === 0) {
    throw invalid('redirect_uris must be a non-empty array', 'invalid_redirect_uri')
  }
  // RFC 7591 §3.2.2: a redirect URI the server will not take is invalid_redirect_uri.
  if (redirectUris.length > limits.maxRedirectUris) throw invalid(`at most ${limits.maxRedirectUris} redirect_uris`, 'invalid_redirect_uri')
  redirectUris.forEach((u, i) => {
    const problem = redirectUriProblem(u, limits.maxRedirectUriLength)
    if (problem !== undefined) throw invalid(`redirect_uris[${i}] ${problem}`, 'invalid_redirect_uri')
  })
  // RFC 7591 §3.2.1: the server may replace requested values with the ones it supports.
  const grants = stringList(req.grant_types, 'grant_types')
  const grantTypes = grants === undefined
    ? [...SUPPORTED_GRANTS]
    : SUPPORTED_GRANTS.filter(g => grants.includes(g))
  if (!grantTypes.includes('authorization_code')) throw invalid('grant_types must include authorization_code')
  const responses = stringList(req.response_types, 'response_types')
  if (responses !== undefined && !responses.includes('code')) throw invalid('response_types must include code')
  const clientName = optionalString(req.client_name, 'client_name')
  const scope = optionalString(req.scope, 'scope')
  const out: Record<string, unknown> = {
    client_id: clientId,
    client_id_issued_at: Math.floor(now / 1000),
    token_endpoint_auth_method: 'none',
    redirect_uris: [...redirectUris],
    grant_types: grantTypes,
    response_types: ['code'],
  }
  if (clientName !== undefined) out.client_name = clientName
  if (scope !== undefined) out.scope = scope
  return out
}

export function createRegistration (env: PluginEnv, options?: RegistrationOptionsInput): Plugin {
  const idp = env.provided.idp as IdpIdentity | undefined
  if (idp?.family === undefined) return { name: 'registration', routes: [] }
  // The options' schema already rejects this; never answer a made-up client id.
  if (idp.clientId === undefined) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${env.configPath}: registration needs the clientId of mcpAuthentication (mcp.policies.mcpAuthentication.clientId: is required for client registration)`)
  }
  const clientId = idp.clientId
  const opts = withDefaults(options)
  const limiter = new RateLimiter(opts.rateLimit)
  // With cluster.redis every replica draws from one bucket per address; else this process's table.
  const shared = env.shared?.kind === 'redis' && opts.rateLimit.requests > 0 ? env.shared : undefined
  /** Addresses refused since last served, for one log line per streak (bounded like the local table). */
  const refusing = new Set<string>()

  async function take (address: string): Promise<TakeResult> {
    if (shared === undefined) return limiter.take(address)
    const waitMs = await shared.take(`registration\u0000${address}`, opts.rateLimit.requests, opts.rateLimit.windowSeconds * 1000)
    if (waitMs === 0) { refusing.delete(address); return { retryAfter: 0, firstRefusal: false } }
    const firstRefusal = !refusing.has(address)
    if (firstRefusal) {
      refusing.add(address)
      if (refusing.size > opts.rateLimit.maxAddresses) refusing.delete(refusing.values().next().value!)
    }
    return { retryAfter: Math.max(1, Math.ceil(waitMs / 1000)), firstRefusal }
  }

  async function registerClient (ctx: RequestContext): Promise<Reply> {
    if (ctx.method === 'OPTIONS') {
      return {
        status: 204,
        headers: {
          'access-control-allow-origin': '*', 'access-control-allow-methods': 'POST, OPTIONS',
          'access-control-allow-headers': '*', 'access-control-max-age': '600',
        },
      }
    }
    // Counted before anything is read: a refused request costs a map lookup.
    const address = addressKey(ctx.clientAddress)
    const limited = await take(address)
    if (limited.retryAfter > 0) {
      if (limited.firstRefusal) ctx.log.warn({ address, retryAfter: limited.retryAfter }, 'client registration rate limit reached for this address')
      throw RateLimited('too many client registrations from this address; retry later', { headers: { 'retry-after': String(limited.retryAfter) } })
    }
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/json') throw invalid('the request must be application/json')
    const raw = await ctx.readBody(opts.maxBodyBytes)
    let body: unknown
    try { body = JSON.parse(raw.toString('utf8')) } catch { throw invalid('the request body is not valid JSON') }
    const out = buildRegistrationResponse(body, clientId, Date.now(), opts)
    ctx.log.info({ clientName: out.client_name, redirectUris: (out.redirect_uris as string[]).length }, 'client registration answered with the configured client id')
    return {
      status: 201,
      headers: { 'cache-control': 'no-store', pragma: 'no-cache', 'access-control-allow-origin': '*' },
      body: out,
    }
  }

  return {
    name: 'registration',
    routes: [{ methods: ['POST', 'OPTIONS'], path: REGISTRATION_PATH, handler: registerClient }],
    describe () { return { path: REGISTRATION_PATH, clientId, limits: opts } },
  }
}

export default definePlugin<RegistrationOptionsInput>({
  name: 'registration',
  engine: '^1',
  optionsSchema: schema as Record<string, unknown>,
  needs: ['idp'],
  errors: [InvalidClientMetadata, RateLimited],
  create (options, env) {
    return createRegistration(env, options)
  },
})
