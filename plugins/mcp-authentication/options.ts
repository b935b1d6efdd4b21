/** The plugin's options, as schema.json validates them: shared by the plugin module and the authenticator. */

/** Options as validated by schema.json (defaults applied); nested blocks may be missing when built by hand. */
export interface McpAuthenticationOptions {
  mode: 'strict' | 'optional' | 'permissive'
  issuer: string
  audiences?: string[]
  provider?: { oss_idp?: Record<string, never>; cloud_idp?: Record<string, never> }
  clientId?: string
  clientSecret?: string
  jwks?: string
  resourceMetadata: { resource: string; scopesSupported?: string[]; bearerMethodsSupported?: string[] }
  /** Opt-in OAuth facade (plugins/oauth-facade/schema.json). */
  facade?: unknown
  clockToleranceSeconds?: number
  tokenCache?: { enabled?: boolean; maxEntries?: number; ttlSeconds?: number }
  keySet?: { refreshSeconds?: number; cooldownSeconds?: number; maxBackoffSeconds?: number; timeoutMs?: number; maxBytes?: number; retryAfterSeconds?: number }
  subjectClaim?: string
  rejectIdTokens?: boolean
  maxTokenLifetimeSeconds?: number
  maxTokenBytes?: number
  maxClaimDepth?: number
  discovery?: { ttlSeconds?: number; timeoutMs?: number }
}
