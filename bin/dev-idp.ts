/**
 * A development-only OpenID provider built on `oidc-provider`, shaped like
 * the `oss_idp` variant (Authentik, docs/identity-providers.md "Identity providers"): issuer with a trailing slash under
 * `/application/o/<slug>/`, keys at `{issuer}jwks/`, discovery reporting
 * `registration_endpoint: null`, JWT access tokens whose `aud` is the client
 * id, a `groups` claim when `profile` is requested, a public PKCE client and
 * the by-hand `client_credentials` request with service-account
 * `username`/`password`.
 *
 * Logins need no UI: the configured user is logged in and consent is granted
 * on the authorize request itself, so an OAuth client can follow the redirect
 * straight to its redirect_uri with a code. It binds to 127.0.0.1 only.
 * Used by tests and by the demo; never deploy it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { randomUUID } from 'node:crypto'
import { generateKeyPair, exportJWK, SignJWT, type CryptoKey, type JWK, type JWTPayload, type JWTHeaderParameters } from 'jose'
import { Provider, errors as oidcErrors, interactionPolicy, type GrantInstance, type OidcCtx } from 'oidc-provider'
import {
  exchangeClientMetadata,
  registerTokenExchange,
  type DevIdpExchangeClient,
  type DevIdpExchangeRecord,
  type DevIdpTokenExchangeOptions,
  type ExchangeDeps,
  type TokenEndpointFailure,
} from './dev-idp-token-exchange.ts'

export type { DevIdpExchangeClient, DevIdpExchangeRecord, DevIdpTokenExchangeOptions, TokenEndpointFailure }

/** An interactive user (authorization-code flow). */
export interface DevIdpUser {
  /** Not checked by the automatic login; kept for documentation and demos. */
  readonly password?: string
  /** Put in the `groups` claim when the `profile` scope is granted. */
  readonly groups?: readonly string[]
  readonly email?: string
  readonly name?: string
}

/** A service account for the by-hand `client_credentials` request (docs/identity-providers.md "Setting up the identity provider"). */
export interface DevIdpServiceAccount {
  readonly password: string
  readonly groups?: readonly string[]
}

export interface DevIdpOptions {
  /** Port on 127.0.0.1. Default 0 (any free port). */
  port?: number
  /** Bind address. Only `127.0.0.1` is accepted: this provider is development-only. */
  host?: string
  /** Application slug in the issuer path `/application/o/<slug>/`. Default `mcp`. */
  slug?: string
  /** Client id of the pre-registered public client; also the `aud` of every access token. Default `mcp-gateway-dev`. */
  clientId?: string
  /** Extra exact redirect URIs. Any `http://127.0.0.1:<port>/...` or `http://localhost:<port>/...` callback is accepted anyway unless `allowLoopbackRedirects` is false. */
  redirectUris?: readonly string[]
  /** Accept any loopback http redirect URI (RFC 8252 style). Default true. */
  allowLoopbackRedirects?: boolean
  /** Interactive users by username. Default `{ alice: { password: 'alice-dev-password', groups: ['mcp-users'] } }`. */
  users?: Readonly<Record<string, DevIdpUser>>
  /** User logged in automatically on authorize (a `login_hint` naming a configured user wins). Default: the first user. */
  defaultUser?: string
  /** Service accounts by username. Default `{ 'mcp-service': { password: 'mcp-service-dev-password', groups: ['mcp-users'] } }`. */
  serviceAccounts?: Readonly<Record<string, DevIdpServiceAccount>>
  /** Lifetime of access tokens. Default 600. */
  accessTokenTtlSeconds?: number
  /**
   * Whether a refresh grant rotates the refresh token (and refuses a used one). Default: oidc-provider's
   * own rule. `false` acts like the many IdPs that keep one refresh token for its lifetime, so a test can
   * show what a client of the gateway gets when only the gateway enforces single use.
   */
  rotateRefreshTokens?: boolean
  /**
   * Enables the RFC 8693 token-exchange grant (bin/dev-idp-token-exchange.ts) for these confidential clients, e.g.
   * `{ clients: { 'mcp-gateway': { secret: 's3cret', audiences: ['crm'], scopes: ['crm.read'] } } }`. Off by default.
   */
  tokenExchange?: DevIdpTokenExchangeOptions
}

