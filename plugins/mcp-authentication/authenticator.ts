/**
 * The bearer-token check of /mcp (the plugin mcpAuthentication creates) and
 * the protected resource metadata (RFC 9728) it serves. A token verified
 * before (the connection's last one, or in the cache) is settled without a
 * promise; only a signature verification awaits, and its failures map to
 * answers by mode: `strict` and `optional` refuse a bad token (401, or 503
 * while the IdP's keys cannot be had), `permissive` never refuses.
 */
import {
  ProxyError,
  authInfo,
  createError,
  tracer,
  type AuthInfo,
  type Plugin,
  type PluginEnv,
  type Reply,
  type RequestContext,
  type RouteDef,
} from '../../core/plugin-api.ts'
import type { IdpIdentity } from './identity.ts'
import { KeysUnavailableError, type RemoteKeySet } from './key-set.ts'
import { AuthFailure, createVerifier, type Verified } from './verifier.ts'
import { TokenCache } from './token-cache.ts'
import { quote, readBearer, stripAuthorization } from './bearer.ts'
import type { McpAuthenticationOptions } from './options.ts'

type Counter = ReturnType<PluginEnv['metrics']['counter']>

/** 503, not 401: a client would go back to its login, get a new token and fail again, in a loop. */
export const KeysUnavailable = createError('MCPP_ERR_KEYS_UNAVAILABLE', 503, "The IdP's signing keys could never be fetched (`Retry-After`)", {
  oauthError: 'temporarily_unavailable',
  expose: true,
})

/** The MCP protocol version the protected resource metadata advertises (docs/identity-providers.md "Authentication", protected resource metadata). */
export const PRM_PROTOCOL_VERSION = '2025-06-18'
export const PRM_PATH = '/.well-known/oauth-protected-resource/mcp'
export const PRM_ROOT_PATH = '/.well-known/oauth-protected-resource'

export interface AuthenticatorParts {
  readonly options: McpAuthenticationOptions
  readonly idp: IdpIdentity
  /** The gateway's base URL: where the metadata and the authorization server are. */
  readonly baseUrl: string
  readonly keySet: RemoteKeySet
  /** Gives the shared key set back (close). */
  readonly release: () => void
  readonly failures: Counter
  readonly verifications: Counter
}

export class Authenticator implements Plugin {
  readonly name = 'mcpAuthentication'
  readonly routes: readonly RouteDef[]
  readonly #options: McpAuthenticationOptions
  readonly #mode: McpAuthenticationOptions['mode']
  readonly #idp: IdpIdentity
  readonly #prmUrl: string
  readonly #challengeBase: string
  readonly #keySet: RemoteKeySet
  readonly #release: () => void
  readonly #failures: Counter
  readonly #verifications: Counter
  readonly #verify: (token: string) => Promise<Verified>
  readonly #cache: TokenCache | undefined
  readonly #subjectClaim: string
  readonly #stillValidKid = (kid: string | undefined): boolean => this.#keySet.hasKid(kid)
  /** Bound once: readBearer builds its 400s' challenges with it. */
  readonly #challenge = (extra: string): string => (extra === '' ? this.#challengeBase : `${this.#challengeBase}, ${extra}`)
  #verified = 0

