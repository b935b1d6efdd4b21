/**
 * The admin listener without a browser: redaction, the admin API and its
 * protections (admin.token, cookie sign-in, Host and Origin checks), request
 * decisions, "try it", /metrics, /healthz and /readyz, against a whole
 * gateway in front of server-everything and the dev IdP.
 */
import t from 'tap'
import { request } from 'node:http'
import { createServer } from 'node:net'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { redactConfig, secretValues, createScrubber, REDACTED } from '../core/admin/redact.ts'
import { RequestLog, decisionOf, createAdminState } from '../core/admin/admin-state.ts'
import type { GatewayConfig } from '../core/config.ts'
import { RouteTable } from '../core/routes.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { keyOnlyCaller } from '../core/mcp/credentials.ts'
import { brokerOf, credentialDouble } from './helpers/credential-double.ts'
import { memoryLogger } from './helpers/logger.ts'
import type { AccessRecord } from '../core/observability/access-log.ts'
import { adminGateway, parsePrometheus, sampleSum, SECRETS, RULE } from './helpers/admin.ts'

t.test('redactConfig hides secret keys, env and headers values and every ${NAME} value', async t => {
  const config = {
    mcp: {
      policies: {
        mcpAuthentication: { issuer: 'https://idp.example/', clientId: 'abc', clientSecret: 'shh-secret-value', tokenCache: { enabled: true } },
        authorization: { rules: [RULE] },
      },
      targets: [
        { name: 'a', stdio: { cmd: 'node', args: ['server.js', '--key=from-env-123456'], env: { HOME_DIR: '/home/x' } } },
        { name: 'b', mcp: { url: 'https://up.example/mcp', headers: { 'x-api-key': 'hdr-secret-99' } } },
      ],
    },
    admin: { token: 'admin-token-0123456789' },
    credentials: { user: 'u', password: 'pw-nested-secret' },
  }
  const paths = new Set(['mcp.targets[0].stdio.args[1]', 'mcp.policies.mcpAuthentication.issuer'])
  const r = redactConfig(config, paths) as typeof config
  t.equal(r.mcp.policies.mcpAuthentication.clientSecret, REDACTED)
  t.equal(r.mcp.policies.mcpAuthentication.clientId, 'abc', 'a public value stays')
  t.same(r.mcp.policies.mcpAuthentication.tokenCache, { enabled: true }, '"tokenCache" is not a secret key')
  t.same(r.mcp.policies.authorization, { rules: [RULE] }, 'the authorization policy section is not a credential')
  t.equal(r.mcp.policies.mcpAuthentication.issuer, REDACTED, 'a ${NAME} value is redacted even when public-looking')
  t.equal(r.mcp.targets[0]!.stdio!.args[1], REDACTED)
  t.equal(r.mcp.targets[0]!.stdio!.args[0], 'server.js')
  t.equal(r.mcp.targets[0]!.stdio!.env.HOME_DIR, REDACTED)
  t.equal(r.mcp.targets[1]!.mcp!.headers['x-api-key'], REDACTED)
  t.equal(r.admin.token, REDACTED)
  t.same(r.credentials, { user: 'u', password: REDACTED }, 'a secret-named section is walked, its secret leaves redacted')
  t.equal(config.admin.token, 'admin-token-0123456789', 'the input is not modified')
  const withRedis = {
    cluster: { secret: 'cluster-secret-0123456789-0123456789', advertiseUrl: 'http://10.0.0.7:3000', redis: { url: 'redis://gw:redis-pass-123@redis:6379/0' } },
    probes: { port: 9090, metricsToken: 'metrics-token-0123456789' },
  }
  const rr = redactConfig(withRedis, new Set()) as typeof withRedis
  t.same(
    rr,
    {
      cluster: { secret: REDACTED, advertiseUrl: 'http://10.0.0.7:3000', redis: { url: `redis://gw:${REDACTED}@redis:6379/0` } },
      probes: { port: 9090, metricsToken: REDACTED },
    },
    'the cluster secret, the metrics token and a password inside a URL are redacted'
  )
  t.same(createScrubber(secretValues(withRedis, new Set()))({ e: 'auth redis-pass-123 failed' }), { e: `auth ${REDACTED} failed` }, 'and scrubbed anywhere')

  const scrub = createScrubber(secretValues(config, paths))
  const out = scrub({ note: 'keys: shh-secret-value and hdr-secret-99', list: ['--key=from-env-123456'], issuer: 'https://idp.example/' }) as Record<
    string,
    unknown
  >
  t.same(
    out,
    { note: `keys: ${REDACTED} and ${REDACTED}`, list: [REDACTED], issuer: 'https://idp.example/' },
    'secrets are scrubbed anywhere; a ${NAME} URL stays visible outside the config view'
  )
})

