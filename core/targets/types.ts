/**
 * The contract between the MCP layer (core/mcp/: legacy sessions, pools,
 * 2026-07-28 requests) and the upstream connectors (stdio children, remote
 * streamable-HTTP servers), and what a connector reports of its lifecycle
 * (UpstreamObserver, kept per target by lifecycle.ts). An Upstream carries
 * whole JSON-RPC messages both ways; it knows nothing of sessions, prefixes
 * or authentication.
 */

import type { JsonRpcId, JsonRpcMessage } from '../jsonrpc.ts'

// The message types are the engine's (core/jsonrpc.ts); re-exported here because every upstream speaks them.
export type { JsonRpcId, JsonRpcMessage }

export interface UpstreamInfo {
  /** Target name from the config. */
  readonly target: string
  readonly kind: 'stdio' | 'http'
  /** Child pid (stdio) once started. */
  readonly pid?: number
  readonly startedAt?: number
  readonly lastError?: string
}

export interface Upstream extends UpstreamInfo {
  /**
   * Spawns the child / checks the remote is reachable. Rejects with a
   * ProxyError (MCPP_ERR_UPSTREAM) when it cannot start (e.g. ENOENT).
   */
  start(): Promise<void>
  /**
   * Sends one message. Throws ProxyError MCPP_ERR_UPSTREAM if the upstream is
   * closed. For HTTP upstreams a request's answer (and any notifications sent
   * on its stream) arrive through `onMessage` like stdio ones.
   */
  send(message: JsonRpcMessage): void
  /** Called for every message from the upstream. Set by the MCP layer before start(). */
  onMessage: (message: JsonRpcMessage) => void
  /**
   * Called once when the upstream ends for any reason (exit, crash, flood,
   * remote session gone, close()). `error` is undefined for a clean close().
   */
  onClose: (error: Error | undefined) => void
  /** Whether the upstream is running. */
  readonly alive: boolean
  /**
   * Epoch ms from which what this upstream carries is stale (`UpstreamAttachment.staleAt` of the
   * attachment it runs with); undefined or Infinity: never. Reported by the upstream that resolved
   * its attachment (the MCP layer's, core/mcp/upstreams/deferred-upstream.ts); the transports ignore it.
   */
  readonly staleAt?: number
  /**
   * HTTP only, revision 2026-07-28: POSTs one stateless request (no session
   * header) with the revision's request headers `headers` (MCP-Protocol-Version,
   * Mcp-Method, Mcp-Name, Mcp-Param-*) beside the target's static ones. Its
   * answer arrives through `onMessage`; notifications on its stream go to
   * `related` (they belong to this request, which a shared `onMessage` could
   * not tell). An error answer with an HTTP 4xx JSON-RPC body is delivered as
   * that error. stdio upstreams carry the revision over `send()` as is.
   */
  sendModern?(message: JsonRpcMessage, headers: Readonly<Record<string, string>>, related: (message: JsonRpcMessage) => void): void
  /** HTTP only: ends the request stream of a `sendModern` request (the revision's cancellation on HTTP). */
  abortModern?(id: JsonRpcId): void
  /**
   * Ends the upstream. stdio: end stdin, then SIGTERM, then SIGKILL to the
   * whole process group. HTTP: DELETE the upstream session. Idempotent.
   */
  close(): Promise<void>
}

/** What a transport reports of its own lifecycle (core/targets/lifecycle.ts keeps it per target). */
export interface UpstreamObserver {
  /** start() was called. */
  started(upstream: UpstreamInfo): void
  /**
   * The upstream failed to start or ended; `error` is undefined for a clean
   * close(). A failure may be reported twice (start rejects, then the close
   * follows): it is counted once.
   */
  ended(upstream: UpstreamInfo, error: Error | undefined): void
}

/**
 * Per-upstream additions the MCP layer hands a transport at `create()`: the
 * credential of the caller the upstream serves (core/credentials/), opaque
 * here. An upstream is never shared across callers, so these never are.
 */
export interface UpstreamAttachment {
  /**
   * HTTP: headers for each exchange (POST, GET stream, resumed GET, DELETE)
   * beside the target's static ones (after them: an attached header wins over
   * a static one; never over the transport's own, such as Mcp-Session-Id,
   * MCP-Protocol-Version or Content-Type), asked for before each exchange
   * (usually a cache hit, returned synchronously). A rejection fails that
   * exchange only: a request's with a JSON-RPC error carrying the rejection's
   * message; the upstream and its other requests go on.
   */
  readonly headers?: () => Readonly<Record<string, string>> | Promise<Readonly<Record<string, string>>>
  /** stdio: environment of the child beside the target's own `env` (fixed at spawn). */
  readonly env?: Readonly<Record<string, string>>
  /**
   * When this attachment expires, in epoch ms; undefined or Infinity: never. Only `env` can expire
   * under a running upstream (it is fixed for the child's life; `headers` are asked for before each
   * exchange), so a stdio child's attachment is the one that sets it. The transport ignores it: the
   * MCP layer gives such an upstream no new work from then on (its pool retires it and closes it
   * once its leases end).
   */
  readonly staleAt?: number
}

/**
 * Creates upstreams for one configured target. Who an upstream serves
 * (sessions, subjects, pools) is the MCP layer's business, not the transport's.
 */
export interface UpstreamFactory {
  readonly target: string
  readonly kind: 'stdio' | 'http'
  /**
   * The target's `share` setting. `subject`: sessions of one subject share
   * processes (the MCP layer then leases from its pool instead of calling
   * `create()` per session). Absent or `session`: one upstream per session.
   */
  readonly share?: 'session' | 'subject'
  /** With `share: subject`: processes per (target, subject). */
  readonly processesPerSubject?: number
  /**
   * The target's `protocol` setting: `auto` (default) asks the upstream with
   * `server/discover` whether it speaks 2026-07-28; `2026-07-28` or `session`
   * say so without asking.
   */
  readonly protocol?: 'auto' | '2026-07-28' | 'session'
  /** A new upstream; `attach`: what it carries for the one caller it serves (none: the target's static config only). */
  create(attach?: UpstreamAttachment): Upstream
}
