/**
 * Claim templates of `auth.headers` / `auth.env` (core/credentials/templates.ts)
 * and how a target with claim templates answers a caller: rendered values
 * (text around placeholders, nested claims, arrays, numbers, literal braces,
 * non-ASCII sent as UTF-8 bytes), compile errors, and the 403
 * MCPP_ERR_TARGET_CREDENTIAL that names the target and the claim, never the
 * value, for a claim that is missing, not a value, holds CR/LF or another
 * control character, or is over 4096 bytes.
 */
import t from 'tap'
import { compileTemplate, headerValue, renderTemplate, type Template } from '../core/credentials/templates.ts'
import { createCredentialBroker, type Caller } from '../core/credentials/index.ts'
import type { TargetConfig } from '../core/config.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { ProxyError } from '../core/errors.ts'
import { memoryLogger } from './helpers/logger.ts'

function compiled(source: string): Template {
  const c = compileTemplate(source)
  if (typeof c === 'string') throw new Error(`does not compile: ${c}`)
  return c
}

const claims = Object.freeze({
  sub: 'user-1',
  groups: ['admins', 'dev ops', 42, true],
  realm_access: { roles: ['reader', 'writer'] },
  'cognito:groups': ['a'],
  age: 42,
  verified: false,
  name: 'José 山田',
  empty: [],
})

t.test('rendering: text around placeholders, nested claims, arrays joined by ",", numbers and booleans as text, literal braces', async t => {
  t.equal(renderTemplate(compiled('{sub}'), claims), 'user-1')
  t.equal(renderTemplate(compiled('user={sub}; groups=[{groups}]'), claims), 'user=user-1; groups=[admins,dev ops,42,true]')
  t.equal(renderTemplate(compiled('{realm_access.roles}'), claims), 'reader,writer')
  t.equal(renderTemplate(compiled('{ cognito:groups }'), claims), 'a', 'spaces inside the braces are trimmed; ":" is part of a claim name')
  t.equal(renderTemplate(compiled('{age}/{verified}'), claims), '42/false')
  t.equal(renderTemplate(compiled('{empty}'), claims), '', 'an empty array is an empty value')
  t.equal(renderTemplate(compiled('{{literal}} {sub}'), claims), '{literal} user-1')
  t.equal(renderTemplate(compiled('Bearer {credential}'), claims, 'minted'), 'Bearer minted')
  const c = compiled('x-{sub}-{sub}')
  t.same(c.claims, ['sub'], 'a claim read twice is listed once')
  t.equal(c.constant, false)
  t.equal(compiled('static').constant, true)
  t.equal(compiled('{credential}').usesCredential, true)
  t.same(compiled('{credential}').claims, [], '{credential} is not a claim')
})

t.test('a header carries characters beyond ASCII as their UTF-8 bytes; ASCII is left as it is', async t => {
  const v = renderTemplate(compiled('{name}'), claims) as string
  const h = headerValue(v)
  t.equal(Buffer.from(h, 'latin1').toString('utf8'), 'José 山田', 'the target reads the UTF-8 bytes back as the claim')
  t.ok(
    [...h].every(ch => ch.charCodeAt(0) <= 0xff),
    'every character fits one byte, so Node writes it'
  )
  t.equal(headerValue('plain'), 'plain')
})

t.test('compile errors say what is wrong: not a claim path, unclosed or lone braces', async t => {
  t.match(compileTemplate('{}'), /placeholder \{\} is not a claim path/)
  t.match(compileTemplate('{sub name}'), /placeholder \{sub name\} is not a claim path/)
  t.match(compileTemplate('{a..b}'), /is not a claim path/)
  t.match(compileTemplate('{9lives}'), /is not a claim path/)
  t.match(compileTemplate('{$(id)}'), /is not a claim path/)
  t.match(compileTemplate('x {sub'), /an unclosed "\{" at 2/)
  t.match(compileTemplate('x } y'), /a lone "\}" at 2/)
})

