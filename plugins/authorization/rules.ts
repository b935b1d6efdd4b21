/**
 * Authorization rule language: parsed by jsep once at start-up, checked
 * against an allow-list of node types, and compiled into closures that
 * evaluate totally (a missing value is `undefined`, a type mismatch is
 * `false`, any exception denies). No `eval`, no prototype walks: every
 * property read is `Object.hasOwn` on a static key that was checked at
 * compile time, so `__proto__`/`constructor`/`prototype` can never be reached.
 */
import jsep from 'jsep'
import { ProxyError } from '../../core/plugin-api.ts'

// jsep's operator table is global to the module; `in` is not in it by default.
// Precedence 7 is jsep's relational level, as in JavaScript. Idempotent.
if (jsep.binary_ops.in === undefined) jsep.addBinaryOp('in', 7)

export const MAX_RULE_LENGTH = 4096
export const MAX_RULE_DEPTH = 32

const ROOTS = new Set(['jwt', 'mcp', 'request'])
const FORBIDDEN_NAMES = new Set(['__proto__', 'constructor', 'prototype'])

/** What a rule can see. Built by the caller per request / per operation. */
export interface RuleVariables {
  /** Verified JWT claims. */
  readonly jwt?: Readonly<Record<string, unknown>>
  /** `{ method, tool: {name, target}, prompt: {name, target}, resource: {uri, target} }` */
  readonly mcp?: Readonly<Record<string, unknown>>
  /** `{ headers }` with lower-cased names and string values. */
  readonly request?: Readonly<Record<string, unknown>>
}

export type RuleOutcome =
  | { readonly allow: true }
  | { readonly allow: false; readonly reason: 'rule is false' | 'group overage' | 'evaluation error'; readonly error?: unknown }

export interface CompiledRule {
  /** Position in `rules`. */
  readonly index: number
  readonly text: string
  /** `operation` when the rule reads `mcp` (evaluated per MCP operation), else `endpoint`. */
  readonly kind: 'endpoint' | 'operation'
  /** Top-level JWT claims the rule reads by name (`jwt.groups`, `jwt["custom-claim"]`). */
  readonly claims: ReadonlySet<string>
  /** True when the rule uses `jwt` as a whole (`"groups" in jwt`, `size(jwt)`). */
  readonly readsWholeJwt: boolean
  /** True when the rule reads `jwt.scp` or `jwt.scope`: a failure is answered as `insufficient_scope`. */
  readonly aboutScopes: boolean
  evaluate(vars: RuleVariables): RuleOutcome
}

export interface RuleFailure {
  readonly rule: CompiledRule
  readonly outcome: Exclude<RuleOutcome, { allow: true }>
}

export interface CompiledRuleSet {
  readonly rules: readonly CompiledRule[]
  readonly endpoint: readonly CompiledRule[]
  readonly operation: readonly CompiledRule[]
  /** The first rule of `rules` that does not hold, or undefined when all hold. */
  firstFailure(rules: readonly CompiledRule[], vars: RuleVariables): RuleFailure | undefined
}

type Scope = RuleVariables
type Ev = (s: Scope) => unknown

/** Compile-time rejection with an (approximate, for non-syntax errors) position. */
class RuleError extends Error {
  readonly position: number
  constructor(message: string, position: number) {
    super(message)
    this.position = position
  }
}

interface Analysis {
  roots: Set<string>
  claims: Set<string>
  wholeJwt: boolean
  text: string
}

function own(obj: unknown, key: string | number): unknown {
  if (obj === null || typeof obj !== 'object') return undefined
  const k = typeof key === 'number' ? String(key) : key
  return Object.hasOwn(obj, k) ? (obj as Record<string, unknown>)[k] : undefined
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

/** Where `needle` first occurs outside string literals, else where it occurs at all, else 0. */
function positionOf(text: string, needle: string, asWord: boolean): number {
  let quote = ''
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (quote !== '') {
      if (c === '\\') i++
      else if (c === quote) quote = ''
      continue
    }
    if (c === '"' || c === "'") {
      if (!asWord && text.startsWith(needle, i)) return i
      quote = c
      continue
    }
    if (text.startsWith(needle, i)) {
      const before = text[i - 1]
      const after = text[i + needle.length]
      if (!asWord || ((before === undefined || !/[\w$]/.test(before)) && (after === undefined || !/[\w$]/.test(after)))) return i
    }
  }
  return Math.max(0, text.indexOf(needle))
}

