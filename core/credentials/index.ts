/**
 * The credential layer's one door: the broker built once at start-up from
 * `mcp.targets[].auth` (core/gateway.ts), the config checks and outlines
 * (start-up and `--check`), and the contract's types. A side system like core/cluster/:
 * it knows the engine's errors, config types and observability, and never
 * the MCP layer, the transports or a plugin (.dependency-cruiser.cjs).
 */
import type { Logger } from 'pino'
import type { TargetConfig } from '../config.ts'
import type { Metrics } from '../observability/metrics.ts'
import { targetMetrics } from './metrics.ts'
import { createTargetAuth, type OwnedTargetAuth } from './target-auth.ts'
import type { CredentialBroker } from './types.ts'

export type { Caller, CredentialBroker, CredentialMode, TargetAuth, TargetAuthSummary, TargetCredential } from './types.ts'
export { checkTargetAuth, isLoopbackUrl, type AuthCheckContext } from './config-check.ts'
export { FAILURE_REASONS, RETRY_AFTER_SECONDS, type FailureReason } from './failures.ts'
export { MAX_CLAIM_BYTES } from './templates.ts'
export { outlineOf, type AuthOutline } from './outline.ts'

export interface CredentialBrokerOptions {
  readonly log: Logger
  readonly metrics: Metrics
  /** The gateway's RFC 9728 metadata URL (`<base>/.well-known/oauth-protected-resource/mcp`): every step-up challenge names it. */
  readonly resourceMetadataUrl: string
  /** The scopes a consent step-up asks for unless the target sets `auth.stepUpScope` (the gateway's scopes_supported). */
  readonly scopesSupported: readonly string[]
  /** The HTTP client for token endpoints (tests); default the global fetch. */
  readonly fetch?: typeof fetch
  /** The clock (epoch ms) for cache freshness; default Date.now (tests move time instead of sleeping). */
  readonly now?: () => number
}

/**
 * A broker for `targets` (those without `auth` get none). The targets must
 * have passed `checkTargetAuth`: what it refuses is not checked again here.
 */
export function createCredentialBroker(targets: readonly TargetConfig[], opts: CredentialBrokerOptions): CredentialBroker {
  const now = opts.now ?? Date.now
  const log = opts.log.child({ component: 'credentials' })
  const byName = new Map<string, OwnedTargetAuth>()
  for (const t of targets) {
    if (t.auth === undefined) continue
    const exchanging = t.auth.tokenExchange !== undefined || t.auth.onBehalfOf !== undefined
    const scope = t.auth.stepUpScope ?? opts.scopesSupported.join(' ')
    byName.set(
      t.name,
      createTargetAuth(t, {
        log,
        metrics: targetMetrics(opts.metrics, t.name, exchanging),
        challenge: { resourceMetadataUrl: opts.resourceMetadataUrl, scope },
        fetch: opts.fetch,
        now,
      })
    )
  }
  return {
    forTarget: name => byName.get(name),
    describe: () => [...byName.values()].map(a => a.describe()),
    now,
    close() {
      for (const a of byName.values()) a.close()
    },
  }
}
