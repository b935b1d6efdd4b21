/**
 * "Did you mean" for configuration keys: the allowed key nearest to a typo,
 * by edit distance with adjacent transpositions (optimal string alignment),
 * case-insensitive. Only close matches are offered: at most one edit per
 * three characters (at least one, at most three), so a wholly unknown key
 * gets no guess.
 */

/** Optimal-string-alignment distance between `a` and `b`. */
export function editDistance(a: string, b: string): number {
  const rows = a.length + 1
  const cols = b.length + 1
  const d: number[][] = Array.from({ length: rows }, (_, i) => Array.from({ length: cols }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)))
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1)
      d[i]![j] = v
    }
  }
  return d[a.length]![b.length]!
}

/** The allowed key closest to `key`, when close enough to be a typo of it. */
export function closestKey(key: string, allowed: Iterable<string>): string | undefined {
  const k = key.toLowerCase()
  const limit = Math.max(1, Math.min(3, Math.floor(k.length / 3)))
  let best: string | undefined
  let bestDistance = limit + 1
  for (const candidate of allowed) {
    const distance = editDistance(k, candidate.toLowerCase())
    if (distance < bestDistance) {
      best = candidate
      bestDistance = distance
    }
  }
  return best
}

/** `unknown key`, with `(did you mean "x"?)` when an allowed key is near. */
export function unknownKeyMessage(key: string, allowed: Iterable<string>): string {
  const near = closestKey(key, allowed)
  return near === undefined ? 'unknown key' : `unknown key (did you mean "${near}"?)`
}
