/**
 * Assembles a running gateway from a loaded config: logger, metrics,
 * plugins (in pipeline order), route table, upstream factories, the /mcp
 * endpoint, the MCP listener and the admin listener. Owns shutdown order.
 */
import { createHmac, randomBytes } from 'node:crypto'
import type { Server } from 'node:http'
import { createServer as createNetServer, type Server as NetServer } from 'node:net'
import type { Logger } from 'pino'
import { createLogger } from './logger.ts'
import { ProxyError } from './errors.ts'
import { Metrics } from './observability/metrics.ts'
import { collectProcessMetrics } from './observability/process-metrics.ts'
import type { LoadedConfig } from './config.ts'
import { loadPlugins } from './plugin-loader.ts'
import { Pipeline } from './pipeline.ts'
import { RouteTable } from './routes.ts'
import { GatewayServer, type McpEndpoint } from './server.ts'
import { createAdminServer, type AdminState } from './admin/admin.ts'
import { createAdminState, RequestLog } from './admin/admin-state.ts'
import { EMPTY_REGISTRY, type Plugin, type PluginRegistry } from './plugin.ts'
import { createUpstreamFactory, killAllChildren, observeTargets } from './targets/index.ts'
import { createHttpPassthrough } from './mcp/legacy/passthrough.ts'
import { createMcpEndpoint } from './mcp/index.ts'
import { TargetReadiness } from './targets/readiness.ts'
import { startTracing, stopTracing } from './observability/tracing.ts'
import { VERSION } from './version.ts'
import { listenError } from './listen-error.ts'
import { createClusterForward } from './cluster/forward.ts'
import { createClientRelay } from './cluster/client-address.ts'
import { createProbeServer, type ProbeReadiness } from './admin/probes.ts'
import { createMemoryState, createRedisState, type SharedState } from './cluster/shared-state.ts'

export { VERSION }

export interface StartOptions {
  /** Logger to use (tests pass a silent one). Default: from config.logging. */
  log?: Logger
  /** Override listen ports (tests use 0). */
  mcpPort?: number
  adminPort?: number
  /** The built-in plugins (bin/ passes plugins/index.ts); core imports none. */
  registry?: PluginRegistry
  probesPort?: number
  /** `workers` > 1: this process is worker `slot` of a primary (core/workers.ts), which serves probes and admin. */
  worker?: { readonly slot: number; readonly secret: string; readonly shared: SharedState }
}

export interface RunningGateway {
  readonly mcpUrl: string
  readonly adminUrl: string | undefined
  /** The probe listener's origin, when `probes` is set. */
  readonly probesUrl: string | undefined
  readonly baseUrl: string
  readonly plugins: readonly Plugin[]
  readonly metrics: Metrics
  readonly log: Logger
  readonly endpoint: ReturnType<typeof createMcpEndpoint>
  /** Readiness as /readyz reports it (a worker answers its primary with it). */
  ready(): ProbeReadiness | undefined
  close(): Promise<void>
}

/** `{base_url}`: from a built-in's policy (mcpAuthentication's resource, minus /mcp), else mcp.baseUrl, else the listen address. */
export function computeBaseUrl (loaded: LoadedConfig, port: number, registry: PluginRegistry = EMPTY_REGISTRY): string {
  const c = loaded.config.mcp
  for (const mod of Object.values(registry.modules)) {
    const options = mod.policy !== undefined ? c.policies[mod.policy] : undefined
    const url = options !== undefined ? mod.baseUrlOf?.(options) : undefined
    if (url !== undefined) return url
  }
  if (c.baseUrl !== undefined) return c.baseUrl
  return `http://localhost:${port}`
}

/** `exclusive`: in a worker, a listener of its own, not the port the workers share (node:cluster). */
function listen (server: Server | NetServer, port: number, host: string, exclusive = false): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen({ port, host, exclusive }, () => {
      server.off('error', reject)
      resolve((server.address() as import('node:net').AddressInfo).port)
    })
  })
}

/** An address this process can reach its own listener on. */
function loopbackFor (boundHost: string): string {
  if (boundHost === '0.0.0.0' || boundHost === '') return '127.0.0.1'
  if (boundHost === '::') return '[::1]'
  return boundHost.includes(':') ? `[${boundHost}]` : boundHost
}

