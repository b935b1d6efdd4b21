/**
 * One target's upstream within a session-era session, and the upstream calls in flight on it:
 * each under an id unique on the link (calls.ts), answered by `done`, cancelled past its deadline
 * (one shared timer: `Session.expireCalls`), by the client, or failed when the upstream closes.
 * Also the shapes session.ts routes with: a client request in flight and the upstream calls made
 * for it.
 */
import type { Logger } from 'pino'
import type { JsonRpcId, JsonRpcMessage, Upstream } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { rpcError } from '../protocol.ts'
import type { TargetCallMeter } from '../upstreams/call-metrics.ts'
import { UpstreamCalls } from '../upstreams/calls.ts'
import type { TargetAuth } from '../credentials.ts'
import type { PostStream } from './session-streams.ts'

/** One upstream request in flight; `done` gets its response (or a synthesized error). */
export interface UpstreamCall {
  readonly link: SessionLink
  readonly id: number
  readonly done: (msg: JsonRpcMessage) => void
  /** Epoch ms after which the call is cancelled (`Session.expireCalls`). */
  readonly deadline: number
}

/** One client request awaiting its answer. */
export interface Inflight {
  readonly clientId: JsonRpcId
  readonly post: PostStream
  readonly progressToken: unknown
  readonly calls: UpstreamCall[]
  link: SessionLink | undefined
  finished: boolean
}

export class SessionLink {
  readonly target: string
  readonly upstream: Upstream
  /** The target's credential source (../credentials.ts); undefined for a target without `auth`. */
  readonly auth: TargetAuth | undefined
  up = false
  /** Left out at initialize because the caller's credential was refused: revived by a request that reaches it (session.ts). */
  refused = false
  /** A revival in flight (one per link, whatever the number of requests waiting for it). */
  revival: Promise<void> | undefined
  readonly pending: UpstreamCalls<UpstreamCall>
  /** Client requests currently forwarded to this link, oldest first. */
  readonly active = new Set<Inflight>()
  initResult: Record<string, unknown> | undefined
  readonly #log: Logger

  constructor(target: string, upstream: Upstream, log: Logger, meter: TargetCallMeter | undefined, auth?: TargetAuth) {
    this.target = target
    this.upstream = upstream
    this.auth = auth
    this.#log = log
    this.pending = new UpstreamCalls(meter)
  }

  /** Sends `msg` under a fresh upstream id; undefined (and `done` with an error) when the upstream is closed. */
  send(msg: JsonRpcMessage, done: (r: JsonRpcMessage) => void, timeoutMs: number): UpstreamCall | undefined {
    const id = this.pending.nextId()
    msg.id = id
    const call: UpstreamCall = { link: this, id, done, deadline: Date.now() + timeoutMs }
    this.pending.add(call, msg)
    try {
      this.upstream.send(msg)
    } catch {
      this.pending.remove(call)
      done(rpcError(RPC.CONNECTION_CLOSED, `upstream ${this.target} closed`))
      return undefined
    }
    return call
  }

  /** Fire-and-forget send: a closed upstream reports itself through onClose. */
  sendQuietly(msg: JsonRpcMessage): void {
    if (!this.up) return
    try {
      this.upstream.send(msg)
    } catch (err) {
      this.#log.debug({ target: this.target, err: (err as Error).message }, 'send to a closed upstream')
    }
  }

  /** `reason` absent: none is sent (it is optional, MCP 2025-11-25 utilities, Cancellation). */
  cancel(id: number, reason: string | undefined): void {
    this.sendQuietly({ jsonrpc: '2.0', method: 'notifications/cancelled', params: reason === undefined ? { requestId: id } : { requestId: id, reason } })
  }

  /** Cancels the calls past their deadline; each gets a timeout error. */
  expire(now: number): void {
    if (this.pending.size === 0) return
    for (const call of this.pending.values()) {
      if (call.deadline > now || !this.pending.remove(call)) continue
      this.cancel(call.id, 'request timed out')
      call.done(rpcError(RPC.REQUEST_TIMEOUT, 'Request timed out'))
    }
  }

  /** Every call in flight gets a connection-closed error. */
  failPending(message: string): void {
    for (const call of this.pending.drain()) {
      call.done(rpcError(RPC.CONNECTION_CLOSED, message))
    }
  }
}
