/**
 * For the admin listener tests: a whole gateway (core/gateway.ts) loaded
 * from a YAML file with `${NAME}` secrets, in front of server-everything over
 * stdio (its child's environment templated from the caller's claims: a
 * target with `auth`) and the dev IdP (oss_idp), plus a small Prometheus text parser.
 */
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import { loadConfig } from '../../core/config.ts'
import { startGateway, type RunningGateway } from '../../core/gateway.ts'
import type { DevIdp } from '../../bin/dev-idp.ts'
import { devIdp } from './idp.ts'
import { memoryLogger } from './logger.ts'
import { EVERYTHING } from './gateway-harness.ts'
import { builtins } from '../../plugins/index.ts'

/** Values that must never leave the gateway through the admin listener. */
export const SECRETS = {
  /** Reaches the config through `${UPSTREAM_API_KEY}` (a clientSecret-like credential of the target). */
  upstreamKey: 'upstream-api-key-7f3a9c1e5b',
  /** A literal value in the target's env: admin-visible in the file, still redacted. */
  literalEnv: 'literal-env-value-4711-zq',
  /** `admin.token`, through `${ADMIN_TOKEN}`. */
  adminToken: 'admin-token-3b8e2d9f61c04a7e',
} as const

export const RULE = '"mcp-users" in jwt.groups'

export interface AdminGateway {
  gw: RunningGateway
  idp: DevIdp | undefined
  admin: string
  mcp: string
  logText: () => string
  /** GET/DELETE/POST on the admin listener with the admin token. */
  call: (path: string, init?: RequestInit) => Promise<Response>
  aliceToken: () => Promise<string>
  bobToken: () => Promise<string>
  /** A caller the rules let in whose `groups` claim cannot go into the child's environment (a control character): the credential fails. */
  malloryToken: () => Promise<string>
}

