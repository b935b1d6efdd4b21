/**
 * State that replicas of one gateway must agree on: per-subject session caps,
 * rate limits and single-use codes. In this process's memory by default (one
 * replica: as before); in Redis when `cluster.redis.url` is set, so that N
 * replicas behind a balancer enforce one cap and one limit; with `workers`
 * and no Redis, in the primary process, which every worker asks over IPC.
 *
 * Each operation is one atomic step on the server (a Lua script or one
 * command), never read-then-write from here, so two replicas racing for the
 * last slot cannot both get it. Redis is reached through `@redis/client`
 * (the official client: typed, no dependencies of its own). The offline queue
 * is off and every command has a deadline: while Redis is down, callers get an
 * error at once (503 to clients, a log line) instead of requests piling up.
 */
import { createHash } from 'node:crypto'
import type { Logger } from 'pino'
import { createClient } from '@redis/client'
import { ProxyError } from '../errors.ts'

export interface SharedState {
  /** `primary`: a worker's view of its primary's memory store (`workers`, primary-store.ts). */
  readonly kind: 'memory' | 'redis' | 'primary'
  /**
   * Takes one token from the bucket `key` (`capacity` deep, refilled evenly
   * over `windowMs`): 0 when taken, else the milliseconds until one is there.
   */
  take(key: string, capacity: number, windowMs: number): Promise<number>
  /**
   * Counts `member` under `key` when fewer than `limit` members hold a live
   * lease: true when it joined. A lease lasts `leaseMs` unless renewed, so the
   * slots of a replica that died free themselves.
   */
  join(key: string, member: string, limit: number, leaseMs: number): Promise<boolean>
  /** Renews the leases of members that are still alive. */
  renew(entries: ReadonlyArray<{ key: string; member: string }>, leaseMs: number): Promise<void>
  leave(key: string, member: string): Promise<void>
  /** Stores `value` under `key` for `ttlMs` unless the key exists: true when stored. */
  putOnce(key: string, value: string, ttlMs: number): Promise<boolean>
  /** Returns the value and removes it: of all callers on every replica, one gets it. */
  takeOnce(key: string): Promise<string | undefined>
  /** Whether the store can be used now (Redis connected), for /readyz. */
  ready(): { ready: boolean; reason?: string }
  close(): Promise<void>
}

export interface RedisStateOptions {
  readonly url: string
  readonly keyPrefix: string
  readonly log: Logger
  /** Deadline of one command. Default 2000 ms. */
  readonly commandTimeoutMs?: number
}

/** Keys of the memory store at once (buckets, cap sets, codes each); the least recently touched go first. */
const MEMORY_MAX_KEYS = 100_000

function unavailable(cause: unknown): ProxyError {
  return new ProxyError('MCPP_ERR_SHARED_STATE', 503, 'Service Unavailable: shared state (Redis) is unreachable', {
    cause,
    headers: { 'retry-after': '1' },
    expose: true,
  })
}

/** Keys name subjects and client addresses: hashed, so Redis holds no identity and keys stay short. */
function hashed(key: string): string {
  return createHash('sha256').update(key).digest('base64url').slice(0, 27)
}

function touch<K, V>(map: Map<K, V>, key: K, value: V): void {
  map.delete(key)
  map.set(key, value)
  if (map.size > MEMORY_MAX_KEYS) map.delete(map.keys().next().value!)
}

export function createMemoryState(now: () => number = () => performance.now()): SharedState {
  const buckets = new Map<string, { tokens: number; at: number }>()
  const sets = new Map<string, Map<string, number>>()
  const once = new Map<string, { value: string; until: number }>()
  return {
    kind: 'memory',
    async take(key, capacity, windowMs) {
      const t = now()
      const rate = capacity / windowMs
      const b = buckets.get(key) ?? { tokens: capacity, at: t }
      b.tokens = Math.min(capacity, b.tokens + (t - b.at) * rate)
      b.at = t
      touch(buckets, key, b)
      if (b.tokens >= 1) {
        b.tokens -= 1
        return 0
      }
      return Math.ceil((1 - b.tokens) / rate)
    },
    async join(key, member, limit, leaseMs) {
      const t = now()
      const members = sets.get(key) ?? new Map<string, number>()
      for (const [m, until] of members) if (until <= t) members.delete(m)
      if (members.size >= limit && !members.has(member)) return false
      members.set(member, t + leaseMs)
      touch(sets, key, members)
      return true
    },
    async renew(entries, leaseMs) {
      const until = now() + leaseMs
      for (const { key, member } of entries) {
        const members = sets.get(key)
        if (members?.has(member) === true) members.set(member, until)
      }
    },
    async leave(key, member) {
      const members = sets.get(key)
      if (members === undefined) return
      members.delete(member)
      if (members.size === 0) sets.delete(key)
    },
    async putOnce(key, value, ttlMs) {
      const t = now()
      const held = once.get(key)
      if (held !== undefined && held.until > t) return false
      touch(once, key, { value, until: t + ttlMs })
      return true
    },
    async takeOnce(key) {
      const held = once.get(key)
      once.delete(key)
      return held !== undefined && held.until > now() ? held.value : undefined
    },
    ready() {
      return { ready: true }
    },
    async close() {
      buckets.clear()
      sets.clear()
      once.clear()
    },
  }
}