/** Bracket nesting is checked before jsep so a pathological rule cannot exhaust its recursion. */
function checkBracketDepth(text: string): void {
  let depth = 0
  let quote = ''
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (quote !== '') {
      if (c === '\\') i++
      else if (c === quote) quote = ''
      continue
    }
    if (c === '"' || c === "'") quote = c
    else if (c === '(' || c === '[') {
      if (++depth > MAX_RULE_DEPTH) throw new RuleError(`nesting deeper than ${MAX_RULE_DEPTH}`, i)
    } else if (c === ')' || c === ']') depth--
  }
}

type Helper = { arity: number; fn: (...args: unknown[]) => unknown }

/** The only functions a rule may call. Each is total: wrong types give false/undefined. */
const HELPERS: Readonly<Record<string, Helper>> = Object.freeze(
  Object.assign(Object.create(null) as Record<string, Helper>, {
    startsWith: { arity: 2, fn: (s: unknown, p: unknown) => typeof s === 'string' && typeof p === 'string' && s.startsWith(p) },
    endsWith: { arity: 2, fn: (s: unknown, p: unknown) => typeof s === 'string' && typeof p === 'string' && s.endsWith(p) },
    contains: {
      arity: 2,
      fn: (x: unknown, v: unknown) => (Array.isArray(x) ? x.some(e => e === v) : typeof x === 'string' && typeof v === 'string' && x.includes(v)),
    },
    size: {
      arity: 1,
      fn: (x: unknown) => (typeof x === 'string' || Array.isArray(x) ? x.length : isPlainObject(x) ? Object.keys(x).length : undefined),
    },
    // OAuth scope claims are space-delimited strings (RFC 9068 `scope`, Entra `scp`);
    // substring checks would let `mcp_access_all` satisfy `mcp_access`.
    scopes: {
      arity: 1,
      fn: (x: unknown) => (typeof x === 'string' ? x.split(' ').filter(s => s !== '') : Array.isArray(x) ? x.filter(s => typeof s === 'string') : []),
    },
  })
)

export const HELPER_NAMES: readonly string[] = Object.freeze(Object.keys(HELPERS))

function compare(op: string, a: unknown, b: unknown): boolean {
  if (!((typeof a === 'number' && typeof b === 'number') || (typeof a === 'string' && typeof b === 'string'))) return false
  switch (op) {
    case '<':
      return a < b
    case '<=':
      return a <= b
    case '>':
      return a > b
    default:
      return a >= b
  }
}

function inOp(needle: unknown, haystack: unknown): boolean {
  if (Array.isArray(haystack)) return haystack.some(e => e === needle)
  if (isPlainObject(haystack) && (typeof needle === 'string' || typeof needle === 'number')) {
    return Object.hasOwn(haystack, String(needle))
  }
  return false
}

/** A static member key, checked against the forbidden names. */
function memberKey(node: jsep.MemberExpression, a: Analysis): string | number {
  const p = node.property
  let key: string | number
  if (!node.computed) {
    if (p.type !== 'Identifier') throw new RuleError('invalid member access', 0)
    key = (p as jsep.Identifier).name
  } else if (p.type === 'Literal' && (typeof (p as jsep.Literal).value === 'string' || typeof (p as jsep.Literal).value === 'number')) {
    key = (p as jsep.Literal).value as string | number
  } else {
    throw new RuleError('bracket access needs a literal string or number key', positionOf(a.text, '[', false))
  }
  if (typeof key === 'string' && FORBIDDEN_NAMES.has(key)) {
    throw new RuleError(`"${key}" is not allowed`, positionOf(a.text, key, !node.computed))
  }
  return key
}

