/**
 * providerBridge: makes an identity provider that lacks parts of the MCP
 * authorization flow usable by MCP clients (docs/identity-providers.md "Identity providers";
 * RFC 8414 metadata, MCP authorization).
 *
 * - Serves RFC 8414 metadata derived from the IdP's cached OIDC discovery
 *   document at the root path (issuer as the IdP reports it) and at the three
 *   paths where clients look for the authorization server `{base_url}/mcp`
 *   (issuer `{base_url}/mcp`).
 * - cloud_idp: serves the authorize and token endpoints it advertises,
 *   stripping `resource` and adding the operator's secret (cloud-proxy.ts).
 *
 * Needs `idp` and `protectedResource` (provided by mcpAuthentication, listed
 * before it). Its one option, `allowedRedirectSchemes`, opts the cloud_idp
 * authorize endpoint into private-use redirect schemes (RFC 8252 §7.1).
 * Without a provider family there are no routes.
 */
import { definePlugin, ProxyError, type Plugin, type RouteDef, type PluginEnv, type RequestContext, type Reply } from '../../core/plugin-api.ts'
import schema from './schema.json' with { type: 'json' }
import { DiscoveryCache } from '../oauth-common/discovery.ts'
import type { IdpIdentity, ProtectedResource, ProviderKind } from '../mcp-authentication/identity.ts'
import { buildAuthorizationServerMetadata, ROOT_METADATA_PATH, MCP_METADATA_PATHS, AUTHORIZE_PATH, TOKEN_PATH } from '../oauth-common/metadata.ts'
import { createCloudProxy } from './cloud-proxy.ts'
import { BASE_SCOPES, cloudFallbackEndpoints } from '../oauth-common/idp-endpoints.ts'
import { OAuthRequestInvalid } from '../oauth-common/errors.ts'
import { privateSchemes } from '../oauth-common/redirect-uri.ts'

export { DiscoveryCache } from '../oauth-common/discovery.ts'
export {
  buildAuthorizationServerMetadata,
  AUTHORIZE_PATH,
  TOKEN_PATH,
  REGISTRATION_PATH,
  ROOT_METADATA_PATH,
  MCP_METADATA_PATHS,
} from '../oauth-common/metadata.ts'
export { cloudFallbackEndpoints } from '../oauth-common/idp-endpoints.ts'
export { shouldInjectSecret } from './cloud-proxy.ts'

/** Browsers may read the metadata from any origin (no credentials involved). */
const METADATA_CORS = {
  'access-control-allow-origin': '*',
  'access-control-allow-methods': 'GET, OPTIONS',
  'access-control-allow-headers': '*',
} as const

/** The scopes a request that gets the operator's secret may ask for. */
export function allowedScopesOf(resource: ProtectedResource | undefined): Set<string> {
  return new Set<string>([...BASE_SCOPES, ...(resource?.scopesSupported ?? [])])
}

/** The bridge's options (schema.json): any key may be left out. */
export interface ProviderBridgeOptions {
  /** Private-use redirect URI schemes the cloud_idp authorize endpoint passes on (RFC 8252 §7.1). Default none. */
  readonly allowedRedirectSchemes?: readonly string[]
}

export interface ProviderBridgePlugin extends Plugin {
  readonly provider: ProviderKind | undefined
  readonly discovery: DiscoveryCache | undefined
}