export interface MintOptions {
  /** `kid` header; default the current signing key's kid. Pass `null` to omit it. */
  kid?: string | null
  /** Default `RS256`. */
  alg?: string
  /** Extra protected header fields (e.g. `jku`, `jwk`, `x5u`). */
  header?: Record<string, unknown>
  /** Sign with this key instead of the provider's current key. */
  key?: CryptoKey | Uint8Array
  /** Default true: add `iss`, `aud` and `azp` (client id), `iat`, `exp` unless present in `claims`. Set false to send `claims` as they are. */
  defaults?: boolean
}

export interface RotateOptions {
  /** Keep the previous keys in the served JWKS. Default true. */
  keepOld?: boolean
}

export interface DevIdp {
  /** Issuer, with its trailing slash: `http://127.0.0.1:<port>/application/o/<slug>/`. */
  readonly issuer: string
  readonly port: number
  /** `http://127.0.0.1:<port>` */
  readonly origin: string
  readonly clientId: string
  /** `{issuer}jwks/` */
  readonly jwksUrl: string
  /** `{issuer}.well-known/openid-configuration` */
  readonly discoveryUrl: string
  readonly authorizationEndpoint: string
  readonly tokenEndpoint: string
  /** Kid of the key that signs `mintToken` and client-credentials tokens. */
  readonly currentKid: string
  /** How many times the JWKS was requested (answered or failed). */
  readonly jwksRequests: number
  /** Signs a JWT access token with the current (or a given) key; for tests that craft good and bad tokens. */
  mintToken(claims: JWTPayload, opts?: MintOptions): Promise<string>
  /** Adds a new signing key (new kid) that becomes the signer of minted tokens. Returns the new kid. */
  rotateKeys(opts?: RotateOptions): Promise<string>
  /** When false the JWKS route answers 503 (key-set drills). */
  setJwksAvailable(available: boolean): void
  /** Tokens issued by the token-exchange grant. */
  readonly exchanges: number
  /** Every token-exchange request that reached the grant (its client authenticated), issued or refused, oldest first. */
  readonly exchangeLog: readonly DevIdpExchangeRecord[]
  /** Changes a token-exchange client's policy (audiences, scopes, subject audiences); the client must be configured at start. */
  setTokenExchangePolicy(clientId: string, policy: Partial<DevIdpExchangeClient>): void
  /** Makes every token endpoint request fail this way (503, or an unparsable 200); undefined heals it. */
  setTokenEndpointFailure(kind: TokenEndpointFailure | undefined): void
  /** Requests a token the way docs/identity-providers.md "Setting up the identity provider" does by hand (client_credentials + service-account credentials). */
  clientCredentialsToken(username: string, password: string, scope?: string): Promise<string>
  close(): Promise<void>
}

interface SigningKey {
  kid: string
  privateKey: CryptoKey
  publicJwk: JWK
  privateJwk: JWK
}

const DEFAULT_USERS: Record<string, DevIdpUser> = {
  alice: { password: 'alice-dev-password', groups: ['mcp-users'], email: 'alice@example.test', name: 'Alice' },
}
const DEFAULT_SERVICE_ACCOUNTS: Record<string, DevIdpServiceAccount> = { 'mcp-service': { password: 'mcp-service-dev-password', groups: ['mcp-users'] } }
const SCOPES = ['openid', 'profile', 'email', 'offline_access']

async function newSigningKey(): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true })
  const kid = randomUUID()
  const publicJwk = { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' }
  const privateJwk = { ...(await exportJWK(privateKey)), kid, alg: 'RS256', use: 'sig' }
  return { kid, privateKey, publicJwk, privateJwk }
}

function isLoopbackRedirect(value: string): boolean {
  let u: URL
  try {
    u = new URL(value)
  } catch {
    return false
  }
  return (
    u.protocol === 'http:' &&
    (u.hostname === '127.0.0.1' || u.hostname === 'localhost' || u.hostname === '[::1]') &&
    u.username === '' &&
    u.password === '' &&
    u.hash === ''
  )
}

