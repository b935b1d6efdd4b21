/**
 * mcpAuthentication: bearer-token authentication for /mcp and the OAuth
 * protected resource metadata (RFC 9728) that tells clients where to log in.
 *
 * Modes: `strict` (a valid token on every /mcp request), `optional` (a
 * missing token passes, a bad one is rejected), `permissive` (never rejects
 * a token; verified claims are passed on when present). In every mode a
 * token in the query string or two Authorization headers get 400, and the
 * Authorization header is removed once read so nothing forwards it.
 *
 * This file is the plugin module (options, what it provides, start-up);
 * the per-request check is authenticator.ts, the token's reading bearer.ts.
 */
import { definePlugin, ProxyError, type PluginEnv, type PluginModule } from '../../core/plugin-api.ts'
import { baseUrlOf, identityOf, type IdpIdentity, type ProtectedResource } from './identity.ts'
import { acquireKeySet } from './key-set.ts'
import { TOKEN_FAILURE_REASONS } from './verifier.ts'
import { Authenticator, KeysUnavailable } from './authenticator.ts'
import type { McpAuthenticationOptions } from './options.ts'
import ownSchema from './schema.json' with { type: 'json' }

export { readBearer, stripAuthorization } from './bearer.ts'
export { KeysUnavailable, PRM_PATH, PRM_ROOT_PATH, PRM_PROTOCOL_VERSION } from './authenticator.ts'
export type { McpAuthenticationOptions } from './options.ts'

/**
 * How the `facade` block (opt-in OAuth facade) is validated: by the facade's
 * own schema and checks, handed in by the registry (plugins/index.ts), since
 * a plugin imports no other plugin. They are part of these options, so config
 * load and `--check` name the block's paths.
 */
export interface FacadeBlock {
  /** The block's JSON schema, without `$schema`. */
  readonly schema: Record<string, unknown>
  /** The block with defaults applied and checked; throws a config error naming `path`. */
  options(raw: unknown, path: string): unknown
}

export type { IdpIdentity, ProtectedResource } from './identity.ts'

/** What this plugin provides to the plugins listed after it (`PluginEnv.provided`). */
export interface McpAuthenticationProvides {
  readonly idp: IdpIdentity
  readonly protectedResource: ProtectedResource
  /** The facade's options (checked by FacadeBlock.options), or undefined when the SPEC's behaviour applies. */
  readonly facade: unknown
}

