/**
 * The `auth` block of mcp.targets[] through the real CLI (issue 25 "config
 * errors"): what the schema refuses (two modes, an exchange without the
 * gateway's credential, an empty block, a typo) and what the credential
 * layer's checks refuse (headers on stdio, env on http, {credential} without
 * an exchange, invalid or reserved header names, placeholders that are not
 * claim paths, plain http beyond loopback, a key that is no key, variables
 * that change how a child runs, caller-dependent auth without an
 * authenticating stage), each naming its path, in --check and at start-up
 * alike (exit 1, nothing listening); and the configs that pass.
 */
import t from 'tap'
import { generateKeyPairSync } from 'node:crypto'
import { runCli, configFile, freePort, canConnect } from './helpers/cli.ts'

const AUTHENTICATION = [
  '  policies:',
  '    mcpAuthentication:',
  '      mode: strict',
  '      issuer: https://idp.example.test/app/',
  '      audiences: [c1]',
  '      jwks: https://idp.example.test/app/jwks/',
  '      resourceMetadata: { resource: "https://gw.example.test/mcp", scopesSupported: [openid] }',
]

/** A config with `targets` (YAML lines under `targets:`), with or without an authentication stage. */
async function config(targets: string[], opts: { authentication?: boolean; port?: number } = {}): Promise<string> {
  return configFile(
    [
      'mcp:',
      `  port: ${opts.port ?? 0}`,
      '  host: 127.0.0.1',
      ...(opts.authentication === false ? [] : AUTHENTICATION),
      '  targets:',
      ...targets.map(l => '    ' + l),
      'admin: { enabled: false }',
      '',
    ].join('\n')
  )
}

const EXCHANGE = 'tokenExchange: { tokenEndpoint: "https://idp.example.test/token", clientId: gw, clientSecret: "${MCPP_TEST_SECRET}", audience: [crm] }'
const ENV = { MCPP_TEST_SECRET: 'exchange-secret-value-0123456789' }

t.test('the schema: one credential mode per target, the exchange needs the gateway credential, no empty block, typos named', async t => {
  const file = await config([
    '- name: two',
    '  mcp: { url: "https://two.example/mcp" }',
    '  auth: { bearer: x, apiKey: { header: X-Key, value: y } }',
    '- name: nocred',
    '  mcp: { url: "https://nocred.example/mcp" }',
    '  auth: { tokenExchange: { tokenEndpoint: "https://idp.example.test/token", clientId: gw } }',
    '- name: both',
    '  mcp: { url: "https://both.example/mcp" }',
    '  auth:',
    '    onBehalfOf:',
    '      tokenEndpoint: https://login.example.test/t/oauth2/v2.0/token',
    '      clientId: gw',
    '      clientSecret: s',
    '      privateKey: { pem: x }',
    '      scope: api://crm/.default',
    '- name: empty',
    '  mcp: { url: "https://empty.example/mcp" }',
    '  auth: {}',
    '- name: typo',
    '  mcp: { url: "https://typo.example/mcp" }',
    '  auth: { tokenExchange: { tokenEndpoint: "https://idp.example.test/token", clientId: gw, clientSecret: s, audence: [crm] } }',
    '- name: noscope',
    '  mcp: { url: "https://noscope.example/mcp" }',
    '  auth: { onBehalfOf: { tokenEndpoint: "https://idp.example.test/token", clientId: gw, clientSecret: s } }',
  ])
  const r = await runCli(['-f', file, '--check'], {}, 20000)
  t.equal(r.code, 1, r.stderr)
  t.match(r.stderr, 'mcp.targets[0].auth: must have at most one of tokenExchange, onBehalfOf, bearer, apiKey (one credential mode per target)')
  t.match(r.stderr, "mcp.targets[1].auth.tokenExchange: must have exactly one of clientSecret, privateKey (the gateway's own client credential)")
  t.match(r.stderr, "mcp.targets[2].auth.onBehalfOf: must have exactly one of clientSecret, privateKey (the gateway's own client credential)")
  t.match(r.stderr, 'mcp.targets[3].auth: must set a credential mode (tokenExchange, onBehalfOf, bearer, apiKey) or headers / env')
  t.match(r.stderr, 'mcp.targets[4].auth.tokenExchange.audence: unknown key (did you mean "audience"?)')
  t.match(r.stderr, 'mcp.targets[5].auth.onBehalfOf.scope: is required')
})

