/**
 * subscriptions/listen (MCP 2026-07-28 Subscriptions): one stream that holds an upstream per target
 * for its life. Session-era upstreams are listened to here (their list changes, and the resources
 * subscribed on them); native ones hold a subscriptions/listen of their own, given the part of the
 * filter that is theirs. The opted-in change notifications are relayed tagged with the
 * subscription id (the listen request's id); an upstream that ends ends the stream.
 */
import type { JsonRpcMessage } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { SseStream, SSE_HEADERS } from '../sse.ts'
import { KEEPALIVE_MS, META, MODERN_REVISION } from '../protocol.ts'
import type { PoolCall, PooledUpstream } from '../upstreams/pool.ts'
import type { ModernContext } from './context.ts'
import type { ModernRequest } from './request.ts'
import { lease } from './upstream-call.ts'
import { refusalAmong } from '../credentials.ts'

interface Wanted {
  toolsListChanged?: unknown
  promptsListChanged?: unknown
  resourcesListChanged?: unknown
  resourceSubscriptions?: unknown
}

const LIST_FLAGS = ['toolsListChanged', 'promptsListChanged', 'resourcesListChanged'] as const

/** The opt-in flag of a list-change notification. */
function listFlagOf(method: string | undefined): string | undefined {
  switch (method) {
    case 'notifications/tools/list_changed':
      return 'toolsListChanged'
    case 'notifications/prompts/list_changed':
      return 'promptsListChanged'
    case 'notifications/resources/list_changed':
      return 'resourcesListChanged'
  }
  return undefined
}

function capOf(e: PooledUpstream, kind: string, flag: string): boolean {
  const c = (e.initResult?.capabilities as Record<string, Record<string, unknown> | undefined> | undefined)?.[kind]
  return c?.[flag] === true
}

export async function listen(cx: ModernContext, ex: ModernRequest, params: Record<string, unknown>): Promise<void> {
  const all: PooledUpstream[] = []
  const parts = await Promise.allSettled(cx.opts.targets.map(f => lease(cx, ex, f)))
  for (const p of parts) if (p.status === 'fulfilled') all.push(p.value)
  if (all.length === 0) {
    // Every target left out: a refused credential among them is the answer (status and challenge).
    const refusal = refusalAmong(parts.flatMap(p => (p.status === 'rejected' ? [p.reason] : [])))
    if (refusal !== undefined) throw refusal
    await ex.fail(RPC.SERVER_ERROR, 'no upstream available', 502)
    return
  }
  await new Listen(cx, ex, (params.notifications ?? {}) as Wanted, all).open()
}

