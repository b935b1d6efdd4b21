/**
 * Summarises a V8 .cpuprofile (from `BENCH_CPU_PROF=<dir> npm run bench`):
 * self time by function and file, and inclusive time of the project's own
 * functions, as shares of the busy (non-idle) time.
 * Usage: node --import tsx bench/lib/cpuprofile.ts <file.cpuprofile> [top=25] [skipMs=0]
 * (skipMs drops the first samples, e.g. start-up and module loading).
 * CPUPROF_EXCLUDE=writeUtf8String,writev leaves those frames out of the busy
 * time (on a loaded box they mostly hold time spent descheduled in a syscall).
 */
import { readFile } from 'node:fs/promises'

interface Node {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  hitCount?: number
  children?: number[]
}
interface Profile {
  nodes: Node[]
  samples: number[]
  timeDeltas: number[]
}

function label(n: Node): string {
  const url = n.callFrame.url.replace(/^file:\/\//, '').replace(/^.*\/work\/main\//, '')
  return `${n.callFrame.functionName || '(anonymous)'} ${url}${url !== '' ? `:${n.callFrame.lineNumber + 1}` : ''}`
}

const [file, topArg, skipArg] = process.argv.slice(2)
const skipUs = Number(skipArg ?? 0) * 1000
const exclude = new Set((process.env.CPUPROF_EXCLUDE ?? '').split(',').filter(Boolean))
const prof = JSON.parse(await readFile(file!, 'utf8')) as Profile
const byId = new Map(prof.nodes.map(n => [n.id, n]))
const parent = new Map<number, number>()
for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const self = new Map<number, number>()
let at = 0
for (let i = 0; i < prof.samples.length; i++) {
  at += prof.timeDeltas[i] ?? 0
  if (at < skipUs) continue
  self.set(prof.samples[i]!, (self.get(prof.samples[i]!) ?? 0) + (prof.timeDeltas[i] ?? 0))
}
let busy = 0
const selfBy = new Map<string, number>()
const inclBy = new Map<string, number>()
for (const [id, t] of self) {
  const n = byId.get(id)!
  if (n.callFrame.functionName === '(idle)' || exclude.has(n.callFrame.functionName)) continue
  busy += t
  selfBy.set(label(n), (selfBy.get(label(n)) ?? 0) + t)
  const seen = new Set<string>()
  for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
    const l = label(byId.get(cur)!)
    if (seen.has(l)) continue
    seen.add(l)
    inclBy.set(l, (inclBy.get(l) ?? 0) + t)
  }
}
const top = Number(topArg ?? 25)
const pct = (t: number): string => `${((100 * t) / busy).toFixed(1).padStart(5)}%`
process.stdout.write(`busy ${(busy / 1000).toFixed(0)} ms\n\nself time:\n`)
for (const [l, t] of [...selfBy].sort((a, b) => b[1] - a[1]).slice(0, top)) process.stdout.write(`${pct(t)}  ${l}\n`)
process.stdout.write('\ninclusive, project files:\n')
for (const [l, t] of [...inclBy]
  .filter(([l]) => /^\S+ (\S*\/)?(core|plugins|bin)\//.test(l))
  .sort((a, b) => b[1] - a[1])
  .slice(0, top))
  process.stdout.write(`${pct(t)}  ${l}\n`)
