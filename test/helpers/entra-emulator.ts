/**
 * A loopback emulator of Microsoft Entra ID (SPEC's cloud_idp) for tests.
 *
 * Faithful where the gateway depends on it:
 * - OIDC discovery only, at `/{tenant}/v2.0/.well-known/openid-configuration`:
 *   no RFC 8414 document, no `code_challenge_methods_supported`, no
 *   `registration_endpoint`;
 * - keys at `/{tenant}/discovery/v2.0/keys`;
 * - authorize `/{tenant}/oauth2/v2.0/authorize`: logs the configured user in
 *   automatically and redirects to the redirect_uri with `code` and `state`;
 *   a `resource` parameter gets `error=invalid_target` (AADSTS9010010);
 * - token `/{tenant}/oauth2/v2.0/token`: `resource` -> 400 invalid_target
 *   (AADSTS9010010; parameter names match case-insensitively, as in
 *   ASP.NET's collections, so `Resource` counts too); a confidential app without client_secret -> 401
 *   invalid_client (AADSTS7000218); PKCE S256 verified; authorization_code,
 *   refresh_token and client_credentials grants;
 * - v2 tokens (iss `{origin}/{tenant}/v2.0`, aud = the client id GUID) or v1
 *   tokens (iss `https://sts.windows.net/{tenant}/` by default, aud
 *   `api://{client id}`), with `roles`, `scp`, `tid`, `oid`, `sub`, `amr`;
 * - on-behalf-of (entra-obo.ts) for the downstream APIs of `downstreamApis`,
 *   the app authenticated by its secret or a certificate assertion
 *   (entra-client-auth.ts), with Entra's errors (entra-errors.ts).
 *
 * The single app registration is both the MCP client and the exposed API
 * (the SPEC's setup: `api://<client_id>/mcp_access`): the gateway in the OBO
 * flow. Several users can log in (`users`, picked by `login_hint`); an
 * authorize request with `claims` (a client following a claims challenge)
 * counts as multifactor sign-in: its tokens carry `amr` `mfa`.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createHash, randomBytes, randomUUID } from 'node:crypto'
import { generateKeyPair, exportJWK, SignJWT, type CryptoKey, type JWK, type JWTPayload } from 'jose'
import { authenticateClient, presentedClient, type EntraCertificate } from './entra-client-auth.ts'
import { entraError, traceTrailer, entraTimestamp } from './entra-errors.ts'
import { entraDiscovery } from './entra-discovery.ts'
import { redirectAllowed } from './entra-redirects.ts'
import { usersOf, type EntraUser } from './entra-users.ts'
import { loginFlow } from './entra-login.ts'
import { JWT_BEARER, onBehalfOf, pairwiseSub, type EntraDownstreamApi, type OboContext, type OboRecord } from './entra-obo.ts'

export type { EntraCertificate, EntraDownstreamApi, EntraUser, OboRecord }

export interface EntraEmulatorOptions {
  /** Tenant id. Default: a random GUID. */
  tenant?: string
  /** App registration (application) id. Default: a random GUID. */
  clientId?: string
  /** Set for a confidential (web platform) app: then token requests need it. */
  clientSecret?: string
  /** Exposed API scopes (short names). Default `['mcp_access']`. */
  exposedScopes?: readonly string[]
  /** App roles the app itself holds for client_credentials tokens. Default `['mcp.admin']`. */
  appRoles?: readonly string[]
  /** `accessTokenAcceptedVersion` of the app: 2 (default) or 1. */
  tokenVersion?: 1 | 2
  /**
   * Issuer of v1 tokens. Default `https://sts.windows.net/{tenant}/` (a host
   * tests cannot reach: pair it with the gateway's `jwks` setting). A function
   * gets the emulator's origin, e.g. to issue `{origin}/{tenant}/`.
   */
  v1Issuer?: string | ((origin: string, tenant: string) => string)
  /** The user logged in automatically (its login name is its preferredUsername). */
  user?: Partial<EntraUser>
  /** More users, by login name (an authorize request's `login_hint` picks one; preferredUsername defaults to the name). */
  users?: Readonly<Record<string, Partial<EntraUser>>>
  /** Certificate credentials of the app: a `client_assertion` signed with one authenticates it. */
  clientCertificates?: readonly EntraCertificate[]
  /** APIs the app may call on behalf of a user (OBO). */
  downstreamApis?: readonly EntraDownstreamApi[]
  /**
   * Registered redirect URIs. Loopback `http://127.0.0.1/...`/`http://localhost/...`
   * entries match any port (Entra's rule for the mobile and desktop platform).
   * Default: `http://127.0.0.1/callback` and `http://localhost/callback`.
   */
  redirectUris?: readonly string[]
  /** Lifetime of issued access tokens. Default 3600; a negative value issues tokens already expired (assertion-expiry tests). */
  accessTokenTtlSeconds?: number
}

