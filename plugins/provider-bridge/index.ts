/**
 * providerBridge: makes an identity provider that lacks parts of the MCP
 * authorization flow usable by MCP clients (SPEC "Authorization server
 * metadata", "Authentication" 5-6).
 *
 * - Serves RFC 8414 metadata derived from the IdP's cached OIDC discovery
 *   document at the root path (issuer as the IdP reports it) and at the three
 *   paths where clients look for the authorization server `{base_url}/mcp`
 *   (issuer `{base_url}/mcp`).
 * - cloud_idp: serves the authorize and token endpoints it advertises,
 *   stripping `resource` and adding the operator's secret (cloud-proxy.ts).
 *
 * Options come from `mcp.policies.mcpAuthentication`; without a provider the
 * plugin has no routes.
 */
import { definePlugin, type Plugin, type RouteDef, type PluginEnv } from '../../core/plugin.ts'
import type { GatewayConfig, McpAuthenticationConfig } from '../../core/config.ts'
import type { RequestContext, Reply } from '../../core/context.ts'
import { ProxyError } from '../../core/errors.ts'
import schema from './schema.json' with { type: 'json' }
import { DiscoveryCache } from './discovery.ts'
import { providerKind, discoveryUrlFor, ossJwksUri, cloudTenantOf, cloudFallbackEndpoints, type ProviderKind } from './idp.ts'
import { buildAuthorizationServerMetadata, ROOT_METADATA_PATH, MCP_METADATA_PATHS, AUTHORIZE_PATH, TOKEN_PATH } from './metadata.ts'
import { createCloudProxy, BASE_SCOPES } from './cloud-proxy.ts'

export { DiscoveryCache } from './discovery.ts'
export { parseCloudIssuer, cloudTenantOf, discoveryUrlFor, ossJwksUri } from './idp.ts'
export { buildAuthorizationServerMetadata, AUTHORIZE_PATH, TOKEN_PATH, REGISTRATION_PATH, ROOT_METADATA_PATH, MCP_METADATA_PATHS } from './metadata.ts'
export { shouldInjectSecret } from './cloud-proxy.ts'

/** Browsers may read the metadata from any origin (no credentials involved). */
const METADATA_CORS = {
  'access-control-allow-origin': '*',
  'access-control-allow-methods': 'GET, OPTIONS',
  'access-control-allow-headers': '*',
} as const

function authConfigOf (env: PluginEnv): McpAuthenticationConfig | undefined {
  return (env.config as unknown as Partial<GatewayConfig>).mcp?.policies?.mcpAuthentication
}

/** The scopes a request that gets the operator's secret may ask for. */
export function allowedScopesOf (auth: McpAuthenticationConfig): Set<string> {
  return new Set<string>([...BASE_SCOPES, ...(auth.resourceMetadata.scopesSupported ?? [])])
}

export interface ProviderBridgePlugin extends Plugin {
  readonly provider: ProviderKind | undefined
  readonly discovery: DiscoveryCache | undefined
}

export async function createProviderBridge (env: PluginEnv): Promise<ProviderBridgePlugin> {
  const auth = authConfigOf(env)
  const kind = providerKind(auth)
  if (auth === undefined || kind === undefined) {
    return { name: 'providerBridge', provider: undefined, discovery: undefined, routes: [] }
  }
  const where = 'mcp.policies.mcpAuthentication'
  if (auth.clientId === undefined) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${where}.clientId: is required for ${kind}`)
  }
  const baseUrl = env.baseUrl.replace(/\/+$/, '')
  const tenant = kind === 'cloud_idp' ? cloudTenantOf(auth.issuer, where) : undefined
  const discovery = new DiscoveryCache({
    url: discoveryUrlFor(kind, auth.issuer),
    ttlMs: auth.discovery.ttlSeconds * 1000,
    timeoutMs: auth.discovery.timeoutMs,
    log: env.log,
  })
  env.log.info({ provider: kind, discovery: discovery.url }, 'provider bridge: fetching the identity provider\'s discovery document')
  // In the background: an unreachable IdP must not hold up start-up (issue 13
  // item 23); a request that needs the document waits for this fetch.
  void discovery.start()

  const jwksUri = kind === 'oss_idp' ? (auth.jwks ?? ossJwksUri(auth.issuer)) : undefined
  const cacheSeconds = Math.min(300, auth.discovery.ttlSeconds)

  async function metadataReply (ctx: RequestContext, issuerOverride: string | undefined): Promise<Reply> {
    if (ctx.method === 'OPTIONS') return { status: 204, headers: { ...METADATA_CORS, 'access-control-max-age': '600' } }
    const doc = await discovery.get()
    const body = buildAuthorizationServerMetadata({
      kind: kind!, doc, baseUrl, jwksUri, issuer: issuerOverride ?? String(doc.issuer),
    })
    return {
      status: 200,
      headers: { ...METADATA_CORS, 'cache-control': `public, max-age=${cacheSeconds}` },
      body,
    }
  }

  const routes: RouteDef[] = [
    { methods: ['GET', 'HEAD', 'OPTIONS'], path: ROOT_METADATA_PATH, handler: function rootMetadata (ctx) { return metadataReply(ctx, undefined) } },
    ...MCP_METADATA_PATHS.map((path): RouteDef => ({
      methods: ['GET', 'HEAD', 'OPTIONS'], path, handler: function mcpMetadata (ctx) { return metadataReply(ctx, `${baseUrl}/mcp`) },
    })),
  ]

  if (tenant !== undefined) {
    const fallback = cloudFallbackEndpoints(tenant)
    const proxy = createCloudProxy({
      clientId: auth.clientId,
      clientSecret: auth.clientSecret,
      allowedScopes: allowedScopesOf(auth),
      discovery,
      fallbackAuthorize: fallback.authorize,
      fallbackToken: fallback.token,
      timeoutMs: Math.max(auth.discovery.timeoutMs, 10_000),
      log: env.log,
    })
    routes.push(
      { methods: ['GET'], path: AUTHORIZE_PATH, handler: proxy.authorizeHandler },
      { methods: ['POST'], path: TOKEN_PATH, handler: proxy.tokenHandler },
    )
  }

  return {
    name: 'providerBridge',
    provider: kind,
    discovery,
    routes,
    ready () {
      const s = discovery.state
      return s.doc !== undefined
        ? { ready: true }
        : { ready: false, reason: `identity provider discovery document not fetched (${s.lastError ?? 'pending'})` }
    },
    describe () {
      const s = discovery.state
      return {
        provider: kind,
        discoveryUrl: discovery.url,
        fetchedAt: s.fetchedAt === undefined ? null : new Date(s.fetchedAt).toISOString(),
        stale: s.stale,
        lastError: s.lastError ?? null,
        tenant: tenant?.tenant,
        clientSecretConfigured: auth.clientSecret !== undefined,
      }
    },
    async close () { discovery.close() },
  }
}

export default definePlugin<Record<string, never>>({
  name: 'providerBridge',
  engine: '^1',
  optionsSchema: schema as Record<string, unknown>,
  create (_options, env) {
    return createProviderBridge(env)
  },
})
