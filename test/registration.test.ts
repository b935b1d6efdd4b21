/**
 * registration: RFC 7591 answers with the configured client id, request
 * validation (content type, JSON object, redirect URIs, grants, size), and
 * acceptance of the answer by the official SDK's schema.
 */
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import { createServer, request } from 'node:http'
import type { AddressInfo } from 'node:net'
import { OAuthClientInformationFullSchema } from '@modelcontextprotocol/sdk/shared/auth.js'
import { validateConfig } from '../core/config.ts'
import { ProxyError } from '../core/errors.ts'
import registrationModule, { buildRegistrationResponse, redirectUriProblem, DEFAULT_OPTIONS } from '../plugins/registration/index.ts'
import { RateLimiter, addressKey, REGISTRATION_RATE_LIMIT } from '../plugins/oauth-common/rate-limit.ts'
import { startBridgeServer, makeEnv, type BridgeServer } from './helpers/bridge-server.ts'
import { memoryLogger } from './helpers/logger.ts'
import { builtins } from '../plugins/index.ts'

const PATH = '/.well-known/oauth-authorization-server/client-registration'
const CLIENT_ID = 'pre-registered-client'

async function idpStub(t: Test): Promise<string> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(
      JSON.stringify({
        issuer: 'https://idp.example/app/',
        authorization_endpoint: 'https://idp.example/authorize',
        token_endpoint: 'https://idp.example/token',
        registration_endpoint: null,
      })
    )
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/app/`
}

async function ossServer(
  t: Test,
  maxBodyBytes?: number,
  registration?: Record<string, unknown>,
  trustedProxies?: string[],
  now?: () => number
): Promise<BridgeServer> {
  const issuer = await idpStub(t)
  const s = await startBridgeServer(
    { issuer, audiences: [CLIENT_ID], clientId: CLIENT_ID, provider: { oss_idp: {} } },
    { maxBodyBytes, registration, trustedProxies, now }
  )
  t.teardown(() => s.close())
  return s
}

function register(s: BridgeServer, body: unknown, contentType = 'application/json'): Promise<Response> {
  return fetch(s.url + PATH, { method: 'POST', headers: { 'content-type': contentType }, body: typeof body === 'string' ? body : JSON.stringify(body) })
}

t.test('redirect URI rules', async t => {
  const good = [
    'https://app.example.com/callback',
    'http://127.0.0.1:33418/callback',
    'http://localhost:6274/oauth/callback',
    'http://[::1]:3000/cb',
    'com.example.app:/oauth2redirect',
    'cursor://anysphere.cursor-retrieval/oauth/user-mcp/callback',
    'https://app.example.com/cb?x=1',
  ]
  for (const u of good) t.equal(redirectUriProblem(u), undefined, u)
  const bad: Array<[unknown, RegExp]> = [
    ['', /non-empty/],
    [42, /non-empty string/],
    ['/relative/callback', /absolute/],
    ['callback', /absolute/],
    ['https://app.example.com/cb#frag', /fragment/],
    ['https://app.example.com/cb\r\nSet-Cookie: x=1', /control/],
    ['https://app.example.com/c b', /whitespace/],
    ['javascript:alert(1)', /not allowed/],
    ['data:text/html,hi', /not allowed/],
    ['file:///etc/passwd', /not allowed/],
    ['http://app.example.com/cb', /loopback/],
    ['https://user:pw@app.example.com/cb', /user information/],
    ['https://app.example.com/' + 'a'.repeat(3000), /at most/],
  ]
  for (const [u, reason] of bad) t.match(redirectUriProblem(u), reason, String(u).slice(0, 40))
})

t.test('registration answers with the configured client id', async t => {
  const s = await ossServer(t)
  const req = {
    client_name: 'MCP Inspector',
    redirect_uris: ['http://localhost:6274/oauth/callback', 'com.example.app:/cb'],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: 'openid profile',
  }
  const res = await register(s, req)
  t.equal(res.status, 201)
  t.equal(res.headers.get('cache-control'), 'no-store')
  const body = (await res.json()) as Record<string, unknown>
  t.equal(body.client_id, CLIENT_ID)
  t.equal(body.token_endpoint_auth_method, 'none', 'public client even when another method was asked for')
  t.same(body.redirect_uris, req.redirect_uris)
  t.same(body.grant_types, ['authorization_code', 'refresh_token'])
  t.same(body.response_types, ['code'])
  t.equal(body.client_name, 'MCP Inspector')
  t.equal(body.scope, 'openid profile')
  t.ok(Number.isInteger(body.client_id_issued_at) && (body.client_id_issued_at as number) <= Math.floor(Date.now() / 1000))
  t.notOk('client_secret' in body)
  t.ok(OAuthClientInformationFullSchema.safeParse(body).success, 'the SDK accepts the answer')

  const minimal = await register(s, { redirect_uris: ['http://127.0.0.1:1234/cb'] }, 'application/json; charset=utf-8')
  t.equal(minimal.status, 201)
  const m = (await minimal.json()) as Record<string, unknown>
  t.same(m.grant_types, ['authorization_code', 'refresh_token'], 'defaulted')
  t.same(m.response_types, ['code'], 'defaulted')
  t.notOk('client_name' in m)

  const extra = await register(s, { redirect_uris: ['https://a.example/cb'], grant_types: ['authorization_code', 'client_credentials', 'urn:x'] })
  t.same(((await extra.json()) as Record<string, unknown>).grant_types, ['authorization_code'], 'unsupported grants replaced (RFC 7591 §3.2.1)')
})

t.test('invalid registration requests', async t => {
  const s = await ossServer(t, 4096)
  const cases: Array<[string, unknown, string, string?]> = [
    ['not JSON', '{redirect_uris:', 'invalid_client_metadata'],
    ['array body', [], 'invalid_client_metadata'],
    ['null body', 'null', 'invalid_client_metadata'],
    ['string body', '"x"', 'invalid_client_metadata'],
    ['form content type', 'redirect_uris=https://a', 'invalid_client_metadata', 'application/x-www-form-urlencoded'],
    ['text content type', JSON.stringify({ redirect_uris: ['https://a.example/cb'] }), 'invalid_client_metadata', 'text/plain'],
    ['no redirect_uris', { client_name: 'x' }, 'invalid_redirect_uri'],
    ['empty redirect_uris', { redirect_uris: [] }, 'invalid_redirect_uri'],
    ['redirect_uris not an array', { redirect_uris: 'https://a.example/cb' }, 'invalid_redirect_uri'],
    ['relative redirect', { redirect_uris: ['/cb'] }, 'invalid_redirect_uri'],
    ['fragment', { redirect_uris: ['https://a.example/cb#x'] }, 'invalid_redirect_uri'],
    ['CR/LF', { redirect_uris: ['https://a.example/cb\r\nx'] }, 'invalid_redirect_uri'],
    ['one bad among good', { redirect_uris: ['https://a.example/cb', 'javascript:alert(1)'] }, 'invalid_redirect_uri'],
    ['too many', { redirect_uris: Array.from({ length: 21 }, (_, i) => `https://a.example/cb${i}`) }, 'invalid_redirect_uri'],
    ['grant_types not strings', { redirect_uris: ['https://a.example/cb'], grant_types: [1] }, 'invalid_client_metadata'],
    ['no authorization_code', { redirect_uris: ['https://a.example/cb'], grant_types: ['client_credentials'] }, 'invalid_client_metadata'],
    ['no code response type', { redirect_uris: ['https://a.example/cb'], response_types: ['token'] }, 'invalid_client_metadata'],
    ['client_name not a string', { redirect_uris: ['https://a.example/cb'], client_name: { a: 1 } }, 'invalid_client_metadata'],
  ]
  for (const [name, body, error, type] of cases) {
    const res = await register(s, body, type)
    t.equal(res.status, 400, name)
    const b = (await res.json()) as Record<string, unknown>
    t.equal(b.error, error, name)
    t.type(b.error_description, 'string', name)
  }
  const big = await register(s, { redirect_uris: ['https://a.example/cb'], client_name: 'x'.repeat(8000) })
  t.equal(big.status, 413, 'size-limited by core')
  const get = await fetch(s.url + PATH)
  t.equal(get.status, 405)
  t.match(get.headers.get('allow'), /POST/)
  const pre = await fetch(s.url + PATH, {
    method: 'OPTIONS',
    headers: { origin: 'http://localhost:6274', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' },
  })
  t.equal(pre.status, 204)
  t.equal(pre.headers.get('access-control-allow-origin'), '*')
})

