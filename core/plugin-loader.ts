/**
 * Builds the plugin pipeline from the config: built-ins from the registry the
 * caller hands in (core imports no plugin) and third-party modules loaded
 * with import(). Every plugin goes through the same steps: options (inline,
 * else its `mcp.policies` block) validated against its own schema with the
 * config path in every error, `check` (cross-field checks, what it provides),
 * `needs` met by a plugin listed before it, then `create`. The pipeline order
 * is decided here and nowhere else; so are the checks of the targets' `auth`
 * blocks that depend on it (core/credentials/config-check.ts).
 */
import { createRequire } from 'node:module'
import { isAbsolute, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import type { Plugin, PluginEnv, PluginModule, PluginRegistry } from './plugin.ts'
import { PLUGIN_API_VERSION, EMPTY_REGISTRY } from './plugin.ts'
import type { GatewayConfig, PluginEntryConfig } from './config.ts'
import { deepFreeze, validatePluginOptions } from './config.ts'
import { ProxyError, ERROR_CODES, ERROR_CODE_RE } from './errors.ts'
import { sealKey } from './cluster/seal.ts'
import { checkTargetAuth } from './credentials/index.ts'

/** The default pipeline when `mcp.plugins` is not given, from the registry. */
export function defaultEntries(config: GatewayConfig, registry: PluginRegistry = EMPTY_REGISTRY): PluginEntryConfig[] {
  return registry.defaultPipeline(config.mcp.policies ?? {}).map(builtin => ({ builtin }))
}

/** Minimal semver-range check for plugin `engine` fields: `*`, `^X`, `^X.Y`, `>=X.Y.Z`, `X.x`. */
export function engineSatisfied(range: string, version = PLUGIN_API_VERSION): boolean {
  const [maj, min, pat] = version.split('.').map(Number) as [number, number, number]
  const r = range.trim()
  if (r === '*' || r === '') return true
  let m = /^\^(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(r)
  if (m) {
    const [a, b = 0, c = 0] = [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)]
    return maj === a && (min > b || (min === b && pat >= c))
  }
  m = /^>=\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(r)
  if (m) {
    const [a, b, c] = [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)]
    return maj > a || (maj === a && (min > b || (min === b && pat >= c)))
  }
  m = /^(\d+)\.x$/.exec(r)
  if (m) return maj === Number(m[1])
  return false
}

function isPluginModule(v: unknown): v is PluginModule {
  const m = v as PluginModule | undefined
  return typeof m === 'object' && m !== null && typeof m.name === 'string' && typeof m.engine === 'string' && typeof m.create === 'function'
}

async function importModule(spec: string, baseDir: string, at: string): Promise<PluginModule> {
  let url: string
  if (spec.startsWith('.') || isAbsolute(spec)) {
    url = pathToFileURL(isAbsolute(spec) ? spec : resolve(baseDir, spec)).href
  } else {
    try {
      url = pathToFileURL(createRequire(join(baseDir, 'noop.js')).resolve(spec)).href
    } catch {
      url = spec
    }
  }
  let ns: Record<string, unknown>
  try {
    ns = (await import(url)) as Record<string, unknown>
  } catch (err) {
    // Only the plugin itself being absent is "module not found"; a missing
    // import inside the plugin keeps its own message. Loaders do not always
    // keep `code` on the error, so the message is checked too.
    const code = (err as NodeJS.ErrnoException).code
    const message = String((err as Error).message)
    const missing = code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND' || /^Cannot find (module|package) /.test(message)
    const itself = url.startsWith('file:') ? fileURLToPath(url) : spec
    const why = missing && message.includes(`'${itself}'`) ? 'module not found' : message
    throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: cannot load plugin module "${spec}": ${why}`, { cause: err })
  }
  const mod = ns.default ?? ns.plugin
  if (!isPluginModule(mod)) {
    throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: "${spec}" does not export a plugin module (default export with name, engine and create())`)
  }
  return mod
}

