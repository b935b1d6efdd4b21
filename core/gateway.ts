/**
 * Assembles a running gateway from a loaded config: logger, metrics,
 * plugins (in pipeline order), route table, upstream factories, the /mcp
 * endpoint, the MCP listener, the admin and probe listeners, this
 * process's place in a deployment (core/cluster/node.ts, handed to MCP
 * through core/mcp/cluster.ts) and the targets' credentials
 * (core/credentials/, one broker per process: each worker builds its own).
 * Composition only; owns start-up and shutdown order.
 */
import type { AddressInfo } from 'node:net'
import type { Server } from 'node:http'
import type { Logger } from 'pino'
import { createLogger } from './logger.ts'
import { ProxyError } from './errors.ts'
import { Metrics } from './observability/metrics.ts'
import { collectProcessMetrics } from './observability/process-metrics.ts'
import type { GatewayConfig, LoadedConfig } from './config.ts'
import { loadPipeline } from './plugin-loader.ts'
import { Pipeline } from './pipeline.ts'
import { RouteTable } from './routes.ts'
import { GatewayServer, type McpEndpoint } from './server.ts'
import { createAdminServer, type AdminState } from './admin/admin.ts'
import { createAdminState, RequestLog } from './admin/admin-state.ts'
import { EMPTY_REGISTRY, type Plugin, type PluginRegistry } from './plugin.ts'
import { createUpstreamFactory, killAllChildren, observeTargets } from './targets/index.ts'
import { createHttpPassthrough } from './mcp/legacy/passthrough.ts'
import { createMcpEndpoint, type GatewayMcpEndpoint } from './mcp/index.ts'
import { createMcpCluster } from './mcp/cluster.ts'
import { TargetReadiness } from './targets/readiness.ts'
import { startTracing, stopTracing } from './observability/tracing.ts'
import { VERSION } from './version.ts'
import { listenError } from './listen-error.ts'
import { createProbeServer, type ProbeReadiness, type ProbeServer } from './admin/probes.ts'
import { ClusterNode, type WorkerIdentity } from './cluster/node.ts'
import type { SharedState } from './cluster/shared-state.ts'
import { createCredentialBroker, type CredentialBroker } from './credentials/index.ts'

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
  /** `workers` > 1: this process is worker `slot` of a primary (core/cluster/primary.ts), which serves probes and admin. */
  worker?: WorkerIdentity
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
  readonly endpoint: GatewayMcpEndpoint
  /** Readiness as /readyz reports it (a worker answers its primary with it). */
  ready(): ProbeReadiness | undefined
  close(): Promise<void>
}

/** `{base_url}`: from a built-in's policy (mcpAuthentication's resource, minus /mcp), else mcp.baseUrl, else the listen address. */
export function computeBaseUrl(loaded: LoadedConfig, port: number, registry: PluginRegistry = EMPTY_REGISTRY): string {
  const c = loaded.config.mcp
  for (const mod of Object.values(registry.modules)) {
    const options = mod.policy !== undefined ? c.policies[mod.policy] : undefined
    const url = options !== undefined ? mod.baseUrlOf?.(options) : undefined
    if (url !== undefined) return url
  }
  if (c.baseUrl !== undefined) return c.baseUrl
  return `http://localhost:${port}`
}

/** A listener bound on `port`; `exclusive`: in a worker, a listener of its own, not the port the workers share (node:cluster). */
function listen(server: Server, port: number, host: string, exclusive = false): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen({ port, host, exclusive }, () => {
      server.off('error', reject)
      resolve((server.address() as AddressInfo).port)
    })
  })
}

/** An address this process can reach its own listener on. */
function loopbackFor(boundHost: string): string {
  if (boundHost === '0.0.0.0' || boundHost === '') return '127.0.0.1'
  if (boundHost === '::') return '[::1]'
  return boundHost.includes(':') ? `[${boundHost}]` : boundHost
}

function hostForUrl(host: string): string {
  if (host === '0.0.0.0' || host === '::' || host === '127.0.0.1' || host === '::1') return 'localhost'
  return host.includes(':') ? `[${host}]` : host
}

/** What every start-up step reads; `cleanup` is undone in reverse order when start-up fails. */
interface Boot {
  readonly loaded: LoadedConfig
  readonly config: Readonly<GatewayConfig>
  readonly opts: StartOptions
  readonly log: Logger
  readonly metrics: Metrics
  readonly node: ClusterNode
  readonly cleanup: Array<() => Promise<unknown>>
}