/** The root identifier of a member chain, if the chain starts at one. */
function rootOf(node: jsep.Expression): string | undefined {
  let n = node
  while (n.type === 'MemberExpression') n = (n as jsep.MemberExpression).object
  return n.type === 'Identifier' ? (n as jsep.Identifier).name : undefined
}

function compileNode(node: jsep.Expression, depth: number, a: Analysis): Ev {
  if (depth > MAX_RULE_DEPTH) throw new RuleError(`nesting deeper than ${MAX_RULE_DEPTH}`, 0)
  const d = depth + 1
  switch (node.type) {
    case 'Literal': {
      const v = (node as jsep.Literal).value
      if (v !== null && typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'boolean') {
        throw new RuleError('unsupported literal', positionOf(a.text, String((node as jsep.Literal).raw), false))
      }
      return () => v
    }
    case 'Identifier': {
      const name = (node as jsep.Identifier).name
      if (FORBIDDEN_NAMES.has(name)) throw new RuleError(`"${name}" is not allowed`, positionOf(a.text, name, true))
      if (!ROOTS.has(name)) {
        throw new RuleError(`unknown identifier "${name}" (allowed: jwt, mcp, request)`, positionOf(a.text, name, true))
      }
      a.roots.add(name)
      if (name === 'jwt') a.wholeJwt = true
      const root = name as keyof Scope
      return s => s[root]
    }
    case 'MemberExpression':
      return compileMember(node as jsep.MemberExpression, d, a)
    case 'UnaryExpression': {
      const u = node as jsep.UnaryExpression
      if (u.operator === '-' && u.argument.type === 'Literal' && typeof (u.argument as jsep.Literal).value === 'number') {
        const v = -((u.argument as jsep.Literal).value as number)
        return () => v
      }
      if (u.operator !== '!') throw new RuleError(`operator "${u.operator}" is not allowed`, positionOf(a.text, u.operator, false))
      const arg = compileNode(u.argument, d, a)
      // `!` of a non-boolean is undefined (not true), so a missing claim cannot flip a rule to true.
      return s => {
        const v = arg(s)
        return typeof v === 'boolean' ? !v : undefined
      }
    }
    case 'BinaryExpression':
      return compileBinary(node as jsep.BinaryExpression, d, a)
    case 'ConditionalExpression': {
      const c = node as jsep.ConditionalExpression
      const t = compileNode(c.test, d, a)
      const y = compileNode(c.consequent, d, a)
      const n = compileNode(c.alternate, d, a)
      return s => {
        const v = t(s)
        return v === true ? y(s) : v === false ? n(s) : undefined
      }
    }
    case 'ArrayExpression': {
      const arr = node as jsep.ArrayExpression
      const evs = arr.elements.map(e => {
        if (e === null) throw new RuleError('array holes are not allowed', positionOf(a.text, ',,', false))
        return compileNode(e, d, a)
      })
      return s => evs.map(e => e(s))
    }
    case 'CallExpression':
      return compileCall(node as jsep.CallExpression, d, a)
    case 'ThisExpression':
      throw new RuleError('"this" is not allowed', positionOf(a.text, 'this', true))
    case 'Compound':
      throw new RuleError('a rule is one expression (no "," or ";")', Math.max(positionOf(a.text, ';', false), positionOf(a.text, ',', false), 0))
    default:
      throw new RuleError(`${node.type} is not allowed`, 0)
  }
}

/** `jwt.claim`, `mcp.x[0]`...: member access on the three roots only, with static keys. */
function compileMember(m: jsep.MemberExpression, d: number, a: Analysis): Ev {
  const key = memberKey(m, a)
  const root = rootOf(m)
  if (root === undefined || !ROOTS.has(root)) {
    if (root !== undefined && FORBIDDEN_NAMES.has(root)) throw new RuleError(`"${root}" is not allowed`, positionOf(a.text, root, true))
    throw new RuleError(
      root === undefined ? 'member access is only allowed on jwt, mcp and request' : `unknown identifier "${root}" (allowed: jwt, mcp, request)`,
      root === undefined ? 0 : positionOf(a.text, root, true)
    )
  }
  // `jwt.<claim>` directly: record the claim instead of marking the whole token as read.
  let obj: Ev
  if (m.object.type === 'Identifier' && (m.object as jsep.Identifier).name === 'jwt') {
    a.roots.add('jwt')
    a.claims.add(String(key))
    obj = s => s.jwt
  } else {
    obj = compileNode(m.object, d, a)
  }
  return s => own(obj(s), key)
}