export interface LoadPluginsOptions {
  config: GatewayConfig
  baseDir: string
  env: Omit<PluginEnv, 'configPath' | 'log' | 'provided' | 'deriveKey'> & { log: PluginEnv['log'] }
  /** The built-ins `- builtin: <name>` and the default pipeline refer to. */
  registry?: PluginRegistry
  /** Resolve and validate everything, run `check()`, but create nothing (`--check`). */
  dryRun?: boolean
  /**
   * The secret this deployment's processes share (`cluster.secret`, or the
   * per-run secret of `workers`): each plugin's `env.deriveKey` derives from it.
   */
  secret?: string
}

interface Resolved {
  readonly mod: PluginModule
  readonly at: string
  readonly path: string
  readonly options: unknown
  readonly inline: boolean
}

/** The module and validated options of one pipeline entry. */
async function resolveEntry(entry: PluginEntryConfig, at: string, config: GatewayConfig, baseDir: string, registry: PluginRegistry): Promise<Resolved> {
  let mod: PluginModule
  if (entry.builtin !== undefined) {
    const found = Object.hasOwn(registry.modules, entry.builtin) ? registry.modules[entry.builtin] : undefined
    if (found === undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `${at}.builtin: unknown built-in plugin "${entry.builtin}"`)
    mod = found
  } else {
    mod = await importModule(entry.module!, baseDir, at)
    if (!engineSatisfied(mod.engine)) {
      throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: plugin ${mod.name} needs plugin API ${mod.engine}, this gateway has ${PLUGIN_API_VERSION}`)
    }
  }
  const policies = (config.mcp.policies ?? {}) as Record<string, unknown>
  const fromPolicy = entry.options === undefined && mod.policy !== undefined && Object.hasOwn(policies, mod.policy)
  // Unlisted (the default pipeline) and without a policy block: no options to point at but the policies.
  const path = fromPolicy ? `mcp.policies.${mod.policy!}` : entry.options !== undefined || at !== 'mcp.policies' ? `${at}.options` : at
  const options = deepFreeze(validatePluginOptions(mod, fromPolicy ? policies[mod.policy!] : entry.options, path))
  return { mod, at, path, options, inline: entry.options !== undefined }
}

/** Error codes: well-formed, and none declared twice (by core or another plugin). */
function checkErrorCodes(resolved: readonly Resolved[]): void {
  const owner = new Map<string, string>(Object.keys(ERROR_CODES).map(c => [c, 'core']))
  for (const r of resolved) {
    for (const e of r.mod.errors ?? []) {
      if (!ERROR_CODE_RE.test(e.code))
        throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${r.at}: plugin ${r.mod.name} declares an invalid error code ${JSON.stringify(e.code)}`)
      const other = owner.get(e.code)
      if (other !== undefined && other !== r.mod.name) {
        throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${r.at}: plugin ${r.mod.name} declares error code ${e.code}, already declared by ${other}`)
      }
      owner.set(e.code, r.mod.name)
    }
  }
}

/**
 * Every configured block is acted on by a stage that will run. With an
 * explicit `mcp.plugins` list, a `mcp.policies` block whose plugin is not
 * listed (or is listed with inline options, which win) would be ignored
 * without a word: with `plugins: [cors]` a `mcpAuthentication` block meant
 * no authentication at all. The same for a part of a plugin's options that
 * another plugin serves (`actedOnBy`). Each is a config error naming both.
 */
function checkCoverage(resolved: readonly Resolved[], config: GatewayConfig, registry: PluginRegistry): void {
  if (config.mcp.plugins === undefined) return
  const problems: string[] = []
  const names = new Set(resolved.map(r => r.mod.name))
  const kind = (name: string): string => (Object.hasOwn(registry.modules, name) ? `builtin ${name}` : `plugin ${name}`)
  for (const key of Object.keys(config.mcp.policies ?? {})) {
    const claims = resolved.filter(r => r.mod.policy === key)
    const owner = Object.values(registry.modules).find(m => m.policy === key)?.name ?? claims[0]?.mod.name ?? key
    if (claims.length === 0) {
      problems.push(`mcp.policies.${key}: configured, but the pipeline mcp.plugins does not include ${kind(owner)}`)
    } else if (claims.every(r => r.inline)) {
      problems.push(
        `mcp.policies.${key}: configured, but ${claims.map(r => r.at).join(' and ')} gives ${kind(owner)} its options inline, which win; keep one of the two`
      )
    }
  }
  for (const r of resolved) {
    for (const part of r.mod.actedOnBy?.(r.options) ?? []) {
      if (!names.has(part.plugin)) problems.push(`${r.path}.${part.path}: configured, but the pipeline mcp.plugins does not include ${kind(part.plugin)}`)
    }
  }
  if (problems.length > 0) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, 'invalid configuration:\n' + problems.map(l => '  ' + l).join('\n'), { data: { problems } })
  }
}

/** Which module (among the listed and the registry) provides `name`, for error messages. */
function providerHint(name: string, registry: PluginRegistry): string {
  const mods = Object.values(registry.modules)
    .filter(m => m.provides?.includes(name))
    .map(m => m.name)
  return mods.length > 0 ? mods.join(' or ') : 'no known plugin'
}

interface Prepared {
  readonly resolved: readonly Resolved[]
  readonly provided: ReadonlyArray<Readonly<Record<string, unknown>>>
  /** Everything the pipeline's plugins provide, by name (what the core itself reads of it: the protected resource's scopes). */
  readonly all: Readonly<Record<string, unknown>>
}

/** Modules, options, error codes, `needs`, `check()`, coverage: everything that can fail without side effects. */
async function prepare(config: GatewayConfig, baseDir: string, registry: PluginRegistry): Promise<Prepared> {
  const listed = config.mcp.plugins !== undefined
  const entries = config.mcp.plugins ?? defaultEntries(config, registry)
  const resolved: Resolved[] = []
  for (let i = 0; i < entries.length; i++) {
    resolved.push(await resolveEntry(entries[i]!, listed ? `mcp.plugins[${i}]` : 'mcp.policies', config, baseDir, registry))
  }
  checkErrorCodes(resolved)
  const provided: Array<Readonly<Record<string, unknown>>> = []
  const available = new Map<string, unknown>()
  for (const r of resolved) {
    const own: Record<string, unknown> = {}
    for (const name of r.mod.needs ?? []) {
      if (!available.has(name)) {
        const later = resolved.slice(resolved.indexOf(r) + 1).find(o => o.mod.provides?.includes(name))
        throw new ProxyError(
          'MCPP_ERR_CONFIG',
          500,
          later !== undefined
            ? `${r.at}: plugin ${r.mod.name} needs "${name}" from plugin ${later.mod.name}, which must be listed before it`
            : `${r.at}: plugin ${r.mod.name} needs "${name}", provided by ${providerHint(name, registry)}, which is not in the pipeline`
        )
      }
    }
    for (const [name, value] of available) own[name] = value
    provided.push(Object.freeze(own))
    let out: Readonly<Record<string, unknown>> | undefined
    try {
      out = r.mod.check?.(r.options, r.path) ?? undefined
    } catch (err) {
      if (ProxyError.is(err)) throw err
      throw new ProxyError('MCPP_ERR_CONFIG', 500, `${r.path}: ${(err as Error).message}`, { cause: err })
    }
    for (const name of r.mod.provides ?? []) {
      if (out === undefined || !Object.hasOwn(out, name)) {
        throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${r.at}: plugin ${r.mod.name} declares that it provides "${name}" but its check() returned none`)
      }
      if (!available.has(name)) available.set(name, deepFreeze(out[name]))
    }
  }
  checkCoverage(resolved, config, registry)
  checkTargets(config, available)
  return { resolved, provided, all: Object.freeze(Object.fromEntries(available)) }
}

