/**
 * mcpAuthentication: bearer-token authentication for /mcp and the OAuth
 * protected resource metadata (RFC 9728) that tells clients where to log in.
 *
 * Modes: `strict` (a valid token on every /mcp request), `optional` (a
 * missing token passes, a bad one is rejected), `permissive` (never rejects
 * a token; verified claims are passed on when present). In every mode a
 * token in the query string or two Authorization headers get 400, and the
 * Authorization header is removed once read so nothing forwards it.
 */
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http'
import { definePlugin, ProxyError, createError, tracer, type Plugin, type PluginModule, type RouteDef, type AuthInfo, type Reply, type RequestContext } from '../../core/plugin-api.ts'
import { baseUrlOf, identityOf, type IdpIdentity, type ProtectedResource } from './identity.ts'
import { acquireKeySet } from './key-set.ts'
import { AuthFailure, createVerifier, TOKEN_FAILURE_REASONS } from './verifier.ts'
import { TokenCache } from './token-cache.ts'
import { KeysUnavailableError } from './key-set.ts'
import ownSchema from './schema.json' with { type: 'json' }

/**
 * How the `facade` block (opt-in OAuth facade) is validated: by the facade's
 * own schema and checks, handed in by the registry (plugins/index.ts), since
 * a plugin imports no other plugin. They are part of these options, so config
 * load and `--check` name the block's paths.
 */
export interface FacadeBlock {
  /** The block's JSON schema, without `$schema`. */
  readonly schema: Record<string, unknown>
  /** The block with defaults applied and checked; throws a config error naming `path`. */
  options (raw: unknown, path: string): unknown
}

export type { IdpIdentity, ProtectedResource } from './identity.ts'

/** 503, not 401: a client would go back to its login, get a new token and fail again, in a loop. */
export const KeysUnavailable = createError('MCPP_ERR_KEYS_UNAVAILABLE', 503, 'The IdP\'s signing keys could never be fetched (`Retry-After`)', {
  oauthError: 'temporarily_unavailable', expose: true,
})

/** The MCP protocol version the protected resource metadata advertises (docs/identity-providers.md "Authentication", protected resource metadata). */
export const PRM_PROTOCOL_VERSION = '2025-06-18'
export const PRM_PATH = '/.well-known/oauth-protected-resource/mcp'
export const PRM_ROOT_PATH = '/.well-known/oauth-protected-resource'

/** Options as validated by schema.json (defaults applied); nested blocks may be missing when built by hand. */
export interface McpAuthenticationOptions {
  mode: 'strict' | 'optional' | 'permissive'
  issuer: string
  audiences?: string[]
  provider?: { oss_idp?: Record<string, never>; cloud_idp?: Record<string, never> }
  clientId?: string
  clientSecret?: string
  jwks?: string
  resourceMetadata: { resource: string; scopesSupported?: string[]; bearerMethodsSupported?: string[] }
  /** Opt-in OAuth facade (plugins/oauth-facade/schema.json). */
  facade?: unknown
  clockToleranceSeconds?: number
  tokenCache?: { enabled?: boolean; maxEntries?: number; ttlSeconds?: number }
  keySet?: { refreshSeconds?: number; cooldownSeconds?: number; maxBackoffSeconds?: number; timeoutMs?: number; maxBytes?: number; retryAfterSeconds?: number }
  subjectClaim?: string
  rejectIdTokens?: boolean
  maxTokenLifetimeSeconds?: number
  maxTokenBytes?: number
  maxClaimDepth?: number
  discovery?: { ttlSeconds?: number; timeoutMs?: number }
}

/** What this plugin provides to the plugins listed after it (`PluginEnv.provided`). */
export interface McpAuthenticationProvides {
  readonly idp: IdpIdentity
  readonly protectedResource: ProtectedResource
  /** The facade's options (checked by FacadeBlock.options), or undefined when the SPEC's behaviour applies. */
  readonly facade: unknown
}