export interface RecordedRequest {
  readonly method: string
  readonly path: string
  /** Decoded query (GET) or form (POST) parameters, in order. */
  readonly params: ReadonlyArray<[string, string]>
  readonly authorization: string | undefined
}

export interface EntraEmulator {
  readonly origin: string
  readonly tenant: string
  readonly clientId: string
  /** `{origin}/{tenant}/v2.0` */
  readonly issuerV2: string
  readonly issuerV1: string
  /** Issuer of the tokens this emulator issues (per `tokenVersion`). */
  readonly tokenIssuer: string
  /** Audience of the tokens it issues: the client id (v2) or `api://{client id}` (v1). */
  readonly tokenAudience: string
  readonly discoveryUrl: string
  readonly jwksUrl: string
  readonly authorizeUrl: string
  readonly tokenUrl: string
  /** `api://{clientId}/{scope}` for each exposed scope. */
  readonly apiScopes: readonly string[]
  /** The default user (logged in when no `login_hint` names another). */
  readonly user: EntraUser
  /** A configured user by login name (or preferredUsername); throws for an unknown one. */
  userNamed(login: string): EntraUser
  /** Changes a user's state (e.g. `amr: ['pwd', 'mfa']`: the next sign-in counts as MFA). */
  setUser(login: string, patch: Partial<Pick<EntraUser, 'amr' | 'roles' | 'name'>>): void
  /** A user's own consent to the app calling `api` (app id or identifier URI) on their behalf; overrides the API's `consented`. */
  setConsent(login: string, api: string, consented: boolean): void
  /** Changes a downstream API (e.g. `{ requireMfa: true }`, `{ consented: false }`). */
  updateDownstreamApi(api: string, patch: Partial<Omit<EntraDownstreamApi, 'appId' | 'identifierUri'>>): void
  /** OBO tokens issued. */
  readonly oboExchanges: number
  /** Every OBO request whose client authenticated, issued or refused, oldest first. */
  readonly oboLog: readonly OboRecord[]
  /**
   * An access token for `login` (default: the default user) by the real authorization-code + PKCE flow
   * against this emulator (the app's secret sent when it has one); `claims` on the authorize request
   * makes it an MFA sign-in. Default scope: the first exposed API scope.
   */
  loginToken(login?: string, o?: { scope?: string; claims?: string }): Promise<string>
  /** Every request received, in order (tests assert what the gateway forwarded). */
  readonly requests: RecordedRequest[]
  /** Requests per path. */
  count(path: string): number
  /** When false, discovery and keys answer 503. */
  setAvailable(available: boolean): void
  /** Makes the token endpoint fail this way (503 `temporarily_unavailable`, or an unparsable 200); undefined heals it. */
  setTokenEndpointFailure(kind: 'unavailable' | 'malformed' | undefined): void
  close(): Promise<void>
}

interface CodeGrant {
  clientId: string
  /** Login name of the user who signed in, and whether the sign-in was multifactor. */
  login: string
  mfa: boolean
  redirectUri: string
  scope: string
  challenge?: string
  method?: string
  nonce?: string
  expires: number
}
interface RefreshGrant {
  clientId: string
  scope: string
  login: string
  mfa: boolean
}

/** Parameter names are matched case-insensitively, as ASP.NET's collections do. */
function hasResource(params: URLSearchParams): boolean {
  for (const k of params.keys()) if (k.toLowerCase() === 'resource') return true
  return false
}

function correlation(): string {
  return traceTrailer(randomUUID(), randomUUID(), entraTimestamp())
}

