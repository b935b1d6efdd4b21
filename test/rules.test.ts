import t from 'tap'
import type { Test } from 'tap'
import { compileRule, compileRules, MAX_RULE_DEPTH, MAX_RULE_LENGTH } from '../plugins/authorization/rules.ts'
import type { RuleVariables } from '../plugins/authorization/rules.ts'
import { ProxyError } from '../core/errors.ts'

const claims = Object.freeze({
  sub: 'u1',
  groups: ['mcp-users', 'admins'],
  roles: ['mcp.admin'],
  scp: 'openid mcp_access',
  level: 3,
  name: 'Ada',
  verified: true,
  nothing: null,
  'custom-claim': 'x',
  nested: { team: { id: 7 } },
})
const headers = Object.freeze({ 'x-tenant': 'acme', 'user-agent': 'test/1' })
const vars = (mcp?: Record<string, unknown>, jwt: Record<string, unknown> = claims): RuleVariables => ({
  jwt,
  request: { headers },
  ...(mcp === undefined ? {} : { mcp }),
})

function holds(rule: string, v: RuleVariables = vars()): boolean {
  return compileRule(rule, 0).evaluate(v).allow
}

function rejects(t: Test, rule: string, pattern: RegExp): void {
  const name = `rejects ${rule.length > 60 ? rule.slice(0, 60) + '…' : rule}`
  try {
    compileRule(rule, 0)
    t.fail(name + ': compiled')
  } catch (err) {
    t.ok(ProxyError.is(err) && err.code === 'MCPP_ERR_CONFIG' && pattern.test(err.message), name, { message: (err as Error).message })
  }
}

t.test('SPEC examples', async t => {
  t.equal(holds('"mcp-users" in jwt.groups'), true)
  t.equal(holds('"other" in jwt.groups'), false)
  t.equal(holds('"mcp.admin" in jwt.roles'), true)
  t.equal(holds('"mcp.admin" in jwt.roles', vars(undefined, { roles: ['reader'] })), false)
  const perTool = 'mcp.tool.name != "delete_file" || "admins" in jwt.groups'
  const admin = vars({ method: 'tools/call', tool: { name: 'delete_file', target: 'fs' } })
  const user = vars({ method: 'tools/call', tool: { name: 'delete_file', target: 'fs' } }, { groups: ['mcp-users'] })
  const userOther = vars({ method: 'tools/call', tool: { name: 'read_file', target: 'fs' } }, { groups: ['mcp-users'] })
  t.equal(holds(perTool, admin), true)
  t.equal(holds(perTool, user), false)
  t.equal(holds(perTool, userOther), true)
  t.equal(compileRule(perTool, 0).kind, 'operation')
  t.equal(compileRule('"mcp-users" in jwt.groups', 0).kind, 'endpoint')
  t.equal(compileRule('request.headers["x-tenant"] == "acme"', 0).kind, 'endpoint')
})

t.test('allowed forms', async t => {
  const table: Array<[string, boolean]> = [
    ['true', true],
    ['false', false],
    ['jwt.sub == "u1"', true],
    ['jwt.sub === "u1"', true],
    ['jwt.sub != "u2"', true],
    ['jwt.sub !== "u1"', false],
    ["jwt['custom-claim'] == 'x'", true],
    ['jwt.nested.team.id == 7', true],
    ['jwt.nested["team"]["id"] >= 7', true],
    ['jwt.groups[0] == "mcp-users"', true],
    ['jwt.groups[5] == null', false],
    ['jwt.level > 2 && jwt.level < 4', true],
    ['jwt.level <= 3 && jwt.level >= 3', true],
    ['jwt.level > -1', true],
    ['jwt.name < "Bob"', true],
    ['jwt.verified == true', true],
    ['jwt.nothing == null', true],
    ['!(jwt.sub == "u2")', true],
    ['!jwt.verified', false],
    ['("a" in ["a", "b"]) && !("c" in ["a", "b"])', true],
    ['"team" in jwt.nested', true],
    ['"groups" in jwt', true],
    ['3 in [1, 2, 3]', true],
    ['jwt.level == 3 ? "admins" in jwt.groups : false', true],
    ['startsWith(jwt.sub, "u")', true],
    ['endsWith(jwt.sub, "1")', true],
    ['contains(jwt.groups, "admins")', true],
    ['contains(jwt.name, "d")', true],
    ['size(jwt.groups) == 2', true],
    ['size(jwt.nested) == 1', true],
    ['size(jwt.name) == 3', true],
    ['"mcp_access" in scopes(jwt.scp)', true],
    ['"mcp" in scopes(jwt.scp)', false],
    ['request.headers["x-tenant"] == "acme"', true],
    ['request.headers.missing == "acme"', false],
    ['jwt?.sub == "u1"', true],
    ['false || false || false || true', true],
    ['true && true && false', false],
  ]
  for (const [rule, want] of table) {
    t.equal(holds(rule), want, rule)
  }
  // Long flat chains do not count as nesting.
  const chain = Array.from({ length: 100 }, (_, i) => `"g${i}" in jwt.groups`).join(' || ')
  t.equal(holds(chain + ' || "admins" in jwt.groups'), true)
  t.equal(holds(chain), false)
})

