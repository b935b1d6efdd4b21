/**
 * /metrics of a whole gateway (authentication, a rule, a stdio target, the
 * admin listener) against docs/admin-and-observability.md: the metric names scraped are exactly
 * the ones its Metrics table lists; every series with labels known
 * at start-up is there at 0 before the first request; process and runtime
 * metrics are there under prom-client's names; per-tool calls and latency
 * are counted under the names the target advertised, anything else as
 * `other`.
 */
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { adminGateway, parsePrometheus, sampleSum, type Family } from './helpers/admin.ts'
import { rawInitialize, ROOT, INIT_HEADERS, sseMessages } from './helpers/gateway-harness.ts'

/** Metric names in the first column of the "Metrics (`GET /metrics`)" table (docs/admin-and-observability.md, linked from the README). */
async function readmeMetricNames(): Promise<Set<string>> {
  const text = await readFile(join(ROOT, 'docs', 'admin-and-observability.md'), 'utf8')
  const start = text.indexOf('### Metrics (`GET /metrics`)')
  const table = text.slice(start, text.indexOf('\n## ', start))
  const names = new Set<string>()
  for (const line of table.split('\n')) {
    if (!line.startsWith('| `')) continue
    const first = line.split(' | ')[0]!
    for (const m of first.matchAll(/`([a-z_:][a-z0-9_:]*)`/g)) names.add(m[1]!)
  }
  return names
}

function series(families: Map<string, Family>, name: string): Array<Record<string, string>> {
  const out: Array<Record<string, string>> = []
  for (const f of families.values()) for (const s of f.samples) if (s.name === name) out.push(s.labels)
  return out
}

/** Families only a configuration this gateway does not have registers. */
const NOT_IN_THIS_CONFIG = new Set([
  // HTTP targets only (this gateway has one stdio target).
  'mcp_proxy_upstream_http_errors_total',
])

