/**
 * core/shared-state.ts: the memory store and the Redis store against a real
 * redis-server. Two Redis stores on one server stand for two replicas: one
 * cap, one bucket, one redemption of a code between them; a slot of a
 * replica that stopped renewing expires; Redis gone is a 503 at once, not a
 * hang. Registration's rate limit across two gateways on one Redis.
 */
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createMemoryState, createRedisState, type SharedState } from '../core/cluster/shared-state.ts'
import { ProxyError } from '../core/errors.ts'
import { startBridgeServer, type BridgeServer } from './helpers/bridge-server.ts'
import { memoryLogger } from './helpers/logger.ts'
import { startRedis } from './helpers/redis.ts'
import { eventually } from './helpers/cli.ts'

async function redisPair(t: Test, url: string, prefix = 'test:'): Promise<{ a: SharedState; b: SharedState; logText: () => string }> {
  const mem = memoryLogger('debug')
  const a = await createRedisState({ url, keyPrefix: prefix, log: mem.log })
  const b = await createRedisState({ url, keyPrefix: prefix, log: mem.log })
  t.teardown(async () => {
    await a.close()
    await b.close()
  })
  await eventually(
    () => a.ready().ready && b.ready().ready,
    ok => ok
  )
  return { a, b, logText: mem.text }
}

t.test('memory store: bucket, capped leases, single-use values', async t => {
  let now = 0
  const s = createMemoryState(() => now)
  t.same(await Promise.all([1, 2, 3, 4].map(() => s.take('k', 3, 3000))).then(w => w.map(x => x === 0)), [true, true, true, false])
  t.equal(await s.take('k', 3, 3000), 1000, 'the wait until one token is back')
  now += 1000
  t.equal(await s.take('k', 3, 3000), 0, 'refilled evenly')
  t.equal(await s.take('other', 3, 3000), 0, 'keys are apart')

  t.equal(await s.join('sub', 'a', 2, 60_000), true)
  t.equal(await s.join('sub', 'b', 2, 60_000), true)
  t.equal(await s.join('sub', 'c', 2, 60_000), false, 'the cap holds')
  t.equal(await s.join('sub', 'a', 2, 60_000), true, 'a member already in counts once')
  await s.leave('sub', 'a')
  t.equal(await s.join('sub', 'c', 2, 60_000), true, 'leaving frees a slot')
  now += 60_001
  t.equal(await s.join('sub', 'd', 2, 60_000), true, 'expired leases free their slots')

  t.equal(await s.putOnce('code', 'v', 1000), true)
  t.equal(await s.putOnce('code', 'w', 1000), false, 'a stored key is not replaced')
  t.equal(await s.takeOnce('code'), 'v')
  t.equal(await s.takeOnce('code'), undefined, 'taken once')
  await s.putOnce('late', 'v', 1000)
  now += 1001
  t.equal(await s.takeOnce('late'), undefined, 'expired values are gone')
})

t.test('redis store: two replicas share one cap, one bucket and one redemption', async t => {
  const redis = await startRedis(t)
  const { a, b } = await redisPair(t, redis.url)
  t.equal(a.kind, 'redis')

  // 10 joins raced from both replicas for 3 slots.
  const joins = await Promise.all(Array.from({ length: 10 }, (_, i) => (i % 2 === 0 ? a : b).join('alice', `s${i}`, 3, 60_000)))
  t.equal(joins.filter(Boolean).length, 3, 'exactly the cap joined across replicas')
  t.equal(await a.join('bob', 's-bob', 3, 60_000), true, 'another subject has slots of its own')
  const member = joins.findIndex(Boolean)
  await b.leave('alice', `s${member}`)
  t.equal(await a.join('alice', 'late', 3, 60_000), true, 'a slot freed on one replica is free on the other')

  const waits = await Promise.all(Array.from({ length: 8 }, (_, i) => (i % 2 === 0 ? a : b).take('10.0.0.1', 5, 3_600_000)))
  t.equal(waits.filter(w => w === 0).length, 5, 'one bucket for both replicas')
  t.ok(
    waits.filter(w => w > 0).every(w => w > 0 && w <= 720_000),
    'the others learn how long to wait'
  )

  t.equal(await a.putOnce('code-1', 'payload', 60_000), true)
  t.equal(await b.putOnce('code-1', 'other', 60_000), false)
  const taken = await Promise.all(Array.from({ length: 10 }, (_, i) => (i % 2 === 0 ? a : b).takeOnce('code-1')))
  t.same(
    taken.filter(v => v !== undefined),
    ['payload'],
    'redeemed exactly once across replicas'
  )
})