/**
 * The targets' `auth` blocks against the pipeline that will run: a
 * credential made from the caller's token needs a stage that authenticates
 * callers, known by what it provides (`protectedResource`, the RFC 9728
 * resource it guards), not by its name.
 */
function checkTargets(config: GatewayConfig, available: ReadonlyMap<string, unknown>): void {
  const problems = checkTargetAuth(config.mcp.targets, { authenticated: available.has('protectedResource') })
  if (problems.length > 0) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, 'invalid configuration:\n' + problems.map(l => '  ' + l).join('\n'), { data: { problems } })
  }
}

/** One stage of the pipeline as it will run, for `mcp-proxy --check`. */
export interface PipelineStage {
  readonly name: string
  /** Where it is configured: `mcp.plugins[1]`, or `mcp.policies` for the default pipeline. */
  readonly at: string
  /** Where its options come from. */
  readonly optionsPath: string
  /** What it enforces (`PluginModule.summary`), when the module says. */
  readonly summary?: string
}

/** The pipeline that will run, in order, after every start-up check (nothing is created). */
export async function describePipeline({
  config,
  baseDir,
  registry = EMPTY_REGISTRY,
}: Pick<LoadPluginsOptions, 'config' | 'baseDir' | 'registry'>): Promise<PipelineStage[]> {
  const { resolved, provided } = await prepare(config, baseDir, registry)
  return resolved.map((r, i) => ({ name: r.mod.name, at: r.at, optionsPath: r.path, summary: r.mod.summary?.(r.options, provided[i]!) }))
}

