/**
 * The plugin contract. The gateway is an ordered list of plugins; the order
 * lives in one place (`mcp.plugins` in the config, or the default list in
 * `core/plugin-loader.ts`).
 */
import type { Logger } from 'pino'
import type { RequestContext, ResponseContext, Reply } from './context.ts'

export interface RouteDef {
  /** HTTP methods this route answers; others get 405 with `Allow`. */
  readonly methods: readonly string[]
  /** Exact path, e.g. `/.well-known/oauth-protected-resource/mcp`. */
  readonly path: string
  /** Error body shape for this route. Defaults to `oauth`. */
  readonly kind?: 'oauth' | 'other'
  handler(ctx: RequestContext): Reply | Promise<Reply>
}

/** One MCP operation the gateway is about to expose or perform, for per-operation access checks. */
export interface McpOperation {
  /** JSON-RPC method, e.g. `tools/call`, `tools/list`. */
  readonly method: string
  readonly tool?: { readonly name: string; readonly target: string }
  readonly prompt?: { readonly name: string; readonly target: string }
  readonly resource?: { readonly uri: string; readonly target: string }
}

export interface Plugin {
  readonly name: string
  /** Routes this plugin answers. Paths must be unique across plugins (checked at start-up). */
  readonly routes?: readonly RouteDef[]
  /**
   * Runs for every request in pipeline order. Return nothing to go on, or a
   * Reply to answer now: later `onRequest` hooks and the terminal handler are skipped.
   * Throwing a ProxyError answers with that error.
   */
  onRequest?(ctx: RequestContext): void | Reply | Promise<void | Reply>
  /**
   * Runs in reverse order for every plugin whose `onRequest` ran (or that has no
   * `onRequest`), also on short-circuits and errors. Status and headers only.
   */
  onResponse?(ctx: ResponseContext): void | Promise<void>
  /**
   * Per-operation access check used by the MCP layer: list results are
   * filtered and calls refused when any plugin returns false.
   * Must be synchronous and cheap: it runs once per listed item.
   */
  allowMcpOperation?(ctx: RequestContext, op: McpOperation): boolean
  /** Whether the plugin is ready to serve (e.g. keys loaded); reported by `/readyz`. */
  ready?(): boolean | { ready: boolean; reason?: string }
  /** Read-only state for the admin UI/API. Must never contain secrets. */
  describe?(): unknown
  close?(): Promise<void>
}

/** What `create` receives besides its options. */
export interface PluginEnv {
  readonly log: Logger
  /** The whole validated, frozen config (read-only). */
  readonly config: Readonly<Record<string, unknown>>
  /** `{base_url}`: the public origin of the gateway, from `resourceMetadata.resource` or the listen address. */
  readonly baseUrl: string
  /** Path in the config where this plugin's options live, for error messages. */
  readonly configPath: string
  /** Registry of gateway metrics (counters/histograms), see core/metrics.ts. */
  readonly metrics: import('./metrics.ts').Metrics
}

/** What a plugin module (built-in or third-party) exports. */
export interface PluginModule<O = unknown> {
  readonly name: string
  /** Semver range of the gateway's plugin API this module supports, e.g. `^1`. */
  readonly engine: string
  /** JSON Schema for the options; validated with the config path in every error. */
  readonly optionsSchema?: Record<string, unknown>
  create(options: O, env: PluginEnv): Plugin | Promise<Plugin>
  /**
   * Optional static check of the options for `mcp-proxy --check` (no network,
   * no side effects), e.g. compiling rules. Throws a ProxyError naming the path.
   */
  check?(options: O, configPath: string): void
}

/** Version of the plugin API, checked against `PluginModule.engine`. */
export const PLUGIN_API_VERSION = '1.0.0'

/** Identity helper that gives plugin authors type checking. */
export function definePlugin<O> (mod: PluginModule<O>): PluginModule<O> {
  return mod
}