/** Cross-field checks and the provided identity: the same at start-up and in `--check`. */
export function provides(options: McpAuthenticationOptions, configPath = 'mcp.policies.mcpAuthentication', facade?: FacadeBlock): McpAuthenticationProvides {
  if (options.facade !== undefined && facade === undefined) {
    // Only a registry without the OAuth facade gets here: never pass an unchecked block on.
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${configPath}.facade: the OAuth facade is not among the available plugins`)
  }
  return {
    idp: identityOf(options, configPath),
    protectedResource: { resource: options.resourceMetadata.resource, scopesSupported: options.resourceMetadata.scopesSupported },
    facade: options.facade === undefined ? undefined : facade?.options(options.facade, `${configPath}.facade`),
  }
}

/** The plugin, with the OAuth facade's block validated by `facade` when given (plugins/index.ts gives it). */
export function mcpAuthenticationModule(facade?: FacadeBlock): PluginModule<McpAuthenticationOptions> {
  const optionsSchema = facade === undefined ? ownSchema : { ...ownSchema, properties: { ...ownSchema.properties, facade: facade.schema } }
  return definePlugin<McpAuthenticationOptions>({
    name: 'mcpAuthentication',
    engine: '^1',
    optionsSchema: optionsSchema as Record<string, unknown>,
    policy: 'mcpAuthentication',
    provides: ['idp', 'protectedResource', 'facade'],
    errors: [KeysUnavailable],
    // `provider` is bridged by providerBridge and registration, `facade` served by oauthFacade (instead of both).
    actedOnBy(options) {
      if (options.facade !== undefined) return [{ path: 'facade', plugin: 'oauthFacade' }]
      if (options.provider !== undefined)
        return [
          { path: 'provider', plugin: 'providerBridge' },
          { path: 'provider', plugin: 'registration' },
        ]
      return []
    },
    summary(options) {
      const what =
        options.mode === 'strict'
          ? 'a valid bearer token required on every request'
          : options.mode === 'optional'
            ? 'a missing token passes, an invalid one is refused'
            : 'never refuses; verified claims passed on when present'
      return (
        `${options.mode}: ${what}; issuer ${options.issuer}` +
        (options.audiences !== undefined ? `, audiences ${options.audiences.join(', ')}` : '') +
        (options.provider !== undefined ? `, provider ${Object.keys(options.provider)[0]}` : '') +
        (options.facade !== undefined ? ', tokens issued by the OAuth facade' : '')
      )
    },
    baseUrlOf(options) {
      return options.resourceMetadata.resource.replace(/\/mcp$/, '')
    },
    check(options, configPath) {
      return provides(options, configPath, facade) as unknown as Readonly<Record<string, unknown>>
    },
    async create(options, env) {
      const { idp } = provides(options, env.configPath, facade)
      const baseUrl = env.baseUrl !== '' && env.baseUrl !== undefined ? env.baseUrl : baseUrlOf(options.resourceMetadata.resource)
      const counters = authMetrics(env.metrics)
      const ks = options.keySet ?? {}
      let lastLoggedError: string | undefined
      const { set: keySet, release } = await acquireKeySet({
        source: idp.keySet,
        refreshMs: (ks.refreshSeconds ?? 300) * 1000,
        cooldownMs: (ks.cooldownSeconds ?? 3) * 1000,
        maxBackoffMs: (ks.maxBackoffSeconds ?? 60) * 1000,
        timeoutMs: ks.timeoutMs ?? 5000,
        maxBytes: ks.maxBytes ?? 524288,
        ...(env.now !== undefined ? { now: env.now } : {}),
        onFetch(result, error) {
          counters.fetches.inc({ result })
          if (result === 'error' && error !== lastLoggedError) env.log.warn({ error }, 'identity provider key set fetch failed')
          lastLoggedError = result === 'error' ? error : undefined
        },
      })
      // Scrape-time gauges: read from the key set when /metrics is asked, nothing per request.
      env.metrics.gauge('mcp_proxy_keyset_keys', 'Signing keys currently loaded from the identity provider').collect = () => [
        [undefined, keySet.state().kids.length],
      ]
      env.metrics.gauge('mcp_proxy_keyset_last_success_timestamp_seconds', 'When the key set was last fetched successfully').collect = () => {
        const at = keySet.state().lastSuccessAt
        return at === undefined ? [] : [[undefined, Date.parse(at) / 1000]]
      }
      return new Authenticator({
        options,
        idp,
        baseUrl,
        keySet,
        release,
        failures: counters.failures,
        verifications: counters.verifications,
      })
    },
  })
}

/** The plugin's counters, every series at 0 before the first event, so a first failure is a visible increase. */
type Counter = ReturnType<PluginEnv['metrics']['counter']>

function authMetrics(metrics: PluginEnv['metrics']): { failures: Counter; fetches: Counter; verifications: Counter } {
  const failures = metrics.counter('mcp_proxy_auth_failures_total', 'Rejected or unverifiable bearer tokens by reason')
  const fetches = metrics.counter('mcp_proxy_keyset_fetches_total', 'Key set fetch attempts by result')
  const verifications = metrics.counter('mcp_proxy_token_verifications_total', 'Signature verifications (token cache misses)')
  for (const reason of [...TOKEN_FAILURE_REASONS, 'missing', 'keys_unavailable']) failures.init({ reason })
  for (const result of ['ok', 'error']) fetches.init({ result })
  verifications.init()
  return { failures, fetches, verifications }
}

export default mcpAuthenticationModule()
