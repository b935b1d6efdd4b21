/**
 * Redeemed authorization codes, remembered until they expire so that a code
 * is single-use (RFC 6749 §4.1.2, §10.5). In memory per replica by default;
 * with `facade.redis.url`, one `SET key 1 NX PX ttl` in Redis makes a code
 * single-use across replicas. Redis is spoken directly (RESP2, one command
 * at a time per connection): the facade needs this one command only.
 * Fails closed: when Redis cannot answer, the code is refused (503), never
 * accepted twice.
 */
import { createConnection, type Socket } from 'node:net'
import type { ProxyError } from '../../core/plugin-api.ts'
import { CodeStoreUnavailable } from './errors.ts'

export interface UsedCodes {
  /** Records `id` as redeemed until `exp` (seconds); false when it already was. */
  markUsed(id: string, exp: number): Promise<boolean>
  readonly size: number
  close(): void
}

function unavailable(message: string): ProxyError {
  return CodeStoreUnavailable(message)
}

export class MemoryUsedCodes implements UsedCodes {
  readonly #max: number
  readonly #codes = new Map<string, number>()
  constructor(max: number) {
    this.#max = max
  }
  get size(): number {
    return this.#codes.size
  }
  async markUsed(id: string, exp: number): Promise<boolean> {
    const now = Date.now() / 1000
    if (this.#codes.size >= this.#max) {
      for (const [k, e] of this.#codes) if (e < now) this.#codes.delete(k)
      if (this.#codes.size >= this.#max) throw unavailable('too many codes in flight; retry later')
    }
    if (this.#codes.has(id)) return false
    this.#codes.set(id, exp)
    return true
  }
  close(): void {
    this.#codes.clear()
  }
}

/** What SharedUsedCodes needs of the gateway's shared state (`env.shared`, Redis with `cluster.redis.url`). */
export interface PutOnceStore {
  putOnce(key: string, value: string, ttlMs: number): Promise<boolean>
}

/**
 * Redeemed codes in the cluster's shared state: one atomic put-if-absent per
 * code, so a code is single-use across replicas. Redis down: the store throws
 * its 503 and the code is refused, never accepted unchecked.
 */
export class SharedUsedCodes implements UsedCodes {
  readonly #store: PutOnceStore
  size = 0
  constructor(store: PutOnceStore) {
    this.#store = store
  }
  async markUsed(id: string, exp: number): Promise<boolean> {
    const ttlMs = Math.max(1000, Math.ceil(exp * 1000 - Date.now()))
    try {
      return await this.#store.putOnce(`facade:code:${id}`, '1', ttlMs)
    } catch {
      // Answered as the facade's own code (503 temporarily_unavailable on the token endpoint).
      throw unavailable('the shared state (Redis) cannot record the code; retry later')
    }
  }
  close(): void {}
}

interface Pending {
  resolve: (v: string | null) => void
  reject: (e: Error) => void
  timer: NodeJS.Timeout
}

/** RESP2 encoding of one command. */
export function encodeCommand(args: readonly string[]): string {
  return `*${args.length}\r\n` + args.map(a => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')
}

export class RedisUsedCodes implements UsedCodes {
  readonly #url: URL
  readonly #timeoutMs: number
  readonly #prefix: string
  #socket: Socket | undefined
  #ready: Promise<void> | undefined
  #buf = ''
  readonly #pending: Pending[] = []
  #closed = false
  size = 0

  constructor(url: string, timeoutMs: number, prefix = 'mcp-proxy:facade:code:') {
    this.#url = new URL(url)
    if (this.#url.protocol !== 'redis:') throw new Error('only redis:// URLs are supported')
    this.#timeoutMs = timeoutMs
    this.#prefix = prefix
  }

  #fail(err: Error): void {
    for (const p of this.#pending.splice(0)) {
      clearTimeout(p.timer)
      p.reject(err)
    }
    this.#socket?.destroy()
    this.#socket = undefined
    this.#ready = undefined
    this.#buf = ''
  }

  /** Parses as many complete replies as the buffer holds (simple strings, errors, integers, bulk strings). */
  #onData(chunk: string): void {
    this.#buf += chunk
    for (;;) {
      const end = this.#buf.indexOf('\r\n')
      if (end < 0) return
      const type = this.#buf[0]
      const line = this.#buf.slice(1, end)
      let value: string | null
      let used = end + 2
      if (type === '$') {
        const n = Number(line)
        if (n < 0) value = null
        else {
          if (this.#buf.length < used + n + 2) return
          value = this.#buf.slice(used, used + n)
          used += n + 2
        }
      } else if (type === '+' || type === ':') {
        value = line
      } else if (type === '-') {
        this.#buf = this.#buf.slice(used)
        const p = this.#pending.shift()
        if (p !== undefined) {
          clearTimeout(p.timer)
          p.reject(new Error(`redis: ${line}`))
        }
        continue
      } else {
        this.#fail(new Error('redis: unexpected reply'))
        return
      }
      this.#buf = this.#buf.slice(used)
      const p = this.#pending.shift()
      if (p !== undefined) {
        clearTimeout(p.timer)
        p.resolve(value)
      }
    }
  }

  #connect(): Promise<void> {
    this.#ready ??= new Promise<void>((resolve, reject) => {
      const s = createConnection({ host: this.#url.hostname.replace(/^\[|\]$/g, ''), port: Number(this.#url.port || 6379) })
      this.#socket = s
      s.setEncoding('utf8')
      s.setNoDelay(true)
      s.on('data', (d: string) => this.#onData(d))
      s.on('error', err => {
        this.#fail(err)
        reject(err)
      })
      s.on('close', () => {
        if (this.#socket === s) this.#fail(new Error('redis: connection closed'))
      })
      s.once('connect', () => {
        const setup: Array<Promise<unknown>> = []
        if (this.#url.password !== '') {
          const user = decodeURIComponent(this.#url.username)
          setup.push(this.#send(user !== '' ? ['AUTH', user, decodeURIComponent(this.#url.password)] : ['AUTH', decodeURIComponent(this.#url.password)]))
        }
        const db = this.#url.pathname.replace(/^\//, '')
        if (db !== '') setup.push(this.#send(['SELECT', db]))
        Promise.all(setup).then(() => resolve(), reject)
      })
    })
    return this.#ready
  }

  #send(args: readonly string[]): Promise<string | null> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => this.#fail(new Error('redis: timed out')), this.#timeoutMs)
      this.#pending.push({ resolve, reject, timer })
      this.#socket!.write(encodeCommand(args))
    })
  }

  async markUsed(id: string, exp: number): Promise<boolean> {
    if (this.#closed) throw unavailable('shutting down')
    const ttlMs = Math.max(1000, Math.ceil(exp * 1000 - Date.now()) + 1000)
    try {
      await this.#connect()
      const reply = await this.#send(['SET', this.#prefix + id, '1', 'NX', 'PX', String(ttlMs)])
      return reply === 'OK'
    } catch (err) {
      throw unavailable(`the store of used codes is unavailable (${(err as Error).message}); retry later`)
    }
  }

  close(): void {
    this.#closed = true
    this.#fail(new Error('closed'))
  }
}