/** Logical operators (short-circuit, flattened), comparisons and `in`. */
function compileBinary(b: jsep.BinaryExpression, d: number, a: Analysis): Ev {
  const op = b.operator
  if (op === '&&' || op === '||') {
    // Flatten chains of the same operator so `a || b || c ...` does not count as nesting.
    const items: jsep.Expression[] = []
    const collect = (n: jsep.Expression): void => {
      if (n.type === 'BinaryExpression' && (n as jsep.BinaryExpression).operator === op) {
        collect((n as jsep.BinaryExpression).left)
        collect((n as jsep.BinaryExpression).right)
      } else items.push(n)
    }
    collect(b)
    const evs = items.map(n => compileNode(n, d, a))
    if (op === '&&') {
      return s => {
        for (const e of evs) if (e(s) !== true) return false
        return true
      }
    }
    return s => {
      for (const e of evs) if (e(s) === true) return true
      return false
    }
  }
  const l = compileNode(b.left, d, a)
  const r = compileNode(b.right, d, a)
  switch (op) {
    case '==':
    case '===':
      return s => l(s) === r(s)
    case '!=':
    case '!==':
      return s => l(s) !== r(s)
    case '<':
    case '<=':
    case '>':
    case '>=':
      return s => compare(op, l(s), r(s))
    case 'in':
      return s => inOp(l(s), r(s))
    default:
      throw new RuleError(`operator "${op}" is not allowed`, positionOf(a.text, op, false))
  }
}

/** A call of one of the helpers, with its arity checked. */
function compileCall(c: jsep.CallExpression, d: number, a: Analysis): Ev {
  const only = `only these functions may be called: ${HELPER_NAMES.join(', ')}`
  if (c.callee.type !== 'Identifier') {
    // Compile the callee first so forbidden names and unknown roots are reported as such.
    compileNode(c.callee, d, a)
    throw new RuleError(only, positionOf(a.text, '(', false))
  }
  const calleeName = (c.callee as jsep.Identifier).name
  if (FORBIDDEN_NAMES.has(calleeName)) throw new RuleError(`"${calleeName}" is not allowed`, positionOf(a.text, calleeName, true))
  if (!Object.hasOwn(HELPERS, calleeName)) throw new RuleError(only, positionOf(a.text, calleeName, true))
  const name = (c.callee as jsep.Identifier).name
  const helper = HELPERS[name]!
  if (c.arguments.length !== helper.arity) {
    throw new RuleError(`${name}() takes ${helper.arity} argument${helper.arity === 1 ? '' : 's'}`, positionOf(a.text, name, true))
  }
  const args = c.arguments.map(x => compileNode(x, d, a))
  const fn = helper.fn
  if (args.length === 1) {
    const [x] = args as [Ev]
    return s => fn(x(s))
  }
  const [x, y] = args as [Ev, Ev]
  return s => fn(x(s), y(s))
}

function hasGroupOverage(claims: Readonly<Record<string, unknown>> | undefined): boolean {
  // Entra ID: too many groups -> `groups` is replaced by `_claim_names`/`_claim_sources`
  // (JWT) or `hasgroups: true`; the rule would silently see no groups.
  if (claims === undefined || claims === null || Object.hasOwn(claims, 'groups')) return false
  return Object.hasOwn(claims, '_claim_names') || Object.hasOwn(claims, 'hasgroups')
}

