import t from 'tap'
import { writeFile, mkdtemp } from 'node:fs/promises'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { parseConfigText, validateConfig, loadConfig, expandString } from '../core/config.ts'
import { ProxyError } from '../core/errors.ts'
import { builtins } from '../plugins/index.ts'
import type { McpAuthenticationOptions } from '../plugins/mcp-authentication/index.ts'

const minimal = {
  mcp: { port: 3000, targets: [{ name: 'everything', stdio: { cmd: 'node', args: ['x.js'] } }] },
}

function withAuth(auth: Record<string, unknown>): unknown {
  return { mcp: { ...minimal.mcp, policies: { mcpAuthentication: auth } } }
}

const goodAuth = {
  mode: 'strict',
  issuer: 'https://idp.example.com/application/o/mcp/',
  audiences: ['client-1'],
  provider: { oss_idp: {} },
  clientId: 'client-1',
  resourceMetadata: { resource: 'https://gw.example.com/mcp', scopesSupported: ['openid', 'profile'] },
}

async function problems(data: unknown): Promise<string[]> {
  try {
    await validateConfig(data, builtins)
  } catch (err) {
    if (ProxyError.is(err)) return (err.data?.problems as string[]) ?? [err.message]
    throw err
  }
  return []
}

t.test('a minimal config validates and gets defaults from the schema', async t => {
  const cfg = await validateConfig(minimal)
  t.equal(cfg.admin.port, 15000)
  t.equal(cfg.admin.host, '127.0.0.1')
  t.equal(cfg.mcp.host, '0.0.0.0')
  t.equal(cfg.logging.level, 'info')
  t.equal(cfg.logging.format, 'json')
  t.same(cfg.mcp.targets[0]!.stdio!.args, ['x.js'])
  t.equal(cfg.mcp.session.idleTimeoutSeconds, 1800)
  t.equal(cfg.mcp.limits.maxBodyBytes, 4194304)
  t.equal(cfg.mcp.limits.maxTasksPerSession, 100)
})

t.test('mcp.limits.maxTasksPerSession: a positive integer, named when wrong', async t => {
  const lines = await problems({ mcp: { ...minimal.mcp, limits: { maxTasksPerSession: 0 } } })
  t.match(lines.join('\n'), /mcp\.limits\.maxTasksPerSession/)
})

t.test('the SPEC example config validates', async t => {
  const cfg = await validateConfig(withAuth(goodAuth), builtins)
  const auth = cfg.mcp.policies.mcpAuthentication as McpAuthenticationOptions
  t.equal(auth.clockToleranceSeconds, 30)
  t.same(auth.resourceMetadata.bearerMethodsSupported, ['header'])
})

const bad: Array<[string, unknown, RegExp]> = [
  ['missing mcp.port', { mcp: { targets: minimal.mcp.targets } }, /^mcp\.port: is required$/],
  ['port out of range', { mcp: { ...minimal.mcp, port: 70000 } }, /^mcp\.port: must be <= 65535$/],
  ['port of the wrong type', { mcp: { ...minimal.mcp, port: 'eighty' } }, /^mcp\.port: must be integer$/],
  [
    'provider with zero keys',
    withAuth({ ...goodAuth, provider: {} }),
    /^mcp\.policies\.mcpAuthentication\.provider: must have exactly one of oss_idp, cloud_idp$/,
  ],
  [
    'provider with two keys',
    withAuth({ ...goodAuth, provider: { oss_idp: {}, cloud_idp: {} } }),
    /^mcp\.policies\.mcpAuthentication\.provider: must have exactly one of oss_idp, cloud_idp$/,
  ],
  ['unknown provider key', withAuth({ ...goodAuth, provider: { keycloak: {} } }), /^mcp\.policies\.mcpAuthentication\.provider\.keycloak: unknown key$/],
  ['unknown top-level key', { ...minimal, extra: 1 }, /^extra: unknown key$/],
  [
    'typo in a nested key',
    withAuth({ ...goodAuth, audience: ['x'] }),
    /^mcp\.policies\.mcpAuthentication\.audience: unknown key \(did you mean "audiences"\?\)$/,
  ],
  ['malformed issuer URL', withAuth({ ...goodAuth, issuer: 'not a url' }), /^mcp\.policies\.mcpAuthentication\.issuer: must /],
  [
    'resource not ending in /mcp',
    withAuth({ ...goodAuth, resourceMetadata: { resource: 'https://gw.example.com/api' } }),
    /^mcp\.policies\.mcpAuthentication\.resourceMetadata\.resource: must be an http\(s\) URL ending in \/mcp$/,
  ],
  ['empty targets', { mcp: { port: 1, targets: [] } }, /^mcp\.targets: must NOT have fewer than 1 items$/],
  ['target without a kind', { mcp: { port: 1, targets: [{ name: 'a' }] } }, /^mcp\.targets\[0\]: must have exactly one of stdio, mcp$/],
  [
    'target name with an underscore',
    { mcp: { port: 1, targets: [{ name: 'a_b', stdio: { cmd: 'x' } }] } },
    /^mcp\.targets\[0\]\.name: letters, digits and '-' only/,
  ],
  ['args of the wrong type', { mcp: { port: 1, targets: [{ name: 'a', stdio: { cmd: 'x', args: 'y' } }] } }, /^mcp\.targets\[0\]\.stdio\.args: must be array$/],
  ['bad mode', withAuth({ ...goodAuth, mode: 'lenient' }), /^mcp\.policies\.mcpAuthentication\.mode: must be one of "strict", "optional", "permissive"$/],
  ['oss_idp without clientId', withAuth({ ...goodAuth, clientId: undefined }), /^mcp\.policies\.mcpAuthentication\.clientId: is required$/],
  ['strict without audiences', withAuth({ ...goodAuth, audiences: undefined }), /^mcp\.policies\.mcpAuthentication\.audiences: is required$/],
  [
    'duplicate target names',
    {
      mcp: {
        port: 1,
        targets: [
          { name: 'a', stdio: { cmd: 'x' } },
          { name: 'a', stdio: { cmd: 'y' } },
        ],
      },
    },
    /^mcp\.targets\[1\]\.name: duplicate target name "a"$/,
  ],
  ['bad logging format', { ...minimal, logging: { format: 'xml' } }, /^logging\.format: must be one of "json", "pretty"$/],
  [
    'bad bearer method',
    withAuth({ ...goodAuth, resourceMetadata: { resource: 'https://gw.example.com/mcp', bearerMethodsSupported: ['query'] } }),
    /^mcp\.policies\.mcpAuthentication\.resourceMetadata\.bearerMethodsSupported\[0\]: must be one of "header"$/,
  ],
]

