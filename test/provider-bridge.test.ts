/**
 * providerBridge: issuer parsing, discovery cache (TTL, stale-while-error,
 * 503, size cap, no redirects, timeout), authorization server metadata at all
 * four paths for both providers, and the cloud_idp authorize/token proxies
 * against the Entra emulator (resource stripping, PKCE, CR/LF, repeated
 * parameters, 405, scope limiting, the full secret-injection matrix).
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createHash, randomBytes } from 'node:crypto'
import { ProxyError } from '../core/errors.ts'
import { parseCloudIssuer, discoveryUrlFor, ossJwksUri } from '../plugins/mcp-authentication/identity.ts'
import { DiscoveryCache, DISCOVERY_MAX_BYTES } from '../plugins/oauth-common/discovery.ts'
import { buildAuthorizationServerMetadata, MCP_METADATA_PATHS } from '../plugins/oauth-common/metadata.ts'
import { shouldInjectSecret } from '../plugins/provider-bridge/cloud-proxy.ts'
import { parseOAuthParams, canonicalName } from '../plugins/oauth-common/params.ts'
import bridgeModule, { type ProviderBridgePlugin } from '../plugins/provider-bridge/index.ts'
import { startEntraEmulator, type EntraEmulator } from './helpers/entra-emulator.ts'
import { startBridgeServer, makeEnv, BASE_URL, type BridgeServer } from './helpers/bridge-server.ts'
import { memoryLogger } from './helpers/logger.ts'
import { startDevIdp } from '../bin/dev-idp.ts'
import { spawnCli, waitForPort, freePort, configFile, runCli } from './helpers/cli.ts'
import { createAjv } from '../core/config.ts'
import bridgeSchema from '../plugins/provider-bridge/schema.json' with { type: 'json' }
import facadeSchema from '../plugins/oauth-facade/schema.json' with { type: 'json' }
import { authorizeRedirectProblem, privateSchemes, NEVER_PRIVATE_SCHEMES } from '../plugins/oauth-common/redirect-uri.ts'

const ROOT = '/.well-known/oauth-authorization-server'
const REG = `${BASE_URL}/.well-known/oauth-authorization-server/client-registration`
const SECRET = 'operator-secret-' + randomBytes(8).toString('hex')

/** A tiny IdP whose discovery answer each test controls. */
async function fakeIdp(t: Test, handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ origin: string; hits: () => number }> {
  let hits = 0
  const server = createServer((req, res) => {
    hits++
    handler(req, res)
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  return { origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits: () => hits }
}

function ossDoc(issuer: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    issuer,
    authorization_endpoint: `${issuer}authorize/`,
    token_endpoint: `${issuer}token/`,
    jwks_uri: `${issuer}jwks/`,
    registration_endpoint: null,
    response_types_supported: ['code'],
    ...extra,
  }
}

async function closedPortUrl(): Promise<string> {
  const s = createServer()
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  const port = (s.address() as AddressInfo).port
  await new Promise<void>(resolve => s.close(() => resolve()))
  return `http://127.0.0.1:${port}`
}

function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url')
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') }
}

function cloudAuth(emu: EntraEmulator, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    issuer: emu.issuerV2,
    audiences: [`api://${emu.clientId}`, emu.clientId],
    clientId: emu.clientId,
    provider: { cloud_idp: {} },
    resourceMetadata: { resource: `${BASE_URL}/mcp`, scopesSupported: [...emu.apiScopes] },
    ...extra,
  }
}

async function withServer(t: Test, auth: Record<string, unknown> | undefined, opts: { maxBodyBytes?: number } = {}): Promise<BridgeServer> {
  const s = await startBridgeServer(auth, opts)
  t.teardown(() => s.close())
  return s
}

t.test('cloud_idp issuers: tenant and login origin', async t => {
  t.same(parseCloudIssuer('https://login.microsoftonline.com/contoso.onmicrosoft.com/v2.0'), {
    origin: 'https://login.microsoftonline.com',
    tenant: 'contoso.onmicrosoft.com',
    version: 'v2',
  })
  t.same(parseCloudIssuer('https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0/'), {
    origin: 'https://login.microsoftonline.com',
    tenant: '72f988bf-86f1-41af-91ab-2d7cd011db47',
    version: 'v2',
  })
  t.same(
    parseCloudIssuer('https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/'),
    { origin: 'https://login.microsoftonline.com', tenant: '72f988bf-86f1-41af-91ab-2d7cd011db47', version: 'v1' },
    'v1 maps to the login host'
  )
  t.same(parseCloudIssuer('https://sts.chinacloudapi.cn/abc/'), { origin: 'https://login.chinacloudapi.cn', tenant: 'abc', version: 'v1' })
  t.same(parseCloudIssuer('http://127.0.0.1:4000/abc/v2.0'), { origin: 'http://127.0.0.1:4000', tenant: 'abc', version: 'v2' }, 'origin comes from the issuer')
  t.same(parseCloudIssuer('http://127.0.0.1:4000/abc/'), { origin: 'http://127.0.0.1:4000', tenant: 'abc', version: 'v1' })
  t.equal(parseCloudIssuer('https://login.microsoftonline.com/a/b/v2.0'), undefined)
  t.equal(parseCloudIssuer('https://login.microsoftonline.com/'), undefined)
  t.equal(parseCloudIssuer('https://login.microsoftonline.com/a/v2.0?x=1'), undefined)
  t.equal(parseCloudIssuer('not a url'), undefined)

  t.equal(discoveryUrlFor('cloud_idp', 'https://sts.windows.net/tid/'), 'https://login.microsoftonline.com/tid/v2.0/.well-known/openid-configuration')
  t.equal(
    discoveryUrlFor('cloud_idp', 'https://login.microsoftonline.com/tid/v2.0'),
    'https://login.microsoftonline.com/tid/v2.0/.well-known/openid-configuration'
  )
  t.equal(
    discoveryUrlFor('oss_idp', 'https://auth.example.com/application/o/mcp/'),
    'https://auth.example.com/application/o/mcp/.well-known/openid-configuration'
  )
  t.equal(
    discoveryUrlFor('oss_idp', 'https://auth.example.com/application/o/mcp'),
    'https://auth.example.com/application/o/mcp/.well-known/openid-configuration'
  )
  t.equal(ossJwksUri('https://auth.example.com/application/o/mcp/'), 'https://auth.example.com/application/o/mcp/jwks/')
  t.equal(ossJwksUri('https://auth.example.com/application/o/mcp'), 'https://auth.example.com/application/o/mcp/jwks/')
  t.throws(() => discoveryUrlFor('cloud_idp', 'https://login.microsoftonline.com/'), { code: 'MCPP_ERR_CONFIG' })
})

