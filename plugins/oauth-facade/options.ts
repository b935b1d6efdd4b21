/**
 * The facade's options: mcpAuthentication's `facade` block, validated by
 * schema.json (composed into mcpAuthentication's schema by the registry,
 * plugins/index.ts, so config load and `--check` name the path) plus the checks a schema cannot say.
 */
import { ProxyError, createAjv, formatAjvErrors } from '../../core/plugin-api.ts'
import { authorizeRedirectProblem, privateSchemes } from '../oauth-common/redirect-uri.ts'
import schema from './schema.json' with { type: 'json' }
import type { SealKey } from './seal.ts'
import type { CimdOptions } from './cimd.ts'

export const FACADE_PATH = 'mcp.policies.mcpAuthentication.facade'

/** schema.json as a subschema (without `$schema`), for mcpAuthentication's options schema. */
export const facadeSchema: Record<string, unknown> = (() => {
  const { $schema: _draft, ...rest } = schema as Record<string, unknown>
  return rest
})()

export interface FacadeOptions {
  readonly keys?: readonly SealKey[]
  readonly callbackPath: string
  readonly stateTtlSeconds: number
  readonly codeTtlSeconds: number
  readonly refreshTokenTtlSeconds: number
  readonly maxUsedCodes: number
  readonly redis?: { readonly url: string; readonly timeoutMs: number }
  readonly consent: { readonly rememberSeconds: number; readonly trustedDomains: readonly string[] }
  /** Private-use redirect URI schemes accepted besides https and loopback http (RFC 8252 §7.1). */
  readonly allowedRedirectSchemes: readonly string[]
  readonly clients: ReadonlyArray<{
    readonly clientId: string
    readonly clientName?: string
    readonly redirectUris: readonly string[]
    readonly trusted: boolean
  }>
  readonly registration: { readonly enabled: boolean; readonly maxBodyBytes: number; readonly maxRedirectUris: number; readonly maxRedirectUriLength: number }
  readonly cimd: CimdOptions & { readonly enabled: boolean }
}

/** This block as mcpAuthentication validates it (the registry hands it over: plugins/index.ts). */
export const facadeBlock = {
  schema: facadeSchema,
  options: (raw: unknown, path: string): FacadeOptions => facadeOptions(raw, path),
} as const

/** Validates the facade block against schema.json (defaults applied to a copy), naming the config path. */
export function facadeOptions(raw: unknown, path = FACADE_PATH): FacadeOptions {
  const copy = structuredClone(raw ?? {})
  const validate = createAjv().compile(facadeSchema)
  if (!validate(copy)) {
    throw new ProxyError(
      'MCPP_ERR_CONFIG',
      500,
      'invalid facade options:\n' +
        formatAjvErrors(validate.errors ?? [], path)
          .map(l => '  ' + l)
          .join('\n')
    )
  }
  const o = copy as unknown as FacadeOptions
  const schemes = privateSchemes(o.allowedRedirectSchemes)
  for (const [i, c] of o.clients.entries()) {
    for (const [j, u] of c.redirectUris.entries()) {
      const problem = authorizeRedirectProblem(u, schemes)
      if (problem !== undefined) throw new ProxyError('MCPP_ERR_CONFIG', 500, `${path}.clients[${i}].redirectUris[${j}]: ${problem}`)
    }
  }
  const ids = new Set<string>()
  o.clients.forEach((c, i) => {
    if (ids.has(c.clientId)) throw new ProxyError('MCPP_ERR_CONFIG', 500, `${path}.clients[${i}].clientId: ${c.clientId} is listed twice`)
    ids.add(c.clientId)
  })
  if (o.cimd.testOnlyCa !== undefined && !o.cimd.testOnlyAllowLoopback) {
    throw new ProxyError('MCPP_ERR_CONFIG', 500, `${path}.cimd.testOnlyCa: is only used with testOnlyAllowLoopback`)
  }
  return o
}
