/**
 * Issue 25 from the outside, configuration: the real CLI refuses a target's
 * `auth` block that could not be safe, with exit 1 and the path of the
 * offending setting, in `--check` and at start-up alike (nothing listens):
 * credentials over plain http to a host that is not loopback (unless
 * `allowInsecureHttp: true`), `{credential}` without an exchange mode,
 * headers on a stdio target. (The full list is core/credentials' own tests.)
 */
import t from 'tap'
import { canConnect, configFile, freePort, runCli } from './helpers/cli.ts'

const IDP = 'https://idp.example.test/application/o/mcp/'

/** A config with mcpAuthentication (the caller's identity exists) and `target` as its only target. */
function config(port: number, target: string[]): string {
  return [
    'mcp:',
    '  host: 127.0.0.1',
    `  port: ${port}`,
    '  policies:',
    '    mcpAuthentication:',
    '      mode: strict',
    `      issuer: ${IDP}`,
    '      audiences: [mcp-gateway-dev]',
    '      provider: { oss_idp: {} }',
    '      clientId: mcp-gateway-dev',
    '      resourceMetadata: { resource: "https://gw.example.test/mcp" }',
    '  targets:',
    ...target,
    'admin: { enabled: false }',
    '',
  ].join('\n')
}

const exchange = [
  '        tokenExchange:',
  `          tokenEndpoint: ${IDP}token/`,
  '          clientId: mcp-gateway-exchange',
  '          clientSecret: ${EXCHANGE_SECRET}',
  '          audience: [crm]',
]
const ENV = { EXCHANGE_SECRET: 'exchange-client-secret-for-config-tests', STATIC_KEY: 'static-key-for-config-tests' }

t.test('credentials over http beyond loopback: exit 1 naming the path, in --check and at start-up; allowInsecureHttp allows it', async t => {
  const port = await freePort()
  const insecure = (extra: string[]): string[] => [
    '    - name: crm',
    '      mcp: { url: "http://crm.example.test/mcp" }',
    '      auth:',
    '        bearer: ${STATIC_KEY}',
    ...extra,
  ]
  const [file, allowed] = await Promise.all([configFile(config(port, insecure([]))), configFile(config(port, insecure(['        allowInsecureHttp: true'])))])
  // Loopback needs no override: every other identity-exchange test runs its targets on http://127.0.0.1.
  const [check, start, ok] = await Promise.all([
    runCli(['-f', file, '--check'], ENV, 30_000),
    runCli(['-f', file], ENV, 30_000),
    runCli(['-f', allowed, '--check'], ENV, 30_000),
  ])
  for (const [what, r] of [
    ['--check', check],
    ['start-up', start],
  ] as const) {
    t.equal(r.code, 1, `${what}: exit 1 (${r.stderr.trim()})`)
    t.match(r.stderr, /mcp\.targets\[0\]\.auth/, `${what}: the message names the path`)
    t.match(r.stderr, /https|allowInsecureHttp/, `${what}: and what to do about it`)
    t.notOk(r.stderr.includes(ENV.STATIC_KEY), `${what}: never the secret`)
  }
  t.equal(await canConnect(port), false, 'nothing listens')
  t.equal(ok.code, 0, `allowInsecureHttp: true is accepted (${ok.stderr.trim()})`)
  t.match(ok.stdout, /config OK/)
  t.notOk(ok.stdout.includes(ENV.STATIC_KEY))
})

t.test('{credential} without an exchange mode, and headers on a stdio target: exit 1 naming the path', async t => {
  const port = await freePort()
  const cases = [
    {
      what: '{credential} without tokenExchange or onBehalfOf',
      target: [
        '    - name: tools',
        `      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [x.js], share: subject }`,
        '      auth:',
        "        env: { USER_ID: '{sub}', CRM_TOKEN: '{credential}' }",
      ],
      path: /mcp\.targets\[0\]\.auth\.env\.CRM_TOKEN/,
    },
    {
      what: 'headers on a stdio target',
      target: [
        '    - name: tools',
        `      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [x.js], share: subject }`,
        '      auth:',
        ...exchange,
        "        headers: { X-User: '{sub}' }",
      ],
      path: /mcp\.targets\[0\]\.auth\.headers/,
    },
  ]
  const results = await Promise.all(cases.map(async c => runCli(['-f', await configFile(config(port, c.target)), '--check'], ENV, 30_000)))
  cases.forEach((c, i) => {
    const check = results[i]!
    t.equal(check.code, 1, `${c.what}: --check exit 1 (${check.stderr.trim()})`)
    t.match(check.stderr, c.path, `${c.what}: names the path`)
    t.notOk(check.stderr.includes(ENV.EXCHANGE_SECRET), 'never the secret')
  })
})