export async function adminGateway(t: Test, opts: { issuer?: string } = {}): Promise<AdminGateway> {
  const idp = opts.issuer === undefined ? await devIdp(t) : undefined
  const issuer = opts.issuer ?? idp!.issuer
  const clientId = idp?.clientId ?? 'mcp-gateway-dev'
  const dir = await mkdtemp(join(tmpdir(), 'mcp-proxy-admin-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const yaml = `
mcp:
  port: 0
  host: 127.0.0.1
  policies:
    mcpAuthentication:
      mode: strict
      issuer: ${JSON.stringify(issuer)}
      audiences: [${JSON.stringify(clientId)}]
      provider: { oss_idp: {} }
      clientId: ${JSON.stringify(clientId)}
      resourceMetadata:
        resource: https://gateway.example.test/mcp
        scopesSupported: [openid, profile]
    authorization:
      rules: [${JSON.stringify(RULE)}]
  targets:
    - name: everything
      stdio:
        cmd: ${JSON.stringify(process.execPath)}
        args: [${JSON.stringify(EVERYTHING)}, stdio]
        env:
          UPSTREAM_API_KEY: \${UPSTREAM_API_KEY}
          VISIBLE_SETTING: ${SECRETS.literalEnv}
      auth:
        env:
          MCP_PROXY_USER: '{sub}'
          MCP_PROXY_GROUPS: '{groups}'
admin:
  host: 127.0.0.1
  port: 0
  token: \${ADMIN_TOKEN}
`
  const file = join(dir, 'gateway.yaml')
  await writeFile(file, yaml)
  const loaded = await loadConfig(file, { UPSTREAM_API_KEY: SECRETS.upstreamKey, ADMIN_TOKEN: SECRETS.adminToken }, builtins)
  const { log, text } = memoryLogger('debug')
  const gw = await startGateway(loaded, { mcpPort: 0, adminPort: 0, log, registry: builtins })
  t.teardown(() => gw.close())
  const admin = gw.adminUrl!.replace('localhost', '127.0.0.1')
  const mcp = gw.mcpUrl.replace('localhost', '127.0.0.1')
  const call = (path: string, init: RequestInit = {}): Promise<Response> =>
    fetch(admin + path, { ...init, headers: { authorization: `Bearer ${SECRETS.adminToken}`, ...(init.headers as Record<string, string> | undefined) } })
  return {
    gw,
    idp,
    admin,
    mcp,
    logText: text,
    call,
    aliceToken: () => idp!.mintToken({ sub: 'alice', groups: ['mcp-users'] }),
    bobToken: () => idp!.mintToken({ sub: 'bob', groups: ['other'] }),
    malloryToken: () => idp!.mintToken({ sub: 'mallory', groups: ['mcp-users', 'ops\u0007'] }),
  }
}

// ---- Prometheus text format ----------------------------------------------------

export interface Sample {
  name: string
  labels: Record<string, string>
  value: number
}
export interface Family {
  name: string
  type: string
  help: string
  samples: Sample[]
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const SUFFIXES = ['_bucket', '_sum', '_count', '_total', '_created']

function parseLabels(s: string, line: string): Record<string, string> {
  const out: Record<string, string> = {}
  let i = 0
  while (i < s.length) {
    const eq = s.indexOf('=', i)
    if (eq === -1) throw new Error(`bad labels in: ${line}`)
    const key = s.slice(i, eq).trim()
    if (!/^[a-zA-Z_][a-zA-Z0-9_]*$/.test(key)) throw new Error(`bad label name ${key} in: ${line}`)
    if (s[eq + 1] !== '"') throw new Error(`unquoted label value in: ${line}`)
    let j = eq + 2
    let value = ''
    for (; j < s.length && s[j] !== '"'; j++) {
      if (s[j] === '\\') {
        const c = s[++j]
        value +=
          c === 'n'
            ? '\n'
            : c === '\\'
              ? '\\'
              : c === '"'
                ? '"'
                : (() => {
                    throw new Error(`bad escape in: ${line}`)
                  })()
      } else value += s[j]
    }
    if (s[j] !== '"') throw new Error(`unterminated label value in: ${line}`)
    if (key in out) throw new Error(`duplicate label ${key} in: ${line}`)
    out[key] = value
    i = j + 1
    if (s[i] === ',') i++
    else if (i < s.length) throw new Error(`expected , in: ${line}`)
  }
  return out
}

function parseValue(v: string, line: string): number {
  if (v === '+Inf') return Infinity
  if (v === '-Inf') return -Infinity
  if (v === 'NaN') return NaN
  if (!/^-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+)$/.test(v)) throw new Error(`bad value in: ${line}`)
  return Number(v)
}

/** Parses Prometheus text exposition format 0.0.4 strictly enough to catch malformed output. */
export function parsePrometheus(text: string): Map<string, Family> {
  const families = new Map<string, Family>()
  if (!text.endsWith('\n')) throw new Error('exposition must end with a newline')
  for (const line of text.split('\n')) {
    if (line === '') continue
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line)
      if (m === null) continue
      const [, kind, name, rest] = m as unknown as [string, string, string, string]
      if (!NAME.test(name)) throw new Error(`bad metric name: ${line}`)
      const f = families.get(name) ?? { name, type: 'untyped', help: '', samples: [] }
      if (kind === 'TYPE') {
        if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest)) throw new Error(`bad type: ${line}`)
        if (f.samples.length > 0) throw new Error(`TYPE after samples: ${line}`)
        f.type = rest
      } else f.help = rest
      families.set(name, f)
      continue
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: -?\d+)?$/.exec(line)
    if (m === null) throw new Error(`bad sample line: ${line}`)
    const [, name, labelText, value] = m as unknown as [string, string, string | undefined, string]
    let family = families.get(name)
    if (family === undefined) {
      const suffix = SUFFIXES.find(s => name.endsWith(s))
      if (suffix !== undefined) family = families.get(name.slice(0, -suffix.length))
    }
    if (family === undefined) throw new Error(`sample without TYPE: ${line}`)
    family.samples.push({ name, labels: labelText === undefined || labelText === '' ? {} : parseLabels(labelText, line), value: parseValue(value, line) })
  }
  for (const f of families.values()) {
    if (f.type !== 'histogram') continue
    const series = new Map<string, Sample[]>()
    for (const s of f.samples.filter(x => x.name.endsWith('_bucket'))) {
      const { le, ...rest } = s.labels
      if (le === undefined) throw new Error(`${f.name}: bucket without le`)
      const key = JSON.stringify(rest)
      series.set(key, [...(series.get(key) ?? []), s])
    }
    for (const [key, buckets] of series) {
      for (let i = 1; i < buckets.length; i++) {
        if (buckets[i]!.value < buckets[i - 1]!.value) throw new Error(`${f.name}${key}: buckets not cumulative`)
      }
      const inf = buckets.find(b => b.labels.le === '+Inf')
      const count = f.samples.find(x => x.name === `${f.name}_count` && JSON.stringify(x.labels) === key)
      if (inf === undefined || count === undefined || inf.value !== count.value) throw new Error(`${f.name}${key}: +Inf bucket does not equal _count`)
    }
  }
  return families
}

/** Sum of the samples named `name` whose labels include `match`. */
export function sampleSum(families: Map<string, Family>, name: string, match: Record<string, string> = {}): number {
  let sum = 0
  for (const f of families.values()) {
    for (const s of f.samples) {
      if (s.name !== name) continue
      if (Object.entries(match).every(([k, v]) => s.labels[k] === v)) sum += s.value
    }
  }
  return sum
}
