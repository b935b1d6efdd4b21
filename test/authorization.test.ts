import t from 'tap'
import { Writable } from 'node:stream'
import type { IncomingMessage } from 'node:http'
import authorization from '../plugins/authorization/index.ts'
import type { Plugin, PluginEnv } from '../core/plugin.ts'
import type { RequestContext } from '../core/context.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { createLogger } from '../core/logger.ts'
import { ProxyError } from '../core/errors.ts'
import { errorBody } from '../core/error-writer.ts'
import { deepFreeze } from '../core/config.ts'

const BASE = 'https://gw.example.test'

function capture(): { lines: Array<Record<string, unknown>>; log: ReturnType<typeof createLogger> } {
  const lines: Array<Record<string, unknown>> = []
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString('utf8').split('\n')) if (l.trim() !== '') lines.push(JSON.parse(l))
      cb()
    },
  })
  return { lines, log: createLogger({ level: 'debug', destination }) }
}

function makeEnv(scopes: string[] | null = ['openid', 'profile']) {
  const { lines, log } = capture()
  const metrics = new Metrics()
  const config = deepFreeze({
    mcp: {
      policies: {
        mcpAuthentication: {
          mode: 'strict',
          issuer: 'https://idp.example.test/',
          resourceMetadata: { resource: BASE + '/mcp', bearerMethodsSupported: ['header'], ...(scopes === null ? {} : { scopesSupported: scopes }) },
        },
      },
    },
  })
  // What the loader hands authorization when mcpAuthentication is listed before it.
  const protectedResource = { resource: BASE + '/mcp', scopesSupported: scopes === null ? undefined : scopes }
  const env: PluginEnv = { log, config, baseUrl: BASE, configPath: 'mcp.policies.authorization', metrics, provided: { protectedResource } }
  return { env, lines, metrics }
}

async function make(rules: string[], scopes?: string[] | null) {
  const e = makeEnv(scopes)
  const plugin = await authorization.create({ rules }, e.env)
  return { plugin, ...e }
}

function fakeCtx(opts: {
  claims?: Record<string, unknown>
  headers?: Record<string, string>
  path?: string
  method?: string
  log: PluginEnv['log']
}): RequestContext {
  const req = { headers: { host: 'gw.example.test', authorization: 'Bearer secret-token', ...(opts.headers ?? {}) } } as unknown as IncomingMessage
  const ctx = {
    req,
    id: 'r1',
    method: opts.method ?? 'POST',
    path: opts.path ?? '/mcp',
    query: '',
    log: opts.log,
    kind: 'mcp',
    state: new Map<string, unknown>(),
    ...(opts.claims === undefined ? {} : { auth: { subject: 'u1', claims: Object.freeze(opts.claims) } }),
  }
  return ctx as unknown as RequestContext
}

function denied(plugin: Plugin, ctx: RequestContext): ProxyError {
  try {
    plugin.onRequest!(ctx)
  } catch (err) {
    if (ProxyError.is(err)) return err
    throw err
  }
  throw new Error('request was not denied')
}

t.test('endpoint rule holds: request goes on', async t => {
  const { plugin, env } = await make(['"mcp-users" in jwt.groups'])
  t.equal(plugin.name, 'authorization')
  const ctx = fakeCtx({ claims: { sub: 'u1', groups: ['mcp-users'] }, log: env.log })
  t.equal(plugin.onRequest!(ctx), undefined)
  t.equal(ctx.denial, undefined)
})

t.test('endpoint rule fails: 403 with an OAuth body that does not reveal the rule', async t => {
  const { plugin, env, lines, metrics } = await make(['jwt.sub == "u1"', '"mcp-users" in jwt.groups'])
  const ctx = fakeCtx({ claims: { sub: 'u1', groups: ['other'] }, log: env.log })
  const err = denied(plugin, ctx)
  t.equal(err.code, 'MCPP_ERR_FORBIDDEN')
  t.equal(err.statusCode, 403)
  t.equal(err.oauthError, 'forbidden')
  t.same(err.headers, {})
  const body = errorBody(ctx, err)
  t.same(body, { error: 'forbidden', error_description: 'access denied by authorization policy' })
  t.notMatch(JSON.stringify(body), /mcp-users|groups/)
  t.same(ctx.denial, { rule: 1, reason: '"mcp-users" in jwt.groups' }, 'a structured denial: the rule index and its text')
  t.equal(metrics.counter('mcp_proxy_authorization_denials_total', '').get({ rule: '1' }), 1)
  const line = lines.find(l => l.msg === 'authorization denied')
  t.match(line, { level: 'info', rule: 1, ruleText: '"mcp-users" in jwt.groups', reason: 'rule is false' })
  t.notMatch(JSON.stringify(lines), /secret-token/, 'the bearer token is never logged')
})

