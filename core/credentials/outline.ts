/**
 * What a target's `auth` block sets, by name only: its credential mode and the headers or
 * environment variables it fills. Read from the config alone (no I/O, nothing created), so the
 * admin views (TargetAuth.describe) and `mcp-proxy --check` say the same; never a value.
 */
import type { TargetConfig } from '../config.ts'
import type { CredentialMode } from './types.ts'

/** A target's `auth` block, by name. */
export interface AuthOutline {
  readonly mode: CredentialMode
  /** Header names as configured; the mode's own first (`Authorization`, or the `apiKey` header). */
  readonly headerNames: readonly string[]
  /** Environment variable names as configured (stdio targets). */
  readonly envNames: readonly string[]
}

export function modeOf(target: TargetConfig): CredentialMode {
  const a = target.auth
  if (a?.tokenExchange !== undefined) return 'tokenExchange'
  if (a?.onBehalfOf !== undefined) return 'onBehalfOf'
  if (a?.bearer !== undefined) return 'bearer'
  if (a?.apiKey !== undefined) return 'apiKey'
  return 'claims'
}

/** The outline of `target`'s `auth` block; undefined without one. */
export function outlineOf(target: TargetConfig): AuthOutline | undefined {
  const a = target.auth
  if (a === undefined) return undefined
  const mode = modeOf(target)
  const headerNames = Object.keys(a.headers ?? {})
  if (mode === 'bearer' || mode === 'tokenExchange' || mode === 'onBehalfOf') headerNames.unshift('Authorization')
  if (a.apiKey !== undefined) headerNames.unshift(a.apiKey.header)
  return { mode, headerNames, envNames: Object.keys(a.env ?? {}) }
}
