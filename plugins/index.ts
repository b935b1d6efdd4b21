/**
 * The built-in plugins: the registry bin/ hands to core (core imports no
 * plugin). A built-in is used by name (`mcp.plugins: [{ builtin: cors }]`) or
 * by the default pipeline below; its options are its `mcp.policies` block.
 */
import type { PluginRegistry } from '../core/plugin-api.ts'
import cors from './cors/index.ts'
import { mcpAuthenticationModule } from './mcp-authentication/index.ts'
import authorization from './authorization/index.ts'
import providerBridge from './provider-bridge/index.ts'
import registration from './registration/index.ts'
import oauthFacade, { facadeBlock } from './oauth-facade/index.ts'

// mcpAuthentication's `facade` block is the OAuth facade's: its schema and checks, handed in here.
const mcpAuthentication = mcpAuthenticationModule(facadeBlock)

export const builtins: PluginRegistry = Object.freeze({
  modules: Object.freeze({ cors, mcpAuthentication, authorization, providerBridge, registration, oauthFacade }),
  /**
   * cors always runs (it validates Origin: MCP transport security, DNS
   * rebinding); the others when their policy is configured; the bridge and
   * registration when mcpAuthentication names a provider; the OAuth facade
   * instead of both when mcpAuthentication has a `facade` block (opt-in: it
   * serves their paths as the authorization server itself).
   */
  defaultPipeline(policies: Readonly<Record<string, unknown>>): readonly string[] {
    const auth = policies.mcpAuthentication as { provider?: unknown; facade?: unknown } | undefined
    const rules = (policies.authorization as { rules?: unknown[] } | undefined)?.rules
    return [
      'cors',
      ...(auth !== undefined ? ['mcpAuthentication'] : []),
      ...(rules !== undefined && rules.length > 0 ? ['authorization'] : []),
      ...(auth?.facade !== undefined ? ['oauthFacade'] : auth?.provider !== undefined ? ['providerBridge', 'registration'] : []),
    ]
  },
})