t.test('metadata document rules', async t => {
  const oss = buildAuthorizationServerMetadata({
    kind: 'oss_idp',
    baseUrl: BASE_URL,
    issuer: 'https://idp/app/',
    jwksUri: 'https://idp/app/jwks/',
    doc: ossDoc('https://idp/app/', { authorization_response_iss_parameter_supported: true, jwks_uri: 'https://idp/app/other' }),
  })
  t.equal(oss.registration_endpoint, REG, 'null registration_endpoint replaced')
  t.equal(oss.jwks_uri, 'https://idp/app/jwks/')
  t.same(oss.code_challenge_methods_supported, ['S256'], 'S256 injected when absent')
  t.notOk('authorization_response_iss_parameter_supported' in oss)
  t.equal(oss.authorization_endpoint, 'https://idp/app/authorize/', "oss_idp endpoints stay the IdP's")
  const plain = buildAuthorizationServerMetadata({
    kind: 'oss_idp',
    baseUrl: BASE_URL,
    issuer: 'x',
    doc: ossDoc('x', { code_challenge_methods_supported: ['plain'] }),
  })
  t.same(plain.code_challenge_methods_supported, ['plain', 'S256'])
  const both = buildAuthorizationServerMetadata({
    kind: 'oss_idp',
    baseUrl: BASE_URL,
    issuer: 'x',
    doc: ossDoc('x', { code_challenge_methods_supported: ['S256', 'plain'] }),
  })
  t.same(both.code_challenge_methods_supported, ['S256', 'plain'])
  const absent = buildAuthorizationServerMetadata({ kind: 'oss_idp', baseUrl: BASE_URL, issuer: 'x', doc: { issuer: 'x' } })
  t.equal(absent.registration_endpoint, REG, 'registration_endpoint added when the IdP omits it')
  const cloud = buildAuthorizationServerMetadata({
    kind: 'cloud_idp',
    baseUrl: BASE_URL,
    issuer: 'https://login/t/v2.0',
    doc: { ...ossDoc('https://login/t/v2.0'), code_challenge_methods_supported: ['plain', 'S256'] },
  })
  t.same(cloud.code_challenge_methods_supported, ['S256'])
  t.equal(cloud.authorization_endpoint, `${BASE_URL}/oauth2/authorize`)
  t.equal(cloud.token_endpoint, `${BASE_URL}/oauth2/token`)
})

/**
 * The truth table of README "Identity providers" (`POST /oauth2/token`): "client_secret is added only for
 * authorization_code and refresh_token grants whose client_id is clientId and that bring no client credentials
 * of their own" (and only when a secret is configured). Written out, not recomputed: every case of the
 * matrix below not listed here must not get the secret.
 */
const SECRET_ADDED = new Set(['authorization_code / app / own=false / secret=true', 'refresh_token / app / own=false / secret=true'])

t.test('secret injection rule (unit matrix)', async t => {
  const grants = ['authorization_code', 'refresh_token', 'client_credentials', 'password', 'urn:ietf:params:oauth:grant-type:device_code', undefined]
  let cases = 0
  for (const grantType of grants) {
    for (const clientId of ['app', 'other', undefined]) {
      for (const ownCredentials of [false, true]) {
        for (const secret of [SECRET, undefined]) {
          const name = `${grantType} / ${clientId} / own=${ownCredentials} / secret=${secret !== undefined}`
          t.equal(shouldInjectSecret({ grantType, clientId, configuredClientId: 'app', secret, ownCredentials }), SECRET_ADDED.has(name), name)
          cases++
        }
      }
    }
  }
  t.equal(cases, 72, 'the whole matrix ran, the two README cases among it')
})

t.test('resource removal and repeated parameters', async t => {
  const p = parseOAuthParams('a=1&resource=x&reso%75rce=y&%72esource=z&Resource=k&resource%5B%5D=l&b=2&resource=')
  t.same(p.entries, [
    ['a', '1'],
    ['b', '2'],
  ])
  t.same(
    [...p.byName],
    [
      ['a', '1'],
      ['b', '2'],
    ]
  )
  t.same(
    [...parseOAuthParams('Client_ID=c&scope%5B%5D=s').byName],
    [
      ['client_id', 'c'],
      ['scope', 's'],
    ],
    'values by canonical name'
  )
  t.same(parseOAuthParams('Client_ID=c').entries, [['Client_ID', 'c']], 'forwarded as spelled')
  const spellings: ReadonlyArray<readonly [string, string]> = [
    ['RESOURCE', 'resource'],
    ['resource[]', 'resource'],
    ['resource[0]', 'resource'],
    ['%2572esource', 'resource'],
    ['re\u017fource', 'resource'],
    ['\uff52esource', 'resource'],
    [' resource ', 'resource'],
    ['[]', '[]'],
    ['%zz', '%zz'],
    ['a%25', 'a%'],
  ]
  for (const [name, canonical] of spellings) {
    t.equal(canonicalName(name), canonical, name)
  }
  for (const raw of ['a=1&a=2', 'a=1&A=2', 'a=1&a[]=2', 'a=1&%61=2']) {
    const err = (() => {
      try {
        parseOAuthParams(raw)
      } catch (e) {
        return e
      }
    })() as ProxyError
    t.equal(err.oauthError, 'invalid_request', raw)
    t.equal(err.statusCode, 400, raw)
  }
})