t.test('redis store: a slot whose replica stops renewing expires; renewed slots do not', async t => {
  const redis = await startRedis(t)
  const { a, b } = await redisPair(t, redis.url)
  t.equal(await a.join('carol', 'kept', 2, 400), true)
  t.equal(await a.join('carol', 'dead', 2, 400), true)
  t.equal(await b.join('carol', 'new', 2, 400), false, 'full')
  // "kept" is renewed as its replica's renewer would; "dead" is not. Guard: a few seconds.
  let joined = false
  for (let i = 0; i < 100 && !joined; i++) {
    await a.renew([{ key: 'carol', member: 'kept' }], 400)
    joined = await b.join('carol', 'new', 2, 400)
    if (!joined) await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.ok(joined, 'the slot of the member nobody renews frees itself')
  await a.renew([{ key: 'carol', member: 'kept' }], 60_000)
  await b.renew([{ key: 'carol', member: 'new' }], 60_000)
  t.equal(await b.join('carol', 'third', 2, 400), false, 'the renewed ones still count')
})

t.test('redis store: Redis gone is a 503 at once and a log line, then it recovers', async t => {
  const redis = await startRedis(t)
  const { a, logText } = await redisPair(t, redis.url)
  t.equal(await a.join('dave', 'x', 1, 60_000), true)
  await redis.kill()
  await eventually(
    () => a.ready().ready,
    ok => !ok
  )
  t.equal(a.ready().ready, false)
  t.match(a.ready().reason, /Redis not connected/)
  const err = await a.join('dave', 'y', 1, 60_000).then(
    () => undefined,
    (e: unknown) => e
  )
  t.ok(ProxyError.is(err), 'a ProxyError')
  t.equal((err as ProxyError).statusCode, 503)
  t.equal((err as ProxyError).code, 'MCPP_ERR_SHARED_STATE')
  t.equal((err as ProxyError).headers?.['retry-after'], '1')
  await t.rejects(a.takeOnce('c'), { code: 'MCPP_ERR_SHARED_STATE' })
  t.match(logText(), /shared state: Redis unreachable/)
  t.equal(
    logText().match(/shared state: Redis unreachable/g)?.length,
    2,
    'one line per store (both write to this log) per outage, not one per reconnect attempt'
  )

  // Redis comes back on the same address (empty: no persistence): the store reconnects by itself.
  await redis.restart()
  t.equal(
    await eventually(
      () => a.ready().ready,
      ok => ok,
      200,
      50
    ),
    true,
    'ready again once Redis is back (reconnect back-off is at most 3 s)'
  )
  t.same(a.ready(), { ready: true }, 'no reason left over from the outage')
  t.equal(await a.join('dave', 'z', 1, 60_000), true, 'commands work again')
  t.equal(await a.join('dave', 'w', 1, 60_000), false, 'and count against the cap again')
  t.equal(await a.putOnce('c', 'v', 60_000), true)
  t.equal(await a.takeOnce('c'), 'v')
  t.match(logText(), /shared state: Redis reachable again/, 'the recovery is logged')
})

async function idpStub(t: Test): Promise<string> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(
      JSON.stringify({
        issuer: 'https://idp.example/app/',
        authorization_endpoint: 'https://idp.example/authorize',
        token_endpoint: 'https://idp.example/token',
        registration_endpoint: null,
      })
    )
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  )
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/app/`
}

t.test('registration rate limit: one bucket per address across two gateways on one Redis', async t => {
  const redis = await startRedis(t)
  const { a, b } = await redisPair(t, redis.url, 'reg:')
  const issuer = await idpStub(t)
  const auth = { issuer, audiences: ['c'], clientId: 'c', provider: { oss_idp: {} } }
  const registration = { rateLimit: { requests: 4, windowSeconds: 3600 } }
  const servers: BridgeServer[] = [await startBridgeServer(auth, { registration, shared: a }), await startBridgeServer(auth, { registration, shared: b })]
  t.teardown(() => Promise.all(servers.map(s => s.close())))
  const statuses: number[] = []
  for (let i = 0; i < 10; i++) {
    const r = await fetch(servers[i % 2]!.url + '/.well-known/oauth-authorization-server/client-registration', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ redirect_uris: ['http://127.0.0.1:1234/cb'] }),
    })
    statuses.push(r.status)
    if (r.status === 429) t.match(r.headers.get('retry-after'), /^[1-9]\d*$/)
    await r.text()
  }
  t.same(statuses, [201, 201, 201, 201, 429, 429, 429, 429, 429, 429], 'the limit is counted once for both gateways')
  t.match(servers[0]!.logText() + servers[1]!.logText(), /client registration rate limit reached/)
})
