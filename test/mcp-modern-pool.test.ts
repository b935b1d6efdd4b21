/**
 * core/mcp/modern-pool.ts: pooled, initialized upstreams per (target,
 * subject), with in-memory upstreams (test/helpers/memory-upstream.ts).
 */
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import { UpstreamPool } from '../core/mcp/upstreams/pool.ts'
import { memoryFactory } from './helpers/memory-upstream.ts'
import { memoryLogger } from './helpers/logger.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'

function pool(t: Test, opts: Partial<ConstructorParameters<typeof UpstreamPool>[0]> = {}): UpstreamPool {
  const p = new UpstreamPool({ log: memoryLogger().log, perKeyMax: 2, globalMax: 10, idleMs: 60_000, requestTimeoutMs: 5_000, ...opts })
  t.teardown(() => p.close())
  return p
}

t.test('an upstream is initialized once by the gateway, as its session-era client', async t => {
  const f = memoryFactory('a')
  const p = pool(t)
  const e = await p.acquire(f, 'alice', 'alice')
  t.ok(e.up)
  t.match(e.initResult, { serverInfo: { name: 'memory-a' } })
  t.same(
    f.server.received.slice(0, 2).map(m => m.method),
    ['initialize', 'notifications/initialized']
  )
  // Written out: the latest session revision; what the gateway can relay for its 2026-07-28 callers (sampling,
  // form elicitation, as InputRequiredResult rounds); the gateway's name and the package version.
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
  t.same(f.server.received[0]!.params, {
    protocolVersion: '2025-11-25',
    capabilities: { sampling: {}, elicitation: { form: {} } },
    clientInfo: { name: 'mcp-proxy', version: pkg.version },
  })
  p.release(e)
})

t.test('per subject: never shared across subjects; least busy first within the cap', async t => {
  const f = memoryFactory('a')
  const p = pool(t)
  const a1 = await p.acquire(f, 'alice', 'alice')
  const a2 = await p.acquire(f, 'alice', 'alice')
  t.not(a1, a2, 'busy: a second upstream within the cap')
  const a3 = await p.acquire(f, 'alice', 'alice')
  t.ok(a3 === a1 || a3 === a2, 'at the cap: shared with the least busy')
  const b1 = await p.acquire(f, 'bob', 'bob')
  t.not(b1.upstream, a1.upstream)
  t.not(b1.upstream, a2.upstream, "another subject never gets alice's upstream")
  t.equal(p.size, 3)
  t.same(
    p
      .describe()
      .map(d => d.subject)
      .sort(),
    ['alice', 'alice', 'bob']
  )
  for (const e of [a1, a2, a3, b1]) p.release(e)
})

t.test("ids are the pool's on the upstream, progress tokens made unique and mapped back", async t => {
  const f = memoryFactory('a')
  const p = pool(t)
  const e = await p.acquire(f, 'alice', 'alice')
  const progress: JsonRpcMessage[] = []
  const msgs: JsonRpcMessage[] = [1, 2].map(() => ({
    jsonrpc: '2.0',
    id: 'client-id',
    method: 'tools/call',
    params: { name: 'progress', _meta: { progressToken: 'same' } },
  }))
  const calls = msgs.map(m => e.call(m, { onProgress: n => progress.push(n) }))
  const done = await Promise.all(calls.map(c => c.done))
  t.same(
    done.map(d => d.result),
    [{ content: [{ type: 'text', text: 'done' }] }, { content: [{ type: 'text', text: 'done' }] }]
  )
  const sent = f.server.received.filter(m => m.method === 'tools/call')
  t.equal(new Set(sent.map(m => m.id)).size, 2, 'two upstream ids')
  t.notOk(
    sent.some(m => m.id === 'client-id'),
    "the client's id never reaches the upstream"
  )
  const tokens = sent.map(m => (m.params!._meta as { progressToken: string }).progressToken)
  t.equal(new Set(tokens).size, 2, 'the same client token becomes two upstream tokens')
  t.same(
    progress.map(n => n.params!.progressToken),
    ['same', 'same'],
    'and is mapped back'
  )
  p.release(e)
})

t.test('timeout and cancel: notifications/cancelled upstream, an error for the caller', async t => {
  const f = memoryFactory('a')
  const p = pool(t, { requestTimeoutMs: 50 })
  const e = await p.acquire(f, 'alice', 'alice')
  const timedOut = await e.call({ jsonrpc: '2.0', method: 'tools/call', params: { name: 'hang' } }).done
  t.same(timedOut.error, { code: -32001, message: 'Request timed out' })
  const c = e.call({ jsonrpc: '2.0', method: 'tools/call', params: { name: 'hang' } }, { timeoutMs: 0 })
  c.cancel('client disconnected')
  t.same((await c.done).error, { code: -32001, message: 'Request cancelled' })
  await new Promise(resolve => setImmediate(resolve))
  const cancels = f.server.received.filter(m => m.method === 'notifications/cancelled').map(m => m.params)
  t.match(cancels, [{ reason: 'request timed out' }, { reason: 'client disconnected' }])
  t.equal(e.inFlight, 0)
  p.release(e)
})

t.test('a crashed upstream fails its calls and leaves the pool; the next acquire starts a fresh one', async t => {
  const f = memoryFactory('a')
  const p = pool(t)
  const e = await p.acquire(f, 'alice', 'alice')
  let gone = 0
  e.onGone.add(() => {
    gone++
  })
  const hanging = e.call({ jsonrpc: '2.0', method: 'tools/call', params: { name: 'hang' } })
  f.server.created[0]!.crash()
  t.same((await hanging.done).error, { code: -32000, message: 'upstream a closed' })
  t.equal(gone, 1)
  t.equal(p.size, 0)
  p.release(e)
  const fresh = await p.acquire(f, 'alice', 'alice')
  t.not(fresh, e)
  t.equal(f.server.created.length, 2)
  p.release(fresh)
})

t.test('the global cap evicts an idle upstream of another key, else 503', async t => {
  const f = memoryFactory('a')
  const p = pool(t, { globalMax: 1 })
  const a = await p.acquire(f, 'alice', 'alice')
  await t.rejects(p.acquire(f, 'bob', 'bob'), { code: 'MCPP_ERR_PROCESS_LIMIT', statusCode: 503 }, "alice's upstream is leased: no room")
  p.release(a)
  const b = await p.acquire(f, 'bob', 'bob')
  t.ok(f.server.created[0]!.alive === false, "alice's idle upstream was evicted")
  t.equal(b.subject, 'bob')
  p.release(b)
  await p.close()
  await t.rejects(p.acquire(f, 'bob', 'bob'), { code: 'MCPP_ERR_SHUTTING_DOWN', statusCode: 503 }, 'closed: shutting down')
})

t.test('subscriptions are counted per URI: the upstream is asked once, unsubscribed by the last holder', async t => {
  const f = memoryFactory('a')
  const p = pool(t)
  const e = await p.acquire(f, 'alice', 'alice')
  await e.subscribe('x://1')
  await e.subscribe('x://1')
  e.unsubscribe('x://1')
  await new Promise(resolve => setImmediate(resolve))
  t.same(
    f.server.received.filter(m => m.method?.startsWith('resources/')).map(m => m.method),
    ['resources/subscribe']
  )
  e.unsubscribe('x://1')
  await new Promise(resolve => setImmediate(resolve))
  t.same(
    f.server.received.filter(m => m.method?.startsWith('resources/')).map(m => m.method),
    ['resources/subscribe', 'resources/unsubscribe']
  )
  p.release(e)
})
