/**
 * Builds the plugin pipeline from the config: the built-ins (whose options
 * are the `mcp.policies.*` blocks) and third-party modules loaded with
 * import(), each validated against its own options schema with the config
 * path in every error. The pipeline order is decided here and nowhere else.
 */
import { createRequire } from 'node:module'
import { isAbsolute, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import type { Plugin, PluginEnv, PluginModule } from './plugin.ts'
import { PLUGIN_API_VERSION } from './plugin.ts'
import type { GatewayConfig, PluginEntryConfig } from './config.ts'
import { createAjv, formatAjvErrors, deepFreeze } from './config.ts'
import { ProxyError } from './errors.ts'

export const BUILTIN_NAMES = ['cors', 'mcpAuthentication', 'authorization', 'providerBridge', 'registration'] as const
export type BuiltinName = typeof BUILTIN_NAMES[number]

const BUILTINS: Record<BuiltinName, () => Promise<{ default: PluginModule<any> }>> = {
  cors: () => import('../plugins/cors/index.ts'),
  mcpAuthentication: () => import('../plugins/mcp-authentication/index.ts'),
  authorization: () => import('../plugins/authorization/index.ts'),
  providerBridge: () => import('../plugins/provider-bridge/index.ts'),
  registration: () => import('../plugins/registration/index.ts'),
}

/** Where a built-in's options live in the config. */
function builtinOptions (name: BuiltinName, config: GatewayConfig): { options: unknown; path: string } {
  const p = config.mcp.policies
  switch (name) {
    case 'cors': return { options: p.cors ?? {}, path: 'mcp.policies.cors' }
    case 'mcpAuthentication': return { options: p.mcpAuthentication, path: 'mcp.policies.mcpAuthentication' }
    case 'authorization': return { options: p.authorization ?? { rules: [] }, path: 'mcp.policies.authorization' }
    default: return { options: {}, path: 'mcp.policies.mcpAuthentication' }
  }
}

/** The default pipeline when `mcp.plugins` is not given: built-ins whose policy is configured. */
export function defaultEntries (config: GatewayConfig): PluginEntryConfig[] {
  const p = config.mcp.policies
  const out: PluginEntryConfig[] = []
  if (p.cors !== undefined) out.push({ builtin: 'cors' })
  if (p.mcpAuthentication !== undefined) out.push({ builtin: 'mcpAuthentication' })
  if (p.authorization !== undefined && p.authorization.rules.length > 0) out.push({ builtin: 'authorization' })
  if (p.mcpAuthentication?.provider !== undefined) out.push({ builtin: 'providerBridge' }, { builtin: 'registration' })
  return out
}

/** Minimal semver-range check for plugin `engine` fields: `*`, `^X`, `^X.Y`, `>=X.Y.Z`, `X.x`. */
export function engineSatisfied (range: string, version = PLUGIN_API_VERSION): boolean {
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

function isPluginModule (v: unknown): v is PluginModule {
  const m = v as PluginModule | undefined
  return typeof m === 'object' && m !== null && typeof m.name === 'string' && typeof m.engine === 'string' && typeof m.create === 'function'
}

async function importModule (spec: string, baseDir: string, at: string): Promise<PluginModule> {
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
    ns = await import(url) as Record<string, unknown>
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
  env: Omit<PluginEnv, 'configPath' | 'log'> & { log: PluginEnv['log'] }
  /** Resolve and validate everything, run `check()`, but create nothing (`--check`). */
  dryRun?: boolean
}

/** Loads and creates every plugin, in pipeline order. Closes the ones created if a later one fails. */
export async function loadPlugins ({ config, baseDir, env, dryRun = false }: LoadPluginsOptions): Promise<Plugin[]> {
  const entries = config.mcp.plugins ?? defaultEntries(config)
  const listed = config.mcp.plugins !== undefined
  const plugins: Plugin[] = []
  try {
    for (let i = 0; i < entries.length; i++) {
      const entry = entries[i]!
      const at = listed ? `mcp.plugins[${i}]` : `mcp.policies`
      let mod: PluginModule
      let options: unknown
      let path: string
      if (entry.builtin !== undefined) {
        const name = entry.builtin as BuiltinName
        mod = (await BUILTINS[name]()).default
        const b = builtinOptions(name, config)
        if (name === 'mcpAuthentication' && b.options === undefined) {
          throw new ProxyError('MCPP_ERR_CONFIG', 500, `${at}: builtin mcpAuthentication needs mcp.policies.mcpAuthentication`)
        }
        options = entry.options ?? b.options
        path = entry.options !== undefined ? `${at}.options` : b.path
      } else {
        mod = await importModule(entry.module!, baseDir, at)
        if (!engineSatisfied(mod.engine)) {
          throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `${at}: plugin ${mod.name} needs plugin API ${mod.engine}, this gateway has ${PLUGIN_API_VERSION}`)
        }
        options = structuredClone(entry.options ?? {})
        path = `${at}.options`
        if (mod.optionsSchema !== undefined) {
          const validate = createAjv().compile(mod.optionsSchema)
          if (!validate(options)) {
            const lines = formatAjvErrors(validate.errors ?? [], path)
            throw new ProxyError('MCPP_ERR_CONFIG', 500, `invalid options for plugin ${mod.name}:\n` + lines.map(l => '  ' + l).join('\n'))
          }
        }
        deepFreeze(options)
      }
      if (dryRun) {
        mod.check?.(options, path)
        plugins.push({ name: mod.name })
        continue
      }
      let plugin: Plugin
      try {
        plugin = await mod.create(options, { ...env, configPath: path, log: env.log.child({ plugin: mod.name }) })
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
  return plugins
}