t.test('no verified claims: rules over jwt deny', async t => {
  const { plugin, env } = await make(['"mcp-users" in jwt.groups'])
  const err = denied(plugin, fakeCtx({ log: env.log }))
  t.equal(err.statusCode, 403)
})

t.test('only POST/GET/DELETE /mcp is gated; OPTIONS and other paths are not', async t => {
  const { plugin, env } = await make(['"mcp-users" in jwt.groups'])
  t.equal(plugin.onRequest!(fakeCtx({ method: 'OPTIONS', log: env.log })), undefined)
  t.equal(plugin.onRequest!(fakeCtx({ path: '/.well-known/oauth-protected-resource/mcp', method: 'GET', log: env.log })), undefined)
  t.equal(denied(plugin, fakeCtx({ method: 'GET', log: env.log })).statusCode, 403)
  t.equal(denied(plugin, fakeCtx({ method: 'DELETE', log: env.log })).statusCode, 403)
})

t.test('a scope rule fails: insufficient_scope with the MCP step-up challenge', async t => {
  const { plugin, env } = await make(['"mcp_access" in scopes(jwt.scp)'], ['api://app/mcp_access', 'openid'])
  const ctx = fakeCtx({ claims: { sub: 'u1', scp: 'openid' }, log: env.log })
  const err = denied(plugin, ctx)
  t.equal(err.statusCode, 403)
  t.equal(err.oauthError, 'insufficient_scope')
  t.same(err.headers, {
    'www-authenticate': `Bearer error="insufficient_scope", scope="api://app/mcp_access openid", resource_metadata="${BASE}/.well-known/oauth-protected-resource/mcp"`,
  })
  const body = errorBody(ctx, err)
  t.equal(body.error, 'insufficient_scope')
  t.type(body.error_description, 'string')
  t.notMatch(String(body.error_description), /mcp_access|scp/)
  t.match(ctx.denial, { rule: 0, reason: String })
  // With the scope present the request goes on.
  t.equal(plugin.onRequest!(fakeCtx({ claims: { scp: 'openid mcp_access' }, log: env.log })), undefined)
})

t.test('insufficient_scope without configured scopes omits the scope parameter', async t => {
  const { plugin, env } = await make(['contains(jwt.scope, "mcp")'], null)
  const err = denied(plugin, fakeCtx({ claims: { scope: 'openid' }, log: env.log }))
  t.equal(err.headers['www-authenticate'], `Bearer error="insufficient_scope", resource_metadata="${BASE}/.well-known/oauth-protected-resource/mcp"`)
})

t.test('request headers are visible to rules (lower-cased), credentials are not', async t => {
  const { plugin, env } = await make(['request.headers["x-tenant"] == "acme"', '!("authorization" in request.headers)', '!("cookie" in request.headers)'])
  t.equal(plugin.onRequest!(fakeCtx({ claims: {}, headers: { 'x-tenant': 'acme', cookie: 'a=b' }, log: env.log })), undefined)
  t.equal(denied(plugin, fakeCtx({ claims: {}, headers: { 'x-tenant': 'other' }, log: env.log })).statusCode, 403)
})

t.test('group overage denies and the log says why', async t => {
  const { plugin, env, lines } = await make(['"admins" in jwt.groups'])
  const ctx = fakeCtx({ claims: { sub: 'u1', _claim_names: { groups: 'src1' } }, log: env.log })
  t.equal(denied(plugin, ctx).statusCode, 403)
  const line = lines.find(l => l.reason === 'group overage')
  t.ok(line, 'logged with reason group overage')
  t.match(String(line?.msg), /group overage/)
})