t.test('missing claims and type mismatches are false', async t => {
  const empty = vars(undefined, {})
  const table = [
    '"mcp-users" in jwt.groups',
    'jwt.groups[0] == "mcp-users"',
    'jwt.a.b.c == 1',
    'jwt.level > 2',
    'jwt.level < 2',
    'size(jwt.groups) >= 0',
    'startsWith(jwt.sub, "u")',
    'contains(jwt.groups, "x")',
    '!jwt.verified',
    '!!jwt.verified',
    'jwt.flag ? true : true',
    'jwt.sub',
  ]
  for (const rule of table) t.equal(holds(rule, empty), false, `${rule} with no claims`)
  // No coercion.
  t.equal(holds('jwt.level == "3"'), false)
  t.equal(holds('jwt.level != "3"'), true)
  t.equal(holds('jwt.level > "2"'), false)
  t.equal(holds('jwt.name > 1'), false)
  t.equal(holds('jwt.verified == 1'), false)
  t.equal(holds('jwt.nothing == false'), false)
  t.equal(holds('"x" in jwt.name'), false, 'in does not search strings')
  t.equal(holds('"x" in jwt.level'), false)
  t.equal(holds('jwt.groups == ["mcp-users", "admins"]'), false, 'arrays compare by identity')
  t.equal(holds('"length" in jwt.groups'), false, 'in on a list is membership, not keys')
  t.equal(holds('"toString" in jwt.nested'), false, 'inherited keys are not own keys')
  t.equal(holds('jwt.name.length == 3'), false, 'no properties of primitives')
  t.equal(holds('jwt.nested.hasOwnProperty == jwt.nope'), true, 'inherited members read as undefined')
  t.equal(holds('jwt.nested.hasOwnProperty != jwt.nope'), false)
  t.equal(holds('size(jwt.level) == 1'), false)
  t.equal(holds('startsWith(jwt.level, "3")'), false)
  t.equal(holds('"mcp_access" in scopes(jwt.missing)'), false)
  t.equal(holds('jwt.sub && true'), false, 'only true is true')
  t.equal(holds('"admins" in jwt.groups', { request: { headers } }), false, 'no jwt at all')
})