t.test("redactConfig hides the secrets of a target's auth block, not its names", async t => {
  const auth = {
    tokenExchange: {
      tokenEndpoint: 'https://idp.example/token',
      clientId: 'gw',
      clientSecret: 'exchange-secret-0123',
      privateKey: { pem: '-----BEGIN PRIVATE KEY-----\nMIIEvQ-literal-key\n-----END PRIVATE KEY-----', alg: 'RS256', kid: 'k1' },
      audience: ['crm'],
    },
    bearer: 'static-bearer-0123456',
    apiKey: { header: 'X-API-Key', value: 'api-key-value-0123456' },
    headers: { 'X-User': '{sub}' },
  }
  const r = redactConfig({ mcp: { targets: [{ name: 'crm', mcp: { url: 'https://crm.example/mcp', headers: {} }, auth }] } }, new Set()) as {
    mcp: { targets: Array<{ auth: typeof auth }> }
  }
  const a = r.mcp.targets[0]!.auth
  t.equal(a.tokenExchange.clientSecret, REDACTED)
  t.equal(a.tokenExchange.privateKey.pem, REDACTED, "a private key's PEM")
  t.equal(a.bearer, REDACTED, 'a static bearer')
  t.equal(a.apiKey.value, REDACTED, "an API key's value")
  t.equal(a.apiKey.header, 'X-API-Key', 'its header name stays')
  t.equal(a.tokenExchange.tokenEndpoint, 'https://idp.example/token')
  t.same(a.tokenExchange.audience, ['crm'])
  const scrub = createScrubber(secretValues({ mcp: { targets: [{ auth }] } }, new Set()))
  t.same(scrub({ e: 'refused static-bearer-0123456 and api-key-value-0123456' }), { e: `refused ${REDACTED} and ${REDACTED}` }, 'and scrubbed anywhere')
})

t.test("the targets view shows each target's credentials as the credential layer describes them, never a secret", async t => {
  const crm = credentialDouble('crm')
  await crm.resolve({ ...keyOnlyCaller('alice', 'alice'), token: 'alice-token-0123456789' })
  crm.refuse('bob', 'step_up')
  await t.rejects(crm.resolve({ ...keyOnlyCaller('bob', 'bob'), token: 'bob-token-0123456789' }))
  crm.allow('bob')
  await crm.resolve({ ...keyOnlyCaller('bob', 'bob'), token: 'bob-token-0123456789' })
  const config = {
    mcp: {
      targets: [
        { name: 'crm', mcp: { url: 'https://crm.example/mcp', headers: {} } },
        { name: 'plain', mcp: { url: 'https://plain.example/mcp', headers: {} } },
      ],
    },
  } as unknown as GatewayConfig
  const { log } = memoryLogger()
  const state = createAdminState({
    loaded: { config, baseDir: '.', secretPaths: new Set() },
    plugins: [],
    routes: new RouteTable([]),
    endpoint: { sessions: () => [], endSession: () => false, describeTargets: () => [] },
    targets: [],
    requests: new RequestLog(),
    metrics: new Metrics(),
    log,
    mcpOrigin: 'http://127.0.0.1:1',
    version: 'test',
    credentials: brokerOf(crm),
  })
  const targets = state.targets() as Array<{ name: string; credentials: unknown }>
  t.match(targets[0], {
    name: 'crm',
    credentials: {
      mode: 'tokenExchange',
      headerNames: ['authorization', 'x-user'],
      envNames: ['USER_ID', 'CRM_TOKEN'],
      cached: 1,
      lastFailure: { reason: 'step_up' },
    },
  })
  t.equal(typeof (targets[0]!.credentials as { lastFailure: { at: unknown } }).lastFailure.at, 'number', 'when it failed')
  t.equal(targets[1]!.credentials, null, 'a target without auth')
  const text = JSON.stringify(targets)
  t.notMatch(text, /minted-|-token-0123456789/, 'no minted credential, no caller token')
})

