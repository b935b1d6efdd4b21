/**
 * Issue 25 from the outside, redaction: the real CLI at logging level debug
 * through a whole flow (two users log in with the SDK clients, calls to an
 * HTTP target with token exchange and claim headers, to a stdio target that
 * gets the minted token in its environment, to a target with a static
 * bearer). Then the log, GET /metrics, every admin API route and the admin
 * UI's page and script are searched for the exchange client's secret, the
 * static key, the clients' tokens and every token the IdP minted: none is there.
 */
import t from 'tap'
import {
  ENV_SERVER,
  EXCHANGE_SECRET,
  exchangeCount,
  exchangeIdp,
  exchangeYaml,
  gatewayPorts,
  identityServer,
  jwtServer,
  loginSdk1,
  loginSdk2,
  sha256,
  startCliGateway,
  toolJson,
  gatewayHeadYaml,
  exchangeTargetYaml,
} from './helpers/identity-e2e.ts'

const STATIC_KEY = 'static-upstream-key-1f9b7c3e5a'
/** Anything shaped like a JWT (header.payload.signature, base64url). */
const JWT = /eyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}/g
const ADMIN_ROUTES = [
  '/api/overview',
  '/api/config',
  '/api/targets',
  '/api/sessions',
  '/api/requests',
  '/api/stats',
  '/api/plugins',
  '/api/oauth',
  '/api/ready',
]

t.test('debug log, /metrics, the admin API and UI never hold a secret or a token', async t => {
  const idp = await exchangeIdp(t, ['crm', 'tools'])
  const [crm, legacy] = await Promise.all([jwtServer(t, idp, 'crm'), identityServer(t, ['--static-bearer', STATIC_KEY])])
  const ports = await gatewayPorts()
  const yaml = [
    ...gatewayHeadYaml(idp, ports),
    ...exchangeTargetYaml(idp, 'crm', crm.url),
    "        headers: { X-User: '{sub}', X-Groups: '{groups}' }",
    '    - name: tools',
    `      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(ENV_SERVER)}, USER_ID, CRM_TOKEN], share: subject }`,
    '      auth:',
    ...exchangeYaml(idp, 'tools'),
    "        env: { USER_ID: '{sub}', CRM_TOKEN: '{credential}' }",
    '    - name: legacy',
    `      mcp: { url: ${JSON.stringify(legacy.url)} }`,
    '      auth: { bearer: "${STATIC_KEY}" }',
    `admin: { host: 127.0.0.1, port: ${ports.admin} }`,
    'logging: { level: debug }',
    '',
  ].join('\n')
  const gw = await startCliGateway(t, yaml, { EXCHANGE_SECRET, STATIC_KEY }, ports)

  const alice = await loginSdk1(t, gw.url, 'alice')
  const bob = await loginSdk2(t, gw.url, 'bob', true)
  const minted: string[] = []
  for (const [who, call] of [
    ['alice', (name: string) => alice.client.callTool({ name, arguments: {} })],
    ['bob', (name: string) => bob.client.callTool({ name, arguments: {} })],
  ] as const) {
    t.equal(toolJson(await call('crm_whoami')).sub, who, `${who}: crm called as ${who}`)
    const env = toolJson(await call('tools_env'))
    t.equal(env.env?.USER_ID, who, `${who}: the stdio child is ${who}'s`)
    minted.push(env.env.CRM_TOKEN as string)
    t.equal(toolJson(await call('legacy_whoami')).bearerSha256, sha256(STATIC_KEY), `${who}: the static key reached its target`)
  }
  t.equal(exchangeCount(idp), 4, 'four tokens minted (two users, two targets): the flow really exchanged')

  const texts: Array<[string, string]> = [['log', gw.output()]]
  texts.push(['/metrics', await (await fetch(`${gw.admin}/metrics`)).text()])
  for (const route of ADMIN_ROUTES) {
    const res = await fetch(gw.admin + route)
    t.equal(res.status, 200, `${route} answers`)
    texts.push([route, await res.text()])
  }
  for (const page of ['/ui', '/ui/app.js']) texts.push([page, await (await fetch(gw.admin + page)).text()])

  const targets = texts.find(([n]) => n === '/api/targets')![1]
  t.match(targets, /tokenExchange/, '/api/targets says which credential mode each target uses')
  t.match(targets, /X-User/, 'and the header names it sets')
  t.match(targets, /CRM_TOKEN/, 'and the environment names')

  // The whole log: the gateway stopped, its output read to the end.
  await gw.stop()
  texts[0] = ['log', gw.output()]
  t.match(texts[0][1], /"level":"debug"/, 'the log is at debug')
  t.match(texts[0][1], /token minted/, 'and tells of the exchanges')

  const clientTokens = [alice.token, bob.token]
  const secrets: Array<[string, string]> = [
    ['the exchange client secret', EXCHANGE_SECRET],
    ['the static key', STATIC_KEY],
    ...clientTokens.flatMap(
      (tok, i): Array<[string, string]> => [
        [`client token ${i}`, tok],
        [`client token ${i} signature`, tok.split('.')[2]!],
      ]
    ),
    ...minted.flatMap(
      (tok, i): Array<[string, string]> => [
        [`minted token ${i}`, tok],
        [`minted token ${i} signature`, tok.split('.')[2]!],
      ]
    ),
  ]
  const crmHashes = new Set(await crm.seen())
  t.equal(crmHashes.size, 2, 'the HTTP target got two minted tokens (known here by their hashes)')
  for (const [where, text] of texts) {
    const leaked = secrets.filter(([, value]) => text.includes(value)).map(([what]) => what)
    t.same(leaked, [], `${where}: no secret, no token`)
    const jwts = text.match(JWT) ?? []
    t.same(
      jwts.filter(j => crmHashes.has(sha256(j))),
      [],
      `${where}: none of the tokens minted for the HTTP target`
    )
    t.same(jwts, [], `${where}: nothing shaped like a JWT at all`)
  }
})