t.test('injection attempts are rejected at compile time', async t => {
  rejects(t, 'jwt.__proto__.x', /"__proto__" is not allowed/)
  rejects(t, 'jwt["__proto__"]["x"] == 1', /"__proto__" is not allowed/)
  rejects(t, '"a" in jwt.constructor', /"constructor" is not allowed/)
  rejects(t, 'jwt.groups.prototype', /"prototype" is not allowed/)
  rejects(t, 'jwt["constructor"]["constructor"]("return process")()', /"constructor" is not allowed/)
  rejects(t, 'constructor', /"constructor" is not allowed/)
  rejects(t, '__proto__.polluted == 1', /"__proto__" is not allowed/)
  rejects(t, 'this', /"this" is not allowed/)
  rejects(t, 'this.jwt.sub == "u1"', /"this" is not allowed|only allowed on jwt/)
  rejects(t, 'process.exit()', /unknown identifier "process"/)
  rejects(t, 'process', /unknown identifier "process"/)
  rejects(t, 'globalThis.process', /unknown identifier "globalThis"/)
  rejects(t, 'require("fs")', /only these functions may be called/)
  rejects(t, 'eval("1")', /only these functions may be called/)
  rejects(t, 'Function("return 1")()', /only these functions may be called|unknown identifier/)
  rejects(t, 'jwt.sub.startsWith("u")', /only these functions may be called/)
  rejects(t, 'jwt.groups.includes("a")', /only these functions may be called/)
  rejects(t, 'size(jwt.groups, 1) > 0', /size\(\) takes 1 argument/)
  rejects(t, 'startsWith(jwt.sub)', /startsWith\(\) takes 2 arguments/)
  rejects(t, 'startsWith', /unknown identifier "startsWith"/)
  rejects(t, 'jwt.a = 1', /syntax error/)
  rejects(t, 'jwt.a == 1; jwt.b == 2', /one expression/)
  rejects(t, 'jwt.a, jwt.b', /one expression/)
  rejects(t, 'jwt[jwt.key] == 1', /literal string or number key/)
  rejects(t, 'jwt.a + 1 == 2', /operator "\+" is not allowed/)
  rejects(t, 'jwt.a ?? true', /operator "\?\?" is not allowed/)
  rejects(t, '~jwt.a', /operator "~" is not allowed/)
  rejects(t, '-jwt.a == 1', /operator "-" is not allowed/)
  rejects(t, 'typeof jwt', /unknown identifier|syntax error|one expression/)
  rejects(t, '`${jwt.sub}`', /syntax error/)
  rejects(t, '/admin/.test(jwt.sub)', /syntax error/)
  rejects(t, 'undefined == jwt.x', /unknown identifier "undefined"/)
  rejects(t, '[1, , 2]', /syntax error|holes/)
  rejects(t, '', /empty rule/)
  rejects(t, '   ', /empty rule/)
  rejects(t, '('.repeat(MAX_RULE_DEPTH + 1) + 'true' + ')'.repeat(MAX_RULE_DEPTH + 1), /nesting deeper than 32/)
  rejects(t, '('.repeat(2000) + 'true' + ')'.repeat(2000), /nesting deeper than 32/)
  rejects(t, '!'.repeat(MAX_RULE_DEPTH + 5) + 'true', /nesting deeper than 32/)
  rejects(t, 'jwt' + '.a'.repeat(MAX_RULE_DEPTH + 1), /nesting deeper than 32/)
  rejects(t, '"' + 'a'.repeat(MAX_RULE_LENGTH) + '" in jwt.groups', /longer than 4096/)
  // Nesting at the limit is fine.
  t.equal(holds('('.repeat(10) + 'true' + ')'.repeat(10)), true)
  t.equal(holds('!'.repeat(30) + 'true'), true)
})

t.test('compile errors name the rule, its index and the position', async t => {
  const err = t.throws(() => compileRules(['true', '"a" in jwt.groups &&', 'false'])) as unknown as ProxyError
  t.ok(ProxyError.is(err))
  t.equal(err.code, 'MCPP_ERR_CONFIG')
  t.match(err.message, /^mcp\.policies\.authorization\.rules\[1\]: syntax error: .* at position 20/)
  t.match(err.message, /"a" in jwt\.groups &&/)
  t.match(err.data, { path: 'mcp.policies.authorization.rules[1]', position: 20 })

  const e2 = t.throws(() => compileRules(['jwt.sub == "x"', 'jwt.__proto__ == 1'], 'mcp.plugins[2].options.rules')) as unknown as ProxyError
  t.match(e2.message, /^mcp\.plugins\[2\]\.options\.rules\[1\]: "__proto__" is not allowed at position 4/)
  const e3 = t.throws(() => compileRule('jwt.a == 1 && foo(jwt.b)', 3)) as unknown as ProxyError
  t.match(e3.message, /rules\[3\]: only these functions may be called: startsWith, endsWith, contains, size, scopes at position 14/)
})