t.test('RequestLog keeps the newest requests and ten-second buckets; decisionOf names the rule', async t => {
  const log = new RequestLog()
  const now = 1_800_000_000_000
  const rec = (over: Partial<AccessRecord>): AccessRecord => ({ id: 'x', method: 'POST', path: '/mcp', status: 200, durationMs: 10, at: now, ...over })
  for (let i = 0; i < 250; i++) log.add(rec({ id: String(i), at: now - 1000 }))
  log.add(rec({ id: 'last', status: 401, durationMs: 30, at: now, denial: { reason: 'unauthorized: no token' } }))
  const recent = log.recent()
  t.equal(recent.length, 200, 'bounded')
  t.equal(recent[0]!.id, 'last', 'newest first')
  const stats = log.stats(now)
  t.equal(stats.buckets.length, 30)
  t.equal(
    stats.buckets.reduce((a, b) => a + b.count, 0),
    251,
    'every request is counted in the stats'
  )
  t.equal(
    stats.buckets.reduce((a, b) => a + b.errors, 0),
    1
  )
  const last = stats.buckets[stats.buckets.length - 1]!
  t.ok(last.count >= 1 && last.maxMs === 30)
  t.same(
    log.stats(now + 600_000).buckets.filter(b => b.count > 0),
    [],
    'old seconds fall out of the window'
  )

  // Denials arrive structured (rule index, reason): nothing is parsed out of a string.
  t.same(decisionOf(rec({})), { decision: 'allowed', reason: null })
  t.same(decisionOf(rec({ status: 401, denial: { reason: 'unauthorized: no token' } })), { decision: 'unauthenticated', reason: 'unauthorized: no token' })
  t.same(decisionOf(rec({ status: 403, denial: { rule: 0, reason: RULE } })), { decision: 'forbidden', reason: `rule[0]: ${RULE}` })
  t.same(decisionOf(rec({ status: 200, denial: { rule: 0, reason: RULE } })), { decision: 'denied', reason: `rule[0]: ${RULE}` })
  t.same(decisionOf(rec({ status: 502 })), { decision: 'error', reason: null })
  t.same(
    decisionOf(rec({ status: 429, denial: 'rate-limited' as never })),
    { decision: 'error', reason: 'rate-limited' },
    'a JavaScript plugin that still sets a string is shown, not a crash'
  )
})

/** A raw request, so the Host and Origin headers are exactly what the test says. */
function raw(
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string }
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: opts.method ?? 'GET', headers: opts.headers }, res => {
      const chunks: Buffer[] = []
      res.on('data', c => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
    })
    req.on('error', reject)
    req.end(opts.body)
  })
}