/** A tiny in-memory storage adapter (oidc-provider's own one warns on every start). */
function memoryAdapterFactory(): (name: string) => unknown {
  const store = new Map<string, { payload: Record<string, unknown>; expiresAt: number }>()
  const live = (key: string): Record<string, unknown> | undefined => {
    const e = store.get(key)
    if (e === undefined) return undefined
    if (e.expiresAt <= Date.now()) {
      store.delete(key)
      return undefined
    }
    return e.payload
  }
  return function adapterFor(name: string) {
    const k = (id: string): string => `${name}:${id}`
    return {
      async upsert(id: string, payload: Record<string, unknown>, expiresIn?: number) {
        store.set(k(id), { payload, expiresAt: typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : Infinity })
      },
      async find(id: string) {
        return live(k(id))
      },
      async findByUserCode(code: string) {
        for (const [key] of store) if (key.startsWith(name + ':') && live(key)?.userCode === code) return live(key)
        return undefined
      },
      async findByUid(uid: string) {
        for (const [key] of store) if (key.startsWith(name + ':') && live(key)?.uid === uid) return live(key)
        return undefined
      },
      async consume(id: string) {
        const p = live(k(id))
        if (p !== undefined) p.consumed = Math.floor(Date.now() / 1000)
      },
      async destroy(id: string) {
        store.delete(k(id))
      },
      async revokeByGrantId(grantId: string) {
        for (const [key, e] of store) if (e.payload.grantId === grantId) store.delete(key)
      },
    }
  }
}

/** What the running provider keeps: its addresses and accounts, and the key set tests rotate and break. */
interface DevIdpState {
  readonly issuer: string
  /** `/application/o/<slug>/`: the issuer's path, the only one served. */
  readonly prefix: string
  readonly clientId: string
  /** Access token lifetime in seconds. */
  readonly ttl: number
  readonly users: Readonly<Record<string, DevIdpUser>>
  readonly serviceAccounts: Readonly<Record<string, DevIdpServiceAccount>>
  readonly defaultUser: string | undefined
  /** Served in the JWKS; `signer` signs minted and client-credentials tokens. */
  keys: SigningKey[]
  signer: SigningKey
  jwksAvailable: boolean
  jwksRequests: number
  tokenEndpointFailure: TokenEndpointFailure | undefined
  readonly exchange: ExchangeDeps
}

/** Starts the development OpenID provider on 127.0.0.1. */
export async function startDevIdp(opts: DevIdpOptions = {}): Promise<DevIdp> {
  const host = opts.host ?? '127.0.0.1'
  if (host !== '127.0.0.1') {
    throw new Error(`dev-idp is development-only and binds to 127.0.0.1 only (refusing host ${host})`)
  }
  const slug = opts.slug ?? 'mcp'
  if (!/^[a-z0-9-]+$/.test(slug)) throw new Error('dev-idp: slug must match [a-z0-9-]+')
  const users = opts.users ?? DEFAULT_USERS
  const prefix = `/application/o/${slug}/`

  // The port is known only after listen(), and the issuer contains it: listen first, build the provider after.
  let handler: ((req: IncomingMessage, res: ServerResponse) => void) | undefined
  const server = createServer((req, res) => {
    if (handler === undefined) {
      res.writeHead(503).end()
      return
    }
    handler(req, res)
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', reject)
      resolve()
    })
  })
  const port = (server.address() as AddressInfo).port
  const origin = `http://127.0.0.1:${port}`

  const first = await newSigningKey()
  const s: DevIdpState = {
    issuer: origin + prefix,
    prefix,
    clientId: opts.clientId ?? 'mcp-gateway-dev',
    ttl: opts.accessTokenTtlSeconds ?? 600,
    users,
    serviceAccounts: opts.serviceAccounts ?? DEFAULT_SERVICE_ACCOUNTS,
    defaultUser: opts.defaultUser ?? Object.keys(users)[0],
    keys: [first],
    signer: first,
    jwksAvailable: true,
    jwksRequests: 0,
    tokenEndpointFailure: undefined,
    exchange: {
      issuer: origin + prefix,
      loginAudience: opts.clientId ?? 'mcp-gateway-dev',
      ttl: opts.tokenExchange?.ttlSeconds ?? 300,
      publicKeys: () => s.keys.map(k => k.publicJwk),
      sign: (payload, typ) => mintToken(s, payload, { defaults: false, header: { typ } }),
      policies: new Map(Object.entries(opts.tokenExchange?.clients ?? {})),
      log: [],
      issued: 0,
    },
  }
  const provider = buildProvider(s, first, opts)
  if (opts.allowLoopbackRedirects ?? true) {
    const proto = provider.Client.prototype
    const original = proto.redirectUriAllowed
    proto.redirectUriAllowed = function redirectUriAllowed(value: string): boolean {
      return original.call(this, value) || isLoopbackRedirect(value)
    }
  }
  provider.registerGrantType('client_credentials', serviceAccountGrant(s), ['scope', 'username', 'password', 'resource'])
  if (opts.tokenExchange !== undefined) registerTokenExchange(provider, s.exchange)
  provider.use(authentikDiscovery(s.issuer))
  provider.use(noIssInAuthorizationResponse)
  handler = devIdpHandler(s, provider.callback())
  return devIdpHandle(s, port, origin, server)
}

