/**
 * oauthFacade: the opt-in mode in which, to MCP clients, the gateway is the
 * authorization server, and to the identity provider one client with one
 * redirect URI, the gateway's callback (switched on by
 * `mcp.policies.mcpAuthentication.facade`; without it the default bridge and
 * registration run instead, docs/identity-providers.md "Identity providers").
 *
 * One flow: client -> GET /oauth/authorize (client resolved: pre-registered,
 * sealed DCR client id, or client ID metadata document; redirect_uri must be
 * one it registered, else an error page and never a redirect) -> IdP
 * authorize with the gateway's own PKCE and the client's request sealed in
 * `state` -> IdP -> GET {callbackPath} (state opened, code redeemed at the
 * IdP with the gateway's verifier and, for cloud_idp, its secret) -> consent
 * page unless remembered or trusted -> client's redirect_uri with the
 * gateway's code (the IdP tokens sealed inside) and RFC 9207 `iss` -> POST
 * /oauth/token (code single-use, PKCE checked against the client's
 * challenge) -> the IdP's access token, so /mcp keeps validating IdP JWTs;
 * the refresh token is sealed and bound to the client.
 *
 * Nothing is stored between requests except the redeemed codes' ids and
 * the used refresh tokens' slots (to refuse a replay), so any replica with
 * the same keys and store continues any flow.
 *
 * One file per step, as node-oidc-provider does: metadata.ts, authorize.ts,
 * callback.ts, decision.ts (the consent form's answer), token.ts,
 * registration.ts; each gets the FacadeContext built once at start-up
 * (facade-context.ts). This file composes them into the plugin.
 */
import { definePlugin, ProxyError, type Plugin, type PluginEnv, type RouteDef } from '../../core/plugin-api.ts'
import { ROOT_METADATA_PATH, MCP_METADATA_PATHS, REGISTRATION_PATH } from '../oauth-common/metadata.ts'
import { facadeRegistration } from './registration.ts'
import type { FacadeIdp } from './idp.ts'
import { FACADE_PATH, type FacadeOptions } from './options.ts'
import { CodeStoreUnavailable } from './errors.ts'
import { createFacadeContext, type FacadeContext } from './facade-context.ts'
import { CORS, metadataReply } from './metadata.ts'
import { authorize } from './authorize.ts'
import { callback } from './callback.ts'
import { decision } from './decision.ts'
import { token } from './token.ts'
import { AUTHORIZE_PATH, CONSENT_PATH, TOKEN_PATH } from './paths.ts'

export { facadeOptions, facadeBlock, FACADE_PATH, type FacadeOptions } from './options.ts'
export { AUTHORIZE_PATH, TOKEN_PATH, CONSENT_PATH } from './paths.ts'
export { redirectMatches, redirectShown, domainTrusted } from './clients.ts'

export async function createFacade(options: FacadeOptions, env: PluginEnv): Promise<Plugin> {
  const f = createFacadeContext(options, env)
  const { discovery, sealer } = f
  return {
    name: 'oauthFacade',
    routes: facadeRoutes(f),
    ready() {
      return discovery.state.doc !== undefined
        ? { ready: true }
        : { ready: false, reason: `identity provider discovery document not fetched (${discovery.state.lastError ?? 'pending'})`, code: 'idp_unreachable' }
    },
    describe() {
      return {
        issuer: f.issuer,
        callback: f.callbackUrl,
        provider: f.idp.family ?? null,
        ephemeralKeys: sealer.ephemeral,
        preregisteredClients: options.clients.map(c => c.clientId),
        registration: options.registration.enabled,
        cimd: options.cimd.enabled,
        trustedDomains: options.consent.trustedDomains,
        usedCodes: f.usedCodesShared ? 'redis' : f.usedCodes.size,
      }
    },
    async close() {
      discovery.close()
      f.usedCodes.close()
    },
  }
}

/** The facade's endpoints, each step a named handler over the one context. */
function facadeRoutes(f: FacadeContext): RouteDef[] {
  const routes: RouteDef[] = [
    {
      methods: ['GET', 'HEAD', 'OPTIONS'],
      path: ROOT_METADATA_PATH,
      handler: function facadeRootMetadata(ctx) {
        return metadataReply(f, ctx, f.baseUrl)
      },
    },
    ...MCP_METADATA_PATHS.map(
      (path): RouteDef => ({
        methods: ['GET', 'HEAD', 'OPTIONS'],
        path,
        handler: function facadeMcpMetadata(ctx) {
          return metadataReply(f, ctx, f.issuer)
        },
      })
    ),
    {
      methods: ['GET'],
      path: AUTHORIZE_PATH,
      kind: 'other',
      handler: function facadeAuthorize(ctx) {
        return authorize(f, ctx)
      },
    },
    {
      methods: ['GET'],
      path: f.options.callbackPath,
      kind: 'other',
      handler: function facadeCallback(ctx) {
        return callback(f, ctx)
      },
    },
    {
      methods: ['POST'],
      path: CONSENT_PATH,
      kind: 'other',
      handler: function facadeConsent(ctx) {
        return decision(f, ctx)
      },
    },
    {
      methods: ['POST', 'OPTIONS'],
      path: TOKEN_PATH,
      handler: function facadeToken(ctx) {
        return token(f, ctx)
      },
    },
  ]
  if (f.options.registration.enabled) {
    routes.push({
      methods: ['POST', 'OPTIONS'],
      path: REGISTRATION_PATH,
      handler: facadeRegistration({ sealer: f.sealer, options: f.options, redirectSchemes: f.redirectSchemes, shared: f.shared, cors: CORS }),
    })
  }
  return routes
}

export default definePlugin<Record<string, never>>({
  name: 'oauthFacade',
  engine: '^1',
  // Its options are mcpAuthentication's `facade` block, validated there with this plugin's schema.json.
  optionsSchema: { type: 'object', additionalProperties: false, properties: {} },
  needs: ['idp', 'protectedResource', 'facade'],
  errors: [CodeStoreUnavailable],
  summary(_options, provided) {
    const keys = (provided.facade as FacadeOptions | undefined)?.keys ?? []
    return (
      `the gateway is the authorization server (consent, codes, tokens) in front of ${(provided.idp as FacadeIdp).issuer}; ` +
      (keys.length > 0
        ? `sealing keys: ${keys.map(k => k.kid).join(', ')}`
        : "no sealing keys configured: derived from the secret the gateway's processes share, else ephemeral")
    )
  },
  create(_options, env) {
    const options = env.provided.facade as FacadeOptions | undefined
    if (options === undefined) {
      throw new ProxyError('MCPP_ERR_CONFIG', 500, `${env.configPath}: oauthFacade is in the pipeline but ${FACADE_PATH} is not set`)
    }
    return createFacade(options, env)
  },
})
