/**
 * Builds the UpstreamFactory of one configured target: stdio children or a
 * remote streamable-HTTP server. The session layer (core/mcp/) calls
 * `create()` once per gateway session.
 */
import type { Logger } from 'pino'
import type { TargetConfig } from '../config.ts'
import type { Metrics } from '../metrics.ts'
import { ProxyError } from '../errors.ts'
import { StdioUpstream } from './stdio.ts'
import type { Upstream, UpstreamFactory } from './types.ts'

export interface UpstreamFactoryOptions {
  log: Logger
  /** Directory of the config file; a stdio target's `cwd` is relative to it. */
  baseDir: string
  /** `mcp.limits.maxLineBytes`: longest stdout line a stdio child may write. */
  maxLineBytes: number
  metrics: Metrics
}

export function createUpstreamFactory (target: TargetConfig, opts: UpstreamFactoryOptions): UpstreamFactory {
  const { name } = target
  if (target.stdio !== undefined) {
    const config = target.stdio
    return {
      target: name,
      kind: 'stdio',
      create (): Upstream {
        return new StdioUpstream({ target: name, config, baseDir: opts.baseDir, maxLineBytes: opts.maxLineBytes, log: opts.log, metrics: opts.metrics })
      },
    }
  }
  throw new ProxyError('MCPP_ERR_CONFIG', 500, `mcp.targets: target ${name} has no supported kind`)
}

export { killAllChildren, liveChildCount, childEnv, CHILD_ENV_ALLOW_LIST, StdioUpstream } from './stdio.ts'
export type { StdioUpstreamOptions } from './stdio.ts'