/** The table "Client registration limits" (Key | Default | Beyond it) of docs/security.md, parsed: the defaults as documented. */
function readmeRegistrationDefaults(): Record<string, number> {
  const readme = readFileSync(new URL('../docs/security.md', import.meta.url), 'utf8')
  const table = readme.slice(readme.indexOf('Client registration limits'))
  const out: Record<string, number> = {}
  for (const m of table.slice(0, table.indexOf('\n\n', table.indexOf('| Key |'))).matchAll(/^\s*\| `([\w.]+)` \| (\d+) \|/gm)) out[m[1]!] = Number(m[2])
  return out
}

t.test("the registration defaults are the README's, and the OAuth facade's registration rate limit is the same", async t => {
  const doc = readmeRegistrationDefaults()
  t.same(
    Object.keys(doc).sort(),
    ['maxBodyBytes', 'maxRedirectUriLength', 'maxRedirectUris', 'rateLimit.maxAddresses', 'rateLimit.requests', 'rateLimit.windowSeconds'],
    'the table parsed'
  )
  const documented = { requests: doc['rateLimit.requests'], windowSeconds: doc['rateLimit.windowSeconds'], maxAddresses: doc['rateLimit.maxAddresses'] }
  t.same(
    DEFAULT_OPTIONS,
    { maxBodyBytes: doc.maxBodyBytes, maxRedirectUris: doc.maxRedirectUris, maxRedirectUriLength: doc.maxRedirectUriLength, rateLimit: documented },
    "the plugin's defaults"
  )
  t.same(REGISTRATION_RATE_LIMIT, documented, 'the facade\'s (README: "registrations share the registration plugin\'s rate limit defaults")')
})

