/**
 * Builds the UpstreamFactory of one configured target: stdio children or a
 * remote streamable-HTTP server, with the target's `share`, pool size and
 * `protocol` settings for the MCP layer to read. The MCP layer decides when
 * to call `create()` (per legacy session, per pooled upstream of a subject);
 * the transport metrics' series are declared here, at start-up, at 0.
 */
import type { Logger } from 'pino'
import type { TargetConfig } from '../config.ts'
import type { Metrics } from '../observability/metrics.ts'
import { ProxyError } from '../errors.ts'
import { StdioUpstream, STDIO_EXIT_REASONS } from './stdio.ts'
import { HttpUpstream } from './http.ts'
import type { Upstream, UpstreamAttachment, UpstreamFactory, UpstreamObserver } from './types.ts'

export interface UpstreamFactoryOptions {
  log: Logger
  /** Directory of the config file; a stdio target's `cwd` is relative to it. */
  baseDir: string
  /** `mcp.limits.maxLineBytes`: longest stdout line a stdio child may write. */
  maxLineBytes: number
  metrics: Metrics
  /** Told of each upstream's start and end (lifecycle.ts). */
  observer?: UpstreamObserver
}

export function createUpstreamFactory(target: TargetConfig, opts: UpstreamFactoryOptions): UpstreamFactory {
  const { name } = target
  if (target.stdio !== undefined) {
    const config = target.stdio
    // Every series at 0 from start-up, before the first session starts a child.
    const exits = opts.metrics.counter('mcp_proxy_upstream_exits_total', 'Upstream ends by target and reason')
    for (const reason of STDIO_EXIT_REASONS) exits.init({ target: name, reason })
    opts.metrics.counter('mcp_proxy_upstream_dropped_lines_total', 'Non-JSON stdout lines of stdio targets that were dropped').init({ target: name })
    return {
      target: name,
      kind: 'stdio',
      share: config.share ?? 'session',
      processesPerSubject: config.processesPerSubject ?? 1,
      protocol: target.protocol ?? 'auto',
      create(attach?: UpstreamAttachment): Upstream {
        return new StdioUpstream({
          target: name,
          config,
          env: attach?.env,
          baseDir: opts.baseDir,
          maxLineBytes: opts.maxLineBytes,
          log: opts.log,
          metrics: opts.metrics,
          observer: opts.observer,
        })
      },
    }
  }
  if (target.mcp !== undefined) {
    const { url, headers } = target.mcp
    opts.metrics.counter('mcp_proxy_upstream_http_errors_total', 'Failed HTTP exchanges with remote MCP targets').init({ target: name })
    return {
      target: name,
      kind: 'http',
      protocol: target.protocol ?? 'auto',
      create(attach?: UpstreamAttachment): Upstream {
        return new HttpUpstream({ target: name, url, headers, attach: attach?.headers, log: opts.log, metrics: opts.metrics, observer: opts.observer })
      },
    }
  }
  throw new ProxyError('MCPP_ERR_CONFIG', 500, `mcp.targets: target ${name} has no supported kind`)
}

// What the gateway (shutdown) and the admin gauges need of the stdio transport.
export { killAllChildren, liveChildCount } from './stdio.ts'
export { observeTargets, type TargetLifecycle, type TargetState } from './lifecycle.ts'
export type { UpstreamObserver } from './types.ts'
