/**
 * Configuration: YAML -> ${NAME} expansion (scalar values only) -> ajv
 * validation against schemas/config.schema.json (all errors, each naming its
 * path) -> defaults -> each `mcp.policies` block validated by the plugin that
 * claims it (the registry the caller hands in) -> deep freeze. Everything
 * fails here, at start-up. Core keys only: plugin option types live with
 * their plugins.
 */
import { weakSecret } from './secret-strength.ts'
import { readFile } from 'node:fs/promises'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseDocument, isScalar, visit, Scalar } from 'yaml'
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv'
import addFormatsModule from 'ajv-formats'
import { ProxyError } from './errors.ts'
import { EMPTY_REGISTRY, type PluginModule, type PluginRegistry } from './plugin.ts'
import { parseCidr } from './cluster/client-address.ts'
import type { TracingConfig } from './observability/tracing.ts'
import { unknownKeyMessage } from './did-you-mean.ts'

const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv

export interface StdioTargetConfig {
  cmd: string
  args: string[]
  env: Record<string, string>
  cwd?: string
  /** `subject`: the sessions of one token subject share processes (see the schema). */
  share?: 'session' | 'subject'
  processesPerSubject?: number
}
export interface HttpTargetConfig {
  url: string
  headers: Record<string, string>
}
/** How the gateway authenticates to the IdP's token endpoint for an exchange. */
export interface TokenClientConfig {
  tokenEndpoint: string
  clientId: string
  /** With `clientSecret`: client_secret_basic (default for tokenExchange) or client_secret_post (default for onBehalfOf, as Microsoft documents). */
  clientSecret?: string
  /** private_key_jwt (RFC 7523 §2.2): a PEM PKCS#8 key; Entra's certificate credential sets `x5t`. */
  privateKey?: { pem: string; alg: 'RS256' | 'PS256' | 'ES256'; kid?: string; x5t?: string }
  clientAuthMethod?: 'client_secret_basic' | 'client_secret_post' | 'private_key_jwt'
  /** What the minted token's `aud` must contain before it is sent (default: audience and resource, or the OBO scope's resource). */
  expectedAudience?: string[]
  /** Seconds before `exp` a minted token is no longer used. Default 60. */
  refreshSkewSeconds?: number
  /** Token endpoint timeout. Default 10000. */
  timeoutMs?: number
  /** Minted tokens cached for this target (one per caller key), least recently used out first. Default 10000. */
  cacheMaxEntries?: number
}
/** RFC 8693 token exchange. */
export interface TokenExchangeConfig extends TokenClientConfig {
  audience?: string[]
  resource?: string[]
  scope?: string
  requestedTokenType?: string
}
/** Entra on-behalf-of (jwt-bearer, requested_token_use=on_behalf_of). */
export interface OnBehalfOfConfig extends TokenClientConfig {
  /** `<app id URI>/.default` or named scopes, space separated. */
  scope: string
}
/**
 * A target's `auth` block: at most one credential mode (tokenExchange,
 * onBehalfOf, bearer, apiKey) plus claim-templated `headers` (HTTP targets)
 * or `env` (stdio targets). Checked by the schema and core/credentials/.
 */