t.test('what the checks refuse, each naming its path, in --check and at start-up alike', async t => {
  const port = await freePort()
  const pem = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()
  const file = await config(
    [
      '- name: stdio-headers',
      '  stdio: { cmd: node, env: { OWN: x } }',
      '  auth: { headers: { X-User: "{sub}" }, env: { OWN: "{sub}", LD_PRELOAD: "{sub}", "1BAD": "{sub}" } }',
      '- name: http-env',
      '  mcp: { url: "https://http-env.example/mcp" }',
      '  auth: { env: { USER_ID: "{sub}" } }',
      '- name: no-exchange',
      '  mcp: { url: "https://no-exchange.example/mcp" }',
      '  auth: { headers: { X-Token: "{credential}" } }',
      '- name: names',
      '  mcp: { url: "https://names.example/mcp", headers: { X-Static: a } }',
      '  auth:',
      '    bearer: b',
      '    headers: { "X User": "{sub}", Mcp-Session-Id: "{sub}", Authorization: "{sub}", Mcp-Param-Region: "{sub}", X-Static: "{sub}", X-Path: "{sub name}", X-Open: "{sub" }',
      '- name: plain-http',
      '  mcp: { url: "http://crm.internal.example/mcp" }',
      '  auth: { bearer: b }',
      '- name: plain-idp',
      '  mcp: { url: "https://plain-idp.example/mcp" }',
      '  auth: { tokenExchange: { tokenEndpoint: "http://idp.internal.example/token", clientId: gw, clientSecret: s } }',
      '- name: keys',
      '  mcp: { url: "https://keys.example/mcp" }',
      `  auth: { onBehalfOf: { tokenEndpoint: "https://login.example.test/t/token", clientId: gw, privateKey: { pem: ${JSON.stringify(pem)}, alg: RS256 }, scope: "api://x/.default" } }`,
      '- name: not-a-key',
      '  mcp: { url: "https://not-a-key.example/mcp" }',
      '  auth: { onBehalfOf: { tokenEndpoint: "https://login.example.test/t/token", clientId: gw, privateKey: { pem: "not a pem" }, scope: "api://x/.default" } }',
      '- name: wrong-method',
      '  mcp: { url: "https://wrong-method.example/mcp" }',
      '  auth: { tokenExchange: { tokenEndpoint: "https://idp.example.test/token", clientId: gw, clientSecret: s, clientAuthMethod: private_key_jwt } }',
      '- name: stdio-exchange',
      '  stdio: { cmd: node }',
      '  auth: { tokenExchange: { tokenEndpoint: "https://idp.example.test/token", clientId: gw, clientSecret: s }, env: { USER_ID: "{sub}" } }',
      '- name: stdio-bearer',
      '  stdio: { cmd: node }',
      '  auth: { bearer: b }',
    ],
    { port }
  )
  const expected = [
    'mcp.targets[0].auth.headers: a stdio target takes no headers; put what the child needs in auth.env',
    'mcp.targets[0].auth.env.OWN: also set in stdio.env; keep one of the two',
    "mcp.targets[0].auth.env.LD_PRELOAD: LD_PRELOAD changes how the child runs and is never filled from a caller's token",
    'mcp.targets[0].auth.env.1BAD: not a valid environment variable name',
    'mcp.targets[1].auth.env: an HTTP target takes no environment; put what it needs in auth.headers',
    'mcp.targets[2].auth.headers.X-Token: {credential} is the token minted by tokenExchange or onBehalfOf, and this target has neither',
    'mcp.targets[3].auth.headers.X User: "X User" is not a valid header name',
    'mcp.targets[3].auth.headers.Mcp-Session-Id: Mcp-Session-Id is set by the gateway itself and cannot carry a credential',
    "mcp.targets[3].auth.headers.Authorization: Authorization is already set by this target's credential mode",
    'mcp.targets[3].auth.headers.Mcp-Param-Region: Mcp-Param-Region is set by the gateway itself',
    'mcp.targets[3].auth.headers.X-Static: X-Static is also a static header in mcp.headers; keep one of the two',
    'mcp.targets[3].auth.headers.X-Path: placeholder {sub name} is not a claim path',
    'mcp.targets[3].auth.headers.X-Open: an unclosed "{" at 0',
    'mcp.targets[4].auth: credentials would go over plain http to crm.internal.example; use https, or set auth.allowInsecureHttp: true',
    "mcp.targets[5].auth.tokenExchange.tokenEndpoint: the caller's token and the gateway's credentials would go over plain http",
    'mcp.targets[6].auth.onBehalfOf.privateKey.pem: RS256 needs an RSA key, this is ec',
    'mcp.targets[7].auth.onBehalfOf.privateKey.pem: is not a PEM private key',
    'mcp.targets[8].auth.tokenExchange.clientAuthMethod: private_key_jwt needs privateKey',
    'mcp.targets[9].auth.tokenExchange: a stdio child receives the minted token only through auth.env ("{credential}"), and none uses it',
    'mcp.targets[10].auth.bearer: a stdio target takes no headers',
  ]
  for (const args of [
    ['-f', file, '--check'],
    ['-f', file],
  ]) {
    const r = await runCli(args, {}, 20000)
    t.equal(r.code, 1, `${args.join(' ')}: ${r.stderr}`)
    for (const line of expected) t.match(r.stderr, line, line.slice(0, 40))
    t.notMatch(r.stderr, pem.split('\n')[1]!, 'the key is never repeated')
    t.notMatch(r.stderr, 'not a pem', 'nor what stood in its place')
    t.notMatch(r.stderr, /mcp\.targets\[(4|6|10)\]\.auth\.headers/, 'targets without problems of that kind are not named for them')
  }
  t.equal(await canConnect(port), false, 'nothing listens after a refused start-up')
})