/** What the admin and probe listeners show: set once the gateway is assembled (they answer "starting" until then). */
interface Views {
  admin?: AdminState
  readiness?: () => ProbeReadiness
}

async function undo(b: Boot): Promise<void> {
  for (const c of b.cleanup.reverse()) await c().catch(() => {})
}

/**
 * The admin listener, bound early (a port in use fails start-up before any
 * plugin starts); it answers /readyz "starting" until the gateway is assembled.
 * A worker's admin listener is its own, on loopback: the primary binds
 * admin.port and relays to it (core/cluster/admin-relay.ts).
 */
async function bindAdmin(b: Boot, views: Views): Promise<{ server: Server; url: string } | undefined> {
  const { config, opts, log, node } = b
  if (!config.admin.enabled) return undefined
  const server = createAdminServer({ log, metrics: b.metrics, token: config.admin.token, host: config.admin.host, state: () => views.admin })
  b.cleanup.push(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  let url: string
  try {
    const port =
      node.worker !== undefined
        ? await listen(server, 0, '127.0.0.1', true)
        : await listen(server, opts.adminPort ?? config.admin.port, config.admin.host).catch((err: unknown) => {
            throw listenError(err, 'admin.port', opts.adminPort ?? config.admin.port, config.admin.host)
          })
    url = node.worker !== undefined ? `http://127.0.0.1:${port}` : `http://${hostForUrl(config.admin.host)}:${port}`
  } catch (err) {
    await undo(b)
    throw err
  }
  if (node.worker === undefined && !['127.0.0.1', '::1', 'localhost'].includes(config.admin.host) && config.admin.token === undefined) {
    log.warn({ host: config.admin.host }, 'admin listener is exposed beyond loopback without admin.token')
  }
  return { server, url }
}

/** The probe listener, bound early too: the kubelet gets /readyz "starting", not a refused connection. A worker's primary serves probes. */
async function bindProbes(b: Boot, views: Views): Promise<{ probes: ProbeServer; url: string } | undefined> {
  const { config, opts, log } = b
  if (config.probes === undefined || b.node.worker !== undefined) return undefined
  const probes = createProbeServer({ log, metrics: b.metrics, metricsToken: config.probes.metricsToken, ready: () => views.readiness?.() })
  let url: string
  try {
    const port = await listen(probes.server, opts.probesPort ?? config.probes.port, config.probes.host).catch((err: unknown) => {
      throw listenError(err, 'probes.port', opts.probesPort ?? config.probes!.port, config.probes!.host)
    })
    url = `http://${hostForUrl(config.probes.host)}:${port}`
  } catch (err) {
    await undo(b)
    await probes.close()
    throw err
  }
  b.cleanup.push(() => probes.close())
  return { probes, url }
}

/** The gateway's MCP side once assembled: plugins, shared state, the /mcp endpoint. */
interface Assembled {
  readonly baseUrl: string
  readonly plugins: Plugin[]
  readonly routes: RouteTable
  readonly shared: SharedState
  readonly lifecycles: ReturnType<typeof observeTargets>
  readonly endpoint: GatewayMcpEndpoint
  /** What each target receives for each caller (core/credentials/): one per process. */
  readonly credentials: CredentialBroker
}

/** Plugins (in pipeline order) over shared state, the cluster seam, the upstream factories and the /mcp endpoint. */
async function assemble(b: Boot, gw: GatewayServer, port: number, targetReadiness: TargetReadiness): Promise<Assembled> {
  const { config, loaded, log, metrics, node, cleanup } = b
  const baseUrl = computeBaseUrl(loaded, port, b.opts.registry)
  // The targets' check (local files only) runs while the plugins are created.
  const checked = targetReadiness.check()
  const shared = await node.openSharedState()
  cleanup.push(() => shared.state.close())
  // The secret every process of this deployment shares: plugins derive keys from it (env.deriveKey).
  const { plugins, provided } = await loadPipeline({
    config,
    baseDir: loaded.baseDir,
    registry: b.opts.registry,
    env: { log, config: config as never, baseUrl, metrics, shared: shared.state },
    secret: node.secret,
  })
  cleanup.push(() => Promise.allSettled(plugins.map(p => p.close?.())))
  // A step-up challenge names the gateway's own protected resource metadata and scopes (as plugins/authorization's does).
  const credentials = createCredentialBroker(config.mcp.targets, {
    log,
    metrics,
    resourceMetadataUrl: `${baseUrl.replace(/\/+$/, '')}/.well-known/oauth-protected-resource/mcp`,
    scopesSupported: (provided.protectedResource as { scopesSupported?: readonly string[] } | undefined)?.scopesSupported ?? [],
  })
  cleanup.push(async () => credentials.close())
  await checked
  const routes = new RouteTable(plugins)
  const pipeline = new Pipeline(plugins)
  // The transports report starts, ends and failures to these (admin UI, upstream gauges); call metrics live in core/mcp/upstreams/calls.ts.
  const lifecycles = observeTargets(
    config.mcp.targets.map(t => ({ name: t.name, kind: t.stdio !== undefined ? ('stdio' as const) : ('http' as const) })),
    metrics
  )
  const factories = config.mcp.targets.map((t, i) =>
    createUpstreamFactory(t, { log, baseDir: loaded.baseDir, maxLineBytes: config.mcp.limits.maxLineBytes, metrics, observer: lifecycles[i] })
  )
  cleanup.push(async () => node.closeRelayListener())
  const relay = await node.openForward(socket => {
    gw.server.emit('connection', socket)
  })
  const cluster = createMcpCluster({ workerSlot: node.worker?.slot, shared: shared.state, leaseMs: shared.leaseMs, relay, secret: node.secret })
  const only = config.mcp.targets.length === 1 ? config.mcp.targets[0]! : undefined
  const perOperation = plugins.some(p => typeof p.allowMcpOperation === 'function')
  // With replicas or workers, a passthrough session's id carries its upstream session: any of them serves it.
  const passthrough =
    only?.mcp !== undefined && !perOperation
      ? createHttpPassthrough(only, {
          log,
          metrics,
          cluster,
          idleTimeoutSeconds: config.mcp.session.idleTimeoutSeconds,
          maxSessions: config.mcp.session.maxSessions,
          auth: credentials.forTarget(only.name),
        })
      : undefined
  const endpoint = createMcpEndpoint({ targets: factories, plugins, config: config.mcp, log, metrics, passthrough, cluster, credentials })
  cleanup.push(() => endpoint.close())
  gw.attach(pipeline, routes, endpoint)
  return { baseUrl, plugins, routes, shared: shared.state, lifecycles, endpoint, credentials }
}

/** Readiness as /readyz reports it: the admin state's, and shared state (Redis) reachable, else this replica cannot check caps and limits. */
function readinessOf(state: AdminState, shared: SharedState): () => ProbeReadiness {
  return () => {
    const r = state.ready()
    const sh = shared.ready()
    return sh.ready
      ? r
      : { ready: false, reasons: [...r.reasons, `shared state: ${sh.reason ?? 'not ready'}`], codes: [...r.codes, 'shared_state_unavailable'] }
  }
}

/** What the ordered shutdown closes. */
interface Running {
  readonly b: Boot
  readonly gw: GatewayServer
  readonly a: Assembled
  readonly targetReadiness: TargetReadiness
  readonly admin: Server | undefined
  readonly probes: ProbeServer | undefined
  readonly stopProcessMetrics: () => void
  readonly endTracing: () => Promise<void>
}

/** Readiness fails first; the MCP listener keeps serving while balancers notice; then everything closes in order. */
async function shutdown(r: Running): Promise<void> {
  const { config, log, node } = r.b
  const { endpoint, plugins, shared } = r.a
  r.probes?.terminating()
  // A worker's primary has failed readiness and waited already.
  const delay = node.worker !== undefined ? 0 : (config.probes?.shutdownDelayMs ?? 0)
  if (delay > 0) {
    log.info({ delayMs: delay }, 'shutting down: not ready, still serving until the delay ends')
    await new Promise(resolve => setTimeout(resolve, delay))
  }
  const serverClosed = r.gw.close(config.mcp.limits.shutdownGraceMs)
  // Stops accepting relayed connections too; those open drain with the MCP listener's.
  const relayClosed = node.closeRelayListener()
  endpoint.drain?.()
  await serverClosed
  await relayClosed
  await endpoint.close()
  r.a.credentials.close()
  r.targetReadiness.close()
  await Promise.allSettled(plugins.map(p => p.close?.()))
  const admin = r.admin
  if (admin !== undefined)
    await new Promise<void>(resolve => {
      admin.close(() => resolve())
      admin.closeAllConnections()
    })
  await r.probes?.close()
  await shared.close()
  await killAllChildren()
  r.stopProcessMetrics()
  await r.endTracing()
}

/** The /mcp endpoint until attach() installs the real one: 503, the gateway is starting. */
const STARTING: McpEndpoint = {
  async handle() {
    throw new ProxyError('MCPP_ERR_STARTING', 503, 'Service Unavailable: the gateway is starting', { headers: { 'retry-after': '1' } })
  },
  async close() {},
}

export async function startGateway(loaded: LoadedConfig, opts: StartOptions = {}): Promise<RunningGateway> {
  const { config } = loaded
  const worker = opts.worker
  const log = worker === undefined ? (opts.log ?? createLogger(config.logging)) : (opts.log ?? createLogger(config.logging)).child({ worker: worker.slot })
  const metrics = new Metrics()
  const stopProcessMetrics = collectProcessMetrics(metrics)
  const mcpPort = opts.mcpPort ?? config.mcp.port
  // Before the listener: the first request already gets its span. Loads nothing when tracing is off.
  const traced = await startTracing(config.tracing, log, VERSION)
  const endTracing = (): Promise<void> => (traced ? stopTracing() : Promise.resolve())
  const requestLog = new RequestLog()
  const node = new ClusterNode({ cluster: config.cluster, mcpHost: config.mcp.host, worker, log })
  // Bind first: `{base_url}` (derived from the listen address when not configured)
  // must name the actual port, and a port in use should fail before any plugin starts.
  // Requests that arrive meanwhile are held (bounded) and answered once attach()
  // installs the real pipeline: no request meets a half-started gateway.
  const gw = new GatewayServer({
    pipeline: new Pipeline([]),
    routes: new RouteTable([]),
    mcp: STARTING,
    log,
    limits: config.mcp.limits,
    metrics,
    trustedProxies: config.mcp.trustedProxies,
    clientRelay: node.clientRelay,
    onAccess: rec => requestLog.add(rec),
    internalToken: node.internalToken,
    hold: { maxRequests: config.mcp.limits.startupMaxHeldRequests, timeoutMs: config.mcp.limits.startupHoldMs },
  })
  const bound = await gw.listen(mcpPort, config.mcp.host).catch(async (err: unknown) => {
    await endTracing()
    throw listenError(err, 'mcp.port', mcpPort, config.mcp.host)
  })
  const b: Boot = { loaded, config, opts, log, metrics, node, cleanup: [endTracing, async () => stopProcessMetrics(), () => gw.close(0)] }
  const views: Views = {}
  const admin = await bindAdmin(b, views)
  const probes = await bindProbes(b, views)
  const targetReadiness = new TargetReadiness({
    targets: config.mcp.targets,
    baseDir: loaded.baseDir,
    log,
    mode: config.mcp.readiness.targets ?? (config.mcp.failClosed ? 'all' : 'any'),
  })
  b.cleanup.push(async () => targetReadiness.close())
  try {
    const a = await assemble(b, gw, bound.port, targetReadiness)
    const mcpUrl = `http://${hostForUrl(config.mcp.host)}:${bound.port}/mcp`
    if (admin !== undefined || probes !== undefined || worker !== undefined) {
      views.admin = createAdminState({
        loaded,
        plugins: a.plugins,
        routes: a.routes,
        endpoint: a.endpoint,
        targets: a.lifecycles,
        requests: requestLog,
        metrics,
        log,
        version: VERSION,
        mcpOrigin: `http://${loopbackFor(bound.host)}:${bound.port}`,
        internalToken: node.internalToken,
        targetReadiness,
        credentials: a.credentials,
      })
      views.readiness = readinessOf(views.admin, a.shared)
    }
    const adminUrl = admin?.url
    log.info(
      {
        mcp: mcpUrl,
        ui: adminUrl !== undefined ? `${adminUrl}/ui` : undefined,
        targets: config.mcp.targets.map(t => t.name),
        plugins: a.plugins.map(p => p.name),
      },
      `mcp-proxy ${VERSION} listening on ${mcpUrl}` + (adminUrl !== undefined ? `; UI at ${adminUrl}/ui` : '')
    )
    const running: Running = { b, gw, a, targetReadiness, admin: admin?.server, probes: probes?.probes, stopProcessMetrics, endTracing }
    let closing: Promise<void> | undefined
    return {
      mcpUrl,
      adminUrl,
      probesUrl: probes?.url,
      baseUrl: a.baseUrl,
      plugins: a.plugins,
      metrics,
      log,
      endpoint: a.endpoint,
      ready: () => views.readiness?.(),
      close: () => {
        closing ??= shutdown(running)
        return closing
      },
    }
  } catch (err) {
    await undo(b)
    await killAllChildren()
    throw err
  }
}