t.test('buildRegistrationResponse never answers without the configured id', async t => {
  t.equal(buildRegistrationResponse({ redirect_uris: ['https://a.example/cb'] }, 'abc', 5000).client_id_issued_at, 5)
  t.throws(() => buildRegistrationResponse({}, 'abc'))
})

t.test('configuration', async t => {
  const log = memoryLogger().log
  const { env: none } = await makeEnv({ issuer: 'https://idp.example/', audiences: ['x'] }, log)
  t.same((await registrationModule.create({}, none)).routes, [], 'no provider: no routes')
  await t.rejects(
    validateConfig(
      {
        mcp: {
          port: 1,
          targets: [{ name: 'a', stdio: { cmd: 'node' } }],
          policies: {
            mcpAuthentication: {
              mode: 'strict',
              issuer: 'https://idp.example/app/',
              provider: { oss_idp: {} },
              resourceMetadata: { resource: 'https://gw.example/mcp' },
            },
          },
        },
      },
      builtins
    ),
    /clientId/,
    'oss_idp without clientId is rejected at start-up, naming the field'
  )
  // Guard in create() for configs that bypass the validator.
  const { env } = await makeEnv({ issuer: 'https://idp.example/app/', audiences: ['x'], clientId: 'x', provider: { oss_idp: {} } }, log)
  const idp = env.provided.idp as Record<string, unknown>
  const bypass = { ...env, provided: { ...env.provided, idp: { ...idp, clientId: undefined } } }
  let err: unknown
  try {
    await registrationModule.create({}, bypass)
  } catch (e) {
    err = e
  }
  t.ok(ProxyError.is(err))
  t.match((err as ProxyError).message, /clientId/)
})

interface RawAnswer {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: string
}

/**
 * POSTs from a chosen local address, the body streamed in `chunks` (chunked
 * when `contentLength` is false). The server may answer and close before the
 * body is sent: that answer is what counts.
 */
function rawRegister(
  s: BridgeServer,
  chunks: Buffer[],
  o: { localAddress?: string; contentLength?: boolean; headers?: Record<string, string> } = {}
): Promise<RawAnswer> {
  const url = new URL(s.url + PATH)
  const size = chunks.reduce((n, c) => n + c.length, 0)
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: url.hostname,
        port: url.port,
        path: PATH,
        method: 'POST',
        localAddress: o.localAddress,
        agent: false,
        headers: { 'content-type': 'application/json', ...(o.contentLength === false ? {} : { 'content-length': size }), ...o.headers },
      },
      res => {
        const got: Buffer[] = []
        res.on('data', (c: Buffer) => got.push(c))
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(got).toString('utf8') }))
        res.on('error', reject)
      }
    )
    // Writes after the server answered and closed fail; the answer already arrived.
    req.on('error', err => {
      if (!req.writableEnded || (err as NodeJS.ErrnoException).code !== 'EPIPE') reject(err)
    })
    const write = (i: number): void => {
      if (i === chunks.length) {
        req.end()
        return
      }
      if (req.destroyed) return
      req.write(chunks[i], () => write(i + 1))
    }
    write(0)
  })
}

const validBody = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ redirect_uris: ['http://127.0.0.1:1234/cb'], ...extra })

