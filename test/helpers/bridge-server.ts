/**
 * A GatewayServer with only the provider-bridge and registration plugins (and
 * a stub /mcp), built the way core/gateway.ts assembles them, for tests of
 * OAuth metadata, registration and the cloud_idp proxies.
 */
import type { Logger } from 'pino'
import { validateConfig, deepFreeze, type GatewayConfig } from '../../core/config.ts'
import { GatewayServer } from '../../core/server.ts'
import { Pipeline } from '../../core/pipeline.ts'
import { RouteTable } from '../../core/routes.ts'
import { Metrics } from '../../core/observability/metrics.ts'
import type { Plugin, PluginEnv } from '../../core/plugin.ts'
import bridgeModule from '../../plugins/provider-bridge/index.ts'
import registrationModule from '../../plugins/registration/index.ts'
import { memoryLogger } from './logger.ts'
import { builtins } from '../../plugins/index.ts'
import { provides, type McpAuthenticationOptions } from '../../plugins/mcp-authentication/index.ts'

/** The public {base_url} used in these tests; requests go to the loopback listener. */
export const BASE_URL = 'https://gateway.example.test'

export interface BridgeServer {
  /** `http://127.0.0.1:<port>` */
  readonly url: string
  readonly plugins: readonly Plugin[]
  readonly config: GatewayConfig
  /** Everything logged so far (to assert secrets never appear). */
  logText(): string
  close(): Promise<void>
}

export async function makeEnv(auth: Record<string, unknown> | undefined, log: Logger): Promise<{ env: PluginEnv; config: GatewayConfig }> {
  const config = deepFreeze(
    await validateConfig(
      {
        mcp: {
          port: 1,
          targets: [{ name: 'stub', stdio: { cmd: 'node' } }],
          policies: auth === undefined ? {} : { mcpAuthentication: { mode: 'strict', resourceMetadata: { resource: `${BASE_URL}/mcp` }, ...auth } },
        },
      },
      builtins
    )
  )
  // What the plugin loader hands the bridge and registration: mcpAuthentication's `idp` and `protectedResource`.
  const options = config.mcp.policies.mcpAuthentication as McpAuthenticationOptions | undefined
  const provided = options === undefined ? {} : (provides(options) as unknown as Record<string, unknown>)
  return { env: { log, config: config as never, baseUrl: BASE_URL, configPath: 'mcp.policies', metrics: new Metrics(), provided }, config }
}

export interface BridgeServerOptions {
  /** Core `limits.maxBodyBytes`. Default 16384. */
  maxBodyBytes?: number
  /** Options of the registration plugin (its own schema). */
  registration?: Record<string, unknown>
  /** `mcp.trustedProxies` */
  trustedProxies?: string[]
  /** Shared state handed to the plugins (core/shared-state.ts), e.g. one Redis for two "replicas". */
  shared?: PluginEnv['shared']
  /** The plugins' clock (PluginEnv.now): a test moves time instead of sleeping. */
  now?: () => number
}

export async function startBridgeServer(auth: Record<string, unknown> | undefined, opts: BridgeServerOptions = {}): Promise<BridgeServer> {
  const mem = memoryLogger('debug')
  const made = await makeEnv(auth, mem.log)
  const config = made.config
  const env: PluginEnv = { ...made.env, ...(opts.shared !== undefined ? { shared: opts.shared } : {}), ...(opts.now !== undefined ? { now: opts.now } : {}) }
  const plugins = [await bridgeModule.create({}, env), await registrationModule.create(opts.registration ?? {}, env)]
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: {
      async handle(ctx) {
        await ctx.writeHead(204)
        ctx.res.end()
      },
      async close() {},
    },
    log: mem.log,
    limits: { maxBodyBytes: opts.maxBodyBytes ?? 16384, headersTimeoutMs: 10_000, requestTimeoutMs: 10_000, keepAliveTimeoutMs: 1000 },
    metrics: env.metrics,
    trustedProxies: opts.trustedProxies,
  })
  const { port } = await server.listen(0, '127.0.0.1')
  return {
    url: `http://127.0.0.1:${port}`,
    plugins,
    config,
    logText: mem.text,
    async close() {
      await server.close(0)
      await Promise.all(plugins.map(p => p.close?.()))
    },
  }
}