t.test('whole gateway: admin API, decisions, try-it, metrics, no secrets', async t => {
  const g = await adminGateway(t)
  const auth = { authorization: `Bearer ${SECRETS.adminToken}` }

  await t.test('admin.token protects everything but /healthz and the stylesheet', async t => {
    t.equal((await fetch(g.admin + '/healthz')).status, 200)
    t.equal((await fetch(g.admin + '/ui/app.css')).status, 200)
    for (const p of ['/api/config', '/api/sessions', '/metrics', '/readyz', '/ui/app.js']) {
      const r = await fetch(g.admin + p)
      t.equal(r.status, 401, `${p} without token`)
      t.match(r.headers.get('www-authenticate') ?? '', /^Bearer /)
    }
    t.equal(
      (await fetch(g.admin + '/api/config', { headers: { authorization: 'Bearer admin-token-3b8e2d9f61c04a7X' } })).status,
      401,
      'a wrong token of the same length'
    )
    t.equal((await fetch(g.admin + '/api/config', { headers: { authorization: 'Bearer short' } })).status, 401, 'a wrong token of another length')
    t.equal((await fetch(g.admin + '/api/config?token=' + SECRETS.adminToken)).status, 401, 'a token in the URL is not accepted')
    const login = await fetch(g.admin + '/ui')
    t.equal(login.status, 200, 'the sign-in form')
    const form = await login.text()
    t.match(form, /<form method="post" action="\/ui\/login">/, 'the page offers a sign-in form')
    t.notMatch(form, /app\.js/, 'and nothing else')
    t.equal((await g.call('/api/config')).status, 200, 'the Bearer token works')
  })

  await t.test('sign-in sets an HttpOnly SameSite cookie that is not the token', async t => {
    const bad = await fetch(g.admin + '/ui/login', { method: 'POST', body: new URLSearchParams({ token: 'nope' }), redirect: 'manual' })
    t.equal(bad.status, 401)
    const ok = await fetch(g.admin + '/ui/login', { method: 'POST', body: new URLSearchParams({ token: SECRETS.adminToken }), redirect: 'manual' })
    t.equal(ok.status, 303)
    t.equal(ok.headers.get('location'), '/ui')
    const cookie = ok.headers.get('set-cookie') ?? ''
    t.match(cookie, /HttpOnly/)
    t.match(cookie, /SameSite=Strict/)
    t.notMatch(cookie, SECRETS.adminToken)
    const pair = cookie.split(';')[0]!
    const page = await fetch(g.admin + '/ui', { headers: { cookie: pair } })
    t.equal(page.status, 200)
    const csp = page.headers.get('content-security-policy') ?? ''
    t.match(csp, /script-src 'self'/)
    t.notMatch(csp, /unsafe-inline/, 'no inline script or style is allowed')
    t.equal((await fetch(g.admin + '/api/overview', { headers: { cookie: pair } })).status, 200)
    t.equal((await fetch(g.admin + '/api/overview', { headers: { cookie: 'mcpp_admin=forged' } })).status, 401)
    const crossSite = await fetch(g.admin + '/ui/login', {
      method: 'POST',
      headers: { origin: 'https://evil.example' },
      body: new URLSearchParams({ token: SECRETS.adminToken }),
      redirect: 'manual',
    })
    t.equal(crossSite.status, 403, 'a cross-origin sign-in is refused')
  })

  await t.test('Host and Origin checks', async t => {
    const rebound = await raw(g.admin + '/api/config', { headers: { ...auth, host: 'attacker.example:15000' } })
    t.equal(rebound.status, 421, 'a non-loopback Host is refused while bound to loopback (DNS rebinding)')
    t.equal((await raw(g.admin + '/api/config', { headers: { ...auth, host: 'localhost:1' } })).status, 200)
    const cross = await raw(g.admin + '/api/sessions/abcdefgh', { method: 'DELETE', headers: { ...auth, origin: 'http://attacker.example' } })
    t.equal(cross.status, 403, 'a state-changing request from another origin is refused')
    const tryForm = await g.call('/api/try', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' })
    t.equal(tryForm.status, 415, 'try-it accepts JSON only (no simple cross-site form posts)')
    t.equal((await g.call('/api/config', { method: 'POST' })).status, 405)
    t.equal((await g.call('/api/sessions/unknown-handle', { method: 'DELETE' })).status, 404)
    const badTry = await g.call('/api/try', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: 1 }) })
    t.equal(badTry.status, 400)
  })

  const metricsBefore = parsePrometheus(await (await g.call('/metrics')).text())

  // Traffic: no token (401), a token that fails the rule (403), a real SDK client (allowed).
  const noToken = await fetch(g.mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(noToken.status, 401)
  const bob = await fetch(g.mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${await g.bobToken()}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(bob.status, 403)
  const aliceToken = await g.aliceToken()
  const client = new Client({ name: 'admin-test', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(g.mcp), { requestInit: { headers: { authorization: `Bearer ${aliceToken}` } } })
  await client.connect(transport)
  t.teardown(() => client.close().catch(() => {}))
  const echoed = await client.callTool({ name: 'echo', arguments: { message: 'hello admin' } })
  t.match(JSON.stringify(echoed), /hello admin/)
  const fullSessionId = transport.sessionId!
  t.ok(fullSessionId.length > 8)
  // The target's auth block templates the child's environment from alice's claims (the real credential layer).
  const env = JSON.parse(((await client.callTool({ name: 'get-env', arguments: {} })) as { content: Array<{ text: string }> }).content[0]!.text) as Record<
    string,
    string
  >
  t.equal(env.MCP_PROXY_USER, 'alice', "the child runs with the caller's claims")
  t.equal(env.MCP_PROXY_GROUPS, 'mcp-users')
  const mallory = await fetch(g.mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${await g.malloryToken()}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(mallory.status, 403, 'a claim that cannot go into the environment refuses the session')
  t.match(await mallory.text(), /everything/, 'naming the target')

  await t.test('sessions and targets', async t => {
    const sessions = (await (await g.call('/api/sessions')).json()) as Array<Record<string, unknown>>
    t.equal(sessions.length, 1)
    const s = sessions[0]!
    t.equal(s.subject, 'alice')
    t.equal(s.handle, fullSessionId.slice(0, 8), 'the handle is the id prefix')
    t.equal(s.id, fullSessionId.slice(0, 8))
    t.same(s.targets, ['everything'])
    t.equal((s.pids as number[]).length, 1)
    const targets = (await (await g.call('/api/targets')).json()) as Array<Record<string, unknown>>
    t.equal(targets.length, 1)
    t.match(targets[0], { name: 'everything', kind: 'stdio', sessions: 1, pids: s.pids, failures: 0, lastError: null })
    t.ok((targets[0]!.started as number) >= 1)
    t.equal(targets[0]!.share, 'session', 'the default: one child per session')
    t.same(targets[0]!.pooled, [], 'nothing pooled for a session-era client of a per-session target')
    t.match(
      targets[0]!.credentials,
      { mode: 'claims', headerNames: [], envNames: ['MCP_PROXY_USER', 'MCP_PROXY_GROUPS'], lastFailure: { reason: 'claim' } },
      "the target's credentials: mode, env names, mallory's failure"
    )
    t.notMatch(JSON.stringify(targets), /mcp-users|alice-/, 'names only, never a value')
  })

  await t.test('recent requests carry the auth decision and the rule', async t => {
    const list = (await (await g.call('/api/requests')).json()) as Array<{
      status: number
      decision: string
      reason: string | null
      subject?: string
      mcpMethod?: string
    }>
    const unauth = list.find(r => r.status === 401)
    t.match(unauth, { decision: 'unauthenticated', reason: 'unauthorized: no token' })
    const forbidden = list.find(r => r.status === 403 && r.subject === 'bob')
    t.match(forbidden, { decision: 'forbidden', reason: `rule[0]: ${RULE}`, subject: 'bob' })
    const noCredential = list.find(r => r.status === 403 && r.subject === 'mallory')
    t.match(noCredential, { decision: 'forbidden', reason: 'MCPP_ERR_TARGET_CREDENTIAL' }, "a refused credential: the layer's code")
    const call = list.find(r => r.mcpMethod === 'tools/call')
    t.match(call, { decision: 'allowed', reason: null, subject: 'alice', status: 200 })
    const stats = (await (await g.call('/api/stats')).json()) as { buckets: Array<{ count: number }> }
    t.ok(stats.buckets.reduce((a, b) => a + b.count, 0) >= 4, 'the chart data counts the traffic')
  })

  await t.test('OAuth documents, key set and discovery state', async t => {
    const o = (await (await g.call('/api/oauth')).json()) as {
      documents: Record<string, Record<string, unknown>>
      keySet: Record<string, unknown>
      discovery: Record<string, unknown>
    }
    t.match(o.documents['/.well-known/oauth-protected-resource/mcp'], { resource: 'https://gateway.example.test/mcp', resource_type: 'mcp-server' })
    t.match(o.documents['/.well-known/oauth-authorization-server'], {
      issuer: g.idp!.issuer,
      registration_endpoint: 'https://gateway.example.test/.well-known/oauth-authorization-server/client-registration',
    })
    t.match(o.keySet, { loaded: true, kids: [g.idp!.currentKid] })
    t.match(o.discovery, { loaded: true, lastError: null })
    const ready = await g.call('/readyz')
    t.equal(ready.status, 200)
  })

  await t.test('try it: initialize -> tools/list -> tools/call with a pasted token, token never echoed or logged', async t => {
    const r = await g.call('/api/try', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token: aliceToken, tool: 'echo', arguments: { message: 'from try-it' } }),
    })
    t.equal(r.status, 200)
    const text = await r.text()
    const body = JSON.parse(text) as { steps: Array<{ step: string; status: number; result?: unknown }>; sessionEnded: boolean }
    t.same(
      body.steps.map(s => [s.step, s.status]),
      [
        ['initialize', 200],
        ['notifications/initialized', 202],
        ['tools/list', 200],
        ['tools/call', 200],
      ]
    )
    t.match(JSON.stringify(body.steps[3]!.result), /from try-it/)
    t.equal(body.sessionEnded, true, 'the try-it session is ended')
    t.notOk(text.includes(aliceToken), 'the token is not in the answer')
    const noTok = (await (await g.call('/api/try', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })).json()) as {
      steps: Array<{ status: number; challenge?: string }>
    }
    t.equal(noTok.steps.length, 1)
    t.equal(noTok.steps[0]!.status, 401)
    t.match(noTok.steps[0]!.challenge, /resource_metadata=/)
    t.notOk(g.logText().includes(aliceToken), 'the token is in no log line')
  })

  await t.test('metrics parse and move with traffic', async t => {
    const m = parsePrometheus(await (await g.call('/metrics')).text())
    for (const name of [
      'mcp_proxy_requests_total',
      'mcp_proxy_auth_failures_total',
      'mcp_proxy_authorization_denials_total',
      'mcp_proxy_upstream_duration_seconds',
      'mcp_proxy_sessions',
      'mcp_proxy_child_processes',
      'mcp_proxy_keyset_fetches_total',
      'mcp_proxy_keyset_keys',
      'mcp_proxy_discovery_fetches_total',
      'mcp_proxy_discovery_up',
      'mcp_proxy_ready',
    ]) {
      t.ok(m.has(name), `${name} is exported`)
    }
    t.equal(m.get('mcp_proxy_upstream_duration_seconds')!.type, 'histogram')
    const moved = (name: string, labels: Record<string, string> = {}): number => sampleSum(m, name, labels) - sampleSum(metricsBefore, name, labels)
    t.ok(moved('mcp_proxy_requests_total', { route: '/mcp', mcp_method: 'tools/call', status: '200' }) >= 2, 'requests by route, method and status')
    t.ok(moved('mcp_proxy_auth_failures_total', { reason: 'missing' }) >= 2, 'auth failures by reason')
    t.ok(moved('mcp_proxy_authorization_denials_total', { rule: '0' }) >= 1, 'denials by rule')
    t.ok(moved('mcp_proxy_upstream_duration_seconds_count', { target: 'everything', method: 'tools/call' }) >= 2, 'upstream latency by target and method')
    t.ok(moved('mcp_proxy_upstream_requests_total', { target: 'everything', method: 'tools/list', outcome: 'ok' }) >= 1)
    t.equal(sampleSum(m, 'mcp_proxy_sessions'), 1, 'one live session (try-it ended its own)')
    t.ok(sampleSum(m, 'mcp_proxy_child_processes') >= 1)
    t.equal(sampleSum(m, 'mcp_proxy_keyset_keys'), 1)
    t.ok(sampleSum(m, 'mcp_proxy_keyset_fetches_total') >= 1)
    t.ok(sampleSum(m, 'mcp_proxy_discovery_fetches_total') >= 1)
    t.equal(sampleSum(m, 'mcp_proxy_discovery_up'), 1)
    t.equal(sampleSum(m, 'mcp_proxy_ready'), 1)
  })

  await t.test('no secret and no whole session id in any admin answer', async t => {
    const paths = [
      '/ui',
      '/ui/app.js',
      '/api/overview',
      '/api/config',
      '/api/targets',
      '/api/sessions',
      '/api/requests',
      '/api/stats',
      '/api/plugins',
      '/api/oauth',
      '/api/ready',
      '/metrics',
      '/readyz',
    ]
    for (const p of paths) {
      const text = await (await g.call(p)).text()
      for (const [name, secret] of Object.entries(SECRETS)) t.notOk(text.includes(secret), `${p} does not contain ${name}`)
      t.notOk(text.includes(fullSessionId), `${p} does not contain the whole session id`)
      t.notOk(text.includes(aliceToken), `${p} does not contain a bearer token`)
    }
    const config = (await (await g.call('/api/config')).json()) as {
      mcp: { targets: Array<{ stdio: { env: Record<string, string> } }> }
      admin: { token: string }
    }
    t.same(config.mcp.targets[0]!.stdio.env, { UPSTREAM_API_KEY: REDACTED, VISIBLE_SETTING: REDACTED })
    t.equal(config.admin.token, REDACTED)
  })

  await t.test('ending a session by its handle: the client then gets 404', async t => {
    const r = await g.call(`/api/sessions/${fullSessionId.slice(0, 8)}`, { method: 'DELETE' })
    t.equal(r.status, 200)
    const err = (await client.listTools().then(
      () => undefined,
      (e: unknown) => e
    )) as { code?: unknown } | undefined
    t.equal(err?.code, 404, 'the SDK client sees HTTP 404')
    t.same(await (await g.call('/api/sessions')).json(), [])
  })
})

