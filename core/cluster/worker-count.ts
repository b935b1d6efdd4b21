/**
 * How many processes serve the MCP port (`workers`, `--workers`): the
 * setting as a count, and the command-line flag as the CLI accepts it.
 */
import { availableParallelism } from 'node:os'

/** `workers` as a count: `auto` is the available cores. */
export function workerCount(value: number | 'auto'): number {
  return value === 'auto' ? Math.max(1, availableParallelism()) : value
}

/** `--workers` as given on the command line; an error message when it is neither a count nor `auto`. */
export function parseWorkersFlag(text: string): number | 'auto' | string {
  if (text === 'auto') return 'auto'
  if (!/^\d{1,2}$/.test(text) || Number(text) < 1 || Number(text) > 64) return `--workers: must be an integer from 1 to 64 or "auto" (got "${text}")`
  return Number(text)
}
