/**
 * core/metrics.ts: series keys (sorted names, escaping, remembered order),
 * bound label handles sharing the series of the unbound calls, and the text
 * format.
 */
import t from 'tap'
import { Metrics } from '../core/observability/metrics.ts'

t.test('series keys: sorted names whatever the order given, values escaped only when needed', async t => {
  const m = new Metrics()
  const c = m.counter('c_total', 'c')
  c.inc({ b: 'x', a: 1 })
  c.inc({ a: 1, b: 'x' })
  t.equal(c.get({ a: 1, b: 'x' }), 2)
  t.same([...c.values.keys()], ['a="1",b="x"'])
  c.inc({ a: 'q"\\\nz', b: 'y' })
  t.ok(m.render().includes('c_total{a="q\\"\\\\\\nz",b="y"} 1\n'), 'quote, backslash and newline escaped')
})

t.test('series keys: another set of label names on the same metric is keyed by its own names', async t => {
  const c = new Metrics().counter('c_total', 'c')
  c.inc({ z: 'a', y: 'b' })
  c.inc({ y: 'b' })
  c.inc({ z: 'a', y: 'b', x: 'c' })
  c.inc({ q: 'b', z: 'a' })
  t.same([...c.values.keys()], ['y="b",z="a"', 'y="b"', 'x="c",y="b",z="a"', 'q="b",z="a"'])
})

t.test('bound handles share the series of unbound calls and create none before use', async t => {
  const m = new Metrics()
  const c = m.counter('req_total', 'r')
  const h = m.histogram('dur_seconds', 'd', [0.1, 1])
  const ch = c.labels({ route: '/mcp', status: 200 })
  const hh = h.labels({ route: '/mcp' })
  t.equal(c.values.size, 0)
  t.equal(h.series.size, 0)
  ch.inc()
  ch.inc(2)
  c.inc({ status: 200, route: '/mcp' })
  t.equal(ch.get(), 4)
  t.equal(c.get({ route: '/mcp', status: 200 }), 4)
  hh.observe(0.05)
  h.observe(0.5, { route: '/mcp' })
  const text = m.render()
  t.ok(text.includes('req_total{route="/mcp",status="200"} 4\n'))
  t.ok(text.includes('dur_seconds_bucket{route="/mcp",le="0.1"} 1\n'))
  t.ok(text.includes('dur_seconds_bucket{route="/mcp",le="1"} 2\n'))
  t.ok(text.includes('dur_seconds_count{route="/mcp"} 2\n'))
  t.ok(text.includes('dur_seconds_sum{route="/mcp"} 0.55\n'))
})

t.test('init() makes a series at 0 (once), collect() reads kept-elsewhere counters, collect awaits beforeScrape work', async t => {
  const m = new Metrics()
  const c = m.counter('c_total', 'c')
  c.inc({ reason: 'a' }, 2)
  c.init({ reason: 'a' })
  c.init({ reason: 'b' })
  const h = m.histogram('h_seconds', 'h', [1])
  h.init({ kind: 'x' })
  const cpu = m.counter('cpu_seconds_total', 'cpu')
  let value = 1.5
  cpu.collect = () => [[undefined, value]]
  m.beforeScrape(async () => {
    value = 2.5
  })
  await m.collect()
  const text = m.render()
  t.ok(text.includes('c_total{reason="a"} 2\n'), 'init keeps a value already counted')
  t.ok(text.includes('c_total{reason="b"} 0\n'))
  t.ok(text.includes('h_seconds_bucket{kind="x",le="+Inf"} 0\nh_seconds_sum{kind="x"} 0\nh_seconds_count{kind="x"} 0\n'))
  t.ok(text.includes('# TYPE cpu_seconds_total counter\ncpu_seconds_total 2.5\n'))
})