export interface TargetAuthConfig {
  tokenExchange?: TokenExchangeConfig
  onBehalfOf?: OnBehalfOfConfig
  /** A static secret sent as `Authorization: Bearer <value>` to this target only. */
  bearer?: string
  /** A static secret in a header of its own. */
  apiKey?: { header: string; value: string }
  /** HTTP targets: header name -> template over the claims, e.g. `{sub}`, `{groups}` (arrays joined by `,`). */
  headers?: Record<string, string>
  /** stdio targets: variable -> template over the claims; `{credential}` is the minted token. */
  env?: Record<string, string>
  /** The step-up challenge's `scope` when the IdP asks for consent (default: the gateway's scopes_supported). */
  stepUpScope?: string
  /** Credentials over plain http to a host that is not loopback: refused unless true. */
  allowInsecureHttp?: boolean
}
export interface TargetConfig {
  name: string
  stdio?: StdioTargetConfig
  mcp?: HttpTargetConfig
  /** What the target receives for each caller (core/credentials/). */
  auth?: TargetAuthConfig
  /** Which era the target speaks to 2026-07-28 clients (see the schema); default auto. */
  protocol?: 'auto' | '2026-07-28' | 'session'
}
export interface PluginEntryConfig {
  builtin?: string
  module?: string
  options?: Record<string, unknown>
}
export interface ProbesConfig {
  host: string
  port: number
  metricsToken?: string
  shutdownDelayMs: number
}
export interface ClusterConfig {
  secret: string
  advertiseUrl: string
  forwardTimeoutMs: number
  redis?: { url: string; keyPrefix: string; sessionLeaseSeconds: number }
}
export interface GatewayConfig {
  mcp: {
    host: string
    port: number
    baseUrl?: string
    /** Options of built-in plugins by `PluginModule.policy`, validated by those plugins. */
    policies: Readonly<Record<string, unknown>>
    plugins?: PluginEntryConfig[]
    targets: TargetConfig[]
    /** CIDR ranges or addresses of reverse proxies whose X-Forwarded-For is believed (core/cluster/client-address.ts). */
    trustedProxies: string[]
    failClosed: boolean
    session: { idleTimeoutSeconds: number; maxSessions: number; maxSessionsPerSubject: number; requestTimeoutSeconds: number }
    limits: {
      maxBodyBytes: number
      maxLineBytes: number
      maxHeaders: number
      headersTimeoutMs: number
      requestTimeoutMs: number
      bodyTimeoutMs: number
      keepAliveTimeoutMs: number
      shutdownGraceMs: number
      maxStreamBufferBytes: number
      maxBacklogBytes: number
      maxResumableStreams: number
      startupHoldMs: number
      startupMaxHeldRequests: number
      maxToolLabels: number
      maxTasksPerSession: number
      maxInputRequestsPerRound: number
    }
    readiness: { targets?: 'all' | 'any' | 'none' }
    /** SSE answers of the session era; `pollAfterMs` 0 is off (schemas/config.schema.json). */
    streams: { pollAfterMs: number }
  }
  admin: { host: string; port: number; token?: string; enabled: boolean }
  logging: { level: string; format: 'json' | 'pretty'; levels: 'name' | 'number'; time: 'iso' | 'epoch' }
  tracing: TracingConfig
  probes?: ProbesConfig
  cluster?: ClusterConfig
  /** Processes on the MCP port (core/cluster/primary.ts); `auto` is one per available core. */
  workers: number | 'auto'
  workerRestartsPerMinute: number
}

export interface LoadedConfig {
  readonly config: Readonly<GatewayConfig>
  /** Directory of the config file; relative paths (plugin modules, cwd) resolve against it. */
  readonly baseDir: string
  /** Dotted paths whose value came from a ${NAME} reference: redacted in the UI. */
  readonly secretPaths: ReadonlySet<string>
}

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', fileURLToPath(import.meta.url).endsWith('.ts') ? '' : '..')
/** Path to a file shipped with the package (package.json, schemas/). */
export function packagePath(rel: string): string {
  return resolve(ROOT, rel)
}

/** RFC 9110 §5.5 field-value: visible ASCII, space, tab and obs-text; what Node accepts in a header. */
export const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/

let validatorPromise: Promise<{ ajv: Ajv; validate: ValidateFunction }> | undefined

/** A new ajv instance with our conventions; plugin option schemas are validated with it too. */
export function createAjv(): Ajv {
  const ajv = new Ajv({ allErrors: true, useDefaults: true, strict: false, verbose: true })
  addFormats(ajv)
  // A value that ends up in an HTTP header (a scope in WWW-Authenticate, a CORS
  // list): Node refuses to write one holding a control character (RFC 9110
  // §5.5 field-value), so it must fail at load, not on every response.
  ajv.addFormat('header-value', HEADER_VALUE)
  ajv.addKeyword({ keyword: 'errorMessage', schemaType: 'string' })
  return ajv
}

async function getValidator(): Promise<{ ajv: Ajv; validate: ValidateFunction }> {
  validatorPromise ??= (async () => {
    const ajv = createAjv()
    const root = JSON.parse(await readFile(packagePath('schemas/config.schema.json'), 'utf8'))
    return { ajv, validate: ajv.compile(root) }
  })()
  return validatorPromise
}

/** `/mcp/targets/0/name` -> `mcp.targets[0].name` */
export function toDotted(pointer: string, prefix = ''): string {
  let out = prefix
  for (const raw of pointer.split('/').slice(1)) {
    const seg = raw.replace(/~1/g, '/').replace(/~0/g, '~')
    out += /^\d+$/.test(seg) ? `[${seg}]` : out === '' ? seg : '.' + seg
  }
  return out
}

