/**
 * The plugin contract. The gateway is an ordered list of plugins; the order
 * lives in one place (`mcp.plugins` in the config, or the registry's default
 * pipeline). Core knows no plugin by name: the built-ins reach it as a
 * `PluginRegistry` handed in by the caller (bin/ passes `plugins/index.ts`).
 */
import type { Logger } from 'pino'
import type { RequestContext, ResponseContext, Reply } from './context.ts'
import type { ErrorFactory } from './errors.ts'

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
  /**
   * Whether the plugin is ready to serve (e.g. keys loaded); reported by `/readyz`.
   * `reason` (details, may name hosts) goes to the admin listener only; the
   * unauthenticated probe listener shows `code` instead (`[a-z0-9_]`, e.g.
   * `idp_unreachable`; default `plugin_not_ready`).
   */
  ready?(): boolean | { ready: boolean; reason?: string; code?: string }
  /**
   * Read-only state for the admin UI/API (`GET /api/plugins`), asked only
   * when someone looks. Must never contain secrets.
   */
  describe?(): PluginDescription
  close?(): Promise<void>
}

/**
 * What `describe()` returns: the plugin's own fields, shown as they are, plus
 * optional sections the admin view also places on its OAuth panel. Any
 * plugin (built-in or third-party) can fill them; the admin never looks a
 * plugin up by name.
 */
export interface PluginDescription {
  /** Signing keys of the identity provider. */
  readonly keySet?: {
    readonly kids?: readonly string[]
    readonly loaded?: boolean
    readonly lastSuccessAt?: string
    readonly lastError?: string
  }
  /** The identity provider's discovery document cache; `fetchedAt` in ms since the epoch. */
  readonly discovery?: {
    readonly fetchedAt: number | null
    readonly lastError: string | null
    readonly fetches: number
    readonly loaded: boolean
  }
  readonly [field: string]: unknown
}

/** What `create` receives besides its options. */
export interface PluginEnv {
  readonly log: Logger
  /**
   * The whole validated, frozen config (read-only). What another plugin owns
   * (the IdP's identity, say) comes through `provided`, not from here.
   */
  readonly config: Readonly<Record<string, unknown>>
  /** `{base_url}`: the public origin of the gateway, from `resourceMetadata.resource` or the listen address. */
  readonly baseUrl: string
  /** Path in the config where this plugin's options live, for error messages. */
  readonly configPath: string
  /** Registry of gateway metrics (counters/histograms), see core/observability/metrics.ts. */
  readonly metrics: import('./observability/metrics.ts').Metrics
  /**
   * What earlier-listed plugins provide (`PluginModule.provides`), by name.
   * Every name in this module's `needs` is present; others may be missing.
   */
  readonly provided: Readonly<Record<string, unknown>>
  /**
   * State shared by every replica (rate limits, single-use codes): Redis with
   * `cluster.redis`, else this process's memory. Absent in older hosts.
   */
  readonly shared?: import('./cluster/shared-state.ts').SharedState
  /**
   * A 256-bit key for `purpose`, the same in every process of this
   * deployment: HKDF-SHA256 (RFC 5869) of the secret the gateway's processes
   * share (`cluster.secret` across replicas, else the secret the primary
   * draws for this run and hands its workers), with an info string naming
   * this plugin and `purpose`, so no two plugins, and no plugin and the core,
   * ever get the same key. Undefined when the process serves alone (no shared
   * secret): a random key of the plugin's own is then as good. Absent in
   * older hosts.
   */
  readonly deriveKey?: (purpose: string) => Uint8Array | undefined
  /**
   * The clock (epoch ms) for a plugin's own timing decisions (cooldowns, back-off); absent:
   * Date.now. Tests pass their own to move time instead of sleeping.
   */
  readonly now?: () => number
}

/** What a plugin module (built-in or third-party) exports. */
export interface PluginModule<O = unknown> {
  readonly name: string
  /** Semver range of the gateway's plugin API this module supports, e.g. `^1`. */
  readonly engine: string
  /**
   * JSON Schema for the options (draft-07, ajv with `allErrors` and
   * `useDefaults`); validated with the config path in every error, the same
   * way for built-ins and third-party modules. Beyond the standard formats,
   * `header-value` refuses control characters in a value that ends up in an
   * HTTP header.
   */
  readonly optionsSchema?: Record<string, unknown>
  /**
   * The `mcp.policies` key that holds this plugin's options when the pipeline
   * entry gives none inline (built-ins: `cors`, `mcpAuthentication`, ...).
   * Those blocks are validated against `optionsSchema` when the config loads.
   */
  readonly policy?: string
  /**
   * Names of what this plugin provides to plugins listed after it (fastify's
   * decorators), each computed by `provide`.
   */
  readonly provides?: readonly string[]
  /**
   * Names this plugin needs from an earlier plugin (fastify-plugin's
   * `dependencies`). A pipeline without a provider listed before it is a
   * config error naming both plugins.
   */
  readonly needs?: readonly string[]
  /**
   * The gateway's public `{base_url}` when this built-in's `mcp.policies`
   * block fixes it (mcpAuthentication: its resource without `/mcp`). Read
   * before any plugin is created; wins over `mcp.baseUrl`.
   */
  baseUrlOf?(options: O): string | undefined
  /** Error codes this plugin raises, each bound to its status (`createError`). */
  readonly errors?: readonly ErrorFactory[]
  /**
   * Cross-field checks and static derivations (no network, no side effects):
   * runs at start-up and in `mcp-proxy --check` alike, so both give the same
   * verdict. Throws a ProxyError naming the path. Returns the values of
   * `provides`, by name.
   */
  check?(options: O, configPath: string): void | Readonly<Record<string, unknown>>
  /**
   * Parts of these options that another plugin acts on (mcpAuthentication's
   * `facade` block is served by oauthFacade): `path` relative to this
   * plugin's options, `plugin` the module name. An explicit `mcp.plugins`
   * list without that plugin is a config error naming both: a configured
   * block is never silently ignored.
   */
  actedOnBy?(options: O): readonly { readonly path: string; readonly plugin: string }[]
  /**
   * One line for `mcp-proxy --check`: what this stage enforces, from its
   * options and what earlier plugins provide. No secrets.
   */
  summary?(options: O, provided: Readonly<Record<string, unknown>>): string
  create(options: O, env: PluginEnv): Plugin | Promise<Plugin>
}

/** The built-in plugins, handed to core by its caller (core imports none). */
export interface PluginRegistry {
  /** Modules by the name `mcp.plugins[].builtin` uses. */
  // biome-ignore lint/suspicious/noExplicitAny: each module has its own options type; core hands it options its own schema validated
  readonly modules: Readonly<Record<string, PluginModule<any>>>
  /** The pipeline (builtin names, in order) when `mcp.plugins` is not given. */
  defaultPipeline(policies: Readonly<Record<string, unknown>>): readonly string[]
}

/** Version of the plugin API, checked against `PluginModule.engine`. */
export const PLUGIN_API_VERSION = '1.0.0'

/** Identity helper that gives plugin authors type checking. */
export function definePlugin<O>(mod: PluginModule<O>): PluginModule<O> {
  return mod
}

/** No built-ins: what a caller that hands in no registry gets. */
export const EMPTY_REGISTRY: PluginRegistry = Object.freeze({ modules: Object.freeze({}), defaultPipeline: () => [] })