export async function startEntraEmulator(opts: EntraEmulatorOptions = {}): Promise<EntraEmulator> {
  const tenant = opts.tenant ?? randomUUID()
  const clientId = opts.clientId ?? randomUUID()
  const exposed = opts.exposedScopes ?? ['mcp_access']
  const tokenVersion = opts.tokenVersion ?? 2
  const ttl = opts.accessTokenTtlSeconds ?? 3600
  const users = usersOf(opts)
  const defaultLogin = [...users.keys()][0]!
  const loginOf = (hint: string | null): string | undefined => {
    if (hint === null) return undefined
    if (users.has(hint)) return hint
    return [...users].find(([, u]) => u.preferredUsername.toLowerCase() === hint.toLowerCase())?.[0]
  }
  const userOf = (login: string): EntraUser => users.get(login)!
  const consent = new Map<string, boolean>()
  const apis: EntraDownstreamApi[] = [...(opts.downstreamApis ?? [])]
  const oboLog: OboRecord[] = []
  const registered = opts.redirectUris ?? ['http://127.0.0.1/callback', 'http://localhost/callback']
  const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true })
  const kid = randomBytes(15).toString('base64url')
  const publicJwk: JWK = { ...(await exportJWK(publicKey)), kid, use: 'sig', kty: 'RSA' }
  const codes = new Map<string, CodeGrant>()
  const refreshTokens = new Map<string, RefreshGrant>()
  const requests: RecordedRequest[] = []
  let available = true
  let tokenFailure: 'unavailable' | 'malformed' | undefined

  let origin = ''
  const issuerV2 = (): string => `${origin}/${tenant}/v2.0`
  const issuerV1 = (): string => (typeof opts.v1Issuer === 'function' ? opts.v1Issuer(origin, tenant) : (opts.v1Issuer ?? `https://sts.windows.net/${tenant}/`))
  const apiPrefix = `api://${clientId}/`
  const certificates = opts.clientCertificates ?? []

  function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    const text = JSON.stringify(body)
    res.writeHead(status, {
      'content-type': 'application/json; charset=utf-8',
      'cache-control': 'no-store, no-cache',
      pragma: 'no-cache',
      'content-length': Buffer.byteLength(text),
      ...headers,
    })
    res.end(text)
  }

  function oauthError(res: ServerResponse, status: number, error: string, aadsts: string, headers: Record<string, string> = {}): void {
    send(res, status, entraError(error, aadsts).body, headers)
  }

  /** Turns requested scopes into the API's short scope names; undefined when a scope is unknown. */
  function apiScopesOf(scope: string): string[] | undefined {
    const out: string[] = []
    for (const s of scope.split(' ').filter(x => x !== '')) {
      if (['openid', 'profile', 'email', 'offline_access'].includes(s)) continue
      if (s.startsWith(apiPrefix) && exposed.includes(s.slice(apiPrefix.length))) out.push(s.slice(apiPrefix.length))
      else if (s === `${apiPrefix}.default`) out.push(...exposed)
      else return undefined
    }
    return out
  }

  function signToken(payload: JWTPayload, issuer: string, audience: string): Promise<string> {
    return new SignJWT(payload)
      .setProtectedHeader({ alg: 'RS256', typ: 'JWT', kid })
      .setIssuer(issuer)
      .setAudience(audience)
      .setIssuedAt()
      .setNotBefore(Math.floor(Date.now() / 1000) - 5)
      .setExpirationTime(`${ttl}s`)
      .sign(privateKey as CryptoKey)
  }

  async function accessToken(claims: Record<string, unknown>): Promise<string> {
    const v1 = tokenVersion === 1
    return new SignJWT({
      ...claims,
      tid: tenant,
      ver: v1 ? '1.0' : '2.0',
      ...(v1 ? { appid: clientId } : { azp: clientId }),
    })
      .setProtectedHeader({ alg: 'RS256', typ: 'JWT', kid })
      .setIssuer(v1 ? issuerV1() : issuerV2())
      .setAudience(v1 ? `api://${clientId}` : clientId)
      .setIssuedAt()
      .setNotBefore(Math.floor(Date.now() / 1000) - 5)
      .setExpirationTime(`${ttl}s`)
      .sign(privateKey as CryptoKey)
  }

  async function userTokens(grant: { scope: string; nonce?: string; login: string; mfa: boolean }): Promise<Record<string, unknown>> {
    const user = userOf(grant.login)
    const amr = [...new Set([...user.amr, ...(grant.mfa ? ['mfa'] : [])])]
    const scopes = grant.scope.split(' ').filter(s => s !== '')
    const scp = apiScopesOf(grant.scope) ?? []
    const out: Record<string, unknown> = {
      token_type: 'Bearer',
      scope: scopes.filter(s => s !== 'offline_access' && s !== 'openid' && s !== 'profile' && s !== 'email').join(' '),
      expires_in: ttl,
      ext_expires_in: ttl,
      access_token: await accessToken({
        sub: pairwiseSub(user.oid, clientId),
        oid: user.oid,
        amr,
        name: user.name,
        ...(tokenVersion === 1 ? { upn: user.preferredUsername } : { preferred_username: user.preferredUsername }),
        scp: scp.join(' '),
        roles: [...user.roles],
      }),
    }
    if (scopes.includes('offline_access')) {
      const rt = randomBytes(48).toString('base64url')
      refreshTokens.set(rt, { clientId, scope: grant.scope, login: grant.login, mfa: grant.mfa })
      out.refresh_token = rt
    }
    if (scopes.includes('openid')) {
      out.id_token = await new SignJWT({
        oid: user.oid,
        tid: tenant,
        name: user.name,
        preferred_username: user.preferredUsername,
        amr,
        ver: '2.0',
        ...(grant.nonce !== undefined ? { nonce: grant.nonce } : {}),
      })
        .setProtectedHeader({ alg: 'RS256', typ: 'JWT', kid })
        .setIssuer(issuerV2())
        .setAudience(clientId)
        .setSubject(user.oid)
        .setIssuedAt()
        .setExpirationTime('1h')
        .sign(privateKey as CryptoKey)
    }
    return out
  }

  function authorize(res: ServerResponse, q: URLSearchParams): void {
    const cid = q.get('client_id')
    const redirectUri = q.get('redirect_uri')
    if (cid !== clientId) {
      oauthError(res, 400, 'unauthorized_client', `AADSTS700016: Application with identifier '${cid ?? ''}' was not found in the directory.`)
      return
    }
    if (redirectUri === null || !redirectAllowed(registered, redirectUri)) {
      oauthError(
        res,
        400,
        'invalid_request',
        `AADSTS50011: The redirect URI '${redirectUri ?? ''}' specified in the request does not match the redirect URIs configured for the application '${clientId}'.`
      )
      return
    }
    const back = new URL(redirectUri)
    const state = q.get('state')
    const fail = (error: string, description: string): void => {
      back.searchParams.set('error', error)
      back.searchParams.set('error_description', `${description}\r\n${correlation()}`)
      if (state !== null) back.searchParams.set('state', state)
      res.writeHead(302, { location: back.href }).end()
    }
    if (hasResource(q)) {
      fail('invalid_target', "AADSTS9010010: The resource parameter provided in the request doesn't match with the requested scopes.")
      return
    }
    if (q.get('response_type') !== 'code') {
      fail('unsupported_response_type', "AADSTS700054: response_type 'code' is required.")
      return
    }
    const scope = q.get('scope') ?? ''
    if (apiScopesOf(scope) === undefined) {
      fail('invalid_scope', `AADSTS70011: The provided value for the input parameter 'scope' is not valid. The scope '${scope}' does not exist.`)
      return
    }
    const challenge = q.get('code_challenge') ?? undefined
    const method = q.get('code_challenge_method') ?? (challenge !== undefined ? 'plain' : undefined)
    if (challenge !== undefined && method !== 'S256' && method !== 'plain') {
      fail('invalid_request', 'AADSTS501491: Invalid code_challenge_method.')
      return
    }
    const code = randomBytes(64).toString('base64url')
    codes.set(code, {
      clientId,
      login: loginOf(q.get('login_hint')) ?? defaultLogin,
      mfa: q.get('claims') !== null,
      redirectUri,
      scope,
      challenge,
      method,
      nonce: q.get('nonce') ?? undefined,
      expires: Date.now() + 600_000,
    })
    back.searchParams.set('code', code)
    if (state !== null) back.searchParams.set('state', state)
    back.searchParams.set('session_state', randomUUID())
    res.writeHead(302, { location: back.href }).end()
  }

  async function token(req: IncomingMessage, res: ServerResponse, form: URLSearchParams): Promise<void> {
    if (hasResource(form)) {
      oauthError(res, 400, 'invalid_target', "AADSTS9010010: The resource parameter provided in the request doesn't match with the requested scopes.")
      return
    }
    const { clientId: cid, secret } = presentedClient(req, form)
    if (cid !== clientId) {
      oauthError(res, 400, 'unauthorized_client', `AADSTS700016: Application with identifier '${cid ?? ''}' was not found in the directory.`)
      return
    }
    const grantType = form.get('grant_type')
    const confidential = opts.clientSecret !== undefined || certificates.length > 0
    const method = await authenticateClient(
      {
        clientId,
        clientSecret: opts.clientSecret,
        certificates,
        assertionAudiences: [`${origin}/${tenant}/oauth2/v2.0/token`, `${origin}/${tenant}/oauth2/token`],
      },
      form,
      confidential || grantType === 'client_credentials' || grantType === JWT_BEARER ? secret : null,
      confidential || grantType === 'client_credentials' || grantType === JWT_BEARER
    )
    if (typeof method !== 'string') {
      send(res, method.status, method.body)
      return
    }
    if (grantType === JWT_BEARER) {
      if (method === 'none') throw new Error('unreachable: OBO requires client authentication')
      const answer = await onBehalfOf(obo, form, method)
      send(res, answer.status, answer.body)
      return
    }
    if (grantType === 'authorization_code') {
      const code = form.get('code') ?? ''
      const grant = codes.get(code)
      codes.delete(code)
      if (grant === undefined || grant.expires < Date.now()) {
        oauthError(res, 400, 'invalid_grant', 'AADSTS70008: The provided authorization code or refresh token has expired due to inactivity.')
        return
      }
      if (form.get('redirect_uri') !== grant.redirectUri) {
        oauthError(res, 400, 'invalid_grant', 'AADSTS50148: The redirect_uri does not match the redirect_uri used to obtain the authorization code.')
        return
      }
      if (grant.challenge !== undefined) {
        const verifier = form.get('code_verifier')
        const computed = verifier === null ? undefined : grant.method === 'S256' ? createHash('sha256').update(verifier).digest('base64url') : verifier
        if (computed !== grant.challenge) {
          oauthError(res, 400, 'invalid_grant', 'AADSTS501481: The Code_Verifier does not match the code_challenge supplied in the authorization request.')
          return
        }
      }
      const requested = form.get('scope')
      send(res, 200, await userTokens({ scope: requested ?? grant.scope, nonce: grant.nonce, login: grant.login, mfa: grant.mfa }))
      return
    }
    if (grantType === 'refresh_token') {
      const grant = refreshTokens.get(form.get('refresh_token') ?? '')
      if (grant === undefined) {
        oauthError(res, 400, 'invalid_grant', 'AADSTS9002313: Invalid request. Request is malformed or invalid.')
        return
      }
      const scope = form.get('scope') ?? grant.scope
      if (apiScopesOf(scope) === undefined) {
        oauthError(
          res,
          400,
          'invalid_scope',
          `AADSTS70011: The provided value for the input parameter 'scope' is not valid. The scope '${scope}' does not exist.`
        )
        return
      }
      send(res, 200, await userTokens({ scope, login: grant.login, mfa: grant.mfa }))
      return
    }
    if (grantType === 'client_credentials') {
      const scope = form.get('scope') ?? ''
      if (scope !== `${apiPrefix}.default`) {
        oauthError(
          res,
          400,
          'invalid_scope',
          `AADSTS1002012: The provided value for scope ${scope} is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier (application ID URI).`
        )
        return
      }
      send(res, 200, {
        token_type: 'Bearer',
        expires_in: ttl,
        ext_expires_in: ttl,
        access_token: await accessToken({ sub: clientId, oid: randomUUID(), roles: [...(opts.appRoles ?? ['mcp.admin'])], idtyp: 'app' }),
      })
      return
    }
    oauthError(res, 400, 'unsupported_grant_type', `AADSTS70003: The app requested an unsupported grant type '${grantType ?? ''}'.`)
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://emulator')
    const chunks: Buffer[] = []
    for await (const c of req) chunks.push(c as Buffer)
    const body = Buffer.concat(chunks).toString('utf8')
    const params = req.method === 'POST' ? new URLSearchParams(body) : url.searchParams
    requests.push({ method: req.method ?? 'GET', path: url.pathname, params: [...params], authorization: req.headers.authorization })
    const t = `/${tenant}`
    switch (url.pathname) {
      case `${t}/v2.0/.well-known/openid-configuration`:
        if (!available) {
          send(res, 503, { error: 'temporarily_unavailable' })
          return
        }
        send(res, 200, entraDiscovery(origin, tenant, issuerV2()), { 'cache-control': 'max-age=86400, private' })
        return
      case `${t}/discovery/v2.0/keys`:
        if (!available) {
          send(res, 503, { error: 'temporarily_unavailable' })
          return
        }
        send(res, 200, { keys: [publicJwk] }, { 'cache-control': 'max-age=86400, private' })
        return
      case `${t}/oauth2/v2.0/authorize`:
        if (req.method !== 'GET') {
          res.writeHead(405).end()
          return
        }
        authorize(res, url.searchParams)
        return
      case `${t}/oauth2/v2.0/token`:
        if (tokenFailure === 'unavailable') {
          send(res, 503, entraError('temporarily_unavailable', 'AADSTS90033: A transient error has occurred. Please try again.').body, { 'retry-after': '1' })
          return
        }
        if (tokenFailure === 'malformed') {
          res.writeHead(200, { 'content-type': 'text/html' }).end('<html>Service Unavailable</html>')
          return
        }
        if (req.method !== 'POST') {
          oauthError(res, 405, 'invalid_request', 'AADSTS900561: The endpoint only accepts POST requests.')
          return
        }
        if (!(req.headers['content-type'] ?? '').startsWith('application/x-www-form-urlencoded')) {
          oauthError(res, 400, 'invalid_request', "AADSTS900144: The request body must contain the following parameter: 'grant_type'.")
          return
        }
        await token(req, res, new URLSearchParams(body))
        return
      default:
        // Entra serves no RFC 8414 document (and nothing else here).
        send(res, 404, { error: 'not_found' })
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch(err => {
      if (!res.headersSent) send(res, 500, { error: 'server_error', error_description: String(err) })
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const obo: OboContext = {
    tenant,
    clientId,
    issuerV1: issuerV1(),
    issuerV2: issuerV2(),
    publicKey: publicKey as CryptoKey,
    ttl,
    apis,
    log: oboLog,
    consentOf: (oid, apiAppId) => consent.get(`${oid} ${apiAppId}`),
    userOf: oid => [...users.values()].find(u => u.oid === oid),
    sign: signToken,
  }
  const known = (login: string): string => {
    const found = loginOf(login)
    if (found === undefined) throw new Error(`entra emulator: no user ${login}`)
    return found
  }
  const apiIndex = (api: string): number => {
    const i = apis.findIndex(a => a.appId === api || a.identifierUri === api)
    if (i < 0) throw new Error(`entra emulator: no downstream API ${api}`)
    return i
  }

  return {
    origin,
    tenant,
    clientId,
    issuerV2: issuerV2(),
    issuerV1: issuerV1(),
    tokenIssuer: tokenVersion === 1 ? issuerV1() : issuerV2(),
    tokenAudience: tokenVersion === 1 ? `api://${clientId}` : clientId,
    discoveryUrl: `${origin}/${tenant}/v2.0/.well-known/openid-configuration`,
    jwksUrl: `${origin}/${tenant}/discovery/v2.0/keys`,
    authorizeUrl: `${origin}/${tenant}/oauth2/v2.0/authorize`,
    tokenUrl: `${origin}/${tenant}/oauth2/v2.0/token`,
    apiScopes: exposed.map(s => `${apiPrefix}${s}`),
    get user() {
      return userOf(defaultLogin)
    },
    userNamed: login => userOf(known(login)),
    setUser(login, patch) {
      const at = known(login)
      users.set(at, { ...userOf(at), ...patch })
    },
    setConsent(login, api, consented) {
      consent.set(`${userOf(known(login)).oid} ${apis[apiIndex(api)]!.appId}`, consented)
    },
    updateDownstreamApi(api, patch) {
      const i = apiIndex(api)
      apis[i] = { ...apis[i]!, ...patch }
    },
    get oboExchanges() {
      return oboLog.filter(r => r.error === undefined && r.scp !== undefined).length
    },
    oboLog,
    loginToken: (login, o = {}) =>
      loginFlow({
        authorizeUrl: `${origin}/${tenant}/oauth2/v2.0/authorize`,
        tokenUrl: `${origin}/${tenant}/oauth2/v2.0/token`,
        clientId,
        clientSecret: opts.clientSecret,
        redirectUri: registered[0]!,
        login: login ?? defaultLogin,
        scope: o.scope ?? `${apiPrefix}${exposed[0]}`,
        claims: o.claims,
      }),
    requests,
    count(path: string) {
      return requests.filter(r => r.path === path).length
    },
    setAvailable(v: boolean) {
      available = v
    },
    setTokenEndpointFailure(kind) {
      tokenFailure = kind
    },
    close() {
      return new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
    },
  }
}