t.test('discovery cache', async t => {
  t.test('fetches once, serves within TTL, refreshes after it, serves stale while the IdP is down', async t => {
    let up = true
    let issuerVersion = 1
    const idp = await fakeIdp(t, (_req, res) => {
      if (!up) {
        res.writeHead(500).end()
        return
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(ossDoc(`https://idp/v${issuerVersion}/`)))
    })
    let now = 1_000_000
    const mem = memoryLogger()
    const cache = new DiscoveryCache({
      url: `${idp.origin}/.well-known/openid-configuration`,
      ttlMs: 60_000,
      timeoutMs: 2000,
      log: mem.log,
      now: () => now,
      retryMs: 1000,
    })
    t.teardown(() => cache.close())
    await cache.start()
    t.equal(idp.hits(), 1)
    t.equal((await cache.get()).issuer, 'https://idp/v1/')
    now += 30_000
    await cache.get()
    t.equal(idp.hits(), 1, 'no fetch within the TTL')
    issuerVersion = 2
    now += 31_000
    t.equal((await cache.get()).issuer, 'https://idp/v1/', 'expired document served while refreshing')
    await cache.refresh()
    t.equal((await cache.get()).issuer, 'https://idp/v2/', 'refreshed in the background')
    up = false
    now += 61_000
    t.equal((await cache.get()).issuer, 'https://idp/v2/')
    await cache.refresh()
    t.equal((await cache.get()).issuer, 'https://idp/v2/', 'stale document kept when a refresh fails')
    t.equal(cache.state.stale, true)
    t.match(cache.state.lastError, /HTTP 500/)
    t.match(mem.text(), /serving the cached document/)
  })

  t.test('never fetched: 503 temporarily_unavailable with Retry-After, then recovers', async t => {
    let up = false
    const idp = await fakeIdp(t, (_req, res) => {
      if (!up) {
        res.writeHead(503).end()
        return
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(ossDoc('https://idp/')))
    })
    let now = 0
    const mem = memoryLogger()
    const cache = new DiscoveryCache({ url: `${idp.origin}/d`, ttlMs: 60_000, timeoutMs: 2000, log: mem.log, now: () => now, retryMs: 5000 })
    t.teardown(() => cache.close())
    await cache.start()
    const err = (await cache.get().catch((e: unknown) => e)) as ProxyError
    t.ok(ProxyError.is(err))
    t.equal(err.statusCode, 503)
    t.equal(err.oauthError, 'temporarily_unavailable')
    t.equal(err.headers['retry-after'], '5')
    t.match(mem.text(), /discovery document unavailable.*answers 503/)
    t.match(mem.text(), /HTTP 503/, 'the log says why')
    const hits = idp.hits()
    await cache.get().catch(() => undefined)
    t.equal(idp.hits(), hits, 'no refetch inside the retry interval')
    up = true
    now += 5000
    t.equal((await cache.get()).issuer, 'https://idp/')
  })

  t.test('refuses oversized, redirected, invalid and slow answers', async t => {
    const target = await fakeIdp(t, (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(ossDoc('https://idp/')))
    })
    const idp = await fakeIdp(t, (req, res) => {
      switch (req.url) {
        case '/big-declared':
          res.writeHead(200, { 'content-length': String(DISCOVERY_MAX_BYTES + 1) }).end()
          return
        case '/big-chunked': {
          res.writeHead(200, { 'content-type': 'application/json' })
          const chunk = Buffer.alloc(64 * 1024, 0x20)
          for (let i = 0; i < 10; i++) res.write(chunk)
          res.end('{}')
          return
        }
        case '/redirect':
          res.writeHead(302, { location: `${target.origin}/d` }).end()
          return
        case '/not-json':
          res.writeHead(200).end('<html>')
          return
        case '/no-issuer':
          res.writeHead(200).end(JSON.stringify({ authorization_endpoint: 'https://a', token_endpoint: 'https://b' }))
          return
        case '/array':
          res.writeHead(200).end('[]')
          return
        case '/slow':
          return // never answers
      }
    })
    const reasons: Record<string, RegExp> = {
      '/big-declared': /limit/,
      '/big-chunked': /more than/,
      '/redirect': /302 \(redirects are not followed\)/,
      '/not-json': /invalid JSON/,
      '/no-issuer': /issuer is missing/,
      '/array': /not a JSON object/,
      '/slow': /timed out/,
    }
    for (const [path, reason] of Object.entries(reasons)) {
      const cache = new DiscoveryCache({ url: `${idp.origin}${path}`, ttlMs: 60_000, timeoutMs: path === '/slow' ? 300 : 5000, log: memoryLogger().log })
      await cache.start()
      cache.close()
      t.equal(cache.peek(), undefined, `${path} not stored`)
      t.match(cache.state.lastError, reason, path)
    }
    t.equal(target.hits(), 0, 'the redirect was not followed')
  })
})

t.test('oss_idp against the development OpenID provider', async t => {
  const idp = await startDevIdp()
  t.teardown(() => idp.close())
  const s = await withServer(t, {
    issuer: idp.issuer,
    audiences: [idp.clientId],
    clientId: idp.clientId,
    provider: { oss_idp: {} },
    resourceMetadata: { resource: `${BASE_URL}/mcp`, scopesSupported: ['openid', 'profile'] },
  })
  const upstream = (await (await fetch(idp.discoveryUrl)).json()) as Record<string, unknown>
  t.equal(upstream.registration_endpoint ?? null, null, 'the provider itself reports no registration endpoint')

  const res = await fetch(s.url + ROOT)
  t.equal(res.status, 200)
  t.equal(res.headers.get('access-control-allow-origin'), '*')
  t.match(res.headers.get('cache-control'), /max-age=\d+/)
  const root = (await res.json()) as Record<string, unknown>
  t.equal(root.issuer, idp.issuer, "root issuer is the IdP's")
  t.equal(root.jwks_uri, `${idp.issuer}jwks/`)
  t.equal(root.registration_endpoint, REG)
  t.ok((root.code_challenge_methods_supported as string[]).includes('S256'))
  t.equal(root.authorization_endpoint, upstream.authorization_endpoint)
  t.notOk('authorization_response_iss_parameter_supported' in root)
  for (const path of MCP_METADATA_PATHS) {
    const r = await fetch(s.url + path)
    t.equal(r.status, 200, path)
    const doc = (await r.json()) as Record<string, unknown>
    t.equal(doc.issuer, `${BASE_URL}/mcp`, `${path} issuer`)
    t.equal(doc.registration_endpoint, REG)
    t.equal(doc.jwks_uri, `${idp.issuer}jwks/`)
  }
  const pre = await fetch(s.url + MCP_METADATA_PATHS[0], {
    method: 'OPTIONS',
    headers: { origin: 'http://localhost:6274', 'access-control-request-method': 'GET', 'access-control-request-headers': 'mcp-protocol-version' },
  })
  t.equal(pre.status, 204)
  t.equal(pre.headers.get('access-control-allow-origin'), '*')
  t.equal((await fetch(s.url + '/oauth2/authorize')).status, 404, 'no proxied endpoints for oss_idp')
  const bridge = s.plugins[0] as ProviderBridgePlugin
  t.same(bridge.ready?.(), { ready: true })

  // oss_idp clients log in at the IdP itself: the bridge's redirect schemes would do nothing, and it says so.
  const mem = memoryLogger()
  const { env } = await makeEnv({ issuer: idp.issuer, audiences: [idp.clientId], clientId: idp.clientId, provider: { oss_idp: {} } }, mem.log)
  const withSchemes = await bridgeModule.create({ allowedRedirectSchemes: ['cursor'] }, env)
  t.teardown(() => withSchemes.close?.())
  t.match(mem.text(), /allowedRedirectSchemes applies to cloud_idp only/)
})

t.test('oss_idp: S256 injected and null registration replaced for a provider that omits them', async t => {
  const idp = await fakeIdp(t, (req, res) => {
    t.equal(req.url, '/application/o/mcp/.well-known/openid-configuration')
    res.writeHead(200).end(JSON.stringify(ossDoc('https://auth.example.com/application/o/mcp/', { authorization_response_iss_parameter_supported: true })))
  })
  const s = await withServer(t, {
    issuer: `${idp.origin}/application/o/mcp/`,
    audiences: ['c'],
    clientId: 'c',
    provider: { oss_idp: {} },
  })
  const doc = (await (await fetch(s.url + '/.well-known/openid-configuration/mcp')).json()) as Record<string, unknown>
  t.same(doc.code_challenge_methods_supported, ['S256'])
  t.equal(doc.registration_endpoint, REG)
  t.equal(doc.jwks_uri, `${idp.origin}/application/o/mcp/jwks/`, 'derived from the configured issuer')
  t.notOk('authorization_response_iss_parameter_supported' in doc)
})