function describeAt(path: string, text: string, message: string, position: number): string {
  const shown = text.length > 200 ? text.slice(0, 200) + '…' : text
  const caret = position <= 200 ? '\n    ' + ' '.repeat(position) + '^' : ''
  return `${path}: ${message} at position ${position} in rule:\n    ${shown}${caret}`
}

/**
 * Parses and checks one rule. Throws ProxyError(MCPP_ERR_CONFIG) naming
 * `path`, the rule text and the position.
 */
export function compileRule(text: string, index: number, basePath = 'mcp.policies.authorization.rules'): CompiledRule {
  const path = `${basePath}[${index}]`
  const fail = (message: string, position: number, cause?: unknown): never => {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, describeAt(path, text, message, position), { cause, data: { path, position } })
  }
  if (typeof text !== 'string') return fail('a rule must be a string', 0)
  if (text.length > MAX_RULE_LENGTH) return fail(`rule longer than ${MAX_RULE_LENGTH} characters`, MAX_RULE_LENGTH)
  if (text.trim() === '') return fail('empty rule', 0)
  const a: Analysis = { roots: new Set(), claims: new Set(), wholeJwt: false, text }
  let ev: Ev
  try {
    checkBracketDepth(text)
    let ast: jsep.Expression
    try {
      ast = jsep(text)
    } catch (err) {
      const e = err as { description?: unknown; index?: unknown; message?: unknown }
      if (err instanceof RangeError) throw new RuleError(`nesting deeper than ${MAX_RULE_DEPTH}`, 0)
      const msg = typeof e.description === 'string' ? e.description : String(e.message)
      throw new RuleError(`syntax error: ${msg}`, typeof e.index === 'number' ? e.index : 0)
    }
    if (ast.type === 'Compound' && (ast as jsep.Compound).body.length === 0) throw new RuleError('empty rule', 0)
    ev = compileNode(ast, 1, a)
  } catch (err) {
    if (err instanceof RuleError) return fail(err.message, err.position, err)
    return fail('cannot compile rule', 0, err)
  }
  const kind = a.roots.has('mcp') ? 'operation' : 'endpoint'
  const readsGroups = a.claims.has('groups') || a.wholeJwt
  const compiled: CompiledRule = {
    index,
    text,
    kind,
    claims: a.claims,
    readsWholeJwt: a.wholeJwt,
    aboutScopes: a.claims.has('scp') || a.claims.has('scope'),
    evaluate(vars: RuleVariables): RuleOutcome {
      try {
        if (readsGroups && hasGroupOverage(vars.jwt)) return { allow: false, reason: 'group overage' }
        return ev(vars) === true ? { allow: true } : { allow: false, reason: 'rule is false' }
      } catch (error) {
        return { allow: false, reason: 'evaluation error', error }
      }
    },
  }
  return Object.freeze(compiled)
}

/**
 * Compiles every rule at start-up. Every bad rule is reported in one error
 * (one bad rule: its own error from compileRule; several: their messages, one
 * after the other, in `data.problems`).
 */
export function compileRules(rules: readonly string[], basePath = 'mcp.policies.authorization.rules'): CompiledRuleSet {
  const failures: ProxyError[] = []
  const list: CompiledRule[] = []
  rules.forEach((r, i) => {
    try {
      list.push(compileRule(r, i, basePath))
    } catch (err) {
      if (!ProxyError.is(err)) throw err
      failures.push(err)
    }
  })
  if (failures.length === 1) throw failures[0]!
  if (failures.length > 1) {
    const problems = failures.map(f => f.message)
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${failures.length} invalid rules:\n` + problems.join('\n'), { data: { problems } })
  }
  const compiled = Object.freeze(list)
  return Object.freeze({
    rules: compiled,
    endpoint: Object.freeze(compiled.filter(r => r.kind === 'endpoint')),
    operation: Object.freeze(compiled.filter(r => r.kind === 'operation')),
    firstFailure(list: readonly CompiledRule[], vars: RuleVariables): RuleFailure | undefined {
      for (const rule of list) {
        const outcome = rule.evaluate(vars)
        if (!outcome.allow) return { rule, outcome }
      }
      return undefined
    },
  })
}
