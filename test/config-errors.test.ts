/**
 * Config errors all at once (issue 18 item 5): every unset variable and every
 * bad rule in one run, shell-style `${NAME:-default}` / `${NAME:?message}`,
 * words instead of raw regexes and errno codes. Unit tests on the parser and
 * the real CLI with --check.
 */
import t from 'tap'
import { parseConfigText, validateConfig, loadConfig } from '../core/config.ts'
import { compileRules } from '../plugins/authorization/rules.ts'
import { builtins } from '../plugins/index.ts'
import type { ProxyError } from '../core/errors.ts'
import { runCli, configFile } from './helpers/cli.ts'

const TARGETS = '  targets:\n    - name: a\n      stdio: { cmd: node }\n'

t.test('every unset variable is reported in one error, each with the SPEC message and its path', async t => {
  const err = t.throws(() =>
    parseConfigText('mcp:\n  baseUrl: "${MCPP_A_UNSET}"\n  host: "${MCPP_B_UNSET}"\n  targets:\n    - name: "${MCPP_C_UNSET}"\n', {})
  ) as unknown as ProxyError
  t.equal(err.code, 'MCPP_ERR_ENV_NOT_FOUND')
  t.match(err.message, /environment variable not found: MCPP_A_UNSET \(referenced at mcp\.baseUrl\)/)
  t.match(err.message, /environment variable not found: MCPP_B_UNSET \(referenced at mcp\.host\)/)
  t.match(err.message, /environment variable not found: MCPP_C_UNSET \(referenced at mcp\.targets\[0\]\.name\)/)
  t.equal((err.data?.problems as string[]).length, 3)
})

t.test('${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message} follow the shell', async t => {
  const env = { SET: 'v', EMPTY: '' }
  const expand = (ref: string): unknown => (parseConfigText(`x: "${ref}"\n`, env).data as { x: unknown }).x
  t.equal(expand('${SET:-d}'), 'v')
  t.equal(expand('${UNSET:-d}'), 'd', ':- when unset')
  t.equal(expand('${EMPTY:-d}'), 'd', ':- when empty')
  t.equal(expand('${EMPTY-d}'), '', '- only when unset: empty stays empty')
  t.equal(expand('${UNSET-d}'), 'd')
  t.equal(expand('${UNSET:-}'), '', 'an empty default')
  t.equal(expand('${UNSET:-http://a:1/x}'), 'http://a:1/x', 'the word is literal, colons included')
  t.equal(expand('${SET:?needed}'), 'v')
  t.equal(expand('${EMPTY?needed}'), '', '? only when unset')
  t.throws(() => expand('${UNSET:?set it to the IdP URL}'), {
    code: 'MCPP_ERR_ENV_NOT_FOUND',
    message: /environment variable not found: UNSET \(referenced at x\): set it to the IdP URL/,
  })
  t.throws(() => expand('${EMPTY:?must not be empty}'), {
    code: 'MCPP_ERR_ENV_NOT_FOUND',
    message: /environment variable is empty: EMPTY \(referenced at x\): must not be empty/,
  })
  t.throws(() => expand('${UNSET?}'), { message: /environment variable not found: UNSET \(referenced at x\)$/ })
  const port = parseConfigText('port: ${PORT:-8080}\n', {}).data as { port: unknown }
  t.equal(port.port, 8080, 'a plain whole reference with a default may still become a number')
  t.throws(() => parseConfigText('x: "${1BAD:-a}"\n', {}), { code: 'MCPP_ERR_CONFIG', message: /x: invalid environment reference/ })
})

t.test('every bad rule is reported in one error', async t => {
  const err = t.throws(() => compileRules(['true', '"a" in jwt.groups &&', 'jwt.__proto__ == 1', 'false'])) as unknown as ProxyError
  t.equal(err.code, 'MCPP_ERR_CONFIG')
  t.match(err.message, /mcp\.policies\.authorization\.rules\[1\]: syntax error/)
  t.match(err.message, /mcp\.policies\.authorization\.rules\[2\]:/)
  t.equal((err.data?.problems as string[]).length, 2)
})

t.test('schema patterns are worded, not shown as regexes', async t => {
  const err = (await t.rejects(
    validateConfig({
      mcp: {
        port: 0,
        baseUrl: 'https://gw.example/x',
        targets: [
          { name: 'my_target', stdio: { cmd: 'node' } },
          { name: 'b', mcp: { url: 'ftp://x' } },
        ],
      },
    })
  )) as unknown as ProxyError
  t.match(err.message, /mcp\.targets\[0\]\.name: letters, digits and '-' only/)
  t.match(err.message, /mcp\.baseUrl: must be an http\(s\) origin only/)
  t.match(err.message, /mcp\.targets\[1\]\.mcp\.url: must be an http\(s\) URL/)
  t.notMatch(err.message, /must match pattern/)
  const auth = (await t.rejects(
    validateConfig(
      {
        mcp: {
          port: 0,
          targets: [{ name: 'a', stdio: { cmd: 'node' } }],
          policies: { mcpAuthentication: { mode: 'optional', issuer: 'urn:x', jwks: 'urn:y', resourceMetadata: { resource: 'https://gw.example/x' } } },
        },
      },
      builtins
    )
  )) as unknown as ProxyError
  t.match(auth.message, /mcp\.policies\.mcpAuthentication\.issuer: must be an http\(s\) URL/)
  t.match(auth.message, /mcp\.policies\.mcpAuthentication\.jwks: must be an http\(s\) URL/)
  t.notMatch(auth.message, /must match pattern/)
})