t.test('no provider: no routes', async t => {
  const mem = memoryLogger()
  const { env } = await makeEnv({ issuer: 'https://idp.example/', audiences: ['x'] }, mem.log)
  const p = await bridgeModule.create({}, env)
  t.same(p.routes, [])
  const { env: none } = await makeEnv(undefined, mem.log)
  t.same((await bridgeModule.create({}, none)).routes, [])
})

t.test('IdP down at start: create succeeds, metadata 503, not ready', async t => {
  const dead = await closedPortUrl()
  const s = await withServer(t, {
    issuer: `${dead}/tenant-a/`,
    audiences: ['x'],
    clientId: 'x',
    provider: { cloud_idp: {} },
    jwks: `${dead}/keys`,
    discovery: { timeoutMs: 500 },
  })
  for (const path of [ROOT, ...MCP_METADATA_PATHS]) {
    const res = await fetch(s.url + path)
    t.equal(res.status, 503, path)
    t.ok(Number(res.headers.get('retry-after')) >= 1)
    const body = (await res.json()) as Record<string, unknown>
    t.equal(body.error, 'temporarily_unavailable')
    t.type(body.error_description, 'string')
  }
  const bridge = s.plugins[0] as ProviderBridgePlugin
  const r = bridge.ready?.() as { ready: boolean; reason: string }
  t.equal(r.ready, false)
  t.match(r.reason, /discovery/)
  t.match(s.logText(), /discovery document unavailable/)
  // The authorize proxy still works from the tenant's fallback endpoint.
  const { challenge } = pkce()
  const res = await fetch(
    `${s.url}/oauth2/authorize?client_id=x&response_type=code&code_challenge=${challenge}&code_challenge_method=S256&redirect_uri=http%3A%2F%2F127.0.0.1%2Fcb&resource=https%3A%2F%2Fgw%2Fmcp`,
    { redirect: 'manual' }
  )
  t.equal(res.status, 302)
  const loc = new URL(res.headers.get('location')!)
  t.equal(loc.origin + loc.pathname, `${dead}/tenant-a/oauth2/v2.0/authorize`)
  t.notOk(loc.searchParams.has('resource'))
  // Token proxy: the IdP is unreachable -> 502 OAuth error.
  const tok = await fetch(`${s.url}/oauth2/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: 'grant_type=authorization_code&code=c&client_id=x',
  })
  t.equal(tok.status, 502)
  t.equal(((await tok.json()) as { error: string }).error, 'temporarily_unavailable')
})

t.test('cloud_idp against the Entra emulator', async t => {
  const emu = await startEntraEmulator({ clientSecret: SECRET })
  t.teardown(() => emu.close())
  const s = await withServer(t, cloudAuth(emu, { clientSecret: SECRET }))
  const redirectUri = 'http://127.0.0.1:33418/callback'

  t.test('the emulator serves only OIDC discovery', async t => {
    t.equal((await fetch(`${emu.origin}/.well-known/oauth-authorization-server/${emu.tenant}/v2.0`)).status, 404)
    const d = (await (await fetch(emu.discoveryUrl)).json()) as Record<string, unknown>
    t.notOk('code_challenge_methods_supported' in d)
    t.notOk('registration_endpoint' in d)
  })

  t.test('metadata', async t => {
    const root = (await (await fetch(s.url + ROOT)).json()) as Record<string, unknown>
    t.equal(root.issuer, emu.issuerV2)
    t.equal(root.authorization_endpoint, `${BASE_URL}/oauth2/authorize`)
    t.equal(root.token_endpoint, `${BASE_URL}/oauth2/token`)
    t.same(root.code_challenge_methods_supported, ['S256'])
    t.equal(root.registration_endpoint, REG)
    t.equal(root.jwks_uri, emu.jwksUrl, "cloud_idp keeps the IdP's key set URL")
    t.ok((root.token_endpoint_auth_methods_supported as string[]).includes('none'))
    for (const path of MCP_METADATA_PATHS) {
      const doc = (await (await fetch(s.url + path)).json()) as Record<string, unknown>
      t.equal(doc.issuer, `${BASE_URL}/mcp`, path)
      t.equal(doc.token_endpoint, `${BASE_URL}/oauth2/token`)
    }
    t.equal(emu.count(`/${emu.tenant}/v2.0/.well-known/openid-configuration`) >= 1, true)
  })

  function authorizeUrl(params: string): string {
    return `${s.url}/oauth2/authorize?${params}`
  }

  t.test('authorize: resource stripped in every spelling, order kept', async t => {
    const { challenge } = pkce()
    const q =
      `response_type=code&client_id=${emu.clientId}&resource=https%3A%2F%2Fgw%2Fmcp&code_challenge=${challenge}` +
      `&reso%75rce=a&code_challenge_method=S256&%72esource=b&redirect_uri=${encodeURIComponent(redirectUri)}&state=s%20t&resource=c` +
      `&scope=${encodeURIComponent(emu.apiScopes[0]! + ' offline_access')}`
    const res = await fetch(authorizeUrl(q), { redirect: 'manual' })
    t.equal(res.status, 302)
    t.equal(res.headers.get('cache-control'), 'no-store')
    const loc = new URL(res.headers.get('location')!)
    t.equal(loc.origin + loc.pathname, emu.authorizeUrl)
    t.same(
      [...loc.searchParams],
      [
        ['response_type', 'code'],
        ['client_id', emu.clientId],
        ['code_challenge', challenge],
        ['code_challenge_method', 'S256'],
        ['redirect_uri', redirectUri],
        ['state', 's t'],
        ['scope', `${emu.apiScopes[0]} offline_access`],
      ]
    )
    // The emulator then issues a code (it would answer invalid_target with a resource).
    const back = await fetch(loc, { redirect: 'manual' })
    const cb = new URL(back.headers.get('location')!)
    t.ok(cb.searchParams.get('code'))
    t.equal(cb.searchParams.get('state'), 's t')
    const direct = await fetch(`${loc.href}&resource=x`, { redirect: 'manual' })
    const err = new URL(direct.headers.get('location')!)
    t.equal(err.searchParams.get('error'), 'invalid_target')
    t.match(err.searchParams.get('error_description'), /^AADSTS9010010/)
  })

  t.test('authorize: refusals', async t => {
    const { challenge } = pkce()
    const base = `response_type=code&client_id=${emu.clientId}&redirect_uri=${encodeURIComponent(redirectUri)}`
    const cases: Array<[string, string, string]> = [
      [`${base}`, 'invalid_request', 'no PKCE'],
      [`${base}&code_challenge=${challenge}`, 'invalid_request', 'no method'],
      [`${base}&code_challenge=${challenge}&code_challenge_method=plain`, 'invalid_request', 'plain'],
      [`${base}&code_challenge=short&code_challenge_method=S256`, 'invalid_request', 'malformed challenge'],
      [`${base}&code_challenge=${challenge}&code_challenge_method=S256&state=a%0D%0Ab`, 'invalid_request', 'CR/LF in a value'],
      [`${base}&code_challenge=${challenge}&code_challenge_method=S256&x%0Ay=1`, 'invalid_request', 'LF in a name'],
      [`${base}&code_challenge=${challenge}&code_challenge_method=S256&state=1&state=2`, 'invalid_request', 'repeated parameter'],
      [
        `${base}&code_challenge=${challenge}&code_challenge_method=S256&scope=https%3A%2F%2Fgraph.microsoft.com%2F.default`,
        'invalid_scope',
        'scope of another API',
      ],
    ]
    for (const [q, error, name] of cases) {
      const res = await fetch(authorizeUrl(q), { redirect: 'manual' })
      t.equal(res.status, 400, name)
      t.equal(((await res.json()) as { error: string }).error, error, name)
    }
    t.equal((await fetch(authorizeUrl(base), { method: 'POST', redirect: 'manual' })).status, 405)
  })

  t.test('authorize: redirect_uri must be https or loopback http without a fragment, else 400 and no redirect (RFC 8252 §7.3)', async t => {
    const { challenge } = pkce()
    const base = `response_type=code&client_id=${emu.clientId}&code_challenge=${challenge}&code_challenge_method=S256&state=st`
    const refused = [
      'javascript:alert(1)',
      'JavaScript:alert(document.domain)//',
      'data:text/html,<script>alert(1)</script>',
      'vbscript:msgbox(1)',
      '/callback',
      'callback',
      '//evil.example/cb',
      'https://app.example.com/cb#frag',
      'https://app.example.com/cb#',
      'http://app.example.com/cb',
      'http://127.0.0.1.evil.example/cb',
      'http://localhost.evil.example/cb',
      'http://2130706433/cb',
      'http://0x7f.0.0.1/cb',
      'http://127.1/cb',
      'https://user:pw@app.example.com/cb',
      'http://evil.example@127.0.0.1/cb',
      'https:\\\\evil.example\\cb',
      'https:/evil.example/cb',
      'https:evil.example',
      'https://',
      'ftp://app.example.com/cb',
      'file:///etc/passwd',
      'cursor://anysphere.cursor-retrieval/oauth/user-mcp/callback',
      'https://app.example.com/c b',
      '',
    ]
    for (const uri of refused) {
      const res = await fetch(`${s.url}/oauth2/authorize?${base}&redirect_uri=${encodeURIComponent(uri)}`, { redirect: 'manual' })
      t.equal(res.status, 400, uri)
      t.equal(res.headers.get('location'), null, `${uri}: never a redirect (RFC 6749 §4.1.2.1)`)
      const body = (await res.json()) as { error: string; error_description: string }
      t.equal(body.error, 'invalid_request', uri)
      t.match(body.error_description, /redirect_uri/, uri)
    }
    const missing = await fetch(`${s.url}/oauth2/authorize?${base}`, { redirect: 'manual' })
    t.equal(missing.status, 400, 'no redirect_uri')
    t.match(((await missing.json()) as { error_description: string }).error_description, /redirect_uri/)
    t.match(s.logText(), /redirect_uri/, 'refusals are logged')

    const allowed = [
      'https://app.example.com/callback',
      'https://app.example.com:8443/cb?x=1',
      'HTTPS://App.Example.com/cb',
      'http://127.0.0.1:33418/callback',
      'http://127.0.0.1/callback',
      'http://localhost:6274/oauth/callback',
      'http://[::1]:3000/cb',
    ]
    for (const uri of allowed) {
      const res = await fetch(`${s.url}/oauth2/authorize?${base}&redirect_uri=${encodeURIComponent(uri)}`, { redirect: 'manual' })
      t.equal(res.status, 302, uri)
      t.equal(new URL(res.headers.get('location')!).searchParams.get('redirect_uri'), uri, `${uri}: forwarded as given`)
    }
  })

  /** Runs authorize through the gateway and returns a code for the verifier. */
  async function getCode(scope = `${emu.apiScopes[0]} offline_access openid`): Promise<{ code: string; verifier: string }> {
    const { verifier, challenge } = pkce()
    const q = new URLSearchParams({
      response_type: 'code',
      client_id: emu.clientId,
      redirect_uri: redirectUri,
      code_challenge: challenge,
      code_challenge_method: 'S256',
      scope,
      resource: `${BASE_URL}/mcp`,
    })
    const res = await fetch(authorizeUrl(q.toString()), { redirect: 'manual' })
    const back = await fetch(res.headers.get('location')!, { redirect: 'manual' })
    const code = new URL(back.headers.get('location')!).searchParams.get('code')
    if (code === null) throw new Error('no code: ' + back.headers.get('location'))
    return { code, verifier }
  }

  function token(body: string, headers: Record<string, string> = {}): Promise<Response> {
    return fetch(`${s.url}/oauth2/token`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, body })
  }

  const lastTokenRequest = (): Map<string, string> => new Map(emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/token')).at(-1)!.params)

  // Names a server may read as `resource`: ASP.NET (the cloud IdP) matches
  // names case-insensitively, PHP and Rails read `name[]`/`name[0]` as the
  // name, some stacks decode twice, trim, or fold Unicode compatibility forms.
  const RESOURCE_SPELLINGS = [
    'resource',
    'Resource',
    'RESOURCE',
    'ReSoUrCe',
    'resource[]',
    'resource%5B%5D',
    'resource[0]',
    'RESOURCE%5Bx%5D',
    '%52esource',
    'reso%75rce',
    're%C5%BFource',
    '%EF%BD%92esource',
    '%2572esource',
    '%252572esource',
    '+resource',
    'resource+',
    '%20Resource%20',
  ]
  /** The test's own reading of a decoded name: would some server take it for `resource`? */
  function readsAsResource(name: string): boolean {
    let n = name
    for (let i = 0; i < 4; i++) {
      try {
        n = decodeURIComponent(n)
      } catch {
        break
      }
    }
    return /^resource(\[|$)/.test(n.normalize('NFKC').trim().toLowerCase())
  }
  const spelled = (value: string): string => RESOURCE_SPELLINGS.map((k, i) => `${k}=${encodeURIComponent(value + i)}`).join('&')

  t.test('authorize and token: every spelling of resource is stripped before the IdP sees it', async t => {
    const { verifier, challenge } = pkce()
    const q =
      `response_type=code&${spelled('https://gw.example/mcp')}&client_id=${emu.clientId}&code_challenge=${challenge}` +
      `&code_challenge_method=S256&redirect_uri=${encodeURIComponent(redirectUri)}&scope=${encodeURIComponent(emu.apiScopes[0]!)}`
    const res = await fetch(authorizeUrl(q), { redirect: 'manual' })
    t.equal(res.status, 302)
    const loc = new URL(res.headers.get('location')!)
    t.same([...loc.searchParams.keys()].filter(readsAsResource), [], 'nothing resource-like in the redirect')
    t.same([...loc.searchParams.keys()], ['response_type', 'client_id', 'code_challenge', 'code_challenge_method', 'redirect_uri', 'scope'])
    const back = await fetch(loc, { redirect: 'manual' })
    const cb = new URL(back.headers.get('location')!)
    t.equal(cb.searchParams.get('error'), null, 'the IdP did not answer invalid_target')
    const code = cb.searchParams.get('code')!
    t.ok(code)
    const seenAuthorize = emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/authorize')).at(-1)!
    t.same(seenAuthorize.params.map(([k]) => k).filter(readsAsResource), [], 'the IdP received no resource at authorize')

    const body =
      `grant_type=authorization_code&${spelled(`${BASE_URL}/mcp`)}&code=${encodeURIComponent(code)}&code_verifier=${verifier}` +
      `&redirect_uri=${encodeURIComponent(redirectUri)}&client_id=${emu.clientId}`
    const tok = await token(body)
    t.equal(tok.status, 200, 'the IdP issued tokens')
    const seenToken = emu.requests.filter(r => r.path.endsWith('/oauth2/v2.0/token')).at(-1)!
    t.same(seenToken.params.map(([k]) => k).filter(readsAsResource), [], 'the IdP received no resource at the token endpoint')
    t.same(
      seenToken.params.map(([k]) => k),
      ['grant_type', 'code', 'code_verifier', 'redirect_uri', 'client_id', 'client_secret']
    )
  })

  t.test('a parameter repeated under another spelling is refused, not read two ways', async t => {
    const { challenge } = pkce()
    const base = `response_type=code&client_id=${emu.clientId}&code_challenge=${challenge}&code_challenge_method=S256&redirect_uri=${encodeURIComponent(redirectUri)}`
    for (const extra of [
      'Client_Id=other',
      'REDIRECT_URI=https%3A%2F%2Fevil.example%2Fcb',
      'redirect_uri[]=https%3A%2F%2Fevil.example%2Fcb',
      'scope=a&Scope=b',
    ]) {
      const res = await fetch(authorizeUrl(`${base}&${extra}`), { redirect: 'manual' })
      t.equal(res.status, 400, extra)
      t.equal(((await res.json()) as { error: string }).error, 'invalid_request', extra)
    }
    const before = emu.requests.length
    for (const extra of ['GRANT_TYPE=client_credentials', 'Client_Id=other', 'client_id[]=other', 'Client_Secret=x&client_secret=y']) {
      const res = await token(`grant_type=authorization_code&code=a&client_id=${emu.clientId}&${extra}`)
      t.equal(res.status, 400, extra)
      t.equal(((await res.json()) as { error: string }).error, 'invalid_request', extra)
    }
    t.equal(emu.requests.length, before, 'none reached the IdP')
  })

  t.test('the scope limit holds whatever the spelling of scope (the IdP reads Scope as scope)', async t => {
    const { challenge } = pkce()
    const base = `response_type=code&client_id=${emu.clientId}&code_challenge=${challenge}&code_challenge_method=S256&redirect_uri=${encodeURIComponent(redirectUri)}`
    const graph = encodeURIComponent('https://graph.microsoft.com/.default')
    for (const name of ['Scope', 'SCOPE', 'scope[]', '%73cope']) {
      const res = await fetch(authorizeUrl(`${base}&${name}=${graph}`), { redirect: 'manual' })
      t.equal(res.status, 400, `authorize ${name}`)
      t.equal(((await res.json()) as { error: string }).error, 'invalid_scope', `authorize ${name}`)
      const before = emu.requests.length
      const tok = await token(`grant_type=refresh_token&refresh_token=x&client_id=${emu.clientId}&${name}=${graph}`)
      t.equal(tok.status, 400, `token ${name}`)
      t.equal(((await tok.json()) as { error: string }).error, 'invalid_scope', `token ${name}`)
      t.equal(emu.requests.length, before, `token ${name}: the secret-bearing request never left`)
    }
  })

  t.test('token: code exchange with resource stripped and the secret added, then refresh', async t => {
    const { code, verifier } = await getCode()
    const res = await token(
      new URLSearchParams({
        grant_type: 'authorization_code',
        code,
        code_verifier: verifier,
        redirect_uri: redirectUri,
        client_id: emu.clientId,
        resource: `${BASE_URL}/mcp`,
      }).toString()
    )
    t.equal(res.status, 200)
    t.equal(res.headers.get('cache-control'), 'no-store')
    t.equal(res.headers.get('pragma'), 'no-cache')
    const tokens = (await res.json()) as Record<string, string>
    t.type(tokens.access_token, 'string')
    t.type(tokens.refresh_token, 'string')
    const sent = lastTokenRequest()
    t.notOk(sent.has('resource'), 'resource stripped')
    t.equal(sent.get('client_secret'), SECRET, 'secret added server-side')

    const ok = await token(
      new URLSearchParams({
        grant_type: 'refresh_token',
        refresh_token: tokens.refresh_token!,
        client_id: emu.clientId,
        scope: `${emu.apiScopes[0]} offline_access`,
      }).toString()
    )
    t.equal(ok.status, 200, 'refresh within the configured scopes')
    const bad = await token(
      new URLSearchParams({
        grant_type: 'refresh_token',
        refresh_token: tokens.refresh_token!,
        client_id: emu.clientId,
        scope: 'https://graph.microsoft.com/.default',
      }).toString()
    )
    t.equal(bad.status, 400)
    t.equal(((await bad.json()) as { error: string }).error, 'invalid_scope')
    const mixed = await token(
      new URLSearchParams({
        grant_type: 'refresh_token',
        refresh_token: tokens.refresh_token!,
        client_id: emu.clientId,
        scope: `${emu.apiScopes[0]} User.Read`,
      }).toString()
    )
    t.equal(mixed.status, 400, 'one scope outside is enough to refuse')

    const reused = await token(
      new URLSearchParams({ grant_type: 'authorization_code', code, code_verifier: verifier, redirect_uri: redirectUri, client_id: emu.clientId }).toString()
    )
    t.equal(reused.status, 400, "the IdP's status is passed back")
    t.equal(((await reused.json()) as { error: string }).error, 'invalid_grant')
    t.equal(reused.headers.get('cache-control'), 'no-store')

    const log = s.logText()
    for (const secret of [SECRET, code, verifier, tokens.access_token!, tokens.refresh_token!]) {
      t.notOk(log.includes(secret), 'never logged')
    }
    t.match(log, /"grantType":"authorization_code","status":200/)
  })

  t.test('token: method, content type, repeated parameters, grants', async t => {
    for (const method of ['GET', 'PUT', 'DELETE']) {
      const res = await fetch(`${s.url}/oauth2/token`, { method })
      t.equal(res.status, 405, method)
      t.equal(res.headers.get('allow'), 'POST')
    }
    const json = await fetch(`${s.url}/oauth2/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"grant_type":"authorization_code"}',
    })
    t.equal(json.status, 400)
    t.equal(((await json.json()) as { error: string }).error, 'invalid_request')
    const before = emu.requests.length
    for (const body of [
      `grant_type=authorization_code&code=a&code=b&client_id=${emu.clientId}`,
      `grant_type=authorization_code&grant_type=refresh_token&code=a&client_id=${emu.clientId}`,
      `grant_type=authorization_code&code=a&client_id=${emu.clientId}&client_id=other`,
      `grant_type=authorization_code&code=a&client_id=${emu.clientId}&client%5Fid=other`,
    ]) {
      const res = await token(body)
      t.equal(res.status, 400, body)
      t.equal(((await res.json()) as { error: string }).error, 'invalid_request')
    }
    const repeatedResource = await token(`grant_type=authorization_code&code=a&client_id=${emu.clientId}&resource=x&resource=y`)
    t.equal(repeatedResource.status, 400, 'forwarded (resource repeats are allowed and stripped); the IdP rejects the code')
    t.equal(((await repeatedResource.json()) as { error: string }).error, 'invalid_grant')
    t.equal(emu.requests.length, before + 1, 'only the last request reached the IdP')
    for (const grant of ['client_credentials', 'password', 'urn:ietf:params:oauth:grant-type:device_code']) {
      const res = await token(`grant_type=${encodeURIComponent(grant)}&client_id=${emu.clientId}&scope=api%3A%2F%2Fx%2F.default`)
      t.equal(res.status, 400, grant)
      t.equal(((await res.json()) as { error: string }).error, 'unsupported_grant_type')
    }
    const none = await token(`client_id=${emu.clientId}`)
    t.equal(none.status, 400)
    t.equal(emu.requests.length, before + 1, 'refused grants never reach the IdP')
    const bearer = await token(`grant_type=authorization_code&code=a&client_id=${emu.clientId}`, { authorization: 'Bearer abc' })
    t.equal(bearer.status, 400)
  })

  t.test('token: secret-injection matrix over HTTP (grant x client_id x own credentials)', async t => {
    const ownCreds: Record<string, (p: URLSearchParams) => Record<string, string>> = {
      none: () => ({}),
      client_secret: p => {
        p.set('client_secret', 'client-own-secret')
        return {}
      },
      client_assertion: p => {
        p.set('client_assertion_type', 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer')
        p.set('client_assertion', 'eyJ.x.y')
        return {}
      },
      basic: () => ({ authorization: 'Basic ' + Buffer.from(`${emu.clientId}:basic-own-secret`).toString('base64') }),
    }
    for (const grant of ['authorization_code', 'refresh_token', 'client_credentials']) {
      for (const cid of ['configured', 'other', 'absent']) {
        for (const [credName, addCreds] of Object.entries(ownCreds)) {
          const p = new URLSearchParams({ grant_type: grant })
          if (grant === 'authorization_code') {
            p.set('code', 'not-a-code')
            p.set('redirect_uri', redirectUri)
            p.set('code_verifier', 'v'.repeat(43))
          }
          if (grant === 'refresh_token') p.set('refresh_token', 'not-a-refresh-token')
          if (cid === 'configured') p.set('client_id', emu.clientId)
          if (cid === 'other') p.set('client_id', '11111111-2222-3333-4444-555555555555')
          const headers = addCreds(p)
          const before = emu.requests.length
          const res = await token(p.toString(), headers)
          const name = `${grant} / ${cid} / ${credName}`
          if (grant === 'client_credentials') {
            t.equal(res.status, 400, name)
            t.equal(emu.requests.length, before, `${name}: not forwarded`)
            continue
          }
          t.equal(emu.requests.length, before + 1, `${name}: forwarded`)
          const sent = lastTokenRequest()
          // README: added only for the two grants, the configured client_id, no credentials of the client's own.
          const expectInjected = ['authorization_code / configured / none', 'refresh_token / configured / none'].includes(name)
          if (expectInjected) t.equal(sent.get('client_secret'), SECRET, `${name}: secret added`)
          else if (credName === 'client_secret') t.equal(sent.get('client_secret'), 'client-own-secret', `${name}: own secret untouched`)
          else t.notOk(sent.has('client_secret'), `${name}: no secret added`)
          const forwardedAuth = emu.requests.at(-1)!.authorization
          t.equal(forwardedAuth, credName === 'basic' ? headers.authorization : undefined, `${name}: only the client's own Basic credentials are forwarded`)
        }
      }
    }
    t.notOk(s.logText().includes(SECRET))
  })
})