/** Cross-field checks and the provided identity: the same at start-up and in `--check`. */
export function provides (options: McpAuthenticationOptions, configPath = 'mcp.policies.mcpAuthentication', facade?: FacadeBlock): McpAuthenticationProvides {
  if (options.facade !== undefined && facade === undefined) {
    // Only a registry without the OAuth facade gets here: never pass an unchecked block on.
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${configPath}.facade: the OAuth facade is not among the available plugins`)
  }
  return {
    idp: identityOf(options, configPath),
    protectedResource: { resource: options.resourceMetadata.resource, scopesSupported: options.resourceMetadata.scopesSupported },
    facade: options.facade === undefined ? undefined : facade?.options(options.facade, `${configPath}.facade`),
  }
}

function isAuthorizationName (name: string): boolean {
  return name.length === 13 && name.toLowerCase() === 'authorization'
}

/** Extracts the bearer token: `undefined` when there is none; throws 400 for ambiguous requests. */
export function readBearer (req: IncomingMessage, query: string, challenge: (extra: string) => string): string | undefined {
  if (query !== '' && new URLSearchParams(query).has('access_token')) {
    // RFC 6750 §2.3 tokens in URIs leak into logs and referrers; MCP forbids them.
    throw new ProxyError('MCPP_ERR_BAD_REQUEST', 400, 'access tokens in the query string are not accepted', {
      oauthError: 'invalid_request', headers: { 'www-authenticate': challenge('error="invalid_request"') },
    })
  }
  // One pass over rawHeaders: headersDistinct would build arrays for every header.
  const raw = req.rawHeaders
  let value: string | undefined
  for (let i = 0; i < raw.length; i += 2) {
    if (!isAuthorizationName(raw[i]!)) continue
    if (value !== undefined) {
      throw new ProxyError('MCPP_ERR_BAD_REQUEST', 400, 'more than one Authorization header', {
        oauthError: 'invalid_request', headers: { 'www-authenticate': challenge('error="invalid_request"') },
      })
    }
    value = raw[i + 1]!
  }
  if (value === undefined) return undefined
  return bearerOf(value)
}

function isAsciiLetter (c: number): boolean {
  return (c >= 65 && c <= 90) || (c >= 97 && c <= 122)
}

/**
 * The credentials of a `Bearer` Authorization value, '' when it has none, or
 * undefined for another scheme. Same result as matching
 * `/^([A-Za-z]+)(?:[ \t]+(.*))?$/` on the trimmed value and trimming the
 * credentials, without running a regex over a token of a few hundred bytes.
 */
function bearerOf (header: string): string | undefined {
  const v = header.trim()
  let i = 0
  while (i < v.length && isAsciiLetter(v.charCodeAt(i))) i++
  if (i !== 6 || v.slice(0, 6).toLowerCase() !== 'bearer') return undefined
  if (i === v.length) return ''
  const sep = v.charCodeAt(i)
  if (sep !== 32 && sep !== 9) return undefined
  // The regex's `.` stops at line terminators, so a value holding one did not match.
  if (v.includes('\n') || v.includes('\r') || v.includes('\u2028') || v.includes('\u2029')) return undefined
  return v.slice(i).trim()
}

/** Removes every Authorization header from the request so nothing downstream can forward it. */
export function stripAuthorization (req: IncomingMessage): void {
  const raw = req.rawHeaders
  for (let i = raw.length - 2; i >= 0; i -= 2) {
    if (isAuthorizationName(raw[i]!)) raw.splice(i, 2)
  }
  const headers = req.headers
  if (!Object.hasOwn(headers, 'authorization')) return
  // A copy without it rather than `delete`: a deleted key turns the object
  // into a slow dictionary, and every later read and copy of the request's
  // headers (plugins, the HTTP passthrough, http-proxy) would pay for that.
  const kept: IncomingHttpHeaders = {}
  for (const k of Object.keys(headers)) if (k !== 'authorization') kept[k] = headers[k]
  req.headers = kept
}

function quote (s: string): string {
  return s.replace(/[\\"]/g, '\\$&')
}

/** The plugin, with the OAuth facade's block validated by `facade` when given (plugins/index.ts gives it). */
export function mcpAuthenticationModule (facade?: FacadeBlock): PluginModule<McpAuthenticationOptions> {
  const optionsSchema = facade === undefined ? ownSchema : { ...ownSchema, properties: { ...ownSchema.properties, facade: facade.schema } }
  return definePlugin<McpAuthenticationOptions>({
    name: 'mcpAuthentication',
    engine: '^1',
    optionsSchema: optionsSchema as Record<string, unknown>,
    policy: 'mcpAuthentication',
    provides: ['idp', 'protectedResource', 'facade'],
    errors: [KeysUnavailable],
    // `provider` is bridged by providerBridge and registration, `facade` served by oauthFacade (instead of both).
    actedOnBy (options) {
      if (options.facade !== undefined) return [{ path: 'facade', plugin: 'oauthFacade' }]
      if (options.provider !== undefined) return [{ path: 'provider', plugin: 'providerBridge' }, { path: 'provider', plugin: 'registration' }]
      return []
    },
    summary (options) {
      const what = options.mode === 'strict' ? 'a valid bearer token required on every request'
        : options.mode === 'optional' ? 'a missing token passes, an invalid one is refused'
          : 'never refuses; verified claims passed on when present'
      return `${options.mode}: ${what}; issuer ${options.issuer}` +
        (options.audiences !== undefined ? `, audiences ${options.audiences.join(', ')}` : '') +
        (options.provider !== undefined ? `, provider ${Object.keys(options.provider)[0]}` : '') +
        (options.facade !== undefined ? ', tokens issued by the OAuth facade' : '')
    },
    baseUrlOf (options) {
      return options.resourceMetadata.resource.replace(/\/mcp$/, '')
    },
    check (options, configPath) {
      return provides(options, configPath, facade) as unknown as Readonly<Record<string, unknown>>
    },
    async create (options, env) {
      const mode = options.mode
      const { idp } = provides(options, env.configPath, facade)
      const baseUrl = env.baseUrl !== '' && env.baseUrl !== undefined ? env.baseUrl : baseUrlOf(options.resourceMetadata.resource)
      const prmUrl = `${baseUrl}${PRM_PATH}`
      const scopes = options.resourceMetadata.scopesSupported
      const bearerMethods = options.resourceMetadata.bearerMethodsSupported ?? ['header']
      const challengeBase = `Bearer resource_metadata="${quote(prmUrl)}"` +
        (scopes !== undefined && scopes.length > 0 ? `, scope="${quote(scopes.join(' '))}"` : '')
      const challenge = (extra: string): string => extra === '' ? challengeBase : `${challengeBase}, ${extra}`

      const ks = options.keySet ?? {}
      const cooldownMs = (ks.cooldownSeconds ?? 3) * 1000
      const subjectClaim = options.subjectClaim ?? 'sub'
      const failures = env.metrics.counter('mcp_proxy_auth_failures_total', 'Rejected or unverifiable bearer tokens by reason')
      const fetches = env.metrics.counter('mcp_proxy_keyset_fetches_total', 'Key set fetch attempts by result')
      const verifications = env.metrics.counter('mcp_proxy_token_verifications_total', 'Signature verifications (token cache misses)')
      // Every series at 0 before the first event, so a first failure is a visible increase.
      for (const reason of [...TOKEN_FAILURE_REASONS, 'missing', 'keys_unavailable']) failures.init({ reason })
      for (const result of ['ok', 'error']) fetches.init({ result })
      verifications.init()
      let lastLoggedError: string | undefined

      const { set: keySet, release } = await acquireKeySet({
        source: idp.keySet,
        refreshMs: (ks.refreshSeconds ?? 300) * 1000,
        cooldownMs,
        maxBackoffMs: (ks.maxBackoffSeconds ?? 60) * 1000,
        timeoutMs: ks.timeoutMs ?? 5000,
        maxBytes: ks.maxBytes ?? 524288,
        ...(env.now !== undefined ? { now: env.now } : {}),
        onFetch (result, error) {
          fetches.inc({ result })
          if (result === 'error' && error !== lastLoggedError) env.log.warn({ error }, 'identity provider key set fetch failed')
          lastLoggedError = result === 'error' ? error : undefined
        },
      })

      // Scrape-time gauges: read from the key set when /metrics is asked, nothing per request.
      env.metrics.gauge('mcp_proxy_keyset_keys', 'Signing keys currently loaded from the identity provider').collect = () => [[undefined, keySet.state().kids.length]]
      env.metrics.gauge('mcp_proxy_keyset_last_success_timestamp_seconds', 'When the key set was last fetched successfully').collect = () => {
        const at = keySet.state().lastSuccessAt
        return at === undefined ? [] : [[undefined, Date.parse(at) / 1000]]
      }

      const verify = createVerifier({
        issuer: options.issuer,
        audiences: options.audiences,
        clockToleranceSeconds: options.clockToleranceSeconds ?? 30,
        keySet,
        maxTokenBytes: options.maxTokenBytes ?? 16384,
        maxClaimDepth: options.maxClaimDepth ?? 16,
        maxLifetimeSeconds: options.maxTokenLifetimeSeconds,
        tokenKind: options.rejectIdTokens === false
          ? 'none'
          : options.provider?.cloud_idp !== undefined ? 'cloud_idp' : options.provider?.oss_idp !== undefined ? 'oss_idp' : 'none',
      })
      const tc = options.tokenCache ?? {}
      const cache = tc.enabled === false ? undefined : new TokenCache(tc.maxEntries ?? 10000, tc.ttlSeconds ?? 300)
      let verified = 0

      const unauthorized = (ctx: RequestContext, f: AuthFailure): ProxyError => {
        failures.inc({ reason: f.reason })
        ctx.denial = { reason: `invalid_token: ${f.message}${f.detail === undefined ? '' : ` (${f.detail})`}` }
        return new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, f.message, {
          oauthError: 'invalid_token',
          headers: { 'www-authenticate': challenge(`error="invalid_token", error_description="${quote(f.message)}"`) },
        })
      }

      const stillValidKid = (kid: string | undefined): boolean => keySet.hasKid(kid)

      /** A full verification (a token not in the cache), cached for the next requests. */
      async function verifyToken (token: string, connection: object): Promise<AuthInfo> {
        verified++
        verifications.inc()
        // The verifier deep-froze the claims after bounding their depth.
        const { payload, kid } = await verify(token)
        const claims = payload as Readonly<Record<string, unknown>>
        // Only the named claim identifies the caller: azp/client_id name the client, shared by all its users.
        const subject = claims[subjectClaim]
        if (typeof subject !== 'string' || subject === '') throw new AuthFailure('no_subject', 'token has no subject')
        const auth: AuthInfo = { subject, claims, expiresAt: typeof payload.exp === 'number' ? payload.exp : undefined }
        cache?.set(token, auth, kid, connection)
        return auth
      }

      const prmDocument = Object.freeze({
        resource: options.resourceMetadata.resource,
        authorization_servers: [`${baseUrl}/mcp`],
        mcp_protocol_version: PRM_PROTOCOL_VERSION,
        resource_type: 'mcp-server',
        bearer_methods_supported: [...bearerMethods],
        ...(scopes !== undefined ? { scopes_supported: [...scopes] } : {}),
      })
      const prmBody = JSON.stringify(prmDocument)
      function protectedResourceMetadata (): Reply {
        return {
          status: 200,
          headers: { 'content-type': 'application/json', 'access-control-allow-origin': '*', 'cache-control': 'public, max-age=300' },
          body: prmBody,
        }
      }
      const routes: RouteDef[] = [
        { methods: ['GET'], path: PRM_PATH, kind: 'oauth', handler: protectedResourceMetadata },
        { methods: ['GET'], path: PRM_ROOT_PATH, kind: 'oauth', handler: protectedResourceMetadata },
      ]

      /** The slow path of `onRequest`: verify the signature, then map failures to answers by mode. */
      async function verifyRequest (ctx: RequestContext, token: string): Promise<undefined> {
        // The span records the outcome, never the token.
        const endSpan = tracer?.verification(ctx, false)
        try {
          ctx.auth = await verifyToken(token, ctx.req.socket)
          endSpan?.()
          return undefined
        } catch (err) {
          endSpan?.(err instanceof AuthFailure ? err.reason : err instanceof KeysUnavailableError ? 'keys_unavailable' : 'error')
          if (mode === 'permissive') {
            if (err instanceof AuthFailure) failures.inc({ reason: err.reason })
            return undefined
          }
          if (err instanceof KeysUnavailableError) {
            failures.inc({ reason: 'keys_unavailable' })
            ctx.denial = { reason: 'keys unavailable' }
            throw KeysUnavailable('signing keys of the identity provider are unavailable; retry later', {
              headers: { 'retry-after': String(ks.retryAfterSeconds ?? err.retryAfterSeconds) }, cause: err,
            })
          }
          if (err instanceof AuthFailure) throw unauthorized(ctx, err)
          throw err
        }
      }

      const plugin: Plugin = {
        name: 'mcpAuthentication',
        routes,
        onRequest (ctx) {
          if (ctx.path !== '/mcp' || ctx.method === 'OPTIONS') return undefined
          let token: string | undefined
          try {
            token = readBearer(ctx.req, ctx.query, challenge)
          } finally {
            stripAuthorization(ctx.req)
          }
          if (token === undefined) {
            if (mode !== 'strict') return undefined
            failures.inc({ reason: 'missing' })
            ctx.denial = { reason: 'unauthorized: no token' }
            throw new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, 'JWT token required', {
              oauthError: 'unauthorized', headers: { 'www-authenticate': challenge('') },
            })
          }
          // A token verified before (the connection's last one, or in the cache)
          // is settled here without a promise; only a verification awaits.
          const hit = cache?.get(token, stillValidKid, ctx.req.socket)
          if (hit !== undefined) {
            tracer?.verification(ctx, true)
            ctx.auth = hit
            return undefined
          }
          return verifyRequest(ctx, token)
        },
        ready () {
          return keySet.loaded ? { ready: true } : { ready: false, reason: `signing keys not loaded: ${keySet.state().lastError ?? 'not fetched yet'}`, code: 'idp_keys_unavailable' }
        },
        describe () {
          return {
            mode,
            issuer: options.issuer,
            audiences: options.audiences ?? [],
            provider: idp.family,
            clientId: options.clientId,
            resourceMetadataUrl: prmUrl,
            keySet: keySet.state(),
            verifications: verified,
            tokenCache: cache === undefined ? { enabled: false } : { enabled: true, size: cache.size, hits: cache.hits, misses: cache.misses },
          }
        },
        async close () {
          cache?.clear()
          release()
        },
      }
      return plugin
    },
  })
}

export default mcpAuthenticationModule()