for (const [name, data, expected] of bad) {
  t.test(`rejects: ${name}`, async t => {
    const lines = await problems(JSON.parse(JSON.stringify(data)))
    t.ok(
      lines.some(l => expected.test(l)),
      `expected ${expected} in:\n${lines.join('\n')}`
    )
  })
}

t.test('all errors are reported at once', async t => {
  const lines = await problems({ mcp: { port: -1, targets: [], extra: true } })
  t.ok(lines.length >= 3, lines.join('\n'))
})

t.test('${NAME} expansion', async t => {
  const env = { HOST_A: 'idp.example.com', PORT: '8080', SECRET: 's3cr3t', EVIL: 'x\n  injected: true', FLAG: 'true' }
  const { data, secretPaths } = parseConfigText(
    [
      'mcp:',
      '  port: ${PORT}',
      '  baseUrl: "https://${HOST_A}"',
      '  targets:',
      '    - name: a',
      '      stdio: { cmd: "echo", args: ["${EVIL}", "$${LITERAL}", "pre-${SECRET}-post", "${FLAG}"] }',
    ].join('\n'),
    env
  )
  const d = data as { mcp: { port: unknown; baseUrl: string; targets: Array<{ stdio: { args: unknown[] } }> } }
  t.equal(d.mcp.port, 8080, 'a whole plain reference may become a number')
  t.equal(d.mcp.baseUrl, 'https://idp.example.com')
  t.equal(d.mcp.targets[0]!.stdio.args[0], 'x\n  injected: true', 'an expanded value never becomes YAML structure')
  t.equal(d.mcp.targets[0]!.stdio.args[1], '${LITERAL}', '$${ is a literal ${')
  t.equal(d.mcp.targets[0]!.stdio.args[2], 'pre-s3cr3t-post')
  t.equal(d.mcp.targets[0]!.stdio.args[3], 'true', 'a quoted reference stays a string')
  t.ok(secretPaths.has('mcp.targets[0].stdio.args[2]'))
  t.ok(secretPaths.has('mcp.port'))
  t.notOk(Object.hasOwn(d.mcp, 'injected'))
})

t.test('an unset variable names itself and the path', async t => {
  t.throws(() => parseConfigText('mcp:\n  baseUrl: "${NOPE_NOT_SET}"\n', {}), {
    code: 'MCPP_ERR_ENV_NOT_FOUND',
    message: /environment variable not found: NOPE_NOT_SET \(referenced at mcp\.baseUrl\)/,
  })
  t.throws(() => expandString('${1BAD}', {}, 'x'), /invalid environment reference/)
})

t.test('keys are never expanded', async t => {
  const { data } = parseConfigText('mcp:\n  ${K}: 1\n', { K: 'port' })
  t.same(Object.keys((data as { mcp: object }).mcp), ['${K}'])
})

t.test('YAML syntax errors and unreadable files are config errors', async t => {
  t.throws(() => parseConfigText('mcp: [\n', {}), { code: 'MCPP_ERR_CONFIG', message: /invalid YAML/ })
  t.throws(() => parseConfigText('a: 1\na: 2\n', {}), { code: 'MCPP_ERR_CONFIG', message: /invalid YAML/ })
  await t.rejects(loadConfig('/nonexistent/config.yaml'), /cannot read config file/)
})

t.test('loadConfig freezes the result and records its directory', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-'))
  const file = join(dir, 'c.yaml')
  await writeFile(file, 'mcp:\n  port: 0\n  targets:\n    - name: a\n      stdio: { cmd: node }\n')
  const loaded = await loadConfig(file, {})
  t.equal(loaded.baseDir, dir)
  t.ok(Object.isFrozen(loaded.config.mcp.targets[0]))
  t.throws(() => {
    ;(loaded.config.mcp as { port: number }).port = 1
  })
})