// Token bucket in one step. Time from the server (TIME), so replicas with skewed clocks agree.
const TAKE = `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'n', 'at')
local n = tonumber(b[1]) or cap
local at = tonumber(b[2]) or now
n = math.min(cap, n + (now - at) * rate)
local wait = 0
if n >= 1 then n = n - 1 else wait = math.ceil((1 - n) / rate) end
redis.call('HSET', KEYS[1], 'n', tostring(n), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 1000)
return wait
`

// A capped set of leases: members scored by the end of their lease; expired ones drop out first.
const JOIN = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
`

const RENEW = `
local t = redis.call('TIME')
local until_ = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', until_, ARGV[i + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
end
return 1
`

export async function createRedisState(o: RedisStateOptions): Promise<SharedState> {
  const { log } = o
  const timeoutMs = o.commandTimeoutMs ?? 2000
  let lastError: string | undefined
  let loggedDown = false
  const client = createClient({
    url: o.url,
    // Without this, commands issued while disconnected wait for the reconnect; requests would pile up behind them.
    disableOfflineQueue: true,
    socket: {
      connectTimeout: timeoutMs,
      reconnectStrategy: retries => Math.min(100 * 2 ** Math.min(retries, 5), 3000),
    },
  })
  client.on('error', (err: Error) => {
    lastError = err.message
    // One line per outage, not one per reconnect attempt. The URL may hold a password: never logged.
    if (!loggedDown) log.error({ err: { message: err.message } }, 'shared state: Redis unreachable')
    loggedDown = true
  })
  client.on('ready', () => {
    if (loggedDown) log.info('shared state: Redis reachable again')
    loggedDown = false
    lastError = undefined
  })
  // Start-up does not wait for Redis: /readyz says why it is not ready until it connects.
  client.connect().catch(() => {})

  const k = (kind: string, key: string): string => `${o.keyPrefix}${kind}:${hashed(key)}`

  async function run<T>(what: () => Promise<T>): Promise<T> {
    if (!client.isReady) throw unavailable(new Error(lastError ?? 'not connected'))
    let timer: NodeJS.Timeout | undefined
    try {
      return await Promise.race([
        what(),
        new Promise<never>((_resolve, reject) => {
          timer = setTimeout(() => reject(new Error(`Redis command took over ${timeoutMs} ms`)), timeoutMs)
        }),
      ])
    } catch (err) {
      if (ProxyError.is(err)) throw err
      throw unavailable(err)
    } finally {
      clearTimeout(timer)
    }
  }

  return {
    kind: 'redis',
    take(key, capacity, windowMs) {
      return run(async () => Number(await client.eval(TAKE, { keys: [k('rate', key)], arguments: [String(capacity), String(capacity / windowMs)] })))
    },
    join(key, member, limit, leaseMs) {
      return run(async () => Number(await client.eval(JOIN, { keys: [k('cap', key)], arguments: [hashed(member), String(limit), String(leaseMs)] })) === 1)
    },
    async renew(entries, leaseMs) {
      if (entries.length === 0) return
      await run(() => client.eval(RENEW, { keys: entries.map(e => k('cap', e.key)), arguments: [String(leaseMs), ...entries.map(e => hashed(e.member))] }))
    },
    async leave(key, member) {
      await run(() => client.zRem(k('cap', key), hashed(member)))
    },
    putOnce(key, value, ttlMs) {
      return run(async () => (await client.set(k('once', key), value, { condition: 'NX', expiration: { type: 'PX', value: ttlMs } })) === 'OK')
    },
    takeOnce(key) {
      return run(async () => (await client.getDel(k('once', key))) ?? undefined)
    },
    ready() {
      return client.isReady ? { ready: true } : { ready: false, reason: `Redis not connected${lastError !== undefined ? `: ${lastError}` : ''}` }
    },
    async close() {
      if (client.isOpen) await client.close().catch(() => client.destroy())
      else client.destroy()
    },
  }
}