/** The oidc-provider instance, configured to look like Authentik and to log users in without a UI. */
function buildProvider(s: DevIdpState, first: SigningKey, opts: DevIdpOptions): Provider {
  const { issuer, clientId, ttl, users, serviceAccounts } = s
  const groupsOf = (sub: string): readonly string[] => users[sub]?.groups ?? serviceAccounts[sub]?.groups ?? []
  const policy = interactionPolicy.base()
  // No prompt ever needs a UI: the account and grant are set up on the authorize request (see autoLogin).
  for (const prompt of policy) prompt.checks.length = 0
  return new Provider(issuer, {
    adapter: memoryAdapterFactory(),
    clients: [
      {
        client_id: clientId,
        application_type: 'native',
        token_endpoint_auth_method: 'none',
        grant_types: ['authorization_code', 'refresh_token', 'client_credentials'],
        response_types: ['code'],
        redirect_uris: opts.redirectUris?.length ? [...opts.redirectUris] : ['http://127.0.0.1/callback'],
      },
      ...exchangeClientMetadata(opts.tokenExchange),
    ],
    jwks: { keys: [first.privateJwk] },
    scopes: SCOPES,
    claims: { openid: ['sub'], profile: ['name', 'groups'], email: ['email'] },
    cookies: { keys: [randomUUID()] },
    pkce: { required: () => true },
    routes: { jwks: '/jwks/' },
    interactions: { policy, url: (_ctx: unknown, interaction: { uid: string }) => `${s.prefix}interaction/${interaction.uid}` },
    findAccount: async (_ctx: unknown, sub: string) => {
      if (users[sub] === undefined && serviceAccounts[sub] === undefined) return undefined
      return {
        accountId: sub,
        claims: async () => ({ sub, name: users[sub]?.name, email: users[sub]?.email, groups: [...groupsOf(sub)] }),
      }
    },
    loadExistingGrant: impliedGrant,
    extraParams: {
      // Runs on every authorize request after the session is loaded and before the account is: the automatic login.
      async dev_auto_login(ctx: OidcCtx) {
        const session = ctx.oidc.session
        if (ctx.oidc.route !== 'authorization' || session === undefined || session.accountId !== undefined) return
        const hint = ctx.oidc.params?.login_hint
        const accountId = typeof hint === 'string' && users[hint] !== undefined ? hint : s.defaultUser
        if (accountId !== undefined) session.loginAccount({ accountId })
      },
    },
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: false },
      revocation: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // Authentik ignores RFC 8707: whatever `resource` a client sends, the token's `aud` is the client id.
        defaultResource: async () => issuer,
        useGrantedResource: async () => true,
        getResourceServerInfo: async () => ({
          scope: SCOPES.join(' '),
          audience: clientId,
          accessTokenFormat: 'jwt',
          accessTokenTTL: ttl,
          jwt: { sign: { alg: 'RS256' } },
        }),
      },
    },
    extraTokenClaims: async (_ctx: unknown, token: { accountId?: string; scope?: string }) => {
      if (token.accountId === undefined) return undefined
      const scopes = new Set((token.scope ?? '').split(' '))
      return scopes.has('profile') ? { groups: [...groupsOf(token.accountId)] } : undefined
    },
    issueRefreshToken: async (_ctx: unknown, client: { grantTypeAllowed(g: string): boolean }) => client.grantTypeAllowed('refresh_token'),
    ...(opts.rotateRefreshTokens !== undefined ? { rotateRefreshToken: opts.rotateRefreshTokens } : {}),
    clientBasedCORS: () => true,
    ttl: {
      AccessToken: ttl,
      AuthorizationCode: 60,
      IdToken: ttl,
      RefreshToken: 86400,
      Grant: 86400,
      Interaction: 600,
      Session: 86400,
      ClientCredentials: ttl,
    },
    renderError: async (ctx: OidcCtx, out: Record<string, unknown>) => {
      ctx.body = out
    },
  })
}