t.test('rendering problems name the claim, never the value', async t => {
  t.same(renderTemplate(compiled('{email}'), claims), { claim: 'email', why: 'missing' })
  t.same(renderTemplate(compiled('{realm_access.nope}'), claims), { claim: 'realm_access.nope', why: 'missing' })
  t.same(renderTemplate(compiled('{sub.deeper}'), claims), { claim: 'sub.deeper', why: 'missing' }, 'a path through a string finds nothing')
  t.same(renderTemplate(compiled('{realm_access}'), claims), { claim: 'realm_access', why: 'not a value' })
  t.same(renderTemplate(compiled('{x}'), { x: [['nested']] }), { claim: 'x', why: 'not a value' })
  t.same(renderTemplate(compiled('{x}'), { x: null }), { claim: 'x', why: 'missing' })
  t.same(renderTemplate(compiled('{x}'), { x: 'a\r\nInjected: 1' }), { claim: 'x', why: 'control characters' })
  t.same(renderTemplate(compiled('{x}'), { x: ['ok', 'b\n'] }), { claim: 'x', why: 'control characters' })
  t.same(renderTemplate(compiled('{x}'), { x: 'nul\0' }), { claim: 'x', why: 'control characters' })
  t.same(renderTemplate(compiled('{x}'), { x: 'del\x7f' }), { claim: 'x', why: 'control characters' })
  t.equal(renderTemplate(compiled('{x}'), { x: 'a'.repeat(4096) }), 'a'.repeat(4096), '4096 bytes is the limit, inclusive')
  t.same(renderTemplate(compiled('{x}'), { x: 'a'.repeat(4097) }), { claim: 'x', why: 'too large' })
  t.same(renderTemplate(compiled('{x}'), { x: 'é'.repeat(2049) }), { claim: 'x', why: 'too large' }, 'bytes, not characters')
  t.same(renderTemplate(compiled('{x}'), { x: Array.from({ length: 1000 }, () => 'abcd') }), { claim: 'x', why: 'too large' }, 'an array, joined')
  t.same(renderTemplate(compiled('{x}'), Object.create({ x: 'inherited' }) as Record<string, unknown>), { claim: 'x', why: 'missing' }, 'own claims only')
})

/** A broker over one HTTP target with claim templates. */
function claimsTarget() {
  const { log, text } = memoryLogger()
  const metrics = new Metrics()
  const target: TargetConfig = {
    name: 'crm',
    mcp: { url: 'https://crm.example/mcp', headers: {} },
    auth: { headers: { 'X-User': '{sub}', 'X-Groups': 'groups={groups}', 'X-Tenant': 'acme' } },
  }
  const broker = createCredentialBroker([target], {
    log,
    metrics,
    resourceMetadataUrl: 'https://gw.example/.well-known/oauth-protected-resource/mcp',
    scopesSupported: [],
  })
  return { broker, auth: broker.forTarget('crm')!, metrics, text }
}

const caller = (claims: Record<string, unknown>, key = 'k1'): Caller => ({
  key,
  subject: String(claims.sub),
  claims: Object.freeze(claims),
  token: 'caller-token-xyz',
})

t.test("a claims target renders each caller's headers, lower-cased, and peek answers the same object on the next request", async t => {
  const { auth, broker } = claimsTarget()
  t.equal(auth.mode, 'claims')
  t.equal(auth.perCaller, true)
  const c = caller({ sub: 'alice', groups: ['g1', 'g2'] })
  const cred = await auth.resolve(c)
  t.same(cred.headers, { 'x-user': 'alice', 'x-groups': 'groups=g1,g2', 'x-tenant': 'acme' })
  t.same(cred.env, {})
  t.equal(cred.freshUntil, Number.POSITIVE_INFINITY)
  t.equal(auth.peek(c), cred, 'the same caller: a lookup, no new render')
  const bob = await auth.resolve(caller({ sub: 'bob', groups: [] }, 'k2'))
  t.same(bob.headers, { 'x-user': 'bob', 'x-groups': 'groups=', 'x-tenant': 'acme' }, 'another caller, its own values')
  t.same(broker.describe(), [{ target: 'crm', mode: 'claims', headerNames: ['X-User', 'X-Groups', 'X-Tenant'], envNames: [], cached: 0 }])
})

