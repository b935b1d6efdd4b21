/**
 * The primary's /metrics with `workers`: every worker's Prometheus text
 * exposition, each series labelled with its worker, merged with the
 * primary's own series into one exposition (HELP and TYPE once per family).
 */

interface Family {
  meta: string[]
  samples: string[]
}

/** Adds `worker="N"` to every series of a Prometheus text exposition, and merges families (HELP/TYPE once). */
export function mergeMetrics(parts: ReadonlyArray<{ worker: number; text: string }>, own: string): string {
  const families = new Map<string, Family>()
  add(families, own, undefined)
  for (const p of parts) add(families, p.text, `worker="${p.worker}"`)
  let out = ''
  for (const f of families.values()) out += f.meta.join('\n') + '\n' + (f.samples.length > 0 ? f.samples.join('\n') + '\n' : '')
  return out
}

function familyOf(families: Map<string, Family>, name: string): Family {
  let f = families.get(name)
  if (f === undefined) {
    f = { meta: [], samples: [] }
    families.set(name, f)
  }
  return f
}

/** One exposition into `families`; `label` (undefined: the primary's own) is added to each sample. */
function add(families: Map<string, Family>, text: string, label: string | undefined): void {
  let current: Family | undefined
  for (const line of text.split('\n')) {
    if (line === '') continue
    if (line.startsWith('# ')) {
      const [, kind, name] = line.split(' ', 3)
      if (kind !== 'HELP' && kind !== 'TYPE') continue
      current = familyOf(families, name!)
      if (current.meta.length < 2 && !current.meta.some(m => m.startsWith(`# ${kind} `))) current.meta.push(line)
      continue
    }
    const brace = line.indexOf('{')
    const space = line.indexOf(' ')
    const target = current ?? familyOf(families, line.slice(0, brace !== -1 && brace < space ? brace : space))
    if (label === undefined) target.samples.push(line)
    else if (brace !== -1 && brace < space) target.samples.push(`${line.slice(0, brace + 1)}${label},${line.slice(brace + 1)}`.replace(',}', '}'))
    else target.samples.push(`${line.slice(0, space)}{${label}}${line.slice(space)}`)
  }
}