/** Keywords whose error a schema's `errorMessage` replaces. */
const CUSTOM_KEYWORDS = ['minProperties', 'maxProperties', 'oneOf', 'required', 'pattern']

/**
 * Whether a schema's `errorMessage` speaks for this error: its structural
 * keywords, but not a `required` of its own (a missing `name` is not a wrong
 * choice among a oneOf's keys).
 */
function spokenFor(e: ErrorObject): boolean {
  if (!CUSTOM_KEYWORDS.includes(e.keyword)) return false
  return e.keyword !== 'required' || e.schemaPath.includes('/oneOf/')
}

/** Turns ajv errors into `path: message` lines, one per problem, deduplicated. */
export function formatAjvErrors(errors: readonly ErrorObject[], prefix = ''): string[] {
  const lines = new Set<string>()
  const custom = new Set<string>()
  // A schema with `errorMessage` speaks for its structural errors at that path.
  for (const e of errors) {
    const parent = e.parentSchema as { errorMessage?: string } | undefined
    if (parent?.errorMessage !== undefined && spokenFor(e)) {
      const at = toDotted(e.instancePath, prefix) || '(root)'
      custom.add(at)
      lines.add(`${at}: ${parent.errorMessage}`)
    }
  }
  for (const e of errors) {
    let at = toDotted(e.instancePath, prefix)
    if (custom.has(at || '(root)') && spokenFor(e)) continue
    if (e.keyword === 'if') continue
    let msg = e.message ?? 'is invalid'
    if (e.keyword === 'additionalProperties') {
      const key = (e.params as { additionalProperty: string }).additionalProperty
      at = at === '' ? key : `${at}.${key}`
      msg = unknownKeyMessage(key, Object.keys((e.parentSchema as { properties?: object } | undefined)?.properties ?? {}))
    } else if (
      e.keyword === 'type' &&
      (e.params as { type: string }).type === 'object' &&
      typeof e.data === 'string' &&
      Object.hasOwn((e.parentSchema as { properties?: object } | undefined)?.properties ?? {}, e.data)
    ) {
      // `provider: oss_idp` for `provider: { oss_idp: { ... } }`: the value names one of the object's keys.
      msg = `must be an object like \`${at.split('.').pop()}: { ${e.data}: { … } }\`, not the string "${e.data}"`
    } else if (e.keyword === 'required') {
      const key = (e.params as { missingProperty: string }).missingProperty
      at = at === '' ? key : `${at}.${key}`
      msg = 'is required'
    } else if (e.keyword === 'enum') {
      msg = `must be one of ${(e.params as { allowedValues: unknown[] }).allowedValues.map(v => JSON.stringify(v)).join(', ')}`
    } else if (e.keyword === 'format' && (e.params as { format: string }).format === 'header-value') {
      msg = 'must not contain control characters (the value is sent in an HTTP header)'
    } else if (e.keyword === 'format') {
      msg = `must be a valid ${(e.params as { format: string }).format}`
    }
    lines.add(`${at || '(root)'}: ${msg}`)
  }
  return [...lines]
}

const ENV_REF = /\$\$\{|\$\{([^}]*)\}/g
/** `NAME`, optionally followed by a POSIX shell operator (`:-`, `-`, `:?`, `?`) and its word. */
const ENV_EXPR = /^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([\s\S]*))?$/

/**
 * Expands `${NAME}` in a string with the shell's parameter expansion
 * (POSIX.1-2017 XCU §2.6.2): `${NAME:-word}` gives word when NAME is unset
 * or empty, `${NAME-word}` only when unset; `${NAME:?message}` fails when
 * unset or empty, `${NAME?message}` only when unset. The word is literal (no
 * nested references). `$${` stands for a literal `${`. Returns undefined when
 * the string has no reference. Each problem is pushed to `problems` when
 * given (so one run reports every one), else thrown.
 */
export function expandString(value: string, env: NodeJS.ProcessEnv, where: string, problems?: EnvProblem[]): string | undefined {
  if (!value.includes('${')) return undefined
  let used = false
  const report = (p: EnvProblem): string => {
    if (problems === undefined) throw envError([p])
    problems.push(p)
    return ''
  }
  const out = value.replace(ENV_REF, (match: string, body: string | undefined) => {
    if (match === '$${') return '${'
    const m = ENV_EXPR.exec((body ?? '').trim())
    if (m === null) {
      return report({ code: 'MCPP_ERR_CONFIG', line: `${where}: invalid environment reference \${${body ?? ''}}` })
    }
    const [, n, op, word = ''] = m as unknown as [string, string, string | undefined, string | undefined]
    const v = env[n]
    const absent = v === undefined || (op?.startsWith(':') === true && v === '')
    used = true
    if (!absent) return v!
    if (op === ':-' || op === '-') return word
    const why = v === undefined ? `environment variable not found: ${n}` : `environment variable is empty: ${n}`
    return report({ code: 'MCPP_ERR_ENV_NOT_FOUND', line: `${why} (referenced at ${where})${word !== '' ? `: ${word}` : ''}` })
  })
  return used || out !== value ? out : undefined
}

