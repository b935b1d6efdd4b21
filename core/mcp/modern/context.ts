/**
 * What a 2026-07-28 handler holds between requests, as one explicit record handed to each of its
 * modules (handler.ts composes them): the options, the target namespace (`namespace`), the target eras, the calls
 * parked on an InputRequiredResult, the learnt `Mcp-Param-*` annotations, the task seal and slots,
 * and the open listen streams. Also the shapes of an upstream call in flight and a parked one.
 */
import type { Logger } from 'pino'
import type { Plugin } from '../../plugin.ts'
import type { JsonRpcId, JsonRpcMessage, UpstreamFactory } from '../../targets/types.ts'
import type { StreamLimits } from '../sse.ts'
import { TargetNamespace } from '../routing/namespace.ts'
import type { CallHooks, PoolCall, PooledUpstream, UpstreamPool } from '../upstreams/pool.ts'
import { TargetEras } from '../upstreams/target-era.ts'
import { ParamHeaderCache } from './param-headers.ts'
import { createTaskSeal, type TaskSeal } from '../upstreams/task-seal.ts'
import { createMcpCluster, type McpCluster, type SharedState } from '../cluster.ts'
import type { CredentialBroker } from '../credentials.ts'

export interface ModernOptions {
  readonly targets: readonly UpstreamFactory[]
  /** Plugins with `allowMcpOperation`; empty means no filtering. */
  readonly checkers: readonly Plugin[]
  readonly pool: UpstreamPool
  readonly log: Logger
  readonly failClosed: boolean
  /** Bounds of every SSE answer and listen stream (sse.ts). */
  readonly streams: StreamLimits
  /** `mcp.limits.maxInputRequestsPerRound`; default 16. */
  readonly maxInputsPerRound?: number
  /** `mcp.limits.maxTasksPerSession`, here per subject: unfinished tasks one subject may have; default 100. */
  readonly maxTasks?: number
  /**
   * This process's place in the deployment (../cluster.ts). Its secret seals task ids (task-seal.ts: under
   * the cluster/worker secret any process serves a task, alone a per-process key); its shared state counts
   * each subject's unfinished tasks (memory, the primary's store under workers, Redis); its `newSessionId`
   * mints the `requestState` of a parked call, sealed to this process as a session's owner id is
   * (core/cluster/forward.ts), so a retry landing elsewhere is relayed here. Default: one process alone.
   */
  readonly cluster?: McpCluster
  /** The targets' credential sources (../credentials.ts); absent: no target has `auth`. */
  readonly credentials?: CredentialBroker
}

/** An upstream call in flight and the upstream it holds. */
export interface Running {
  readonly entry: PooledUpstream
  readonly call: PoolCall
  readonly hooks: CallHooks
  /**
   * Server-to-client requests of the call not yet turned into input requests: taken from the
   * moment the call is sent (a fast upstream may ask before anyone waits) and while it is parked.
   */
  readonly asked: JsonRpcMessage[]
  /** Wakes whoever waits for `asked`. */
  wake: (() => void) | undefined
  /** Takes a server request into `asked`: the call's `onServerRequest` except while it is parked. */
  readonly take: ((req: JsonRpcMessage) => void) | undefined
}

/** An upstream's final answer, and the upstream that gave it (whose serverInfo the answer carries). */
export interface Settled {
  readonly res: JsonRpcMessage
  readonly entry: PooledUpstream
}

/** One server-to-client request of a parked call, under the key the client answers it by. */
export interface Ask {
  readonly key: string
  readonly serverRequestId: JsonRpcId
}

/** An upstream call parked on an InputRequiredResult until the client retries. */
export interface Continuation {
  readonly run: Running
  readonly subjectKey: string
  readonly method: string
  /** The name or URI as the client sent it. */
  readonly name: unknown
  readonly asks: readonly Ask[]
  readonly timer: NodeJS.Timeout
}

/** The state of one handler, shared by its modules. */
export interface ModernContext {
  readonly opts: ModernOptions
  readonly pool: UpstreamPool
  readonly checkers: readonly Plugin[]
  readonly log: Logger
  readonly namespace: TargetNamespace<UpstreamFactory>
  /** Several targets: names carry their target, answers the gateway's serverInfo. */
  readonly multi: boolean
  /** `mcp.limits.maxInputRequestsPerRound`. */
  readonly maxInputs: number
  readonly eras: TargetEras
  /** Ends of the open subscriptions/listen streams. */
  readonly listens: Set<() => void>
  /** Calls parked on an InputRequiredResult, by `requestState`. */
  readonly parked: Map<string, Continuation>
  /** The last input request key handed out (`input-<n>`). */
  readonly inputSeq: { n: number }
  readonly paramHeaders: ParamHeaderCache
  /** `tools/list` fetches under way to learn a target's `Mcp-Param-*` annotations. */
  readonly paramFetches: Map<string, Promise<void>>
  /**
   * A server MUST check on every task-related request that the caller may access the task (SEP-2663,
   * Security Implications, "Auth binding"); the upstream sees no subjects (one pooled HTTP upstream
   * serves all), so the id the client sees is the task sealed to the subject whose call created it,
   * and tasks/* are answered only for an id that opens for the caller (never probed upstream).
   * The per-subject count lives in shared state, so it holds across workers and replicas.
   */
  readonly tasks: { readonly seal: TaskSeal; readonly slots: SharedState; readonly max: number }
  /** Mints the `requestState` of a parked call: an owner id with peers (ModernOptions.cluster); alone, undefined (192 random bits). */
  readonly mintState: (() => string) | undefined
}

export function createModernContext(opts: ModernOptions): ModernContext {
  const cluster = opts.cluster ?? createMcpCluster()
  const namespace = new TargetNamespace(opts.targets, opts.checkers)
  return {
    opts,
    pool: opts.pool,
    checkers: opts.checkers,
    log: opts.log,
    namespace,
    multi: namespace.multi,
    maxInputs: opts.maxInputsPerRound ?? 16,
    eras: new TargetEras(opts.pool, opts.log),
    listens: new Set(),
    parked: new Map(),
    inputSeq: { n: 0 },
    paramHeaders: new ParamHeaderCache(),
    paramFetches: new Map(),
    tasks: { seal: createTaskSeal(cluster.secret), slots: cluster.shared, max: opts.maxTasks ?? 100 },
    mintState: cluster.newSessionId,
  }
}
