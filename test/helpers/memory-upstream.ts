/**
 * An in-process session-era MCP server behind the `Upstream` contract, for
 * unit tests of the MCP layer (session.ts, modern-pool.ts, modern.ts,
 * endpoint.ts) that need to see exactly what reaches an upstream. The
 * end-to-end files use real servers (server-everything, the fixtures).
 *
 * Tools: `echo` (answers `args.message`), `hang` (never answers), `progress`
 * (one progress notification, then the answer), `ask` (a sampling request
 * to the client first, then its answer as text), `ask2` (a sampling and an
 * elicitation request at once, then both answers as text; not listed). `tools/list` comes in two
 * pages. `resources/read` answers any URI with its own contents.
 */
import type { JsonRpcMessage, Upstream, UpstreamAttachment, UpstreamFactory } from '../../core/targets/types.ts'

export interface MemoryServer {
  /** Every message the upstream received, in order (copies). */
  readonly received: JsonRpcMessage[]
  /** Upstreams created so far. */
  readonly created: MemoryUpstream[]
}

export class MemoryUpstream implements Upstream {
  readonly target: string
  readonly kind = 'stdio' as const
  readonly pid: number
  /** What the MCP layer attached at create() (a caller's credential), if anything. */
  readonly attach: UpstreamAttachment | undefined
  startedAt: number | undefined
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}
  alive = false
  readonly #server: MemoryServer
  /** Pending `ask` calls: server-request id -> the tools/call id to answer. */
  readonly #asks = new Map<number | string, number | string>()
  /** `ask2` calls: the tools/call id -> the answers so far (two expected). */
  readonly #rounds = new Map<number | string, unknown[]>()
  #serverSeq = 0

  constructor(target: string, server: MemoryServer, pid: number, attach?: UpstreamAttachment) {
    this.target = target
    this.attach = attach
    this.#server = server
    this.pid = pid
  }

  async start(): Promise<void> {
    this.alive = true
    this.startedAt = Date.now()
  }

  send(msg: JsonRpcMessage): void {
    if (!this.alive) throw new Error('closed')
    this.#server.received.push(structuredClone(msg))
    queueMicrotask(() => this.#handle(msg))
  }

  /** Sends a message of the upstream's own to the gateway. */
  emit(msg: JsonRpcMessage): void {
    if (this.alive) this.onMessage(msg)
  }

  /** Ends as a crashed server would. */
  crash(): void {
    if (!this.alive) return
    this.alive = false
    this.onClose(new Error('crashed'))
  }

  async close(): Promise<void> {
    if (!this.alive) return
    this.alive = false
    this.onClose(undefined)
  }

  #answer(id: JsonRpcMessage['id'], result: unknown): void {
    this.emit({ jsonrpc: '2.0', id: id!, result })
  }

  #handle(msg: JsonRpcMessage): void {
    if (!this.alive) return
    if (msg.method === undefined) {
      const callId = msg.id === undefined || msg.id === null ? undefined : this.#asks.get(msg.id)
      if (callId !== undefined) {
        this.#asks.delete(msg.id!)
        const round = this.#rounds.get(callId)
        if (round === undefined) {
          this.#answer(callId, { content: [{ type: 'text', text: `answered: ${JSON.stringify(msg.result ?? msg.error)}` }] })
          return
        }
        round.push(msg.result ?? msg.error)
        if (round.length < 2) return
        this.#rounds.delete(callId)
        this.#answer(callId, { content: [{ type: 'text', text: `answered: ${JSON.stringify(round)}` }] })
      }
      return
    }
    if (msg.id === undefined || msg.id === null) return
    const params = msg.params ?? {}
    switch (msg.method) {
      case 'initialize':
        return this.#answer(msg.id, {
          protocolVersion: params.protocolVersion,
          capabilities: { tools: { listChanged: true }, resources: { subscribe: true }, logging: {} },
          serverInfo: { name: `memory-${this.target}`, version: '1.0.0' },
          instructions: `instructions of ${this.target}`,
        })
      case 'ping':
      case 'logging/setLevel':
      case 'resources/subscribe':
      case 'resources/unsubscribe':
        return this.#answer(msg.id, {})
      case 'tools/list':
        return params.cursor === undefined
          ? this.#answer(msg.id, {
              tools: [
                { name: 'echo', inputSchema: { type: 'object' } },
                { name: 'hang', inputSchema: { type: 'object' } },
              ],
              nextCursor: 'page2',
            })
          : this.#answer(msg.id, {
              tools: [
                { name: 'progress', inputSchema: { type: 'object' } },
                { name: 'ask', inputSchema: { type: 'object' } },
              ],
            })
      case 'resources/read':
        return this.#answer(msg.id, { contents: [{ uri: params.uri, text: `contents of ${String(params.uri)}` }] })
      case 'tools/call': {
        const args = (params.arguments ?? {}) as Record<string, unknown>
        switch (params.name) {
          case 'echo':
            return this.#answer(msg.id, { content: [{ type: 'text', text: String(args.message ?? '') }] })
          case 'hang':
            return
          case 'progress': {
            const token = (params._meta as Record<string, unknown> | undefined)?.progressToken
            if (token !== undefined) this.emit({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: token, progress: 1, total: 2 } })
            return this.#answer(msg.id, { content: [{ type: 'text', text: 'done' }] })
          }
          case 'ask': {
            const sid = `srv-${++this.#serverSeq}`
            this.#asks.set(sid, msg.id)
            // As SDK servers do for a request's own server requests: the call's progress token goes along.
            const token = (params._meta as Record<string, unknown> | undefined)?.progressToken
            return this.emit({
              jsonrpc: '2.0',
              id: sid,
              method: 'sampling/createMessage',
              params: { messages: [], maxTokens: 1, ...(token === undefined ? {} : { _meta: { progressToken: token } }) },
            })
          }
          case 'ask2': {
            const a = `srv-${++this.#serverSeq}`
            const b = `srv-${++this.#serverSeq}`
            this.#asks.set(a, msg.id)
            this.#asks.set(b, msg.id)
            this.#rounds.set(msg.id, [])
            this.emit({ jsonrpc: '2.0', id: a, method: 'sampling/createMessage', params: { messages: [], maxTokens: 1 } })
            return this.emit({
              jsonrpc: '2.0',
              id: b,
              method: 'elicitation/create',
              params: { message: 'name?', requestedSchema: { type: 'object', properties: {} } },
            })
          }
          default:
            return this.emit({ jsonrpc: '2.0', id: msg.id, error: { code: -32602, message: `Unknown tool: ${String(params.name)}` } })
        }
      }
      default:
        return this.emit({ jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: `Method not found: ${msg.method}` } })
    }
  }
}

let pids = 1_000_000

/** A factory of in-memory upstreams for `target`, and what they received. */
export function memoryFactory(target: string, extra: Partial<UpstreamFactory> = {}): UpstreamFactory & { server: MemoryServer } {
  const server: MemoryServer = { received: [], created: [] }
  return {
    target,
    kind: 'stdio',
    ...extra,
    server,
    create(attach?: UpstreamAttachment): Upstream {
      const up = new MemoryUpstream(target, server, ++pids, attach)
      server.created.push(up)
      return up
    },
  }
}