t.test('a missing config file is "file not found", not ENOENT', async t => {
  const err = (await t.rejects(loadConfig('/nonexistent/dir/mcpp.yaml'))) as unknown as ProxyError
  t.match(err.message, /file not found: \/nonexistent\/dir\/mcpp\.yaml/)
  t.notMatch(err.message, /ENOENT/)
})

t.test('the CLI (--check) reports every unset variable and every bad rule in one run', async t => {
  const env = await configFile(`mcp:\n  port: 0\n  host: "\${MCPP_T_HOST_UNSET}"\n  baseUrl: "\${MCPP_T_BASE_UNSET:?set the public URL}"\n${TARGETS}`)
  const r1 = await runCli(['-f', env, '--check'], {}, 20000)
  t.equal(r1.code, 1, r1.stderr)
  t.match(r1.stderr, /environment variable not found: MCPP_T_HOST_UNSET \(referenced at mcp\.host\)/)
  t.match(r1.stderr, /environment variable not found: MCPP_T_BASE_UNSET \(referenced at mcp\.baseUrl\): set the public URL/)

  const withDefault = await configFile(
    `mcp:\n  port: \${MCPP_T_PORT_UNSET:-0}\n  host: "\${MCPP_T_HOST_UNSET:-127.0.0.1}"\n${TARGETS}admin: { enabled: false }\n`
  )
  const r2 = await runCli(['-f', withDefault, '--check'], {}, 20000)
  t.equal(r2.code, 0, r2.stderr)
  t.match(r2.stdout, /listen: 127\.0\.0\.1:0/)

  const rules = await configFile(
    `mcp:\n  port: 0\n  policies:\n    authorization:\n      rules: ['jwt.sub ==', '"a" in jwt.groups', 'constructor.x', 'jwt.x(']\n${TARGETS}`
  )
  const r3 = await runCli(['-f', rules, '--check'], {}, 20000)
  t.equal(r3.code, 1, r3.stderr)
  t.match(r3.stderr, /rules\[0\]: syntax error/)
  t.match(r3.stderr, /rules\[2\]:/)
  t.match(r3.stderr, /rules\[3\]:/)
  t.notMatch(r3.stderr, /rules\[1\]/)

  const names = await configFile('mcp:\n  port: 0\n  targets:\n    - name: my_target\n      stdio: { cmd: node }\n')
  const r4 = await runCli(['-f', names, '--check'], {}, 20000)
  t.equal(r4.code, 1)
  t.match(r4.stderr, /mcp\.targets\[0\]\.name: letters, digits and '-' only/)
  t.notMatch(r4.stderr, /pattern/)

  const r5 = await runCli(['-f', '/nonexistent/mcpp-i18.yaml', '--check'], {}, 20000)
  t.equal(r5.code, 1)
  t.match(r5.stderr, /file not found: \/nonexistent\/mcpp-i18\.yaml/)
  t.notMatch(r5.stderr, /ENOENT/)
})

t.test('a missing required key is named even where a oneOf speaks for the choice of keys', async t => {
  const err = (await t.rejects(
    validateConfig({ mcp: { port: 0, targets: [{ stdio: { cmd: 'node' } }, { name: 'b', stdio: { cmd: 'node' }, mcp: { url: 'http://a' } }] } })
  )) as unknown as ProxyError
  t.match(err.message, /mcp\.targets\[0\]\.name: is required/)
  t.notMatch(err.message, /mcp\.targets\[0\]: must have exactly one of stdio, mcp/)
  t.match(err.message, /mcp\.targets\[1\]: must have exactly one of stdio, mcp/)
})

t.test('unknown keys get the nearest allowed key at their path; a string where a provider object belongs says how to write it (real CLI)', async t => {
  const file = await configFile(
    [
      'mcp:',
      '  port: 3000',
      '  hots: 127.0.0.1',
      TARGETS.trimEnd(),
      '  policies:',
      '    mcpAuthentcation: {}',
      'admin: { enabeld: false, zzzzqqqq: 1 }',
      '',
    ].join('\n')
  )
  const r = await runCli(['-f', file, '--check'])
  t.equal(r.code, 1)
  t.match(r.stderr, 'mcp.hots: unknown key (did you mean "host"?)')
  t.match(r.stderr, 'admin.enabeld: unknown key (did you mean "enabled"?)')
  t.match(r.stderr, /admin\.zzzzqqqq: unknown key\n/, 'no guess when nothing is near')
  const policies = await configFile(['mcp:', '  port: 3000', TARGETS.trimEnd(), '  policies:', '    mcpAuthentcation: {}', ''].join('\n'))
  t.match((await runCli(['-f', policies, '--check'])).stderr, 'mcp.policies.mcpAuthentcation: unknown key (did you mean "mcpAuthentication"?)')
  const provider = await configFile(
    [
      'mcp:',
      '  port: 3000',
      TARGETS.trimEnd(),
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      '      issuer: https://idp.example.com/application/o/mcp/',
      '      audiences: [mcp]',
      '      clientId: mcp',
      '      resourceMetadata: { resource: "http://localhost:3000/mcp" }',
      '      provider: oss_idp',
      '',
    ].join('\n')
  )
  const p = await runCli(['-f', provider, '--check'])
  t.equal(p.code, 1)
  t.match(p.stderr, 'mcp.policies.mcpAuthentication.provider: must be an object like `provider: { oss_idp: { … } }`, not the string "oss_idp"')
})