/** One listen stream and the upstreams, subscriptions and listeners it holds. */
class Listen {
  readonly #cx: ModernContext
  readonly #ex: ModernRequest
  readonly #want: Wanted
  readonly #all: readonly PooledUpstream[]
  /** Session-era upstreams, listened to here. */
  readonly #held: readonly PooledUpstream[]
  /** What the acknowledgement lists. */
  readonly #agreed: Record<string, unknown> = {}
  /** Client URIs acknowledged. */
  readonly #acked: string[] = []
  /** Held upstream -> upstream URIs subscribed there. */
  readonly #subscribed = new Map<PooledUpstream, Set<string>>()
  #natives: PoolCall[] = []
  #listeners: Array<readonly [PooledUpstream, (msg: JsonRpcMessage) => void]> = []
  #stream: SseStream | undefined
  /** Notifications that arrive between an upstream's acknowledgement and the client's. */
  readonly #early: JsonRpcMessage[] = []
  #keepAlive: NodeJS.Timeout | undefined
  #ended = false
  /** Set once the stream is open: before that, an upstream's end leaves the opening to notice. */
  #live = false
  /** Ends the stream gracefully (one identity: registered in `listens` and each upstream's `onGone`). */
  readonly shutdown = (): void => {
    if (this.#live) this.#end(true)
  }

  constructor(cx: ModernContext, ex: ModernRequest, want: Wanted, all: readonly PooledUpstream[]) {
    this.#cx = cx
    this.#ex = ex
    this.#want = want
    this.#all = all
    this.#held = all.filter(e => e.era === 'legacy')
  }

  #tag(): Record<string, unknown> {
    return { [META.subscriptionId]: this.#ex.id }
  }

  async open(): Promise<void> {
    for (const k of LIST_FLAGS) {
      const kind = k.slice(0, -'ListChanged'.length)
      if (this.#want[k] === true && this.#held.some(e => capOf(e, kind, 'listChanged'))) this.#agreed[k] = true
    }
    await this.#subscribeHeld()
    // Each native upstream gets the part of the filter that is its (its own URIs), acknowledges, then streams.
    this.#natives = await Promise.all(this.#all.filter(e => e.era === 'modern').map(e => this.#listenNative(e)))
    if (this.#acked.length > 0) this.#agreed.resourceSubscriptions = this.#acked
    const ex = this.#ex
    if (ex.aborted || ex.ctx.res.destroyed) {
      this.#release()
      return
    }
    await ex.ctx.writeHead(200, { ...SSE_HEADERS })
    const out = new SseStream(ex.ctx.res, this.#cx.opts.streams)
    this.#stream = out
    ex.stream = out
    out.send({ jsonrpc: '2.0', method: 'notifications/subscriptions/acknowledged', params: { _meta: this.#tag(), notifications: this.#agreed } })
    for (const m of this.#early.splice(0)) out.send(m)
    this.#listeners = this.#held.map(entry => {
      const fn = (msg: JsonRpcMessage): void => this.#fromHeld(entry, msg)
      entry.listeners.add(fn)
      return [entry, fn] as const
    })
    this.#keepAlive = setInterval(() => out.keepAlive(), KEEPALIVE_MS)
    this.#keepAlive.unref()
    this.#live = true
    this.#cx.listens.add(this.shutdown)
    out.onClose(() => this.#end(false))
    // An upstream that ends ends the subscription: its state (subscriptions) is gone.
    for (const entry of this.#all) entry.onGone.add(this.shutdown)
    out.onClose(() => {
      for (const entry of this.#all) entry.onGone.delete(this.shutdown)
    })
  }

  /** Subscribes the requested resources of held upstreams (counted on the upstream, shared with other holders). */
  async #subscribeHeld(): Promise<void> {
    const { namespace } = this.#cx
    if (!Array.isArray(this.#want.resourceSubscriptions)) return
    for (const uri of this.#want.resourceSubscriptions) {
      if (typeof uri !== 'string') continue
      const routed = namespace.route('resource', uri)
      const entry = 'answer' in routed ? undefined : this.#held.find(e => e.target === routed.target.target)
      if (entry === undefined || !capOf(entry, 'resources', 'subscribe')) continue
      const name = (routed as { name: string }).name
      if (!namespace.allowsWatch(this.#ex.ctx, name, entry.target)) continue
      const set = this.#subscribed.get(entry) ?? new Set<string>()
      if (set.has(name)) {
        this.#acked.push(uri)
        continue
      }
      // Counted on the upstream: another holder of the same URI keeps its subscription when this stream ends.
      const r = await entry.subscribe(name)
      if (r.error !== undefined) continue
      set.add(name)
      this.#subscribed.set(entry, set)
      this.#acked.push(uri)
    }
  }

  /** The requested URIs of `entry`'s target the caller may watch: upstream URI -> client URI. */
  #urisOf(entry: PooledUpstream): Map<string, string> | undefined {
    if (!Array.isArray(this.#want.resourceSubscriptions)) return undefined
    const uris = new Map<string, string>()
    for (const uri of this.#want.resourceSubscriptions) {
      if (typeof uri !== 'string') continue
      const routed = this.#cx.namespace.route('resource', uri)
      if ('answer' in routed || routed.target.target !== entry.target) continue
      const name = routed.name as string
      if (!this.#cx.namespace.allowsWatch(this.#ex.ctx, name, entry.target)) continue
      uris.set(name, uri)
    }
    return uris
  }

  /** A native upstream's own subscriptions/listen; resolves once it acknowledged (or ended). */
  async #listenNative(entry: PooledUpstream): Promise<PoolCall> {
    const ex = this.#ex
    const mine: Record<string, unknown> = {}
    for (const k of LIST_FLAGS) if (this.#want[k] === true) mine[k] = true
    const known = this.#urisOf(entry)
    if (known !== undefined) mine.resourceSubscriptions = [...known.keys()]
    const uris = known ?? new Map<string, string>()
    let ack!: (n: Record<string, unknown> | undefined) => void
    const acknowledged = new Promise<Record<string, unknown> | undefined>(resolve => {
      ack = resolve
    })
    const params = { _meta: { ...ex.meta }, notifications: mine }
    const call = entry.call(
      { jsonrpc: '2.0', method: 'subscriptions/listen', params },
      {
        timeoutMs: 0,
        headers: { 'mcp-protocol-version': MODERN_REVISION, 'mcp-method': 'subscriptions/listen' },
        onNotification: m => {
          const p = { ...(m.params ?? {}) } as Record<string, unknown>
          if (m.method === 'notifications/subscriptions/acknowledged') {
            ack(p.notifications as Record<string, unknown> | undefined)
            return
          }
          if (this.#ended) return
          if (m.method === 'notifications/resources/updated') {
            const uri = typeof p.uri === 'string' ? uris.get(p.uri) : undefined
            if (uri === undefined) return
            p.uri = uri
          } else {
            const flag = listFlagOf(m.method)
            if (flag === undefined || this.#agreed[flag] !== true) return
          }
          this.#relay({ jsonrpc: '2.0', method: m.method, params: { ...p, _meta: { ...((p._meta ?? {}) as Record<string, unknown>), ...this.#tag() } } })
        },
      }
    )
    // The upstream's listen ending (its graceful result, or a failure) ends the client's.
    let upstreamAcked = false
    void acknowledged.then(() => {
      upstreamAcked = true
    })
    void call.done.then(res => {
      if (!upstreamAcked && res.error !== undefined) {
        // Refused before acknowledging: the target is left out of the acknowledgement, which lists
        // only what was agreed (MCP 2026-07-28 subscriptions, "Acknowledgment"); the operator sees why.
        this.#cx.log.warn(
          { target: entry.target, code: res.error.code, err: res.error.message },
          'upstream refused subscriptions/listen; left out of the acknowledgement'
        )
      } else if (res.error !== undefined) {
        this.#cx.log.debug({ target: entry.target, err: res.error.message }, 'upstream subscriptions/listen ended')
      }
      ack(undefined)
      this.shutdown()
    })
    ex.calls.add(call)
    const got = await acknowledged
    if (got !== undefined) {
      for (const k of LIST_FLAGS) if (got[k] === true) this.#agreed[k] = true
      if (Array.isArray(got.resourceSubscriptions))
        for (const u of got.resourceSubscriptions) if (typeof u === 'string' && uris.has(u)) this.#acked.push(uris.get(u)!)
    }
    return call
  }

  #relay(m: JsonRpcMessage): void {
    if (this.#stream === undefined) this.#early.push(m)
    else this.#stream.send(m)
  }

  /** A held upstream's notification: relayed when the client opted in (its URIs as the client sees them). */
  #fromHeld(entry: PooledUpstream, msg: JsonRpcMessage): void {
    const out = this.#stream!
    if (msg.method === 'notifications/resources/updated') {
      const uri = msg.params?.uri
      if (typeof uri !== 'string' || this.#subscribed.get(entry)?.has(uri) !== true) return
      out.send({ jsonrpc: '2.0', method: msg.method, params: { ...msg.params, uri: this.#cx.namespace.clientUri(entry.target, uri), _meta: this.#tag() } })
      return
    }
    const flag = listFlagOf(msg.method)
    if (flag === undefined || this.#agreed[flag] !== true) return
    out.send({ jsonrpc: '2.0', method: msg.method, params: { ...(msg.params ?? {}), _meta: this.#tag() } })
  }

  /** Cancels the native listens, unsubscribes, releases every upstream. */
  #release(): void {
    for (const c of this.#natives) {
      this.#ex.calls.delete(c)
      c.cancel('subscription ended')
    }
    for (const [entry, uris] of this.#subscribed) for (const uri of uris) entry.unsubscribe(uri)
    this.#subscribed.clear()
    for (const e of this.#all) this.#cx.pool.release(e)
  }

  #end(graceful: boolean): void {
    if (this.#ended) return
    this.#ended = true
    this.#ex.finished = true
    this.#cx.listens.delete(this.shutdown)
    clearInterval(this.#keepAlive)
    for (const [entry, fn] of this.#listeners) entry.listeners.delete(fn)
    this.#release()
    const out = this.#stream!
    // Graceful closure: a result for the listen request, then the stream ends.
    if (graceful) out.end({ jsonrpc: '2.0', id: this.#ex.id, result: { resultType: 'complete', _meta: this.#tag() } })
    else out.end()
  }
}
