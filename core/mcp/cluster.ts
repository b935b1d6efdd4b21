/**
 * The only door from MCP to core/cluster: what the /mcp endpoint and its
 * handlers need of the deployment's other processes, as one object. The
 * session-era registry counts per-subject sessions in `shared`; a request for
 * another process's session (or a retry of a call parked there) goes to its
 * owner through `relay`; ids handed to clients are minted and sealed so that
 * any process can trust them back (session owner ids, passthrough session
 * ids, task ids). Alone (no `cluster`, no `workers`) the same object stands
 * for one process: memory state, no relay, random ids, a per-process seal.
 *
 * The composition root builds it from core/cluster parts (core/gateway.ts);
 * everything under core/mcp/ imports what it needs of core/cluster from here,
 * never from core/cluster itself.
 */
import type { ClusterForward } from '../cluster/forward.ts'
import { createMemoryState, type SharedState } from '../cluster/shared-state.ts'

export type { SharedState }

/** What the /mcp endpoint asks of the relay: whose session (or parked call) an id names, and sending a request there. */
export type McpRelay = Pick<ClusterForward, 'remoteOwner' | 'forward'>
// The sealing primitives, for the MCP ids sealed with a key of their own (upstreams/task-seal.ts).
export { seal, sealKey, unseal } from '../cluster/seal.ts'

/**
 * Passthrough sessions sealed into their ids: the id carries the upstream
 * session id, bound to the target and the caller's key (its subject, or
 * without a token its client address), so every replica and worker serves it.
 */
export interface SealedSessions {
  seal(subjectKey: string, upstreamId: string): string | undefined
  open(subjectKey: string, id: string): string | undefined
}

export interface McpCluster {
  /** This process's slot among `workers` (1..N); undefined when it is no worker. Nothing routes on it. */
  readonly workerSlot: number | undefined
  /**
   * Where per-subject session caps and task slots are counted: this process's
   * memory alone, the primary's store for a worker, Redis with `cluster.redis`.
   */
  readonly shared: SharedState
  /** How long a cap slot outlives a process that stopped renewing it (Infinity in this process's memory). */
  readonly leaseMs: number
  /**
   * With `cluster` or `workers`: session ids name their owner, and a request
   * for another process's session (or parked call) is relayed to it.
   * Undefined when the process serves alone.
   */
  readonly relay: McpRelay | undefined
  /**
   * A new session id (or `requestState` of a parked call) naming this process
   * as its owner (core/cluster/forward.ts); undefined alone (callers then draw random ids).
   */
  readonly newSessionId: (() => string) | undefined
  /**
   * The secret every process of the deployment shares: 2026-07-28 task ids
   * sealed under a key derived from it open in any process. Undefined alone.
   */
  readonly secret: string | undefined
  /** With a relay: passthrough session ids of `target` that carry the upstream session; else undefined. */
  sealedSessions(target: string): SealedSessions | undefined
  /** Releases the relay's connections. */
  close(): void
}

/** The core/cluster parts an McpCluster is made of (none: one process alone). */
export interface McpClusterParts {
  readonly workerSlot?: number
  readonly shared?: SharedState
  readonly leaseMs?: number
  readonly relay?: ClusterForward
  readonly secret?: string
}

export function createMcpCluster(parts: McpClusterParts = {}): McpCluster {
  const relay = parts.relay
  return {
    workerSlot: parts.workerSlot,
    shared: parts.shared ?? createMemoryState(),
    leaseMs: parts.leaseMs ?? Number.POSITIVE_INFINITY,
    relay,
    newSessionId: relay?.newSessionId,
    secret: relay === undefined ? undefined : parts.secret,
    sealedSessions(target) {
      if (relay === undefined) return undefined
      return {
        seal: (subjectKey, upstreamId) => relay.sealUpstream(target, subjectKey, upstreamId),
        open: (subjectKey, id) => relay.openUpstream(target, subjectKey, id),
      }
    },
    close() {
      relay?.close()
    },
  }
}