  constructor(p: AuthenticatorParts) {
    const { options } = p
    this.#options = options
    this.#mode = options.mode
    this.#idp = p.idp
    this.#prmUrl = `${p.baseUrl}${PRM_PATH}`
    const scopes = options.resourceMetadata.scopesSupported
    this.#challengeBase =
      `Bearer resource_metadata="${quote(this.#prmUrl)}"` + (scopes !== undefined && scopes.length > 0 ? `, scope="${quote(scopes.join(' '))}"` : '')
    this.#keySet = p.keySet
    this.#release = p.release
    this.#failures = p.failures
    this.#verifications = p.verifications
    this.#subjectClaim = options.subjectClaim ?? 'sub'
    this.#verify = createVerifier({
      issuer: options.issuer,
      audiences: options.audiences,
      clockToleranceSeconds: options.clockToleranceSeconds ?? 30,
      keySet: p.keySet,
      maxTokenBytes: options.maxTokenBytes ?? 16384,
      maxClaimDepth: options.maxClaimDepth ?? 16,
      maxLifetimeSeconds: options.maxTokenLifetimeSeconds,
      tokenKind:
        options.rejectIdTokens === false
          ? 'none'
          : options.provider?.cloud_idp !== undefined
            ? 'cloud_idp'
            : options.provider?.oss_idp !== undefined
              ? 'oss_idp'
              : 'none',
    })
    const tc = options.tokenCache ?? {}
    this.#cache = tc.enabled === false ? undefined : new TokenCache(tc.maxEntries ?? 10000, tc.ttlSeconds ?? 300)
    this.routes = prmRoutes(options, p.baseUrl)
  }

  onRequest(ctx: RequestContext): undefined | Promise<undefined> {
    if (ctx.path !== '/mcp' || ctx.method === 'OPTIONS') return undefined
    let token: string | undefined
    try {
      token = readBearer(ctx.req, ctx.query, this.#challenge)
    } finally {
      stripAuthorization(ctx.req)
    }
    if (token === undefined) {
      if (this.#mode !== 'strict') return undefined
      this.#failures.inc({ reason: 'missing' })
      ctx.denial = { reason: 'unauthorized: no token' }
      throw new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, 'JWT token required', {
        oauthError: 'unauthorized',
        headers: { 'www-authenticate': this.#challenge('') },
      })
    }
    // A token verified before (the connection's last one, or in the cache)
    // is settled here without a promise; only a verification awaits.
    const hit = this.#cache?.get(token, this.#stillValidKid, ctx.req.socket)
    if (hit !== undefined) {
      tracer?.verification(ctx, true)
      ctx.auth = hit
      return undefined
    }
    return this.#verifyRequest(ctx, token)
  }

  /** The slow path of `onRequest`: verify the signature, then map failures to answers by mode. */
  async #verifyRequest(ctx: RequestContext, token: string): Promise<undefined> {
    // The span records the outcome, never the token.
    const endSpan = tracer?.verification(ctx, false)
    try {
      ctx.auth = await this.#verifyToken(token, ctx.req.socket)
      endSpan?.()
      return undefined
    } catch (err) {
      endSpan?.(err instanceof AuthFailure ? err.reason : err instanceof KeysUnavailableError ? 'keys_unavailable' : 'error')
      if (this.#mode === 'permissive') {
        if (err instanceof AuthFailure) this.#failures.inc({ reason: err.reason })
        return undefined
      }
      if (err instanceof KeysUnavailableError) {
        this.#failures.inc({ reason: 'keys_unavailable' })
        ctx.denial = { reason: 'keys unavailable' }
        throw KeysUnavailable('signing keys of the identity provider are unavailable; retry later', {
          headers: { 'retry-after': String(this.#options.keySet?.retryAfterSeconds ?? err.retryAfterSeconds) },
          cause: err,
        })
      }
      if (err instanceof AuthFailure) throw this.#unauthorized(ctx, err)
      throw err
    }
  }

  /** A full verification (a token not in the cache), cached for the next requests. */
  async #verifyToken(token: string, connection: object): Promise<AuthInfo> {
    this.#verified++
    this.#verifications.inc()
    // The verifier deep-froze the claims after bounding their depth.
    const { payload, kid } = await this.#verify(token)
    const claims = payload as Readonly<Record<string, unknown>>
    // Only the named claim identifies the caller: azp/client_id name the client, shared by all its users.
    const subject = claims[this.#subjectClaim]
    if (typeof subject !== 'string' || subject === '') throw new AuthFailure('no_subject', 'token has no subject')
    // The token rides along for the credential layer (token exchange), hidden from every serialiser; the
    // cache is keyed by this same token, so a cache hit carries it too.
    const auth = authInfo({ subject, claims, expiresAt: typeof payload.exp === 'number' ? payload.exp : undefined, token })
    this.#cache?.set(token, auth, kid, connection)
    return auth
  }

  #unauthorized(ctx: RequestContext, f: AuthFailure): ProxyError {
    this.#failures.inc({ reason: f.reason })
    ctx.denial = { reason: `invalid_token: ${f.message}${f.detail === undefined ? '' : ` (${f.detail})`}` }
    return new ProxyError('MCPP_ERR_UNAUTHORIZED', 401, f.message, {
      oauthError: 'invalid_token',
      headers: { 'www-authenticate': this.#challenge(`error="invalid_token", error_description="${quote(f.message)}"`) },
    })
  }

  ready(): { ready: boolean; reason?: string; code?: string } {
    const keySet = this.#keySet
    return keySet.loaded
      ? { ready: true }
      : { ready: false, reason: `signing keys not loaded: ${keySet.state().lastError ?? 'not fetched yet'}`, code: 'idp_keys_unavailable' }
  }

  describe(): Record<string, unknown> {
    const options = this.#options
    const cache = this.#cache
    return {
      mode: this.#mode,
      issuer: options.issuer,
      audiences: options.audiences ?? [],
      provider: this.#idp.family,
      clientId: options.clientId,
      resourceMetadataUrl: this.#prmUrl,
      keySet: this.#keySet.state(),
      verifications: this.#verified,
      tokenCache: cache === undefined ? { enabled: false } : { enabled: true, size: cache.size, hits: cache.hits, misses: cache.misses },
    }
  }

  async close(): Promise<void> {
    this.#cache?.clear()
    this.#release()
  }
}

/** The protected resource metadata (RFC 9728), one frozen document served at both paths. */
function prmRoutes(options: McpAuthenticationOptions, baseUrl: string): RouteDef[] {
  const scopes = options.resourceMetadata.scopesSupported
  const prmDocument = Object.freeze({
    resource: options.resourceMetadata.resource,
    authorization_servers: [`${baseUrl}/mcp`],
    mcp_protocol_version: PRM_PROTOCOL_VERSION,
    resource_type: 'mcp-server',
    bearer_methods_supported: [...(options.resourceMetadata.bearerMethodsSupported ?? ['header'])],
    ...(scopes !== undefined ? { scopes_supported: [...scopes] } : {}),
  })
  const prmBody = JSON.stringify(prmDocument)
  function protectedResourceMetadata(): Reply {
    return {
      status: 200,
      headers: { 'content-type': 'application/json', 'access-control-allow-origin': '*', 'cache-control': 'public, max-age=300' },
      body: prmBody,
    }
  }
  return [
    { methods: ['GET'], path: PRM_PATH, kind: 'oauth', handler: protectedResourceMetadata },
    { methods: ['GET'], path: PRM_ROOT_PATH, kind: 'oauth', handler: protectedResourceMetadata },
  ]
}