/** Consent is implied: grant every requested scope, for the OIDC part and for the resource (if any). */
async function impliedGrant(ctx: OidcCtx): Promise<GrantInstance | undefined> {
  const accountId = ctx.oidc.session?.accountId
  if (accountId === undefined || ctx.oidc.client === undefined) return undefined
  const grant = new ctx.oidc.provider.Grant({ accountId, clientId: ctx.oidc.client.clientId })
  const scope = [...ctx.oidc.requestParamScopes].filter(s => SCOPES.includes(s)).join(' ')
  grant.addOIDCScope(scope)
  for (const resource of Object.keys(ctx.oidc.resourceServers ?? {})) grant.addResourceScope(resource, scope)
  await grant.save()
  return grant
}

/** Signs a JWT access token with the current (or a given) key. */
async function mintToken(s: DevIdpState, claims: JWTPayload, mo: MintOptions = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000)
  const payload: JWTPayload =
    mo.defaults === false
      ? { ...claims }
      : // azp as in Authentik's access tokens, which the gateway tells from ID tokens by it.
        { iss: s.issuer, aud: s.clientId, azp: s.clientId, iat: now, exp: now + s.ttl, ...claims }
  const kid = mo.kid === null ? undefined : (mo.kid ?? s.signer.kid)
  const header = { alg: mo.alg ?? 'RS256', typ: 'JWT', ...(kid === undefined ? {} : { kid }), ...mo.header } as JWTHeaderParameters
  return new SignJWT(payload).setProtectedHeader(header).sign(mo.key ?? s.signer.privateKey)
}

/** The by-hand request of docs/identity-providers.md "Setting up the identity provider": grant_type=client_credentials with client_id, scope, username and password. */
function serviceAccountGrant(s: DevIdpState): (ctx: OidcCtx) => Promise<void> {
  return async function serviceAccountGrant(ctx: OidcCtx) {
    const params = ctx.oidc.params ?? {}
    const username = params.username
    const password = params.password
    if (typeof username !== 'string' || typeof password !== 'string') {
      throw new oidcErrors.InvalidGrant('username and password (service-account credentials) are required')
    }
    const account = s.serviceAccounts[username]
    if (account === undefined || account.password !== password) {
      throw new oidcErrors.InvalidGrant('invalid service-account credentials')
    }
    const requested = typeof params.scope === 'string' ? params.scope.split(' ').filter(Boolean) : []
    const unknown = requested.find(sc => !SCOPES.includes(sc))
    if (unknown !== undefined) throw new oidcErrors.InvalidScope('requested scope is not allowed', unknown)
    const scope = requested.join(' ')
    const claims: JWTPayload = { sub: username, client_id: s.clientId, azp: s.clientId, scope, jti: randomUUID() }
    if (requested.includes('profile')) claims.groups = [...(account.groups ?? [])]
    ctx.body = { access_token: await mintToken(s, claims), token_type: 'Bearer', expires_in: s.ttl, scope }
  }
}

function authentikDiscovery(issuer: string): (ctx: OidcCtx, next: () => Promise<void>) => Promise<void> {
  return async function authentikDiscovery(ctx, next) {
    await next()
    if (ctx.path === '/.well-known/openid-configuration' && ctx.status === 200 && ctx.body !== null && typeof ctx.body === 'object') {
      // Authentik's open-source builds have no dynamic client registration and say so with null.
      ctx.body = { ...(ctx.body as Record<string, unknown>), registration_endpoint: null, jwks_uri: `${issuer}jwks/` }
    }
  }
}