/** One problem found while expanding references. */
export interface EnvProblem {
  readonly code: 'MCPP_ERR_CONFIG' | 'MCPP_ERR_ENV_NOT_FOUND'
  readonly line: string
}

/** One error for every problem found; `environment variable not found` wins the code (SPEC: exit with that message). */
function envError(problems: readonly EnvProblem[]): ProxyError {
  const lines = problems.map(p => p.line)
  const code = problems.some(p => p.code === 'MCPP_ERR_ENV_NOT_FOUND') ? 'MCPP_ERR_ENV_NOT_FOUND' : 'MCPP_ERR_CONFIG'
  return new ProxyError(code, 500, lines.join('\n'), { data: { problems: lines } })
}

function pathOf(path: readonly unknown[]): string {
  const segs: Array<string | number> = []
  for (let i = 0; i < path.length; i++) {
    const node = path[i] as { items?: unknown[] }
    const next = path[i + 1]
    if (next === undefined) break
    if (node && Array.isArray(node.items)) {
      const idx = node.items.indexOf(next)
      if (idx >= 0) {
        const pair = next as { key?: unknown }
        if (pair && typeof pair === 'object' && 'key' in pair && isScalar(pair.key)) segs.push(String(pair.key.value))
        else segs.push(idx)
      }
    }
  }
  return segs.reduce<string>((acc, s) => (typeof s === 'number' ? `${acc}[${s}]` : acc === '' ? s : `${acc}.${s}`), '')
}

const SCALAR_RE = /^(?:-?\d+(?:\.\d+)?|true|false|null)$/

/** Parses YAML text and expands environment references in scalar values. */
export function parseConfigText(text: string, env: NodeJS.ProcessEnv): { data: unknown; secretPaths: Set<string> } {
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true })
  if (doc.errors.length > 0) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, 'invalid YAML:\n' + doc.errors.map(e => '  ' + e.message).join('\n'))
  }
  const secretPaths = new Set<string>()
  const problems: EnvProblem[] = []
  visit(doc, {
    Pair() {
      // Keys are never expanded: `${X}: 1` stays literal and fails validation as an unknown key.
      return undefined
    },
    Scalar(key, node, path) {
      if (key === 'key' || typeof node.value !== 'string') return undefined
      const where = pathOf([...path, node]) || '(root)'
      const expanded = expandString(node.value, env, where, problems)
      if (expanded === undefined) return undefined
      secretPaths.add(where)
      // A plain (unquoted) scalar that was exactly one reference may become a
      // number or boolean (`port: ${PORT}`); never a map or list.
      const whole = /^\$\{[^}]*\}$/.test(node.value.trim())
      if (whole && node.type === Scalar.PLAIN && SCALAR_RE.test(expanded.trim())) {
        const t = expanded.trim()
        node.value = t === 'true' ? true : t === 'false' ? false : t === 'null' ? null : Number(t)
      } else {
        node.value = expanded
      }
      return undefined
    },
  })
  if (problems.length > 0) throw envError(problems)
  return { data: doc.toJS({ maxAliasCount: 50 }), secretPaths }
}

const compiled = new WeakMap<object, ValidateFunction>()

/**
 * Validates (a copy of) a plugin's options against its schema, applying the
 * schema's defaults. The one path for built-ins, policy blocks and
 * third-party modules alike.
 */