t.test('/readyz answers 503 until the key set and the IdP metadata are loaded', async t => {
  // An issuer on a port where nothing listens: every fetch fails fast.
  const port = await new Promise<number>(resolve => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port
      s.close(() => resolve(p))
    })
  })
  const g = await adminGateway(t, { issuer: `http://127.0.0.1:${port}/application/o/mcp/` })
  const r = await g.call('/readyz')
  t.equal(r.status, 503)
  const body = (await r.json()) as { status: string; reasons: string[] }
  t.equal(body.status, 'not ready')
  t.ok(
    body.reasons.some(x => x.startsWith('mcpAuthentication:')),
    'the key set is named'
  )
  t.ok(
    body.reasons.some(x => x.startsWith('providerBridge:')),
    'the discovery document is named'
  )
  t.equal((await g.call('/healthz')).status, 200, 'alive all the same')
  const overview = (await (await g.call('/api/overview')).json()) as { ready: boolean }
  t.equal(overview.ready, false)
  const m = parsePrometheus(await (await g.call('/metrics')).text())
  t.equal(sampleSum(m, 'mcp_proxy_ready'), 0)
  t.equal(sampleSum(m, 'mcp_proxy_discovery_up'), 0)
  t.ok(sampleSum(m, 'mcp_proxy_keyset_fetches_total', { result: 'error' }) >= 1, 'key-set fetch errors are counted')
})
