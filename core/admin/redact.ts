/**
 * Redaction for everything the admin listener sends. Two layers:
 * `redactConfig` replaces secrets in the effective config by where they are
 * (secret-named keys, target `env` and `headers` values, every value that came
 * from a `${NAME}` reference); `createScrubber` then removes the same secret
 * values wherever else they might surface (plugin state, error messages,
 * upstream errors), so a plugin that describes too much still leaks nothing.
 */

export const REDACTED = '[redacted]'

/** Keys whose value is a credential wherever they appear (compared lower-cased, without `-`/`_`). */
const SECRET_KEYS = new Set([
  'clientsecret',
  'secret',
  'token',
  'accesstoken',
  'refreshtoken',
  'idtoken',
  'password',
  'passwd',
  'apikey',
  'authorization',
  'privatekey',
  'credentials',
  'credential',
  'cookie',
  'sessionid',
  // A target's `auth` block: a static bearer, a private key's PEM.
  'bearer',
  'pem',
])

/** Parents whose every value may be a credential (stdio `env`, HTTP target `headers`). */
const SECRET_PARENTS = new Set(['env', 'headers'])

/** A secret field of a section that is not secret as a whole: a target's `auth.apiKey.value` (its `header` is a name). */
function isSecretField(parentKey: string, key: string): boolean {
  return key === 'value' && parentKey.toLowerCase().replace(/[-_]/g, '') === 'apikey'
}

/** Secret values shorter than this are redacted in the config view but not scrubbed elsewhere (too many false hits). */
const MIN_SCRUB_LENGTH = 6

export function isSecretKey(key: string): boolean {
  const k = key.toLowerCase().replace(/[-_]/g, '')
  return SECRET_KEYS.has(k) || k.endsWith('secret') || k.endsWith('password') || k.endsWith('token')
}

/** Walks a config-shaped value, calling `visit` for every leaf with its dotted path (`mcp.targets[0].name`). */
function walk(v: unknown, path: string, parentKey: string, leaf: (value: unknown, path: string, secret: boolean) => unknown): unknown {
  if (Array.isArray(v)) return v.map((x, i) => walk(x, `${path}[${i}]`, parentKey, leaf))
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {}
    for (const [k, x] of Object.entries(v)) {
      const p = path === '' ? k : `${path}.${k}`
      // A secret-named key holding a map is a section (`mcp.policies.authorization`), not a credential: walk into it.
      const section = x !== null && typeof x === 'object' && !Array.isArray(x)
      if ((isSecretKey(k) && !section) || SECRET_PARENTS.has(parentKey) || isSecretField(parentKey, k)) out[k] = secretLeaves(x, p, leaf)
      else out[k] = walk(x, p, k, leaf)
    }
    return out
  }
  return leaf(v, path, false)
}

function secretLeaves(v: unknown, path: string, leaf: (value: unknown, path: string, secret: boolean) => unknown): unknown {
  if (v !== null && typeof v === 'object') {
    // A secret-named key holding a structure: every leaf of it is secret.
    if (Array.isArray(v)) return v.map((x, i) => secretLeaves(x, `${path}[${i}]`, leaf))
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, secretLeaves(x, `${path}.${k}`, leaf)]))
  }
  return leaf(v, path, true)
}

/** `scheme://user:password@host...`: the password of a URL's userinfo (RFC 3986 §3.2.1), e.g. `cluster.redis.url`. */
const URL_PASSWORD = /^([a-z][a-z0-9+.-]*:\/\/[^/@:]*:)([^/@]+)(@)/i

/** The config with every secret replaced by `[redacted]`. Paths use the notation of `LoadedConfig.secretPaths`. */
export function redactConfig(config: unknown, secretPaths: ReadonlySet<string>): unknown {
  return walk(config, '', '', (value, path, secret) => {
    if (secret || secretPaths.has(path)) return REDACTED
    return typeof value === 'string' ? value.replace(URL_PASSWORD, `$1${REDACTED}$3`) : value
  })
}

/** Every secret string of the config that is long enough to scrub safely. */
export function secretValues(config: unknown, secretPaths: ReadonlySet<string>): string[] {
  const out = new Set<string>()
  walk(config, '', '', (value, path, secret) => {
    if (typeof value !== 'string' || value.length < MIN_SCRUB_LENGTH) return value
    const password = URL_PASSWORD.exec(value)?.[2]
    if (password !== undefined && password.length >= MIN_SCRUB_LENGTH) out.add(password)
    if (secret) out.add(value)
    // A `${NAME}` value that is a plain URL (issuer, resource) is not scrubbed from
    // OAuth documents and plugin state, where it is public; it stays redacted in the config view.
    else if (secretPaths.has(path) && !/^https?:\/\/[^@/]*(?:\/|$)/.test(value)) out.add(value)
    return value
  })
  return [...out].sort((a, b) => b.length - a.length)
}

/** Returns a function that deep-copies a JSON value with every occurrence of a secret replaced. */
export function createScrubber(secrets: readonly string[]): (value: unknown) => unknown {
  if (secrets.length === 0) return v => v
  const scrubString = (s: string): string => {
    let out = s
    for (const secret of secrets) if (out.includes(secret)) out = out.split(secret).join(REDACTED)
    return out
  }
  const scrub = (v: unknown): unknown => {
    if (typeof v === 'string') return scrubString(v)
    if (Array.isArray(v)) return v.map(scrub)
    if (v !== null && typeof v === 'object') {
      if (typeof (v as { toJSON?: unknown }).toJSON === 'function') return scrub(JSON.parse(JSON.stringify(v)))
      const out: Record<string, unknown> = {}
      for (const [k, x] of Object.entries(v)) out[scrubString(k)] = scrub(x)
      return out
    }
    return v
  }
  return scrub
}