/** `env.deriveKey` for one plugin: its name and the purpose in the HKDF info, so keys never cross plugins or the core's own. */
function keyDeriver(secret: string | undefined, plugin: string): PluginEnv['deriveKey'] {
  return purpose => (secret === undefined ? undefined : new Uint8Array(sealKey(secret, `plugin key v1\0${plugin}\0${purpose}`)))
}

/** Loads and creates every plugin, in pipeline order. Closes the ones created if a later one fails. */
export async function loadPlugins(opts: LoadPluginsOptions): Promise<Plugin[]> {
  return (await loadPipeline(opts)).plugins
}

/**
 * As `loadPlugins`, with what the pipeline provides (`provides` of every plugin, by name): the
 * composition root reads the protected resource's `scopesSupported` from it for the credential layer.
 */
export async function loadPipeline({
  config,
  baseDir,
  env,
  registry = EMPTY_REGISTRY,
  dryRun = false,
  secret,
}: LoadPluginsOptions): Promise<{ plugins: Plugin[]; provided: Readonly<Record<string, unknown>> }> {
  const { resolved, provided, all } = await prepare(config, baseDir, registry)
  if (dryRun) return { plugins: resolved.map(r => ({ name: r.mod.name })), provided: all }

  const plugins: Plugin[] = []
  try {
    for (let i = 0; i < resolved.length; i++) {
      const { mod, at, path, options } = resolved[i]!
      let plugin: Plugin
      try {
        plugin = await mod.create(options, {
          ...env,
          configPath: path,
          log: env.log.child({ plugin: mod.name }),
          provided: provided[i]!,
          deriveKey: keyDeriver(secret, mod.name),
        })
      } catch (err) {
        if (ProxyError.is(err)) throw err
        throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: plugin ${mod.name} failed to start: ${(err as Error).message}`, { cause: err })
      }
      if (plugin === null || typeof plugin !== 'object' || typeof plugin.name !== 'string') {
        throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: plugin ${mod.name} create() did not return a plugin object`)
      }
      plugins.push(plugin)
    }
  } catch (err) {
    await Promise.allSettled(plugins.map(p => p.close?.()))
    throw err
  }
  return { plugins, provided: all }
}
