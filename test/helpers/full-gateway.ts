/**
 * A whole gateway (core/gateway.ts startGateway: plugin loader, pipeline,
 * session layer, real targets) on 127.0.0.1:0 from a config object, closed in
 * teardown. For the end-to-end and conformance tests.
 */
import type { Test } from 'tap'
import { validateConfig, deepFreeze, type LoadedConfig } from '../../core/config.ts'
import { startGateway, type RunningGateway } from '../../core/gateway.ts'
import { memoryLogger } from './logger.ts'
import { ROOT } from './gateway-harness.ts'
import { builtins } from '../../plugins/index.ts'

export interface FullGateway {
  gw: RunningGateway
  /** `http://127.0.0.1:<port>/mcp` */
  url: string
  logText: () => string
}

/**
 * `mcp` is the config's `mcp` section; host defaults to 127.0.0.1 and port to 0 (any free port).
 * `sections`: other top-level sections (`tracing`, ...).
 */
export async function fullGateway(t: Test, mcp: Record<string, unknown>, logLevel = 'info', sections: Record<string, unknown> = {}): Promise<FullGateway> {
  const config = deepFreeze(await validateConfig({ mcp: { host: '127.0.0.1', port: 0, ...mcp }, admin: { enabled: false }, ...sections }, builtins))
  const loaded: LoadedConfig = { config, baseDir: ROOT, secretPaths: new Set() }
  const mem = memoryLogger(logLevel)
  const gw = await startGateway(loaded, { log: mem.log, mcpPort: config.mcp.port, registry: builtins })
  t.teardown(() => gw.close())
  // mcpUrl names `localhost`; the listener is bound to 127.0.0.1 only.
  const url = new URL(gw.mcpUrl)
  url.hostname = '127.0.0.1'
  return { gw, url: url.href, logText: mem.text }
}
