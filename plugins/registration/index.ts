/**
 * registration: answers RFC 7591 Dynamic Client Registration with the
 * pre-registered `clientId` (docs/identity-providers.md "Identity providers"). No client is created
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
import { AddressLimiter, type RateLimitOptions } from '../oauth-common/rate-limit.ts'
import { redirectUriProblem as clientRedirectUriProblem } from '../oauth-common/redirect-uri.ts'
import { buildRegistrationResponse as buildClientRegistration, InvalidClientMetadata, type ClientMetadataLimits } from '../oauth-common/client-metadata.ts'

export { InvalidClientMetadata, SUPPORTED_GRANTS } from '../oauth-common/client-metadata.ts'

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
export function withDefaults(o: RegistrationOptionsInput = {}): RegistrationOptions {
  return {
    maxBodyBytes: o.maxBodyBytes ?? DEFAULT_OPTIONS.maxBodyBytes,
    maxRedirectUris: o.maxRedirectUris ?? DEFAULT_OPTIONS.maxRedirectUris,
    maxRedirectUriLength: o.maxRedirectUriLength ?? DEFAULT_OPTIONS.maxRedirectUriLength,
    rateLimit: { ...DEFAULT_OPTIONS.rateLimit, ...o.rateLimit },
  }
}

export const RateLimited = createError('MCPP_ERR_RATE_LIMITED', 429, 'Too many requests from one client address', {
  oauthError: 'temporarily_unavailable',
})

/** redirectUriProblem with this plugin's default length limit. */
export function redirectUriProblem(uri: unknown, maxLength = MAX_URI_LENGTH): string | undefined {
  return clientRedirectUriProblem(uri, maxLength)
}

/** Validates a registration request body and builds the RFC 7591 §3.2.1 response (this plugin's default limits). */
export function buildRegistrationResponse(
  body: unknown,
  clientId: string,
  now = Date.now(),
  limits: ClientMetadataLimits = DEFAULT_OPTIONS
): Record<string, unknown> {
  return buildClientRegistration(body, clientId, now, limits)
}

function invalid(message: string): ProxyError {
  return InvalidClientMetadata(message, { oauthError: 'invalid_client_metadata' })
}

export function createRegistration(env: PluginEnv, options?: RegistrationOptionsInput): Plugin {
  const idp = env.provided.idp as IdpIdentity | undefined
  if (idp?.family === undefined) return { name: 'registration', routes: [] }
  // The options' schema already rejects this; never answer a made-up client id.
  if (idp.clientId === undefined) {
    throw new ProxyError(
      'MCPP_ERR_CONFIG',
      500,
      `${env.configPath}: registration needs the clientId of mcpAuthentication (mcp.policies.mcpAuthentication.clientId: is required for client registration)`
    )
  }
  const clientId = idp.clientId
  const opts = withDefaults(options)
  // With cluster.redis (or workers) every replica and worker draws from one bucket per address; else this process's table.
  const limiter = new AddressLimiter(opts.rateLimit, env.shared, 'registration', env.now)

  async function registerClient(ctx: RequestContext): Promise<Reply> {
    if (ctx.method === 'OPTIONS') {
      return {
        status: 204,
        headers: {
          'access-control-allow-origin': '*',
          'access-control-allow-methods': 'POST, OPTIONS',
          'access-control-allow-headers': '*',
          'access-control-max-age': '600',
        },
      }
    }
    // Counted before anything is read: a refused request costs a map lookup.
    const limited = await limiter.take(ctx.clientAddress)
    if (limited.retryAfter > 0) {
      if (limited.firstRefusal)
        ctx.log.warn({ address: limited.address, retryAfter: limited.retryAfter }, 'client registration rate limit reached for this address')
      throw RateLimited('too many client registrations from this address; retry later', { headers: { 'retry-after': String(limited.retryAfter) } })
    }
    const type = (ctx.req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase()
    if (type !== 'application/json') throw invalid('the request must be application/json')
    const raw = await ctx.readBody(opts.maxBodyBytes)
    let body: unknown
    try {
      body = JSON.parse(raw.toString('utf8'))
    } catch {
      throw invalid('the request body is not valid JSON')
    }
    const out = buildRegistrationResponse(body, clientId, Date.now(), opts)
    ctx.log.info(
      { clientName: out.client_name, redirectUris: (out.redirect_uris as string[]).length },
      'client registration answered with the configured client id'
    )
    return {
      status: 201,
      headers: { 'cache-control': 'no-store', pragma: 'no-cache', 'access-control-allow-origin': '*' },
      body: out,
    }
  }

  return {
    name: 'registration',
    routes: [{ methods: ['POST', 'OPTIONS'], path: REGISTRATION_PATH, handler: registerClient }],
    describe() {
      return { path: REGISTRATION_PATH, clientId, limits: opts }
    },
  }
}

export default definePlugin<RegistrationOptionsInput>({
  name: 'registration',
  engine: '^1',
  optionsSchema: schema as Record<string, unknown>,
  needs: ['idp'],
  errors: [InvalidClientMetadata, RateLimited],
  summary(_options, provided) {
    const clientId = (provided.idp as IdpIdentity).clientId
    return clientId !== undefined
      ? `client registration answered with the pre-registered client ${clientId}`
      : 'client registration: no clientId configured, nothing served'
  },
  create(options, env) {
    return createRegistration(env, options)
  },
})
