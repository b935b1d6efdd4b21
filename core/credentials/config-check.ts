/**
 * The checks of `mcp.targets[].auth` the schema cannot make, run at start-up
 * and by `mcp-proxy --check` alike (no I/O): where the credential can go
 * (headers to HTTP targets, environment to stdio children), templates that
 * compile, header and variable names that are valid and not the protocol's
 * or the transport's own, secrets never over plain http beyond loopback
 * unless the operator says so, and no caller-dependent credential without an
 * authentication stage (there would be no caller: fail closed). Each problem
 * is a `path: message` line naming the config path.
 */
import { createPrivateKey } from 'node:crypto'
import type { TargetConfig, TokenClientConfig } from '../config.ts'
import { compileTemplate, type Template } from './templates.ts'

/** RFC 9110 §5.1 field-name: a token. */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
/** POSIX portable environment variable names. */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

/** Headers the transport or MCP itself sets: a credential header never replaces them. */
const RESERVED_HEADERS: ReadonlySet<string> = new Set([
  'host',
  'content-length',
  'content-type',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'upgrade',
  'te',
  'trailer',
  'expect',
  'proxy-authorization',
  'proxy-connection',
  'accept',
  'accept-encoding',
  'mcp-session-id',
  'mcp-protocol-version',
  'mcp-method',
  'mcp-name',
  'last-event-id',
  'traceparent',
  'tracestate',
])

/** Variables that change how a child runs (loader, interpreter, shell): never filled from a caller's claims. */
const RESERVED_ENV =
  /^(PATH|HOME|SHELL|IFS|ENV|BASH_ENV|SHELLOPTS|NODE_OPTIONS|NODE_PATH|PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|PERL5OPT|PERL5LIB|RUBYOPT|RUBYLIB|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|LD_.*|DYLD_.*)$/

/** Whether `url` names this host (RFC 6761 localhost, 127/8, ::1). */
export function isLoopbackUrl(url: string): boolean {
  let host: string
  try {
    host = new URL(url).hostname
  } catch {
    return false
  }
  return host === 'localhost' || host.endsWith('.localhost') || /^127\.\d+\.\d+\.\d+$/.test(host) || host === '[::1]'
}

/** What the pipeline offers the credential checks. */
export interface AuthCheckContext {
  /** Whether a stage authenticates callers (something provides `protectedResource`): without one there is no caller identity. */
  readonly authenticated: boolean
}

/** A key that works for an `auth` block: its problems, in config order. */
export function checkTargetAuth(targets: readonly TargetConfig[], ctx: AuthCheckContext): string[] {
  const problems: string[] = []
  targets.forEach((t, i) => {
    if (t.auth !== undefined) problems.push(...checkOne(t, `mcp.targets[${i}].auth`, ctx))
  })
  return problems
}

function exchangeOf(t: TargetConfig): { key: 'tokenExchange' | 'onBehalfOf'; cfg: TokenClientConfig } | undefined {
  if (t.auth?.tokenExchange !== undefined) return { key: 'tokenExchange', cfg: t.auth.tokenExchange }
  if (t.auth?.onBehalfOf !== undefined) return { key: 'onBehalfOf', cfg: t.auth.onBehalfOf }
  return undefined
}

function checkOne(t: TargetConfig, at: string, ctx: AuthCheckContext): string[] {
  const a = t.auth!
  const out: string[] = []
  const exchange = exchangeOf(t)
  const stdio = t.stdio !== undefined
  if (exchange !== undefined) out.push(...checkClient(exchange.cfg, `${at}.${exchange.key}`, a.allowInsecureHttp === true))
  const templates = [
    ...checkTemplates(a.headers, `${at}.headers`, exchange !== undefined, out),
    ...checkTemplates(a.env, `${at}.env`, exchange !== undefined, out),
  ]
  if (stdio) {
    if (a.headers !== undefined) out.push(`${at}.headers: a stdio target takes no headers; put what the child needs in auth.env`)
    if (a.bearer !== undefined) out.push(`${at}.bearer: a stdio target takes no headers; give the child the secret in stdio.env`)
    if (a.apiKey !== undefined) out.push(`${at}.apiKey: a stdio target takes no headers; give the child the secret in stdio.env`)
    if (exchange !== undefined && !templates.some(x => x.usesCredential)) {
      out.push(`${at}.${exchange.key}: a stdio child receives the minted token only through auth.env ("{credential}"), and none uses it`)
    }
    out.push(...checkEnvNames(a.env, t.stdio?.env ?? {}, `${at}.env`))
  } else {
    if (a.env !== undefined) out.push(`${at}.env: an HTTP target takes no environment; put what it needs in auth.headers`)
    out.push(...checkHeaderNames(t, at, exchange !== undefined || a.bearer !== undefined))
    const url = t.mcp?.url ?? ''
    if (url.startsWith('http:') && !isLoopbackUrl(url) && a.allowInsecureHttp !== true) {
      out.push(`${at}: credentials would go over plain http to ${new URL(url).host}; use https, or set auth.allowInsecureHttp: true`)
    }
  }
  const perCaller = exchange !== undefined || templates.some(x => !x.constant)
  if (perCaller && !ctx.authenticated) {
    out.push(
      `${at}: the credential is made from the caller's token, but no stage of the pipeline authenticates callers (one that provides protectedResource, like mcpAuthentication): every caller would be anonymous`
    )
  }
  return out
}

