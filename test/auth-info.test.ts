/**
 * The caller's token on ctx.auth (core/context.ts): there for the credential layer (AuthInfo.token),
 * invisible to everything else: JSON.stringify, a pino log line, structuredClone, a spread and
 * util.inspect (whatever its options) never show it. mcpAuthentication sets it from a real token of the
 * dev IdP, on a verification and on a cache hit; a plugin that sets it as a plain property has it
 * hidden by the context; the Caller the MCP layer builds (core/mcp/credentials.ts) hides it as well.
 */
import t, { type Test } from 'tap'
import { inspect } from 'node:util'
import { authInfo, type AuthInfo, type RequestContext } from '../core/context.ts'
import { GatewayServer, sendReply, type McpEndpoint } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { Metrics } from '../core/observability/metrics.ts'
import type { Plugin } from '../core/plugin.ts'
import { callerOf } from '../core/mcp/credentials.ts'
import { realAuth } from './helpers/real-auth.ts'
import { memoryLogger } from './helpers/logger.ts'

const TOKEN = 'eyJhbGciOiJub25lIn0.caller-token-that-must-stay-hidden.sig'

/** Every way the gateway or a plugin might print or copy `value`; none may contain `token`. */
function leaks(value: object, token: string): string[] {
  const { log, text } = memoryLogger('debug')
  log.info({ auth: value }, 'logged')
  log.info(value, 'merged')
  const ways: Record<string, string> = {
    'JSON.stringify': JSON.stringify(value),
    pino: text(),
    structuredClone: JSON.stringify(structuredClone(value)) + inspect(structuredClone(value), { showHidden: true, getters: true }),
    spread: JSON.stringify({ ...value }),
    'Object.keys': Object.keys(value).join(','),
    inspect: inspect(value),
    'inspect showHidden getters': inspect(value, { showHidden: true, getters: true, depth: 10 }),
    'template literal': `${String(value)}`,
  }
  return Object.entries(ways).flatMap(([way, out]) => (out.includes(token) ? [way] : []))
}

t.test('authInfo(): the token is readable, and nothing prints or copies it', async t => {
  const auth = authInfo({ subject: 'alice', claims: Object.freeze({ sub: 'alice', groups: ['a'] }), expiresAt: 2_000_000_000, token: TOKEN })
  t.equal(auth.token, TOKEN)
  t.same(leaks(auth, TOKEN), [])
  t.same(JSON.parse(JSON.stringify(auth)), { subject: 'alice', claims: { sub: 'alice', groups: ['a'] }, expiresAt: 2_000_000_000 }, 'the rest as before')
  t.ok(Object.isFrozen(auth))
  t.same(JSON.parse(JSON.stringify(authInfo({ subject: 's', claims: {} }))), { subject: 's', claims: {} }, 'no expiresAt when none is given')
})

/** A gateway whose /mcp answers what the handler saw of ctx.auth, behind `plugins`. */
async function gateway(t: Test, plugins: Plugin[], seen: (ctx: RequestContext) => void) {
  const { log, text } = memoryLogger('debug')
  const endpoint: McpEndpoint = {
    async handle(ctx) {
      seen(ctx)
      ctx.log.info({ auth: ctx.auth }, 'the handler logs the caller')
      await sendReply(ctx, { status: 200, body: { auth: ctx.auth ?? null } })
    },
    async close() {},
  }
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: endpoint,
    log,
    metrics: new Metrics(),
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 10000, requestTimeoutMs: 30000, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close(100))
  return { url: `http://127.0.0.1:${port}/mcp`, logText: text }
}

t.test('a plugin that sets the token as a plain property has it hidden by the context', async t => {
  const plain: Plugin = {
    name: 'third-party-auth',
    onRequest(ctx) {
      ctx.auth = { subject: 'carol', claims: { sub: 'carol' }, token: TOKEN } as AuthInfo
    },
  }
  let auth: AuthInfo | undefined
  const g = await gateway(t, [plain], ctx => {
    auth = ctx.auth
  })
  const res = await fetch(g.url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
  const body = await res.text()
  t.equal(auth?.token, TOKEN, 'the credential layer still reads it')
  t.equal(auth?.subject, 'carol')
  t.same(leaks(auth!, TOKEN), [])
  t.notOk(body.includes(TOKEN), 'not in a body that serialises ctx.auth')
  t.notOk(g.logText().includes(TOKEN), 'not in the log')
})

t.test('mcpAuthentication: the verified token on ctx.auth, on a verification and on a cache hit; the Caller hides it too', async t => {
  const real = await realAuth(t, ['alice'])
  const token = await real.token('alice')
  const seen: Array<{ token: string | undefined; caller: string | undefined; leaks: string[]; callerLeaks: string[] }> = []
  const g = await gateway(t, [real.plugin], ctx => {
    const caller = callerOf(ctx)
    seen.push({ token: ctx.auth?.token, caller: caller.token, leaks: leaks(ctx.auth!, token), callerLeaks: leaks(caller, token) })
  })
  for (let i = 0; i < 2; i++) {
    const res = await fetch(g.url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` }, body: '{}' })
    t.equal(res.status, 200)
    t.notOk((await res.text()).includes(token))
  }
  t.equal(seen.length, 2)
  for (const [i, s] of seen.entries()) {
    const when = i === 0 ? 'verified' : 'cache hit'
    t.equal(s.token, token, `${when}: ctx.auth.token is the caller's token`)
    t.equal(s.caller, token, `${when}: so is the Caller's`)
    t.same(s.leaks, [], `${when}: ctx.auth shows it nowhere`)
    t.same(s.callerLeaks, [], `${when}: the Caller shows it nowhere`)
  }
  t.notOk(g.logText().includes(token), 'never in the log')
})