t.test('registration limits: body cap (413) of its own, below the core limit', async t => {
  const s = await ossServer(t, 4 * 1024 * 1024)
  const mib = JSON.stringify(validBody({ padding: 'x'.repeat(1024 * 1024) }))
  const big = await register(s, mib)
  t.equal(big.status, 413, 'a 1 MiB registration is refused although the core allows 4 MiB')
  const b = (await big.json()) as Record<string, unknown>
  t.equal(b.error, 'invalid_request')
  t.match(b.error_description, /65536 bytes/)

  const chunked = await rawRegister(
    s,
    Array.from({ length: 64 }, () => Buffer.alloc(16 * 1024, 0x20)),
    { contentLength: false }
  )
  t.equal(chunked.status, 413, 'a chunked body is cut at the cap too')
  t.equal(JSON.parse(chunked.body).error, 'invalid_request')

  const near = await register(s, JSON.stringify(validBody({ padding: 'x'.repeat(60_000) })))
  t.equal(near.status, 201, 'a body under the cap is fine')

  const small = await ossServer(t, 4 * 1024 * 1024, { maxBodyBytes: 1024 })
  t.equal((await register(small, JSON.stringify(validBody({ padding: 'x'.repeat(1100) })))).status, 413, 'maxBodyBytes is configurable')
  t.equal((await register(small, JSON.stringify(validBody()))).status, 201)
})

t.test('registration limits: redirect_uris count and length (400 invalid_redirect_uri, RFC 7591 §3.2.2)', async t => {
  const s = await ossServer(t, 1024 * 1024)
  const long = 'https://app.example.com/' + 'a'.repeat(2048 - 24)
  t.equal(long.length, 2048)
  t.equal((await register(s, validBody({ redirect_uris: [long] }))).status, 201, 'default length 2048 is allowed')
  const tooLong = await register(s, validBody({ redirect_uris: [long + 'a'] }))
  t.equal(tooLong.status, 400)
  t.same(Object.keys((await tooLong.json()) as object).sort(), ['error', 'error_description'])
  const tooMany = await register(s, validBody({ redirect_uris: Array.from({ length: 21 }, (_, i) => `https://a.example/cb${i}`) }))
  t.equal(tooMany.status, 400)
  t.equal(((await tooMany.json()) as Record<string, unknown>).error, 'invalid_redirect_uri')

  const tight = await ossServer(t, 1024 * 1024, { maxRedirectUris: 2, maxRedirectUriLength: 40 })
  t.equal((await register(tight, validBody({ redirect_uris: ['https://a.example/1', 'https://a.example/2'] }))).status, 201)
  for (const [name, uris] of [
    ['3 > maxRedirectUris 2', ['https://a.example/1', 'https://a.example/2', 'https://a.example/3']],
    ['41 > maxRedirectUriLength 40', ['https://a.example/' + 'b'.repeat(41 - 18)]],
  ] as Array<[string, string[]]>) {
    const res = await register(tight, validBody({ redirect_uris: uris }))
    t.equal(res.status, 400, name)
    const body = (await res.json()) as Record<string, unknown>
    t.equal(body.error, 'invalid_redirect_uri', name)
    t.match(body.error_description, /at most (2|40)/, name)
  }
})

t.test('registration limits: a burst from one address gets 429 with Retry-After; other addresses are unaffected', async t => {
  const s = await ossServer(t, 65536)
  const answers = await Promise.all(Array.from({ length: 300 }, () => register(s, validBody())))
  const created = answers.filter(r => r.status === 201).length
  const limited = answers.filter(r => r.status === 429)
  t.ok(created >= 20, `the default burst (20) is served (${created})`)
  t.ok(created < 40, `most of 300 registrations in a burst are refused (${created} created)`)
  t.equal(created + limited.length, 300, 'every other answer is 429')
  for (const r of limited.slice(0, 5)) {
    t.match(r.headers.get('retry-after'), /^[1-9]\d*$/)
    const b = (await r.json()) as Record<string, unknown>
    t.equal(b.error, 'temporarily_unavailable')
    t.type(b.error_description, 'string')
  }
  await Promise.all(answers.map(r => (r.bodyUsed ? undefined : r.body?.cancel())))
  t.match(s.logText(), /client registration rate limit reached/)

  const other = await rawRegister(s, [Buffer.from(JSON.stringify(validBody()))], { localAddress: '127.0.0.2' })
  t.equal(other.status, 201, 'another client address still registers')
  const pre = await fetch(s.url + PATH, { method: 'OPTIONS', headers: { origin: 'http://localhost:6274', 'access-control-request-method': 'POST' } })
  t.equal(pre.status, 204, 'preflights are not limited')
})