t.test("cloud_idp without clientSecret against a confidential app: the IdP's AADSTS7000218 passes through", async t => {
  const emu = await startEntraEmulator({ clientSecret: SECRET })
  t.teardown(() => emu.close())
  const s = await withServer(t, cloudAuth(emu))
  const res = await fetch(`${s.url}/oauth2/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: `grant_type=authorization_code&code=x&client_id=${emu.clientId}`,
  })
  t.equal(res.status, 401)
  const body = (await res.json()) as { error: string; error_description: string }
  t.equal(body.error, 'invalid_client')
  t.match(body.error_description, /^AADSTS7000218/)
  t.equal(res.headers.get('cache-control'), 'no-store')
})

t.test('cloud_idp v1 issuer: tenant and endpoints derived, discovery from the v2 document', async t => {
  const emu = await startEntraEmulator({ tokenVersion: 1, v1Issuer: (origin, tenant) => `${origin}/${tenant}/` })
  t.teardown(() => emu.close())
  const s = await withServer(t, cloudAuth(emu, { issuer: emu.issuerV1, jwks: emu.jwksUrl }))
  const bridge = s.plugins[0] as ProviderBridgePlugin
  t.equal(bridge.discovery?.url, emu.discoveryUrl)
  const root = (await (await fetch(s.url + ROOT)).json()) as Record<string, unknown>
  t.equal(root.issuer, emu.issuerV2, 'issuer as reported by the IdP')
  t.equal(root.token_endpoint, `${BASE_URL}/oauth2/token`)
})

/** A cloud_idp gateway config for the real CLI: an explicit pipeline, so that the bridge can take options. */
function cloudCliConfig(emu: EntraEmulator, port: number, bridgeOptions: string | undefined): string {
  return `mcp:
  host: 127.0.0.1
  port: ${port}
  targets:
    - name: remote
      mcp: { url: "http://127.0.0.1:9/mcp" }
  policies:
    mcpAuthentication:
      mode: strict
      issuer: ${emu.issuerV2}
      audiences: ["api://${emu.clientId}", "${emu.clientId}"]
      clientId: "${emu.clientId}"
      provider: { cloud_idp: {} }
      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp", scopesSupported: ${JSON.stringify(emu.apiScopes)} }
  plugins:
    - builtin: cors
    - builtin: mcpAuthentication
    - builtin: providerBridge${bridgeOptions === undefined ? '' : `\n      options: ${bridgeOptions}`}
    - builtin: registration
admin: { enabled: false }
`
}

async function cloudCli(t: Test, emu: EntraEmulator, bridgeOptions: string | undefined): Promise<string> {
  const port = await freePort()
  const cli = spawnCli(['-f', await configFile(cloudCliConfig(emu, port, bridgeOptions), 'mcpp-schemes-')])
  t.teardown(async () => {
    cli.child.kill('SIGTERM')
    await cli.exited
  })
  await waitForPort(port, cli.exited)
  return `http://127.0.0.1:${port}`
}

t.test('private-use redirect schemes (RFC 8252 §7.1): refused by default, passed on when listed (real CLI, Entra emulator), never javascript', async t => {
  const cursor = 'cursor://anysphere.cursor-retrieval/oauth/user-mcp/callback'
  const app = 'com.example.app:/oauth2redirect'
  const vscode = 'vscode://vscode.github-authentication/did-authenticate'
  const emu = await startEntraEmulator({ redirectUris: [cursor, app, vscode, 'http://127.0.0.1/callback'] })
  t.teardown(() => emu.close())
  const { verifier, challenge } = pkce()
  const authorize = (base: string, redirectUri: string): Promise<Response> =>
    fetch(
      `${base}/oauth2/authorize?${new URLSearchParams({
        response_type: 'code',
        client_id: emu.clientId,
        redirect_uri: redirectUri,
        code_challenge: challenge,
        code_challenge_method: 'S256',
        scope: `${emu.apiScopes[0]} offline_access`,
        state: 'st',
        resource: `${base}/mcp`,
      })}`,
      { redirect: 'manual' }
    )
  const refused = async (res: Response, uri: string, name: string): Promise<void> => {
    t.equal(res.status, 400, `${name}: ${uri}`)
    t.equal(res.headers.get('location'), null, `${name}: ${uri}: never a redirect`)
    const body = (await res.json()) as { error: string; error_description: string }
    t.equal(body.error, 'invalid_request', `${name}: ${uri}`)
    // A control character is refused by the parameter parser before redirect_uri is read.
    t.match(body.error_description, /^redirect_uri |^parameters must not contain control characters/, `${name}: ${uri}`)
  }

  const plain = await cloudCli(t, emu, undefined)
  for (const uri of [cursor, app]) await refused(await authorize(plain, uri), uri, 'default')
  const first = await authorize(plain, cursor)
  t.same(
    await first.json(),
    { error: 'invalid_request', error_description: 'redirect_uri must use https, or http on a loopback address (not cursor)' },
    'default: the existing error'
  )
  // Registration took private-use schemes before and still does: the authorize endpoint is what opts in.
  const reg = await fetch(`${plain}/.well-known/oauth-authorization-server/client-registration`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ redirect_uris: [cursor, app] }),
  })
  t.equal(reg.status, 201, 'registration with private-use redirect URIs')

  const opted = await cloudCli(t, emu, '{ allowedRedirectSchemes: [Cursor, com.example.app] }')
  for (const uri of [cursor, app]) {
    const res = await authorize(opted, uri)
    t.equal(res.status, 302, `listed: ${uri}`)
    const to = new URL(res.headers.get('location')!)
    t.equal(to.origin + to.pathname, emu.authorizeUrl, `${uri}: to the IdP`)
    t.equal(to.searchParams.get('redirect_uri'), uri, `${uri}: passed on as given`)
    t.notOk(to.searchParams.has('resource'), `${uri}: resource stripped`)
  }
  // The whole desktop flow: the IdP sends the code to the app's scheme, the app redeems it through the gateway.
  const atIdp = await fetch((await authorize(opted, cursor)).headers.get('location')!, { redirect: 'manual' })
  const back = new URL(atIdp.headers.get('location')!)
  t.equal(back.protocol + '//' + back.host + back.pathname, cursor, 'the IdP redirects to the app')
  const code = back.searchParams.get('code')!
  const token = await fetch(`${opted}/oauth2/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code, client_id: emu.clientId, redirect_uri: cursor, code_verifier: verifier }).toString(),
  })
  t.equal(token.status, 200, 'the code is redeemed')
  t.type(((await token.json()) as { access_token?: unknown }).access_token, 'string')

  const stillRefused = [
    vscode,
    'javascript:alert(1)',
    'cursor://anysphere.cursor-retrieval/cb#frag',
    'cursor://user@anysphere.cursor-retrieval/cb',
    'cursor:',
    'cursor://',
    'cursor://x/c b',
    'cursor://x/c\\b',
    'cursor://x/\u0007',
    'http://app.example.com/cb',
  ]
  for (const uri of stillRefused) await refused(await authorize(opted, uri), uri, 'listed, still refused')
})

t.test("allowedRedirectSchemes: scheme syntax (RFC 3986 §3.1), and the web's or dangerous schemes refused, naming the path (--check)", async t => {
  // The schemas say what the code refuses: the same names, in any case.
  const item = (bridgeSchema.properties.allowedRedirectSchemes as { items: Record<string, unknown> }).items
  t.same((facadeSchema.properties as Record<string, { items?: unknown }>).allowedRedirectSchemes?.items, item, 'the facade takes the same list')
  const check = createAjv().compile(item)
  for (const s of NEVER_PRIVATE_SCHEMES) {
    for (const v of [s, s.toUpperCase(), s[0]!.toUpperCase() + s.slice(1)]) t.notOk(check(v), `${v} refused`)
  }
  for (const v of ['cursor', 'vscode', 'com.example.app', 'x-my+app.v2', 'httpx', 'https2', 'wsx', 'datadog']) t.ok(check(v), `${v} accepted`)
  for (const v of ['cursor:', '1app', '', 'my app', 'my_app', 'cur/sor', 'é', 'a'.repeat(65)]) t.notOk(check(v), `${JSON.stringify(v)} refused`)
  // And a list that skipped the schema never lets javascript through.
  t.equal(privateSchemes(['javascript', 'HTTP', 'data']).size, 0)
  t.match(authorizeRedirectProblem('javascript:alert(1)', new Set(['javascript'])), /https/)

  const emu = await startEntraEmulator({})
  t.teardown(() => emu.close())
  const port = await freePort()
  const bad = await runCli(
    ['-f', await configFile(cloudCliConfig(emu, port, '{ allowedRedirectSchemes: [cursor, javascript, "vscode:"] }'), 'mcpp-schemes-'), '--check'],
    {},
    20000
  )
  t.equal(bad.code, 1, 'exit 1')
  t.match(bad.stderr, /mcp\.plugins\[2\]\.options\.allowedRedirectSchemes\[1\]: a private-use URI scheme/, 'javascript: named by its path')
  t.match(bad.stderr, /mcp\.plugins\[2\]\.options\.allowedRedirectSchemes\[2\]: a private-use URI scheme/, 'a scheme with its colon: named by its path')
  t.notMatch(bad.stderr, /allowedRedirectSchemes\[0\]/, 'cursor is fine')
  const good = await runCli(['-f', await configFile(cloudCliConfig(emu, port, '{ allowedRedirectSchemes: [cursor] }'), 'mcpp-schemes-'), '--check'], {}, 20000)
  t.equal(good.code, 0, good.stderr)
})
