/**
 * Metric labels a client cannot grow (issue 13 item 16): 2000 JSON-RPC
 * method names made up by one caller with a valid token, sent as requests,
 * notifications and stateless (2026-07-28) requests through the whole
 * gateway, leave /metrics with a bounded number of series: every method label
 * is an MCP method name or `other`.
 */
import t from 'tap'
import { randomBytes } from 'node:crypto'
import { adminGateway, parsePrometheus } from './helpers/admin.ts'
import { AdvertisedNames } from '../core/observability/metric-labels.ts'
import { rawInitialize } from './helpers/gateway-harness.ts'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

function seriesCount(text: string): number {
  let n = 0
  for (const f of parsePrometheus(text).values()) n += f.samples.length
  return n
}

t.test('2000 made-up method names leave /metrics bounded', async t => {
  const g = await adminGateway(t)
  const token = await g.aliceToken()
  const auth = { authorization: `Bearer ${token}` }
  const init = await rawInitialize(g.mcp, '2025-06-18', auth)
  t.equal(init.status, 200)
  const sid = init.sessionId!
  const session = { ...HEADERS, ...auth, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' }
  // A first round of the real methods: the baseline holds their series.
  for (const method of ['ping', 'tools/list']) {
    const r = await fetch(g.mcp, { method: 'POST', headers: session, body: JSON.stringify({ jsonrpc: '2.0', id: method, method, params: {} }) })
    await r.text()
  }
  const baseline = seriesCount(await (await g.call('/metrics')).text())

  const names: string[] = []
  for (let i = 0; i < 2000; i++) names.push(`x-${randomBytes(6).toString('hex')}/${i}`)
  const statuses = new Map<number, number>()
  let next = 0
  async function worker(): Promise<void> {
    while (next < names.length) {
      const i = next++
      const method = names[i]!
      let init: RequestInit
      if (i % 10 === 9) {
        // Revision 2026-07-28: stateless, no session.
        init = {
          method: 'POST',
          headers: { ...HEADERS, ...auth, 'mcp-protocol-version': '2026-07-28', 'mcp-method': method },
          body: JSON.stringify({ jsonrpc: '2.0', id: i, method, params: { _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28' } } }),
        }
      } else {
        // Even: a request (forwarded upstream), odd: a notification.
        const msg = i % 2 === 0 ? { jsonrpc: '2.0', id: i, method, params: {} } : { jsonrpc: '2.0', method, params: {} }
        init = { method: 'POST', headers: session, body: JSON.stringify(msg) }
      }
      const r = await fetch(g.mcp, init)
      await r.arrayBuffer()
      statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1)
    }
  }
  await Promise.all(Array.from({ length: 8 }, worker))
  t.notOk(statuses.has(500), 'no request failed inside the gateway')
  t.ok((statuses.get(200) ?? 0) + (statuses.get(202) ?? 0) > 1000, 'the made-up methods reached the session and the upstream')

  const text = await (await g.call('/metrics')).text()
  const after = seriesCount(text)
  t.ok(after - baseline < 100, `series grew by ${after - baseline} (from ${baseline})`)
  t.notOk(
    names.some(n => text.includes(n)),
    'no made-up method name is a label value'
  )
  const families = parsePrometheus(text)
  const methods = new Set<string>()
  for (const f of families.values())
    for (const s of f.samples) {
      if (s.labels.mcp_method !== undefined) methods.add(s.labels.mcp_method)
      if (s.labels.method !== undefined) methods.add(s.labels.method)
    }
  t.ok(methods.has('other'), 'made-up methods are counted as other')
  t.ok(methods.has('ping') && methods.has('tools/list'), 'MCP methods keep their name')
})

t.test('AdvertisedNames: only advertised names, at most max, 1-128 characters; the rest is other', async t => {
  const names = new AdvertisedNames(2)
  t.equal(names.label('echo'), 'other', 'nothing advertised yet')
  t.equal(names.add('echo'), true)
  t.equal(names.add('echo'), false, 'once')
  t.equal(names.add('x'.repeat(129)), false, 'too long for a tool name')
  t.equal(names.add(42), false)
  t.equal(names.add(''), false)
  t.equal(names.add('add'), true)
  t.equal(names.add('third'), false, 'past the cap')
  t.same(
    ['echo', 'add', 'third', 'x'.repeat(129)].map(n => names.label(n)),
    ['echo', 'add', 'other', 'other']
  )
})