export function validatePluginOptions(mod: PluginModule, options: unknown, path: string): unknown {
  const copy = structuredClone(options ?? {})
  if (mod.optionsSchema === undefined) return copy
  let validate = compiled.get(mod.optionsSchema)
  if (validate === undefined) {
    try {
      validate = createAjv().compile(mod.optionsSchema)
    } catch (err) {
      throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${path}: plugin ${mod.name} has an invalid options schema: ${(err as Error).message}`, { cause: err })
    }
    compiled.set(mod.optionsSchema, validate)
  }
  if (!validate(copy)) {
    const lines = formatAjvErrors(validate.errors ?? [], path)
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `invalid options for plugin ${mod.name}:\n` + lines.map(l => '  ' + l).join('\n'), {
      data: { problems: lines },
    })
  }
  return copy
}

/**
 * Problems with the `mcp.policies` blocks and `builtin` names, as
 * `path: message` lines: a policy no built-in claims is an unknown key; each
 * block is validated against its plugin's schema, with its defaults written
 * into `config` (called by validateConfig on its own copy).
 */
export function checkPolicies(config: GatewayConfig, registry: PluginRegistry): string[] {
  const problems: string[] = []
  const byPolicy = new Map<string, PluginModule>()
  for (const mod of Object.values(registry.modules)) if (mod.policy !== undefined) byPolicy.set(mod.policy, mod)
  const policies = config.mcp.policies as Record<string, unknown>
  for (const key of Object.keys(policies)) {
    const mod = byPolicy.get(key)
    if (mod === undefined) {
      problems.push(`mcp.policies.${key}: ${unknownKeyMessage(key, byPolicy.keys())}`)
      continue
    }
    try {
      policies[key] = validatePluginOptions(mod, policies[key], `mcp.policies.${key}`)
    } catch (err) {
      if (!ProxyError.is(err)) throw err
      problems.push(...((err.data?.problems as string[] | undefined) ?? [err.message]))
    }
  }
  const names = Object.keys(registry.modules)
  config.mcp.plugins?.forEach((e, i) => {
    if (e.builtin !== undefined && !Object.hasOwn(registry.modules, e.builtin)) {
      problems.push(`mcp.plugins[${i}].builtin: must be one of ${names.map(n => JSON.stringify(n)).join(', ')}`)
    }
  })
  return problems
}

export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value)
    for (const v of Object.values(value as Record<string, unknown>)) deepFreeze(v)
  }
  return value
}

/**
 * Validates already-parsed config data, the `mcp.policies` blocks by the
 * registry's plugins; throws one ProxyError listing every problem.
 */
export async function validateConfig(data: unknown, registry: PluginRegistry = EMPTY_REGISTRY): Promise<GatewayConfig> {
  const { validate } = await getValidator()
  const copy = structuredClone(data ?? {})
  if (!validate(copy)) {
    const lines = formatAjvErrors(validate.errors ?? [])
    throw new ProxyError('MCPP_ERR_CONFIG', 500, 'invalid configuration:\n' + lines.map(l => '  ' + l).join('\n'), { data: { problems: lines } })
  }
  const cfg = copy as GatewayConfig
  const problems: string[] = []
  const names = new Set<string>()
  cfg.mcp.targets.forEach((t, i) => {
    if (names.has(t.name)) problems.push(`mcp.targets[${i}].name: duplicate target name "${t.name}"`)
    names.add(t.name)
  })
  cfg.mcp.trustedProxies.forEach((text, i) => {
    const c = parseCidr(text)
    if (typeof c === 'string') problems.push(`mcp.trustedProxies[${i}]: ${c}`)
  })
  if (cfg.cluster !== undefined) {
    const weak = weakSecret(cfg.cluster.secret)
    if (weak !== undefined) problems.push(`cluster.secret: ${weak}`)
  }
  problems.push(...checkPolicies(cfg, registry))
  if (problems.length > 0) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, 'invalid configuration:\n' + problems.map(l => '  ' + l).join('\n'), { data: { problems } })
  }
  return cfg
}

/** Why a file could not be read, in words (never a bare errno code). */
export function readFailure(err: unknown, file: string): string {
  switch ((err as NodeJS.ErrnoException).code) {
    case 'ENOENT':
      return `file not found: ${file}`
    case 'EACCES':
    case 'EPERM':
      return `permission denied: ${file}`
    case 'EISDIR':
      return `is a directory, not a file: ${file}`
    default:
      return `${file}: ${(err as Error).message ?? String(err)}`
  }
}

/** Reads, expands, validates (the policy blocks by the registry's plugins) and freezes a config file. */
export async function loadConfig(file: string, env: NodeJS.ProcessEnv = process.env, registry: PluginRegistry = EMPTY_REGISTRY): Promise<LoadedConfig> {
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch (err) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `cannot read config file: ${readFailure(err, file)}`, { cause: err })
  }
  const { data, secretPaths } = parseConfigText(text, env)
  const config = await validateConfig(data, registry)
  return { config: deepFreeze(config), baseDir: dirname(resolve(file)), secretPaths }
}