t.test('caller-dependent auth without an authenticating stage fails closed; static secrets need none', async t => {
  const perCaller = await config(
    [
      '- name: crm',
      '  mcp: { url: "https://crm.example/mcp" }',
      `  auth: { ${EXCHANGE} }`,
      '- name: claims',
      '  mcp: { url: "https://claims.example/mcp" }',
      '  auth: { headers: { X-User: "{sub}" } }',
      '- name: legacy',
      '  mcp: { url: "https://legacy.example/mcp" }',
      '  auth: { bearer: "${MCPP_TEST_SECRET}", headers: { X-Gateway: mcp-proxy } }',
    ],
    { authentication: false }
  )
  const r = await runCli(['-f', perCaller, '--check'], ENV, 20000)
  t.equal(r.code, 1, r.stderr)
  t.match(r.stderr, /mcp\.targets\[0\]\.auth: the credential is made from the caller's token, but no stage of the pipeline authenticates callers/)
  t.match(r.stderr, /mcp\.targets\[1\]\.auth: the credential is made from the caller's token, but no stage/)
  t.notMatch(r.stderr, /mcp\.targets\[2\]/, 'a static secret and constant headers depend on no caller')
  t.notMatch(r.stderr, ENV.MCPP_TEST_SECRET)

  const staticOnly = await config(['- name: legacy', '  mcp: { url: "https://legacy.example/mcp" }', '  auth: { bearer: "${MCPP_TEST_SECRET}" }'], {
    authentication: false,
  })
  const ok = await runCli(['-f', staticOnly, '--check'], ENV, 20000)
  t.equal(ok.code, 0, ok.stderr)
})

t.test('configs that pass: every mode with an authenticating stage, loopback http, http beyond loopback when allowed', async t => {
  const file = await config([
    '- name: crm',
    '  mcp: { url: "https://crm.example/mcp" }',
    `  auth: { ${EXCHANGE}, headers: { X-User: "{sub}", X-Groups: "{groups}", X-Token-Copy: "{credential}" } }`,
    '- name: graph',
    '  mcp: { url: "https://graph.example/mcp" }',
    '  auth: { onBehalfOf: { tokenEndpoint: "https://login.example.test/t/oauth2/v2.0/token", clientId: gw, clientSecret: s, scope: "api://graph/.default" } }',
    '- name: local',
    '  mcp: { url: "http://127.0.0.1:9/mcp" }',
    '  auth: { tokenExchange: { tokenEndpoint: "http://localhost:9/token", clientId: gw, clientSecret: s }, headers: { Authorization-Hint: "{sub}" } }',
    '- name: lan',
    '  mcp: { url: "http://crm.lan.example/mcp" }',
    '  auth: { apiKey: { header: Authorization, value: "Token ${MCPP_TEST_SECRET}" }, allowInsecureHttp: true }',
    '- name: tools',
    '  stdio: { cmd: node, share: subject }',
    `  auth: { ${EXCHANGE}, env: { USER_ID: "{sub}", CRM_TOKEN: "{credential}" } }`,
    '- name: internal',
    '  mcp: { url: "https://internal.example/mcp" }',
    '  auth: { headers: { X-User: "{sub}", X-Groups: "{groups}" } }',
    '- name: legacy',
    '  mcp: { url: "https://svc:literal-url-password@legacy.example/mcp" }',
    '  auth: { bearer: "${MCPP_TEST_SECRET}" }',
    '- name: reports',
    '  stdio: { cmd: node, args: [reports.js, "${MCPP_TEST_SECRET}"] }',
    '  auth: { env: { USER_ID: "{sub}" } }',
    '- name: plain',
    '  mcp: { url: "https://plain.example/mcp" }',
  ])
  const r = await runCli(['-f', file, '--check'], ENV, 20000)
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /config OK/)
  // Each target with its credential mode and the names it sets, in config order.
  const lines = r.stdout.split('\n').filter(l => /^ {4}\w+: (http|stdio) /.test(l))
  t.same(lines, [
    '    crm: http https://crm.example/mcp, auth tokenExchange (Authorization, X-User, X-Groups, X-Token-Copy)',
    '    graph: http https://graph.example/mcp, auth onBehalfOf (Authorization)',
    '    local: http http://127.0.0.1:9/mcp, auth tokenExchange (Authorization, Authorization-Hint)',
    '    lan: http http://crm.lan.example/mcp, auth apiKey (Authorization)',
    '    tools: stdio node, share subject, auth tokenExchange (env USER_ID, CRM_TOKEN)',
    '    internal: http https://internal.example/mcp, auth claims (X-User, X-Groups)',
    '    legacy: http https://legacy.example/mcp, auth bearer (Authorization)',
    '    reports: stdio node reports.js [redacted], auth claims (env USER_ID)',
    '    plain: http https://plain.example/mcp',
  ])
  t.notMatch(r.stdout + r.stderr, ENV.MCPP_TEST_SECRET)
  t.notMatch(r.stdout, 'literal-url-password', "a URL's userinfo is not printed")
})
