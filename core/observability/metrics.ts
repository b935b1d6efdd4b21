/**
 * A small Prometheus text-format registry: counters, gauges (set or
 * collected on scrape) and histograms, with label sets. No dependencies.
 */

type Labels = Record<string, string | number>

/** A counter bound to one label set: the series key is built once. */
export interface CounterHandle {
  inc(by?: number): void
  get(): number
}

/** A histogram bound to one label set: the series key is built once. */
export interface HistogramHandle {
  observe(value: number): void
}

const NEEDS_ESCAPE = /[\\"\n]/

function labelValue(v: string | number): string {
  if (typeof v === 'number') return String(v)
  return NEEDS_ESCAPE.test(v) ? v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n') : v
}

/**
 * Builds series keys (`a="1",b="2"`, names sorted) for one metric. A metric
 * is observed with the same label names every time, so the sorted order is
 * kept from the first call and reused while the names match; only a
 * different set of names sorts again.
 */
class LabelKeys {
  #order: string[] | undefined

  keyOf(labels: Labels | undefined): string {
    if (labels === undefined) return ''
    let order = this.#order
    if (order === undefined || !sameNames(order, labels)) {
      order = Object.keys(labels).sort()
      this.#order = order
    }
    let out = ''
    for (let i = 0; i < order.length; i++) {
      const k = order[i]!
      out += (i === 0 ? '' : ',') + k + '="' + labelValue(labels[k]!) + '"'
    }
    return out
  }
}

function sameNames(order: readonly string[], labels: Labels): boolean {
  let n = 0
  for (const _ in labels) n++
  if (n !== order.length) return false
  for (let i = 0; i < order.length; i++) if (!Object.hasOwn(labels, order[i]!)) return false
  return true
}

/** One-off key for scrape-time gauges (not on a request path). */
function labelKey(labels: Labels | undefined): string {
  return new LabelKeys().keyOf(labels)
}

export class Counter {
  readonly values = new Map<string, number>()
  /** A counter kept elsewhere (e.g. CPU seconds), read on scrape. */
  collect: (() => Array<[Labels | undefined, number]>) | undefined
  readonly name: string
  readonly help: string
  readonly #keys = new LabelKeys()
  constructor(name: string, help: string) {
    this.name = name
    this.help = help
  }
  inc(labels?: Labels, by = 1): void {
    const k = this.#keys.keyOf(labels)
    this.values.set(k, (this.values.get(k) ?? 0) + by)
  }
  get(labels?: Labels): number {
    return this.values.get(this.#keys.keyOf(labels)) ?? 0
  }
  /**
   * Creates the series at 0 when it does not exist yet, so it is scraped
   * before its first event: rate() and increase() see the first one, and
   * a dashboard shows 0 rather than nothing.
   */
  init(labels?: Labels): void {
    const k = this.#keys.keyOf(labels)
    if (!this.values.has(k)) this.values.set(k, 0)
  }
  /** Binds a label set: keep the handle where the labels are known ahead. */
  labels(labels?: Labels): CounterHandle {
    const k = this.#keys.keyOf(labels)
    const values = this.values
    return {
      inc(by = 1) {
        values.set(k, (values.get(k) ?? 0) + by)
      },
      get() {
        return values.get(k) ?? 0
      },
    }
  }
  render(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} counter\n`
    if (this.collect !== undefined) {
      for (const [l, v] of this.collect()) out += `${this.name}${l ? `{${labelKey(l)}}` : ''} ${v}\n`
    }
    for (const [k, v] of this.values) out += `${this.name}${k ? `{${k}}` : ''} ${v}\n`
    return out
  }
}

export class Gauge {
  readonly values = new Map<string, number>()
  collect: (() => Array<[Labels | undefined, number]>) | undefined
  readonly name: string
  readonly help: string
  readonly #keys = new LabelKeys()
  constructor(name: string, help: string) {
    this.name = name
    this.help = help
  }
  set(value: number, labels?: Labels): void {
    this.values.set(this.#keys.keyOf(labels), value)
  }
  render(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} gauge\n`
    if (this.collect !== undefined) {
      for (const [l, v] of this.collect()) out += `${this.name}${l ? `{${labelKey(l)}}` : ''} ${v}\n`
    }
    for (const [k, v] of this.values) out += `${this.name}${k ? `{${k}}` : ''} ${v}\n`
    return out
  }
}

interface Series {
  counts: number[]
  sum: number
  count: number
}

export class Histogram {
  readonly series = new Map<string, Series>()
  readonly name: string
  readonly help: string
  readonly buckets: readonly number[]
  readonly #keys = new LabelKeys()
  constructor(name: string, help: string, buckets: readonly number[]) {
    this.name = name
    this.help = help
    this.buckets = buckets
  }
  observe(value: number, labels?: Labels): void {
    this.#record(this.#series(this.#keys.keyOf(labels)), value)
  }
  /** Creates the series with no observations (see Counter.init). */
  init(labels?: Labels): void {
    this.#series(this.#keys.keyOf(labels))
  }
  /** Binds a label set: keep the handle where the labels are known ahead. */
  labels(labels?: Labels): HistogramHandle {
    const k = this.#keys.keyOf(labels)
    let s: Series | undefined
    const observe = (value: number): void => {
      s ??= this.#series(k)
      this.#record(s, value)
    }
    return { observe }
  }
  #series(k: string): Series {
    let s = this.series.get(k)
    if (s === undefined) {
      s = { counts: new Array<number>(this.buckets.length).fill(0), sum: 0, count: 0 }
      this.series.set(k, s)
    }
    return s
  }
  #record(s: Series, value: number): void {
    const b = this.buckets
    for (let i = 0; i < b.length; i++) if (value <= b[i]!) s.counts[i]!++
    s.sum += value
    s.count++
  }
  render(): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} histogram\n`
    for (const [k, s] of this.series) {
      const sep = k ? k + ',' : ''
      this.buckets.forEach((b, i) => {
        out += `${this.name}_bucket{${sep}le="${b}"} ${s.counts[i]}\n`
      })
      out += `${this.name}_bucket{${sep}le="+Inf"} ${s.count}\n`
      out += `${this.name}_sum${k ? `{${k}}` : ''} ${s.sum}\n${this.name}_count${k ? `{${k}}` : ''} ${s.count}\n`
    }
    return out
  }
}

export class Metrics {
  readonly #all = new Map<string, Counter | Gauge | Histogram>()
  readonly #before: Array<() => Promise<void>> = []
  /** Work done before each scrape that cannot be synchronous (e.g. counting open file descriptors). */
  beforeScrape(fn: () => Promise<void>): void {
    this.#before.push(fn)
  }
  /** Runs the `beforeScrape` work; the admin listener awaits it before `render()`. */
  async collect(): Promise<void> {
    await Promise.all(this.#before.map(fn => fn().catch(() => {})))
  }
  counter(name: string, help: string): Counter {
    return this.#get(name, () => new Counter(name, help)) as Counter
  }
  gauge(name: string, help: string): Gauge {
    return this.#get(name, () => new Gauge(name, help)) as Gauge
  }
  histogram(name: string, help: string, buckets: readonly number[] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]): Histogram {
    return this.#get(name, () => new Histogram(name, help, buckets)) as Histogram
  }
  #get(name: string, make: () => Counter | Gauge | Histogram): Counter | Gauge | Histogram {
    let m = this.#all.get(name)
    if (m === undefined) {
      m = make()
      this.#all.set(name, m)
    }
    return m
  }
  render(): string {
    let out = ''
    for (const m of this.#all.values()) out += m.render()
    return out
  }
}