function hostForUrl (host: string): string {
  if (host === '0.0.0.0' || host === '::' || host === '127.0.0.1' || host === '::1') return 'localhost'
  return host.includes(':') ? `[${host}]` : host
}

export async function startGateway (loaded: LoadedConfig, opts: StartOptions = {}): Promise<RunningGateway> {
  const { config } = loaded
  const worker = opts.worker
  const log = worker === undefined ? opts.log ?? createLogger(config.logging) : (opts.log ?? createLogger(config.logging)).child({ worker: worker.slot })
  const metrics = new Metrics()
  const stopProcessMetrics = collectProcessMetrics(metrics)
  const mcpPort = opts.mcpPort ?? config.mcp.port
  // Bind first: `{base_url}` (derived from the listen address when not configured)
  // must name the actual port, and a port in use should fail before any plugin starts.
  // Requests that arrive meanwhile are held (bounded) and answered once attach()
  // installs the real pipeline: no request meets a half-started gateway.
  const starting: McpEndpoint = {
    async handle () { throw new ProxyError('MCPP_ERR_STARTING', 503, 'Service Unavailable: the gateway is starting', { headers: { 'retry-after': '1' } }) },
    async close () {},
  }
  // Before the listener: the first request already gets its span. Loads nothing when tracing is off.
  const traced = await startTracing(config.tracing, log, VERSION)
  const endTracing = (): Promise<void> => traced ? stopTracing() : Promise.resolve()
  const requestLog = new RequestLog()
  // Marks the admin's own reads of the /.well-known documents (GatewayServerOptions.internalToken).
  // Workers share the MCP port, so the read may land on a sibling: one value for all, from their shared secret.
  const internalToken = worker === undefined
    ? randomBytes(24).toString('base64url')
    : createHmac('sha256', worker.secret).update('mcp-proxy internal requests').digest('base64url')
  const clusterSecret = config.cluster?.secret ?? worker?.secret
  const clientRelay = clusterSecret === undefined ? undefined : createClientRelay(clusterSecret, log)
  const gw = new GatewayServer({
    pipeline: new Pipeline([]), routes: new RouteTable([]), mcp: starting, log, limits: config.mcp.limits, metrics,
    trustedProxies: config.mcp.trustedProxies,
    clientRelay,
    onAccess: rec => requestLog.add(rec),
    internalToken,
    hold: { maxRequests: config.mcp.limits.startupMaxHeldRequests, timeoutMs: config.mcp.limits.startupHoldMs },
  })
  const bound = await gw.listen(mcpPort, config.mcp.host).catch(async (err: unknown) => { await endTracing(); throw listenError(err, 'mcp.port', mcpPort, config.mcp.host) })
  const cleanup: Array<() => Promise<unknown>> = [endTracing, async () => stopProcessMetrics(), () => gw.close(0)]
  // The admin listener is bound early too (a port in use fails start-up
  // before any plugin starts) and answers /readyz "starting" until then.
  let adminState: AdminState | undefined
  let admin: Server | undefined
  let adminUrl: string | undefined
  if (config.admin.enabled) {
    // A worker's admin listener is its own, on loopback: the primary binds admin.port and relays to it.
    const server = createAdminServer({ log, metrics, token: config.admin.token, host: config.admin.host, state: () => adminState })
    cleanup.push(() => new Promise<void>(resolve => { server.close(() => resolve()); server.closeAllConnections() }))
    try {
      const adminPort = worker !== undefined
        ? await listen(server, 0, '127.0.0.1', true)
        : await listen(server, opts.adminPort ?? config.admin.port, config.admin.host).catch((err: unknown) => { throw listenError(err, 'admin.port', opts.adminPort ?? config.admin.port, config.admin.host) })
      admin = server
      adminUrl = worker !== undefined ? `http://127.0.0.1:${adminPort}` : `http://${hostForUrl(config.admin.host)}:${adminPort}`
    } catch (err) {
      for (const c of cleanup.reverse()) await c().catch(() => {})
      throw err
    }
    if (worker === undefined && !['127.0.0.1', '::1', 'localhost'].includes(config.admin.host) && config.admin.token === undefined) {
      log.warn({ host: config.admin.host }, 'admin listener is exposed beyond loopback without admin.token')
    }
  }
  // The probe listener is bound early too: the kubelet gets /readyz "starting", not a refused connection.
  let readiness: (() => ProbeReadiness) | undefined
  const probes = config.probes === undefined || worker !== undefined
    ? undefined
    : createProbeServer({ log, metrics, metricsToken: config.probes.metricsToken, ready: () => readiness?.() })
  let probesUrl: string | undefined
  if (probes !== undefined) {
    try {
      const port = await listen(probes.server, opts.probesPort ?? config.probes!.port, config.probes!.host)
        .catch((err: unknown) => { throw listenError(err, 'probes.port', opts.probesPort ?? config.probes!.port, config.probes!.host) })
      probesUrl = `http://${hostForUrl(config.probes!.host)}:${port}`
    } catch (err) {
      for (const c of cleanup.reverse()) await c().catch(() => {})
      await probes.close()
      throw err
    }
    cleanup.push(() => probes.close())
  }
  let plugins: Plugin[] = []
  const targetReadiness = new TargetReadiness({
    targets: config.mcp.targets, baseDir: loaded.baseDir, log,
    mode: config.mcp.readiness.targets ?? (config.mcp.failClosed ? 'all' : 'any'),
  })
  cleanup.push(async () => targetReadiness.close())
  /**
   * The URL peers relay a session's requests to: `cluster.advertiseUrl`, or for
   * a worker a port of its own (the MCP port is shared by all workers), on
   * loopback, or on mcp.host advertised under cluster.advertiseUrl's host when
   * workers are replicas too. Its connections are served by the MCP listener.
   */
  async function internalListener (): Promise<string> {
    if (worker === undefined) return config.cluster!.advertiseUrl
    const internal = createNetServer(socket => { gw.server.emit('connection', socket) })
    const host = config.cluster === undefined ? '127.0.0.1' : config.mcp.host
    const port = await listen(internal, 0, host, true)
    cleanup.push(() => new Promise<void>(resolve => internal.close(() => resolve())))
    internalClose = () => new Promise<void>(resolve => internal.close(() => resolve()))
    if (config.cluster === undefined) return `http://127.0.0.1:${port}`
    const u = new URL(config.cluster.advertiseUrl)
    u.port = String(port)
    return u.origin
  }
  let internalClose: (() => Promise<void>) | undefined
  try {
    const baseUrl = computeBaseUrl(loaded, bound.port, opts.registry)
    // The targets' check (local files only) runs while the plugins are created.
    const checked = targetReadiness.check()
    const redis = config.cluster?.redis
    const shared: SharedState = redis !== undefined
      ? await createRedisState({ url: redis.url, keyPrefix: redis.keyPrefix, log: log.child({ component: 'shared-state' }) })
      : worker?.shared ?? createMemoryState()
    cleanup.push(() => shared.close())
    // The secret every process of this deployment shares: plugins derive keys from it (env.deriveKey).
    plugins = await loadPlugins({ config, baseDir: loaded.baseDir, registry: opts.registry, env: { log, config: config as never, baseUrl, metrics, shared }, secret: clusterSecret })
    cleanup.push(() => Promise.allSettled(plugins.map(p => p.close?.())))
    await checked
    const routes = new RouteTable(plugins)
    const pipeline = new Pipeline(plugins)
    // The transports report starts, ends and failures to these (admin UI, upstream gauges); call metrics live in core/mcp/calls.ts.
    const lifecycles = observeTargets(config.mcp.targets.map(t => ({ name: t.name, kind: t.stdio !== undefined ? 'stdio' as const : 'http' as const })), metrics)
    const factories = config.mcp.targets.map((t, i) => createUpstreamFactory(t, { log, baseDir: loaded.baseDir, maxLineBytes: config.mcp.limits.maxLineBytes, metrics, observer: lifecycles[i] }))
    const only = config.mcp.targets.length === 1 ? config.mcp.targets[0]! : undefined
    const perOperation = plugins.some(p => typeof p.allowMcpOperation === 'function')
    const cluster = config.cluster === undefined && worker === undefined
      ? undefined
      : createClusterForward({
        secret: clusterSecret!, advertiseUrl: await internalListener(), forwardTimeoutMs: config.cluster?.forwardTimeoutMs ?? 5000, log, clientRelay: clientRelay!,
      })
    // With replicas or workers, a passthrough session's id carries its upstream session: any of them serves it.
    const sealed = cluster === undefined || only === undefined
      ? undefined
      : { seal: (subject: string | undefined, up: string) => cluster.sealUpstream(only.name, subject, up), open: (subject: string | undefined, id: string) => cluster.openUpstream(only.name, subject, id) }
    const passthrough = only?.mcp !== undefined && !perOperation ? createHttpPassthrough(only, { log, metrics, newSessionId: cluster?.newSessionId, sealed, idleTimeoutSeconds: config.mcp.session.idleTimeoutSeconds, maxSessions: config.mcp.session.maxSessions }) : undefined
    const endpoint = createMcpEndpoint({
      targets: factories, plugins, config: config.mcp, log, metrics, passthrough,
      // In the primary's store a dead worker's slots are freed at once; the lease is a second guard.
      shared: { state: shared, leaseMs: redis !== undefined ? redis.sessionLeaseSeconds * 1000 : shared.kind === 'primary' ? 60_000 : Number.POSITIVE_INFINITY },
      cluster,
      secret: cluster === undefined ? undefined : clusterSecret,
    })
    cleanup.push(() => endpoint.close())
    gw.attach(pipeline, routes, endpoint)
    const mcpUrl = `http://${hostForUrl(config.mcp.host)}:${bound.port}/mcp`

    if (admin !== undefined || probes !== undefined || worker !== undefined) {
      adminState = createAdminState({
        loaded, plugins, routes, endpoint, targets: lifecycles, requests: requestLog, metrics, log, version: VERSION,
        mcpOrigin: `http://${loopbackFor(bound.host)}:${bound.port}`, internalToken, targetReadiness,
      })
      const state = adminState
      // Shared state (Redis) not reachable: this replica cannot check caps and limits.
      readiness = () => {
        const r = state.ready()
        const sh = shared.ready()
        return sh.ready ? r : { ready: false, reasons: [...r.reasons, `shared state: ${sh.reason ?? 'not ready'}`], codes: [...r.codes, 'shared_state_unavailable'] }
      }
    }
    log.info({ mcp: mcpUrl, ui: adminUrl !== undefined ? `${adminUrl}/ui` : undefined, targets: config.mcp.targets.map(t => t.name), plugins: plugins.map(p => p.name) },
      `mcp-proxy ${VERSION} listening on ${mcpUrl}` + (adminUrl !== undefined ? `; UI at ${adminUrl}/ui` : ''))

    let closing: Promise<void> | undefined
    const close = (): Promise<void> => {
      closing ??= (async () => {
        // Readiness fails first; the MCP listener keeps serving while balancers notice.
        probes?.terminating()
        // A worker's primary has failed readiness and waited already.
        const delay = worker !== undefined ? 0 : config.probes?.shutdownDelayMs ?? 0
        if (delay > 0) {
          log.info({ delayMs: delay }, 'shutting down: not ready, still serving until the delay ends')
          await new Promise(resolve => setTimeout(resolve, delay))
        }
        const grace = config.mcp.limits.shutdownGraceMs
        const serverClosed = gw.close(grace)
        // Stops accepting relayed connections too; those open drain with the MCP listener's.
        const internalClosed = internalClose?.()
        endpoint.drain?.()
        await serverClosed
        await internalClosed
        await endpoint.close()
        targetReadiness.close()
        await Promise.allSettled(plugins.map(p => p.close?.()))
        if (admin !== undefined) await new Promise<void>(resolve => { admin!.close(() => resolve()); admin!.closeAllConnections() })
        await probes?.close()
        await shared.close()
        await killAllChildren()
        stopProcessMetrics()
        await endTracing()
      })()
      return closing
    }
    return { mcpUrl, adminUrl, probesUrl, baseUrl, plugins, metrics, log, endpoint, ready: () => readiness?.(), close }
  } catch (err) {
    for (const c of cleanup.reverse()) await c().catch(() => {})
    await killAllChildren()
    throw err
  }
}
