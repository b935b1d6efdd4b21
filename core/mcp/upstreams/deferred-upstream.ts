/**
 * An upstream created only once what it carries is known: a stdio child's environment is fixed at
 * its spawn, and a caller's environment (core/mcp/credentials.ts) may have to be resolved first (a
 * token exchange). Speaks the plain `Upstream` contract, so a session or a pool holds it from the
 * start like any other; `start()` resolves the attachment, creates the real upstream and starts it,
 * and rejects with the attachment's refusal as it is. It reports when that attachment goes stale
 * (`staleAt`), which the pool reads to retire it (pool.ts).
 */
import { ProxyError, RPC } from '../../errors.ts'
import type { JsonRpcMessage, Upstream, UpstreamAttachment, UpstreamFactory } from '../../targets/types.ts'

export class DeferredUpstream implements Upstream {
  readonly target: string
  readonly kind: 'stdio' | 'http'
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}
  readonly #factory: UpstreamFactory
  readonly #attachment: () => Promise<UpstreamAttachment>
  #inner: Upstream | undefined
  #staleAt: number | undefined
  #started = false
  #closed = false

  constructor(factory: UpstreamFactory, attachment: () => Promise<UpstreamAttachment>) {
    this.target = factory.target
    this.kind = factory.kind
    this.#factory = factory
    this.#attachment = attachment
  }

  get pid(): number | undefined {
    return this.#inner?.pid
  }
  get startedAt(): number | undefined {
    return this.#inner?.startedAt
  }
  get lastError(): string | undefined {
    return this.#inner?.lastError
  }
  get alive(): boolean {
    return this.#inner?.alive === true
  }
  /** The resolved attachment's `staleAt`: undefined until it is resolved, and for one that never goes stale. */
  get staleAt(): number | undefined {
    return this.#staleAt
  }

  async start(): Promise<void> {
    if (this.#started || this.#closed) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`, { rpcCode: RPC.SERVER_ERROR })
    this.#started = true
    const attach = await this.#attachment()
    if (this.#closed) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} closed before it started`, { rpcCode: RPC.SERVER_ERROR })
    this.#staleAt = attach.staleAt
    const inner = this.#factory.create(attach)
    inner.onMessage = m => this.onMessage(m)
    inner.onClose = err => this.onClose(err)
    this.#inner = inner
    await inner.start()
  }

  send(message: JsonRpcMessage): void {
    if (this.#inner === undefined) throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`, { rpcCode: RPC.CONNECTION_CLOSED })
    this.#inner.send(message)
  }

  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    // Never created (closed before, or refused at, its start): it ends here, as the contract says, once.
    if (this.#inner === undefined) this.onClose(undefined)
    else await this.#inner.close()
  }
}