t.test('per-operation rules: not evaluated in onRequest, filter via allowMcpOperation', async t => {
  const { plugin, env, metrics, lines } = await make([
    '"mcp-users" in jwt.groups',
    'mcp.tool.name != "delete_file" || "admins" in jwt.groups',
    'mcp.prompt.target != "secret" || "admins" in jwt.groups',
    'mcp.resource.uri == jwt.nope || !startsWith(mcp.resource.uri, "file:///etc/")',
  ])
  const user = fakeCtx({ claims: { groups: ['mcp-users'] }, log: env.log })
  const admin = fakeCtx({ claims: { groups: ['mcp-users', 'admins'] }, log: env.log })
  t.equal(plugin.onRequest!(user), undefined, 'operation rules do not gate the endpoint')
  t.equal(user.denial, undefined)

  // The MCP layer filters `tools/list` by asking about `tools/call` for each item.
  const listing = (ctx: RequestContext): RequestContext => Object.assign(ctx, { mcp: { body: {}, method: 'tools/list' } })
  listing(user)
  listing(admin)
  const tools = ['read_file', 'delete_file', 'write_file'].map(name => ({ method: 'tools/call', tool: { name, target: 'fs' } }))
  t.same(
    tools.filter(op => plugin.allowMcpOperation!(user, op)).map(op => op.tool.name),
    ['read_file', 'write_file']
  )
  t.same(
    tools.filter(op => plugin.allowMcpOperation!(admin, op)).map(op => op.tool.name),
    ['read_file', 'delete_file', 'write_file']
  )
  t.equal(user.denial, undefined, 'filtering a list is not a denial')
  t.equal(metrics.counter('mcp_proxy_authorization_denials_total', '').get({ rule: '1' }), 0)
  t.ok(
    lines.some(l => l.level === 'debug' && l.rule === 1 && l.item === 'delete_file'),
    'filtered items are logged at debug'
  )
  t.notOk(
    lines.some(l => l.level === 'info' && l.rule === 1),
    'and not at info'
  )
  t.equal(
    plugin.allowMcpOperation!(user, { method: 'tools/list', tool: { name: 'delete_file', target: 'fs' } }),
    false,
    'a list-method operation is filtered too'
  )
  t.equal(user.denial, undefined)

  Object.assign(user, { mcp: { body: {}, method: 'tools/call' } })

  t.equal(plugin.allowMcpOperation!(user, { method: 'tools/call', tool: { name: 'delete_file', target: 'fs' } }), false)
  t.match(user.denial, { rule: 1, reason: String })
  t.equal(metrics.counter('mcp_proxy_authorization_denials_total', '').get({ rule: '1' }), 1)
  t.ok(lines.some(l => l.level === 'info' && l.rule === 1 && l.method === 'tools/call'))
  t.equal(plugin.allowMcpOperation!(admin, { method: 'tools/call', tool: { name: 'delete_file', target: 'fs' } }), true)

  t.equal(plugin.allowMcpOperation!(user, { method: 'prompts/get', prompt: { name: 'p', target: 'secret' } }), false)
  t.equal(plugin.allowMcpOperation!(user, { method: 'prompts/get', prompt: { name: 'p', target: 'public' } }), true)
  t.equal(plugin.allowMcpOperation!(user, { method: 'resources/read', resource: { uri: 'file:///etc/passwd', target: 'fs' } }), false)
  t.equal(plugin.allowMcpOperation!(user, { method: 'resources/read', resource: { uri: 'file:///tmp/a', target: 'fs' } }), true)
  t.equal(plugin.allowMcpOperation!(user, { method: 'tools/list' }), true, 'operations without an item')
})

t.test('no rules: everything allowed', async t => {
  const { plugin, env } = await make([])
  const ctx = fakeCtx({ log: env.log })
  t.equal(plugin.onRequest!(ctx), undefined)
  t.equal(plugin.allowMcpOperation, undefined, 'no per-operation hook without mcp.* rules')
  const withEndpointRule = (await make(['"a" in jwt.groups'])).plugin
  t.equal(withEndpointRule.allowMcpOperation, undefined, 'endpoint rules alone do not need per-operation checks')
})

t.test('describe() lists the rules and their kind', async t => {
  const { plugin } = await make(['"mcp.admin" in jwt.roles', 'mcp.tool.name != "delete_file" || "admins" in jwt.groups'])
  t.same(plugin.describe!(), {
    rules: [
      { index: 0, text: '"mcp.admin" in jwt.roles', kind: 'endpoint' },
      { index: 1, text: 'mcp.tool.name != "delete_file" || "admins" in jwt.groups', kind: 'operation' },
    ],
  })
})

t.test('a bad rule fails create() with its config path and position', async t => {
  const { env } = makeEnv()
  let caught: unknown
  try {
    await authorization.create({ rules: ['"a" in jwt.groups', '"b" in jwt.groups &&'] }, env)
  } catch (err) {
    caught = err
  }
  t.ok(ProxyError.is(caught))
  const err = caught as ProxyError
  t.equal(err.code, 'MCPP_ERR_CONFIG')
  t.match(err.message, /^mcp\.policies\.authorization\.rules\[1\]: syntax error: .* at position 20/)
  t.match(err.message, /"b" in jwt\.groups &&/)
})

t.test('check() (mcp-proxy --check) compiles the rules without creating anything', async t => {
  t.doesNotThrow(() => authorization.check!({ rules: ['"a" in jwt.groups'] }, 'mcp.policies.authorization'))
  t.throws(() => authorization.check!({ rules: ['"a" in jwt.groups', 'jwt.groups =='] }, 'mcp.policies.authorization'), {
    code: 'MCPP_ERR_CONFIG',
    message: /^mcp\.policies\.authorization\.rules\[1\]: syntax error/,
  })
})

t.test('the options schema is exported', async t => {
  t.match(authorization.optionsSchema, { type: 'object', properties: { rules: { type: 'array' } } })
  t.equal(authorization.engine, '^1')
})