t.test('a fresh gateway: documented table = scraped names, series at 0 before the first event, process metrics', async t => {
  const g = await adminGateway(t)
  const res = await g.call('/metrics')
  t.equal(res.status, 200)
  const families = parsePrometheus(await res.text())
  const scraped = new Set(families.keys())
  const documented = await readmeMetricNames()
  t.same([...scraped].filter(n => !documented.has(n)).sort(), [], 'every scraped metric is in the documented table')
  t.same([...documented].filter(n => !scraped.has(n) && !NOT_IN_THIS_CONFIG.has(n)).sort(), [], 'every documented metric is scraped')

  const zero = (name: string, labels: Record<string, string>, what: string): void => {
    const hit = families
      .get(name.replace(/_(bucket|sum|count)$/, ''))
      ?.samples.find(s => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    t.equal(hit?.value, 0, what)
  }
  for (const reason of ['missing', 'expired', 'signature', 'audience', 'issuer', 'keys_unavailable', 'unknown_key']) {
    zero('mcp_proxy_auth_failures_total', { reason }, `auth failures {reason="${reason}"} at 0`)
  }
  zero('mcp_proxy_authorization_denials_total', { rule: '0' }, 'denials of rule 0 at 0')
  zero('mcp_proxy_keyset_fetches_total', { result: 'error' }, 'key set fetch errors at 0')
  zero('mcp_proxy_upstream_starts_total', { target: 'everything' }, 'upstream starts at 0')
  zero('mcp_proxy_upstream_failures_total', { target: 'everything' }, 'upstream failures at 0')
  zero('mcp_proxy_upstream_exits_total', { target: 'everything', reason: 'line_too_long' }, 'upstream exits at 0')
  zero('mcp_proxy_upstream_dropped_lines_total', { target: 'everything' }, 'dropped lines at 0')
  zero('mcp_proxy_credential_failures_total', { target: 'everything', reason: 'claim' }, "the target's credential failures at 0 (its auth block)")
  zero('mcp_proxy_sessions_ended_total', { reason: 'idle' }, 'sessions ended at 0')
  zero('mcp_proxy_sse_slow_streams_closed_total', {}, 'slow streams at 0')
  zero('mcp_proxy_tool_calls_total', { target: 'everything', tool: 'other', outcome: 'error' }, 'tool calls under other at 0')
  zero('mcp_proxy_tool_call_duration_seconds_count', { target: 'everything', tool: 'other' }, 'tool latency under other, empty')

  t.ok(sampleSum(families, 'process_cpu_seconds_total') > 0, 'CPU seconds')
  t.ok(sampleSum(families, 'process_resident_memory_bytes') > 10e6, 'resident memory')
  t.ok(sampleSum(families, 'process_start_time_seconds') > 1.7e9, 'start time in seconds since the epoch')
  t.ok(sampleSum(families, 'nodejs_heap_size_used_bytes') > 0, 'heap used')
  t.ok(
    series(families, 'nodejs_heap_space_size_used_bytes').some(l => l.space === 'old'),
    'heap spaces by name'
  )
  t.same(
    series(families, 'nodejs_gc_duration_seconds_count')
      .map(l => l.kind)
      .sort(),
    ['incremental', 'major', 'minor', 'weakcb']
  )
  t.ok(series(families, 'nodejs_version_info')[0]?.version === process.version)
  t.ok(sampleSum(families, 'nodejs_active_resources_total') > 0, 'active resources')
  if (process.platform === 'linux') {
    const open = sampleSum(families, 'process_open_fds')
    t.ok(open > 3 && open <= sampleSum(families, 'process_max_fds'), `open file descriptors (${open})`)
  }
  t.equal(families.get('process_cpu_seconds_total')?.type, 'counter')
  t.equal(families.get('nodejs_eventloop_lag_p99_seconds')?.type, 'gauge')
})

t.test('per-tool calls and latency: advertised names, anything else is other', async t => {
  const g = await adminGateway(t)
  const auth = { authorization: `Bearer ${await g.aliceToken()}` }
  const init = await rawInitialize(g.mcp, '2025-06-18', auth)
  t.equal(init.status, 200)
  const headers = { ...INIT_HEADERS, ...auth, 'mcp-session-id': init.sessionId!, 'mcp-protocol-version': '2025-06-18' }
  let id = 10
  const rpc = async (method: string, params: Record<string, unknown>): Promise<Record<string, unknown> | undefined> => {
    const r = await fetch(g.mcp, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params }) })
    return sseMessages(await r.text()).find(m => m.id === id)
  }
  const scrape = async (): Promise<Map<string, Family>> => parsePrometheus(await (await g.call('/metrics')).text())

  // Before tools/list nothing is advertised: a call is counted, but as other.
  t.ok((await rpc('tools/call', { name: 'echo', arguments: { message: 'early' } }))?.result)
  let m = await scrape()
  t.equal(sampleSum(m, 'mcp_proxy_tool_calls_total', { tool: 'other', outcome: 'ok' }), 1, 'a call before tools/list counts as other')

  const list = await rpc('tools/list', {})
  const advertised = (list?.result as { tools: Array<{ name: string }> }).tools.map(x => x.name)
  t.ok(advertised.includes('echo'))
  m = await scrape()
  const toolLabels = new Set(series(m, 'mcp_proxy_tool_calls_total').map(l => l.tool))
  t.same([...toolLabels].sort(), [...advertised, 'other'].sort(), 'every advertised tool has its series, at 0, once listed')
  t.equal(sampleSum(m, 'mcp_proxy_tool_calls_total', { tool: 'echo' }), 0)

  for (let i = 0; i < 3; i++) t.ok((await rpc('tools/call', { name: 'echo', arguments: { message: `m${i}` } }))?.result)
  const made: string[] = []
  for (let i = 0; i < 300; i++) made.push(`made-up-${i}-${Math.random().toString(36).slice(2)}`)
  await Promise.all(made.map(name => rpc('tools/call', { name, arguments: {} })))

  const text = await (await g.call('/metrics')).text()
  m = parsePrometheus(text)
  t.equal(sampleSum(m, 'mcp_proxy_tool_calls_total', { target: 'everything', tool: 'echo', outcome: 'ok' }), 3, 'three echo calls')
  t.equal(sampleSum(m, 'mcp_proxy_tool_call_duration_seconds_count', { target: 'everything', tool: 'echo' }), 3, 'three latencies')
  t.ok(sampleSum(m, 'mcp_proxy_tool_call_duration_seconds_sum', { tool: 'echo' }) > 0)
  const other = sampleSum(m, 'mcp_proxy_tool_calls_total', { tool: 'other' })
  t.equal(other, 301, 'the early call and 300 made-up names, all under other')
  t.same(new Set(series(m, 'mcp_proxy_tool_calls_total').map(l => l.tool)), toolLabels, 'no new label value')
  t.notOk(
    made.some(n => text.includes(n)),
    'no made-up name reaches /metrics'
  )
})