t.test('static analysis: kind and claims read', async t => {
  const r = compileRule('"mcp.admin" in jwt.roles || jwt["custom-claim"] == "x" || jwt.groups[0] == "a"', 0)
  t.same([...r.claims].sort(), ['custom-claim', 'groups', 'roles'])
  t.equal(r.readsWholeJwt, false)
  t.equal(r.aboutScopes, false)
  t.equal(compileRule('"groups" in jwt', 0).readsWholeJwt, true)
  t.equal(compileRule('"mcp_access" in scopes(jwt.scp)', 0).aboutScopes, true)
  t.equal(compileRule('contains(jwt.scope, "x")', 0).aboutScopes, true)
  t.equal(compileRule('"tool" in mcp', 0).kind, 'operation')
  t.equal(compileRule('mcp.method == "tools/list"', 0).kind, 'operation')
  const set = compileRules(['"a" in jwt.groups', 'mcp.tool.name != "x"', 'request.headers.x == "y"'])
  t.same(
    set.endpoint.map(r => r.index),
    [0, 2]
  )
  t.same(
    set.operation.map(r => r.index),
    [1]
  )
  t.equal(set.firstFailure(set.endpoint, vars(undefined, { groups: ['a'] }))?.rule.index, 2)
  t.equal(set.firstFailure(set.endpoint, { jwt: { groups: ['a'] }, request: { headers: { x: 'y' } } }), undefined)
})

t.test('a claim named __proto__ pollutes nothing', async t => {
  const parsed = JSON.parse('{"__proto__": {"groups": ["admins"], "polluted": true}, "sub": "u1"}') as Record<string, unknown>
  t.ok(Object.hasOwn(parsed, '__proto__'), 'JSON.parse makes an own property')
  const before = Object.getOwnPropertyNames(Object.prototype).sort()
  t.equal(holds('"admins" in jwt.groups', vars(undefined, parsed)), false, 'not inherited through __proto__')
  t.equal(holds('"__proto__" in jwt', vars(undefined, parsed)), true, 'a plain own key')
  t.equal(holds('"__proto__" in jwt', vars(undefined, { sub: 'u1' })), false, 'absent when not an own key')
  t.equal(holds('size(jwt) == 2', vars(undefined, parsed)), true)
  t.equal(holds('jwt.sub == "u1"', vars(undefined, parsed)), true)
  t.equal(holds('"polluted" in jwt', vars(undefined, parsed)), false)
  const hdr = Object.create(null) as Record<string, string>
  Object.defineProperty(hdr, '__proto__', { value: 'x', enumerable: true })
  t.equal(holds('"__proto__" in request.headers', { request: { headers: hdr } }), true)
  t.same(Object.getOwnPropertyNames(Object.prototype).sort(), before)
  t.equal(({} as Record<string, unknown>).polluted, undefined)
  t.equal(({} as Record<string, unknown>).groups, undefined)
})

t.test('Entra group overage denies rules over groups', async t => {
  const overage = { sub: 'u1', roles: ['mcp.admin'], _claim_names: { groups: 'src1' }, _claim_sources: { src1: { endpoint: 'https://graph.invalid' } } }
  const r = compileRule('"admins" in jwt.groups', 0)
  t.same(r.evaluate(vars(undefined, overage)), { allow: false, reason: 'group overage' })
  t.same(r.evaluate(vars(undefined, { sub: 'u1', hasgroups: true })), { allow: false, reason: 'group overage' })
  // A negated rule would otherwise let the request through.
  t.same(compileRule('!("banned" in jwt.groups)', 0).evaluate(vars(undefined, overage)), { allow: false, reason: 'group overage' })
  t.same(compileRule('!("banned" in jwt.groups)', 0).evaluate(vars(undefined, { sub: 'u1' })), { allow: true }, 'no overage: negation holds')
  t.same(compileRule('"groups" in jwt || true', 0).evaluate(vars(undefined, overage)), { allow: false, reason: 'group overage' })
  // Rules not reading groups are unaffected; groups present means no overage.
  t.same(compileRule('"mcp.admin" in jwt.roles', 0).evaluate(vars(undefined, overage)), { allow: true })
  t.same(r.evaluate(vars(undefined, { groups: ['admins'], hasgroups: true })), { allow: true })
  t.same(r.evaluate(vars(undefined, { sub: 'u1' })), { allow: false, reason: 'rule is false' })
})

t.test('evaluation errors deny', async t => {
  const r = compileRule('"a" in jwt.groups', 0)
  const hostile = new Proxy(
    {},
    {
      getOwnPropertyDescriptor() {
        throw new Error('boom')
      },
    }
  )
  const out = r.evaluate({ jwt: hostile })
  t.equal(out.allow, false)
  t.match(out, { reason: 'evaluation error' })
})