t.test('a claim that cannot be used: 403 MCPP_ERR_TARGET_CREDENTIAL naming target and claim, counted, the last failure kept, the value nowhere', async t => {
  const { auth, broker, metrics, text } = claimsTarget()
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ groups: ['g'] }, /^target crm: the caller's token has no claim "sub"$/],
    [{ sub: 'evil\r\nX-Admin: yes', groups: [] }, /^target crm: claim "sub" holds control characters$/],
    [{ sub: 'ok', groups: ['x'.repeat(5000)] }, /^target crm: claim "groups" is over 4096 bytes$/],
    [{ sub: { nested: 'object' }, groups: [] }, /^target crm: claim "sub" is not a string, number, boolean or array of them$/],
  ]
  for (const [claims, message] of cases) {
    const c = caller(claims)
    t.equal(auth.peek(c), undefined, 'peek has nothing for a caller whose claims do not render')
    const err = await auth.resolve(c).then(
      () => undefined,
      (e: unknown) => e
    )
    t.ok(ProxyError.is(err))
    t.match(err, { code: 'MCPP_ERR_TARGET_CREDENTIAL', statusCode: 403, expose: true, message })
  }
  t.match(metrics.render(), /mcp_proxy_credential_failures_total\{reason="claim",target="crm"\} 4/)
  t.match(broker.describe()[0], { lastFailure: { reason: 'claim' } })
  for (const secret of ['evil', 'X-Admin', 'xxxxxxxxxx', 'caller-token-xyz']) {
    t.notMatch(text(), secret, `the log has no ${secret}`)
    t.notMatch(metrics.render(), secret)
    t.notMatch(JSON.stringify(broker.describe()), secret)
  }
})

t.test('static modes: one frozen credential for every caller, a bearer or an API key beside constant headers', async t => {
  const { log } = memoryLogger()
  const targets: TargetConfig[] = [
    { name: 'legacy', mcp: { url: 'https://legacy.example/mcp', headers: {} }, auth: { bearer: 'static-bearer-secret' } },
    {
      name: 'keyed',
      mcp: { url: 'https://keyed.example/mcp', headers: {} },
      auth: { apiKey: { header: 'X-API-Key', value: 'static-api-key' }, headers: { 'X-Gateway': 'mcp-proxy' } },
    },
  ]
  const broker = createCredentialBroker(targets, { log, metrics: new Metrics(), resourceMetadataUrl: 'https://gw/x', scopesSupported: [] })
  const legacy = broker.forTarget('legacy')!
  const keyed = broker.forTarget('keyed')!
  t.equal(legacy.perCaller, false)
  t.equal(keyed.mode, 'apiKey')
  const anyone: Caller = { key: 'anon', subject: undefined, claims: {}, token: undefined }
  t.same((await legacy.resolve(anyone)).headers, { authorization: 'Bearer static-bearer-secret' })
  t.same(keyed.peek(anyone)?.headers, { 'x-api-key': 'static-api-key', 'x-gateway': 'mcp-proxy' })
  t.equal(keyed.peek(anyone), keyed.peek(caller({ sub: 'x' })), 'the same object for everyone')
  t.ok(Object.isFrozen(keyed.peek(anyone)!.headers))
  t.equal(broker.forTarget('nope'), undefined)
  t.same(
    broker.describe().map(d => [d.target, d.mode, d.headerNames]),
    [
      ['legacy', 'bearer', ['Authorization']],
      ['keyed', 'apiKey', ['X-API-Key', 'X-Gateway']],
    ]
  )
  t.notMatch(JSON.stringify(broker.describe()), /static-/)
})
