/**
 * What this process is in a deployment, and the cluster parts that follow
 * from it: alone; a replica among others (`cluster`: the configured secret
 * and advertise URL); a worker of a primary (`workers`: the per-run secret
 * and the primary's store over IPC, primary.ts); or a worker of a replica
 * (both). The composition root (core/gateway.ts) asks for each part in
 * start-up order and hands it on; MCP reaches them through
 * core/mcp/cluster.ts only.
 */
import { createHmac, randomBytes } from 'node:crypto'
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net'
import type { Logger } from 'pino'
import type { ClusterConfig } from '../config.ts'
import { createClientRelay, type ClientRelay } from './client-address.ts'
import { createClusterForward, type ClusterForward } from './forward.ts'
import { createMemoryState, createRedisState, type SharedState } from './shared-state.ts'

/** A worker of a primary (`workers` > 1): its slot, and what came over the IPC channel (worker.ts). */
export interface WorkerIdentity {
  readonly slot: number
  /** The per-run secret the primary drew: every worker of this run shares it. */
  readonly secret: string
  /** The primary's store. */
  readonly shared: SharedState
}

export interface ClusterNodeOptions {
  readonly cluster: Readonly<ClusterConfig> | undefined
  /** `mcp.host`: a worker of a replica binds its relay listener there. */
  readonly mcpHost: string
  readonly worker: WorkerIdentity | undefined
  readonly log: Logger
}

/** Shared state, and how long a cap slot outlives a process that stopped renewing it. */
export interface SharedStateLease {
  readonly state: SharedState
  readonly leaseMs: number
}

export class ClusterNode {
  readonly worker: WorkerIdentity | undefined
  /**
   * The secret every process of this deployment shares (`cluster.secret`,
   * else a worker's per-run secret); undefined when the process serves alone.
   */
  readonly secret: string | undefined
  /** Signs and verifies the client address a peer relays (with a secret). */
  readonly clientRelay: ClientRelay | undefined
  /**
   * Marks the admin's own reads of the /.well-known documents
   * (GatewayServerOptions.internalToken). Workers share the MCP port, so the
   * read may land on a sibling: one value for all, from their shared secret.
   */
  readonly internalToken: string
  readonly #cluster: Readonly<ClusterConfig> | undefined
  readonly #mcpHost: string
  readonly #log: Logger
  #relayListener: NetServer | undefined

  constructor(o: ClusterNodeOptions) {
    this.worker = o.worker
    this.#cluster = o.cluster
    this.#mcpHost = o.mcpHost
    this.#log = o.log
    this.secret = o.cluster?.secret ?? o.worker?.secret
    this.clientRelay = this.secret === undefined ? undefined : createClientRelay(this.secret, o.log)
    this.internalToken =
      o.worker === undefined
        ? randomBytes(24).toString('base64url')
        : createHmac('sha256', o.worker.secret).update('mcp-proxy internal requests').digest('base64url')
  }

  /** Redis with `cluster.redis`, else the primary's store for a worker, else this process's memory. */
  async openSharedState(): Promise<SharedStateLease> {
    const redis = this.#cluster?.redis
    const state: SharedState =
      redis !== undefined
        ? await createRedisState({ url: redis.url, keyPrefix: redis.keyPrefix, log: this.#log.child({ component: 'shared-state' }) })
        : (this.worker?.shared ?? createMemoryState())
    // In the primary's store a dead worker's slots are freed at once; the lease is a second guard.
    const leaseMs = redis !== undefined ? redis.sessionLeaseSeconds * 1000 : state.kind === 'primary' ? 60_000 : Number.POSITIVE_INFINITY
    return { state, leaseMs }
  }

  /**
   * The relay of requests to the process that owns their session, when this
   * process has peers (undefined alone). A worker binds its relay listener
   * first; `accept` hands each of its connections to the MCP listener.
   */
  async openForward(accept: (socket: Socket) => void): Promise<ClusterForward | undefined> {
    if (this.secret === undefined || this.clientRelay === undefined) return undefined
    return createClusterForward({
      secret: this.secret,
      advertiseUrl: await this.#advertiseUrl(accept),
      forwardTimeoutMs: this.#cluster?.forwardTimeoutMs ?? 5000,
      log: this.#log,
      clientRelay: this.clientRelay,
    })
  }

  /**
   * The URL peers relay a session's requests to: `cluster.advertiseUrl`, or for
   * a worker a port of its own (the MCP port is shared by all workers), on
   * loopback, or on mcp.host advertised under cluster.advertiseUrl's host when
   * workers are replicas too. Its connections are served by the MCP listener.
   */
  async #advertiseUrl(accept: (socket: Socket) => void): Promise<string> {
    if (this.worker === undefined) return this.#cluster!.advertiseUrl
    const internal = createNetServer(accept)
    const host = this.#cluster === undefined ? '127.0.0.1' : this.#mcpHost
    const port = await new Promise<number>((resolve, reject) => {
      internal.once('error', reject)
      // `exclusive`: a listener of this worker's own, not a port the workers share (node:cluster).
      internal.listen({ port: 0, host, exclusive: true }, () => {
        internal.off('error', reject)
        resolve((internal.address() as AddressInfo).port)
      })
    })
    this.#relayListener = internal
    if (this.#cluster === undefined) return `http://127.0.0.1:${port}`
    const u = new URL(this.#cluster.advertiseUrl)
    u.port = String(port)
    return u.origin
  }

  /** Stops accepting relayed connections (a worker's relay listener); those open drain with the MCP listener's. */
  closeRelayListener(): Promise<void> | undefined {
    const internal = this.#relayListener
    return internal === undefined ? undefined : new Promise<void>(resolve => internal.close(() => resolve()))
  }
}