t.test('registration limits: behind a trusted proxy each client has its own bucket; a spoofed X-Forwarded-For from elsewhere changes nothing', async t => {
  const s = await ossServer(t, 65536, { rateLimit: { requests: 2, windowSeconds: 3600 } }, ['127.0.0.1'])
  const via = (forwardedFor: string, localAddress = '127.0.0.1'): Promise<{ status: number }> =>
    rawRegister(s, [Buffer.from(JSON.stringify(validBody()))], { localAddress, headers: { 'x-forwarded-for': forwardedFor } })
  t.same(
    [(await via('203.0.113.1')).status, (await via('203.0.113.1')).status, (await via('203.0.113.1')).status],
    [201, 201, 429],
    'one client through the proxy'
  )
  t.equal((await via('203.0.113.2')).status, 201, 'another client through the same proxy is not limited by the first')
  t.equal((await via('198.51.100.7, 203.0.113.1')).status, 429, 'a client cannot escape by prepending addresses')
  const spoofed = []
  for (let i = 0; i < 4; i++) spoofed.push((await via(`198.51.100.${i + 10}`, '127.0.0.2')).status)
  t.same(spoofed, [201, 201, 429, 429], 'a peer that is not a trusted proxy is limited by its own address whatever it claims')
})

t.test('registration limits: the configured rate, refilled evenly', async t => {
  const s = await ossServer(t, 65536, { rateLimit: { requests: 3, windowSeconds: 3600 } })
  const statuses: number[] = []
  for (let i = 0; i < 6; i++) statuses.push((await register(s, validBody())).status)
  t.same(statuses, [201, 201, 201, 429, 429, 429])
  const r = await register(s, validBody())
  const after = Number(r.headers.get('retry-after'))
  t.ok(after >= 1 && after <= 1200, `Retry-After is the time to the next registration (${after} s of at most 1200)`)

  // The limiter's clock (PluginEnv.now) is the test's: a client honouring Retry-After is time moved, not slept.
  let now = 1_000_000
  const quick = await ossServer(t, 65536, { rateLimit: { requests: 1, windowSeconds: 1 } }, undefined, () => now)
  t.equal((await register(quick, validBody())).status, 201)
  const limited = await register(quick, validBody())
  t.equal(limited.status, 429)
  t.equal(limited.headers.get('retry-after'), '1')
  now += 999
  t.equal((await register(quick, validBody())).status, 429, 'still limited just before Retry-After has passed')
  now += 1
  t.equal((await register(quick, validBody())).status, 201, 'served again once Retry-After has passed')

  const off = await ossServer(t, 65536, { rateLimit: { requests: 0 } })
  const all = await Promise.all(Array.from({ length: 50 }, () => register(off, validBody())))
  t.same([...new Set(all.map(a => a.status))], [201], 'requests: 0 turns the limit off')
})

t.test('rate limiter: token buckets per address key, bounded table', async t => {
  t.equal(addressKey('203.0.113.7'), '203.0.113.7')
  t.equal(addressKey('::ffff:203.0.113.7'), '203.0.113.7', 'IPv4-mapped IPv6 is the IPv4 address')
  t.equal(addressKey('2001:db8:1:2:aaaa::1'), '2001:db8:1:2::/64')
  t.equal(addressKey('2001:0DB8:0001:0002:ffff:eeee:dddd:cccc'), '2001:db8:1:2::/64', 'one /64 is one key')
  t.equal(addressKey('2001:db8::1'), '2001:db8:0:0::/64')
  t.equal(addressKey('::1'), '0:0:0:0::/64')
  t.equal(addressKey('fe80::1%eth0'), 'fe80:0:0:0::/64')
  t.equal(addressKey(undefined), 'unknown')

  let now = 0
  const rl = new RateLimiter({ requests: 2, windowSeconds: 10, maxAddresses: 3 }, () => now)
  t.same(rl.take('a'), { retryAfter: 0, firstRefusal: false })
  t.same(rl.take('a'), { retryAfter: 0, firstRefusal: false })
  t.same(rl.take('a'), { retryAfter: 5, firstRefusal: true }, 'one token every 5 s')
  t.same(rl.take('a'), { retryAfter: 5, firstRefusal: false }, 'a streak is logged once')
  now += 4000
  t.same(rl.take('a'), { retryAfter: 1, firstRefusal: false })
  now += 1000
  t.same(rl.take('a'), { retryAfter: 0, firstRefusal: false }, 'refilled after Retry-After')
  t.equal(rl.take('b').retryAfter, 0, 'another key has its own bucket')
  for (const k of ['c', 'd', 'e', 'f']) rl.take(k)
  t.equal(rl.size, 3, 'the table holds at most maxAddresses')
  t.equal(new RateLimiter({ requests: 0, windowSeconds: 1, maxAddresses: 1 }, () => now).take('x').retryAfter, 0, 'requests 0: no limit')
})