async function noIssInAuthorizationResponse(ctx: OidcCtx, next: () => Promise<void>): Promise<void> {
  await next()
  // Like Authentik, the redirect back to the client carries no RFC 9207 `iss`.
  // The gateway serves this IdP's metadata under its own issuer
  // ({base_url}/mcp), so an `iss` naming the IdP would make 2.x SDK clients
  // refuse every callback.
  const location = ctx.response.get('location')
  if (ctx.status >= 300 && ctx.status < 400 && location !== '' && /[?&#]iss=/.test(location)) {
    const u = new URL(location)
    u.searchParams.delete('iss')
    if (u.hash.includes('iss=')) {
      const h = new URLSearchParams(u.hash.slice(1))
      h.delete('iss')
      u.hash = h.toString()
    }
    ctx.redirect(u.href)
  }
}

/** Serves the issuer's path only: the JWKS (counted, and switchable off) here, the rest by oidc-provider. */
function devIdpHandler(s: DevIdpState, callback: (req: IncomingMessage, res: ServerResponse) => void): (req: IncomingMessage, res: ServerResponse) => void {
  const { prefix } = s
  return function devIdpRequest(req, res) {
    const url = req.url ?? '/'
    if (!url.startsWith(prefix)) {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not_found"}')
      return
    }
    const rest = url.slice(prefix.length - 1)
    if ((rest === '/jwks/' || rest.startsWith('/jwks/?')) && (req.method === 'GET' || req.method === 'HEAD')) {
      s.jwksRequests++
      if (!s.jwksAvailable) {
        res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":"temporarily_unavailable"}')
        return
      }
      const body = JSON.stringify({ keys: s.keys.map(k => k.publicJwk) })
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' }).end(body)
      return
    }
    if (s.tokenEndpointFailure !== undefined && rest.startsWith('/token') && req.method === 'POST') {
      failTokenRequest(res, s.tokenEndpointFailure)
      return
    }
    ;(req as IncomingMessage & { originalUrl?: string }).originalUrl = url
    req.url = rest
    callback(req, res)
  }
}

/** A token endpoint outage as the gateway meets one: down, or answering what no client can parse. (A hung IdP: test/helpers/hung-peer.ts.) */
function failTokenRequest(res: ServerResponse, kind: TokenEndpointFailure): void {
  if (kind === 'unavailable') res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":"temporarily_unavailable"}')
  else res.writeHead(200, { 'content-type': 'text/html' }).end('<html>gateway timeout</html>')
}

/** The handle tests and the demo hold. */
function devIdpHandle(s: DevIdpState, port: number, origin: string, server: Server): DevIdp {
  const { issuer, clientId } = s
  return {
    issuer,
    port,
    origin,
    clientId,
    jwksUrl: `${issuer}jwks/`,
    discoveryUrl: `${issuer}.well-known/openid-configuration`,
    authorizationEndpoint: `${issuer}auth`,
    tokenEndpoint: `${issuer}token`,
    get currentKid() {
      return s.signer.kid
    },
    get jwksRequests() {
      return s.jwksRequests
    },
    mintToken(claims: JWTPayload, mo?: MintOptions) {
      return mintToken(s, claims, mo)
    },
    async rotateKeys(ro: RotateOptions = {}) {
      const next = await newSigningKey()
      // The provider's own key (authorization-code tokens) always stays, unless the caller drops old keys.
      s.keys = ro.keepOld === false ? [next] : [...s.keys, next]
      s.signer = next
      return next.kid
    },
    setJwksAvailable(available: boolean) {
      s.jwksAvailable = available
    },
    get exchanges() {
      return s.exchange.issued
    },
    get exchangeLog() {
      return s.exchange.log
    },
    setTokenExchangePolicy(clientId: string, policy: Partial<DevIdpExchangeClient>) {
      const current = s.exchange.policies.get(clientId)
      if (current === undefined) throw new Error(`dev-idp: no token-exchange client ${clientId}`)
      s.exchange.policies.set(clientId, { ...current, ...policy })
    },
    setTokenEndpointFailure(kind: TokenEndpointFailure | undefined) {
      s.tokenEndpointFailure = kind
    },
    async clientCredentialsToken(username: string, password: string, scope = 'openid profile') {
      const res = await fetch(`${issuer}token`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ grant_type: 'client_credentials', client_id: clientId, scope, username, password }),
      })
      const body = (await res.json()) as { access_token?: string; error?: string; error_description?: string }
      if (!res.ok || typeof body.access_token !== 'string') {
        throw new Error(`token request failed: ${res.status} ${body.error ?? ''} ${body.error_description ?? ''}`)
      }
      return body.access_token
    },
    close() {
      return new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
    },
  }
}
