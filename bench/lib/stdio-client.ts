/**
 * The per-message floor: an in-process client speaking newline-delimited
 * JSON-RPC straight to a stdio MCP server (no HTTP, no sessions, no SSE).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { freshId, PROTOCOL_VERSION } from './http-client.ts'

export class StdioClient {
  readonly child: ChildProcess
  readonly #pending = new Map<number, { resolve: (m: Record<string, unknown>) => void; reject: (e: Error) => void }>()
  #buf = ''

  constructor(cmd: string, args: readonly string[]) {
    this.child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'ignore'] })
    this.child.stdout!.setEncoding('utf8')
    this.child.stdout!.on('data', (d: string) => {
      this.#buf += d
      let nl: number
      while ((nl = this.#buf.indexOf('\n')) >= 0) {
        const line = this.#buf.slice(0, nl)
        this.#buf = this.#buf.slice(nl + 1)
        if (line.trim() === '') continue
        const m = JSON.parse(line) as Record<string, unknown>
        const p = typeof m.id === 'number' && m.method === undefined ? this.#pending.get(m.id) : undefined
        if (p === undefined) continue
        this.#pending.delete(m.id as number)
        p.resolve(m)
      }
    })
    this.child.once('exit', () => {
      for (const p of this.#pending.values()) p.reject(new Error('stdio server exited'))
      this.#pending.clear()
    })
  }

  request(method: string, params: unknown): Promise<Record<string, unknown>> {
    const id = freshId()
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject })
      this.child.stdin!.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n')
    })
  }

  async initialize(): Promise<void> {
    await this.request('initialize', { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'mcp-proxy-bench', version: '1' } })
    this.child.stdin!.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) + '\n')
  }

  async echo(): Promise<void> {
    const m = await this.request('tools/call', { name: 'echo', arguments: { message: 'm' } })
    if (m.result === undefined) throw new Error(`stdio echo failed: ${JSON.stringify(m).slice(0, 200)}`)
  }

  close(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return Promise.resolve()
    return new Promise(resolve => {
      this.child.once('exit', () => resolve())
      this.child.stdin!.end()
      setTimeout(() => this.child.kill('SIGKILL'), 2000).unref()
    })
  }
}
