/**
 * A small Prometheus text-format registry: counters, gauges (set or
 * collected on scrape) and histograms, with label sets. No dependencies.
 */

type Labels = Record<string, string | number>

function labelKey (labels: Labels | undefined): string {
  if (labels === undefined) return ''
  const keys = Object.keys(labels).sort()
  return keys.map(k => `${k}="${String(labels[k]).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`).join(',')
}

export class Counter {
  readonly values = new Map<string, number>()
  readonly name: string
  readonly help: string
  constructor (name: string, help: string) { this.name = name; this.help = help }
  inc (labels?: Labels, by = 1): void {
    const k = labelKey(labels)
    this.values.set(k, (this.values.get(k) ?? 0) + by)
  }
  get (labels?: Labels): number { return this.values.get(labelKey(labels)) ?? 0 }
  render (): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} counter\n`
    for (const [k, v] of this.values) out += `${this.name}${k ? `{${k}}` : ''} ${v}\n`
    return out
  }
}

export class Gauge {
  readonly values = new Map<string, number>()
  collect: (() => Array<[Labels | undefined, number]>) | undefined
  readonly name: string
  readonly help: string
  constructor (name: string, help: string) { this.name = name; this.help = help }
  set (value: number, labels?: Labels): void { this.values.set(labelKey(labels), value) }
  render (): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} gauge\n`
    if (this.collect !== undefined) {
      for (const [l, v] of this.collect()) out += `${this.name}${l ? `{${labelKey(l)}}` : ''} ${v}\n`
    }
    for (const [k, v] of this.values) out += `${this.name}${k ? `{${k}}` : ''} ${v}\n`
    return out
  }
}

export class Histogram {
  readonly series = new Map<string, { counts: number[]; sum: number; count: number }>()
  readonly name: string
  readonly help: string
  readonly buckets: readonly number[]
  constructor (name: string, help: string, buckets: readonly number[]) { this.name = name; this.help = help; this.buckets = buckets }
  observe (value: number, labels?: Labels): void {
    const k = labelKey(labels)
    let s = this.series.get(k)
    if (s === undefined) {
      s = { counts: new Array(this.buckets.length).fill(0), sum: 0, count: 0 }
      this.series.set(k, s)
    }
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]!) s.counts[i]!++
    s.sum += value
    s.count++
  }
  render (): string {
    let out = `# HELP ${this.name} ${this.help}\n# TYPE ${this.name} histogram\n`
    for (const [k, s] of this.series) {
      const sep = k ? k + ',' : ''
      this.buckets.forEach((b, i) => { out += `${this.name}_bucket{${sep}le="${b}"} ${s.counts[i]}\n` })
      out += `${this.name}_bucket{${sep}le="+Inf"} ${s.count}\n`
      out += `${this.name}_sum${k ? `{${k}}` : ''} ${s.sum}\n${this.name}_count${k ? `{${k}}` : ''} ${s.count}\n`
    }
    return out
  }
}

export class Metrics {
  readonly #all = new Map<string, Counter | Gauge | Histogram>()
  counter (name: string, help: string): Counter {
    return this.#get(name, () => new Counter(name, help)) as Counter
  }
  gauge (name: string, help: string): Gauge {
    return this.#get(name, () => new Gauge(name, help)) as Gauge
  }
  histogram (name: string, help: string, buckets: readonly number[] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]): Histogram {
    return this.#get(name, () => new Histogram(name, help, buckets)) as Histogram
  }
  #get (name: string, make: () => Counter | Gauge | Histogram): Counter | Gauge | Histogram {
    let m = this.#all.get(name)
    if (m === undefined) { m = make(); this.#all.set(name, m) }
    return m
  }
  render (): string {
    let out = ''
    for (const m of this.#all.values()) out += m.render()
    return out
  }
}
