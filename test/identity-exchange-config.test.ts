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

t.test(
  'credentials over http to a host that is not loopback: exit 1 naming the target, in --check and at start-up; allowed with allowInsecureHttp',
  async t => {
    const port = await freePort()
    const insecure = (extra: string[]): string[] => [
      '    - name: crm',
      '      mcp: { url: "http://crm.example.test/mcp" }',
      '      auth:',
      '        bearer: ${STATIC_KEY}',
      ...extra,
    ]
    const file = await configFile(config(port, insecure([])))
    for (const args of [
      ['-f', file, '--check'],
      ['-f', file],
    ]) {
      const r = await runCli(args, ENV, 20_000)
      t.equal(r.code, 1, `${args.join(' ')}: exit 1 (${r.stderr.trim()})`)
      t.match(r.stderr, /mcp\.targets\[0\]/, 'the message names the target path')
      t.match(r.stderr, /https|allowInsecureHttp/, 'and what to do about it')
      t.notOk(r.stderr.includes(ENV.STATIC_KEY), 'never the secret')
    }
    t.equal(await canConnect(port), false, 'nothing listens')

    const allowed = await configFile(config(port, insecure(['        allowInsecureHttp: true'])))
    const ok = await runCli(['-f', allowed, '--check'], ENV, 20_000)
    t.equal(ok.code, 0, `allowInsecureHttp: true is accepted (${ok.stderr.trim()})`)
    t.match(ok.stdout, /config OK/)
    t.notOk(ok.stdout.includes(ENV.STATIC_KEY))

    const loopback = await configFile(
      config(port, ['    - name: crm', '      mcp: { url: "http://127.0.0.1:9/mcp" }', '      auth:', '        bearer: ${STATIC_KEY}'])
    )
    const lo = await runCli(['-f', loopback, '--check'], ENV, 20_000)
    t.equal(lo.code, 0, `http to loopback needs no override (${lo.stderr.trim()})`)
  }
)

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
  for (const c of cases) {
    const file = await configFile(config(port, c.target))
    const check = await runCli(['-f', file, '--check'], ENV, 20_000)
    t.equal(check.code, 1, `${c.what}: --check exit 1 (${check.stderr.trim()})`)
    t.match(check.stderr, c.path, `${c.what}: names the path`)
    t.notOk(check.stderr.includes(ENV.EXCHANGE_SECRET), 'never the secret')
  }
  const start = await runCli(['-f', await configFile(config(port, cases[1]!.target))], ENV, 20_000)
  t.equal(start.code, 1, 'start-up agrees with --check')
  t.match(start.stderr, cases[1]!.path)
  t.equal(await canConnect(port), false)
})