export async function createProviderBridge(env: PluginEnv, options: ProviderBridgeOptions = {}): Promise<ProviderBridgePlugin> {
  const idp = env.provided.idp as IdpIdentity | undefined
  const kind = idp?.family
  if (idp === undefined || kind === undefined) {
    return { name: 'providerBridge', provider: undefined, discovery: undefined, routes: [] }
  }
  const redirectSchemes = privateSchemes(options.allowedRedirectSchemes)
  if (redirectSchemes.size > 0 && idp.cloud === undefined) {
    // oss_idp clients are sent to the IdP's own authorize endpoint, which checks its own list.
    env.log.warn(
      { path: `${env.configPath}.allowedRedirectSchemes` },
      'provider bridge: allowedRedirectSchemes applies to cloud_idp only; the oss_idp IdP checks redirect URIs itself'
    )
  }
  if (idp.clientId === undefined) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${env.configPath}: providerBridge needs the clientId of mcpAuthentication for ${kind}`)
  }
  const baseUrl = env.baseUrl.replace(/\/+$/, '')
  const tenant = idp.cloud
  const discovery = bridgeDiscovery(env, idp)

  // An oss_idp's key set is always a URL (the configured jwks, else {issuer}/jwks/): the identity derived it.
  const jwksUri = kind === 'oss_idp' && idp.keySet.kind === 'url' ? idp.keySet.url : undefined
  const cacheSeconds = Math.min(300, idp.discovery.ttlSeconds)

  async function metadataReply(ctx: RequestContext, issuerOverride: string | undefined): Promise<Reply> {
    if (ctx.method === 'OPTIONS') return { status: 204, headers: { ...METADATA_CORS, 'access-control-max-age': '600' } }
    const doc = await discovery.get()
    const body = buildAuthorizationServerMetadata({
      kind: kind!,
      doc,
      baseUrl,
      jwksUri,
      issuer: issuerOverride ?? String(doc.issuer),
    })
    return {
      status: 200,
      headers: { ...METADATA_CORS, 'cache-control': `public, max-age=${cacheSeconds}` },
      body,
    }
  }

  const routes: RouteDef[] = [
    {
      methods: ['GET', 'HEAD', 'OPTIONS'],
      path: ROOT_METADATA_PATH,
      handler: function rootMetadata(ctx) {
        return metadataReply(ctx, undefined)
      },
    },
    ...MCP_METADATA_PATHS.map(
      (path): RouteDef => ({
        methods: ['GET', 'HEAD', 'OPTIONS'],
        path,
        handler: function mcpMetadata(ctx) {
          return metadataReply(ctx, `${baseUrl}/mcp`)
        },
      })
    ),
  ]

  if (tenant !== undefined) {
    const fallback = cloudFallbackEndpoints(tenant)
    const proxy = createCloudProxy({
      clientId: idp.clientId,
      clientSecret: idp.clientSecret,
      allowedScopes: allowedScopesOf(env.provided.protectedResource as ProtectedResource | undefined),
      discovery,
      fallbackAuthorize: fallback.authorize,
      fallbackToken: fallback.token,
      timeoutMs: Math.max(idp.discovery.timeoutMs, 10_000),
      log: env.log,
      redirectSchemes,
    })
    routes.push(
      { methods: ['GET'], path: AUTHORIZE_PATH, handler: proxy.authorizeHandler },
      { methods: ['POST'], path: TOKEN_PATH, handler: proxy.tokenHandler }
    )
  }

  return {
    name: 'providerBridge',
    provider: kind,
    discovery,
    routes,
    ready() {
      const s = discovery.state
      return s.doc !== undefined
        ? { ready: true }
        : { ready: false, reason: `identity provider discovery document not fetched (${s.lastError ?? 'pending'})`, code: 'idp_unreachable' }
    },
    describe() {
      const s = discovery.state
      return {
        // The section the admin's OAuth view shows (PluginDescription.discovery).
        discovery: { fetchedAt: s.fetchedAt ?? null, lastError: s.lastError ?? null, fetches: s.fetches, loaded: s.doc !== undefined },
        provider: kind,
        discoveryUrl: discovery.url,
        fetchedAt: s.fetchedAt === undefined ? null : new Date(s.fetchedAt).toISOString(),
        stale: s.stale,
        lastError: s.lastError ?? null,
        tenant: tenant?.tenant,
        clientSecretConfigured: idp.clientSecret !== undefined,
        allowedRedirectSchemes: [...redirectSchemes],
      }
    },
    async close() {
      discovery.close()
    },
  }
}

/**
 * The IdP's discovery document, fetched in the background and cached, with
 * its fetch counter and gauges, and a start-up warning when it names another
 * issuer than the configured one.
 */
function bridgeDiscovery(env: PluginEnv, idp: IdpIdentity): DiscoveryCache {
  // Tokens carry the issuer the IdP names in its discovery document; when the
  // configured one differs (a trailing slash, most often, for oss_idp), every
  // token would get 401 "token issuer not accepted": say so at start-up. A
  // cloud_idp v1 issuer (sts.windows.net) legitimately differs from its v2 document.
  let warnedIssuer: string | undefined
  const checkIssuer = (doc: { issuer?: unknown }): void => {
    const found = String(doc.issuer)
    if (found === idp.issuer || found === warnedIssuer || (idp.cloud !== undefined && !/\/v2\.0\/?$/.test(idp.issuer))) return
    warnedIssuer = found
    env.log.warn(
      { path: 'mcp.policies.mcpAuthentication.issuer', configured: idp.issuer, discovered: found, discovery: idp.discoveryUrl },
      `the identity provider's discovery document names issuer ${JSON.stringify(found)}, not the configured ${JSON.stringify(idp.issuer)}: tokens it issues will get 401 "token issuer not accepted" until mcp.policies.mcpAuthentication.issuer is set to ${JSON.stringify(found)}`
    )
  }
  const fetchCounter = env.metrics.counter('mcp_proxy_discovery_fetches_total', "Fetches of the identity provider's OIDC discovery document")
  fetchCounter.init()
  const fetches = fetchCounter.labels()
  const discovery = new DiscoveryCache({
    url: idp.discoveryUrl,
    ttlMs: idp.discovery.ttlSeconds * 1000,
    timeoutMs: idp.discovery.timeoutMs,
    log: env.log,
    onFetch: () => fetches.inc(),
    onDocument: doc => checkIssuer(doc),
  })
  env.metrics.gauge('mcp_proxy_discovery_up', '1 when the last discovery fetch succeeded, 0 when it failed').collect = () => {
    const s = discovery.state
    return [[undefined, s.doc !== undefined && s.lastError === undefined ? 1 : 0]]
  }
  env.metrics.gauge('mcp_proxy_discovery_last_success_timestamp_seconds', 'When the discovery document was last fetched successfully').collect = () => {
    const at = discovery.state.fetchedAt
    return at === undefined ? [] : [[undefined, at / 1000]]
  }
  env.log.info({ provider: idp.family, discovery: discovery.url }, "provider bridge: fetching the identity provider's discovery document")
  // In the background: an unreachable IdP must not hold up start-up (docs/configuration.md
  // "Running"); a request that needs the document waits for this fetch.
  void discovery.start()
  return discovery
}

export default definePlugin<ProviderBridgeOptions>({
  name: 'providerBridge',
  engine: '^1',
  optionsSchema: schema as Record<string, unknown>,
  needs: ['idp', 'protectedResource'],
  // MCPP_ERR_IDP_UNAVAILABLE is core's (the credential layer raises it too): not declared here.
  errors: [OAuthRequestInvalid],
  summary(options, provided) {
    const idp = provided.idp as IdpIdentity
    const schemes = options.allowedRedirectSchemes ?? []
    return (
      `authorization server metadata of ${idp.issuer} served${idp.family !== undefined ? ` and bridged for ${idp.family}` : ''}` +
      (schemes.length > 0 ? `; private-use redirect schemes: ${schemes.join(', ')}` : '')
    )
  },
  create(options, env) {
    return createProviderBridge(env, options)
  },
})