/** The exchange client: an authentication method that fits the credential given, a key that parses, an https token endpoint. */
function checkClient(cfg: TokenClientConfig, at: string, insecureOk: boolean): string[] {
  const out: string[] = []
  const m = cfg.clientAuthMethod
  if (m === 'private_key_jwt' && cfg.privateKey === undefined) out.push(`${at}.clientAuthMethod: private_key_jwt needs privateKey`)
  if ((m === 'client_secret_basic' || m === 'client_secret_post') && cfg.clientSecret === undefined) out.push(`${at}.clientAuthMethod: ${m} needs clientSecret`)
  if (cfg.privateKey !== undefined) {
    const problem = keyProblem(cfg.privateKey.pem, cfg.privateKey.alg)
    if (problem !== undefined) out.push(`${at}.privateKey.pem: ${problem}`)
  }
  if (cfg.tokenEndpoint.startsWith('http:') && !isLoopbackUrl(cfg.tokenEndpoint) && !insecureOk) {
    out.push(`${at}.tokenEndpoint: the caller's token and the gateway's credentials would go over plain http; use https, or set auth.allowInsecureHttp: true`)
  }
  return out
}

/** Whether `pem` is a private key `alg` can sign with (the key itself is never repeated). */
function keyProblem(pem: string, alg: string): string | undefined {
  let type: string | undefined
  let curve: string | undefined
  try {
    const key = createPrivateKey(pem)
    type = key.asymmetricKeyType
    curve = key.asymmetricKeyDetails?.namedCurve
  } catch {
    return 'is not a PEM private key (PKCS#8 "BEGIN PRIVATE KEY", or PKCS#1/SEC1)'
  }
  if (alg === 'ES256')
    return type === 'ec' && curve === 'prime256v1' ? undefined : `ES256 needs an EC P-256 key, this is ${type}${curve !== undefined ? ` ${curve}` : ''}`
  if (alg === 'PS256') return type === 'rsa' || type === 'rsa-pss' ? undefined : `PS256 needs an RSA key, this is ${type}`
  return type === 'rsa' ? undefined : `${alg} needs an RSA key, this is ${type}`
}

/** Compiles every template of a map; problems go to `out`. */
function checkTemplates(map: Readonly<Record<string, string>> | undefined, at: string, exchange: boolean, out: string[]): Template[] {
  const compiled: Template[] = []
  for (const [name, source] of Object.entries(map ?? {})) {
    const t = compileTemplate(source)
    if (typeof t === 'string') {
      out.push(`${at}.${name}: ${t}`)
      continue
    }
    if (t.usesCredential && !exchange) out.push(`${at}.${name}: {credential} is the token minted by tokenExchange or onBehalfOf, and this target has neither`)
    compiled.push(t)
  }
  return compiled
}

function checkHeaderNames(t: TargetConfig, at: string, setsAuthorization: boolean): string[] {
  const a = t.auth!
  const out: string[] = []
  const seen = new Map<string, string>()
  const statics = new Set(Object.keys(t.mcp?.headers ?? {}).map(k => k.toLowerCase()))
  const names: Array<[string, string]> = Object.keys(a.headers ?? {}).map(k => [k, `${at}.headers.${k}`])
  if (a.apiKey !== undefined) names.unshift([a.apiKey.header, `${at}.apiKey.header`])
  for (const [name, where] of names) {
    const lower = name.toLowerCase()
    if (!HEADER_NAME.test(name)) out.push(`${where}: "${name}" is not a valid header name (RFC 9110 token characters only)`)
    else if (RESERVED_HEADERS.has(lower) || lower.startsWith('mcp-param-'))
      out.push(`${where}: ${name} is set by the gateway itself and cannot carry a credential`)
    else if (lower === 'authorization' && setsAuthorization) out.push(`${where}: Authorization is already set by this target's credential mode`)
    else if (seen.has(lower)) out.push(`${where}: ${name} is also set at ${seen.get(lower)}`)
    else if (statics.has(lower)) out.push(`${where}: ${name} is also a static header in mcp.headers; keep one of the two`)
    seen.set(lower, where)
  }
  return out
}

function checkEnvNames(env: Readonly<Record<string, string>> | undefined, own: Readonly<Record<string, string>>, at: string): string[] {
  const out: string[] = []
  for (const name of Object.keys(env ?? {})) {
    if (!ENV_NAME.test(name)) out.push(`${at}.${name}: not a valid environment variable name (letters, digits and _, not starting with a digit)`)
    else if (RESERVED_ENV.test(name)) out.push(`${at}.${name}: ${name} changes how the child runs and is never filled from a caller's token`)
    else if (Object.hasOwn(own, name)) out.push(`${at}.${name}: also set in stdio.env; keep one of the two`)
  }
  return out
}
