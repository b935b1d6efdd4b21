/**
 * Readiness of the targets (docs/configuration.md "Reference (summary)", `mcp.readiness.targets`): whether each stdio target
 * could be spawned (core/targets/command-check.ts), checked at start-up and
 * again every `recheckMs` while one fails, so installing the command (or
 * mounting the directory) makes the gateway ready without a restart. HTTP
 * targets are not probed: reaching them is a network question of every
 * request, not of start-up.
 *
 * `mcp.readiness.targets` decides what a failing target does to /readyz:
 * `all` (any failing target makes the gateway not ready), `any` (not ready
 * only when no target can start, i.e. when every initialize would fail),
 * `none` (reported only). Default: `all` with `failClosed` (one failing
 * target fails every initialize), else `any` (sessions open with the
 * healthy targets, so the gateway still serves).
 */
import type { Logger } from 'pino'
import type { TargetConfig } from '../config.ts'
import { commandProblem } from './command-check.ts'

export type TargetReadinessMode = 'all' | 'any' | 'none'

export interface TargetHealth {
  readonly name: string
  readonly ok: boolean
  /** Why the target cannot start. */
  readonly error?: string
}

export class TargetReadiness {
  readonly mode: TargetReadinessMode
  readonly #targets: readonly TargetConfig[]
  readonly #baseDir: string
  readonly #log: Logger
  readonly #recheckMs: number
  readonly #problems = new Map<string, string>()
  #timer: NodeJS.Timeout | undefined
  #closed = false

  constructor(opts: { targets: readonly TargetConfig[]; baseDir: string; log: Logger; mode: TargetReadinessMode; recheckMs?: number }) {
    this.#targets = opts.targets
    this.#baseDir = opts.baseDir
    this.#log = opts.log
    this.mode = opts.mode
    this.#recheckMs = opts.recheckMs ?? 10_000
  }

  /** Checks every stdio target once (concurrently); schedules a recheck while one fails. Never throws. */
  async check(): Promise<void> {
    await Promise.all(
      this.#targets.map(async t => {
        if (t.stdio === undefined) return
        const problem = await commandProblem(t.stdio, this.#baseDir).catch((err: unknown) => (err as Error).message)
        const before = this.#problems.get(t.name)
        if (problem === undefined) {
          this.#problems.delete(t.name)
          if (before !== undefined) this.#log.info({ target: t.name }, 'target can start again')
        } else {
          this.#problems.set(t.name, problem)
          if (before !== problem) this.#log.error({ target: t.name, error: problem }, 'target cannot start: every session that needs it fails')
        }
      })
    )
    if (this.#problems.size > 0 && !this.#closed && this.#timer === undefined) {
      this.#timer = setTimeout(() => {
        this.#timer = undefined
        void this.check()
      }, this.#recheckMs)
      this.#timer.unref()
    }
  }

  targets(): TargetHealth[] {
    return this.#targets.map(t => {
      const error = this.#problems.get(t.name)
      return error === undefined ? { name: t.name, ok: true } : { name: t.name, ok: false, error }
    })
  }

  /** Reasons the targets make the gateway not ready, by `mode`. */
  reasons(): string[] {
    if (this.mode === 'none' || this.#problems.size === 0) return []
    if (this.mode === 'any' && this.#problems.size < this.#targets.length) return []
    return [...this.#problems].map(([name, error]) => `target ${name}: ${error}`)
  }

  close(): void {
    this.#closed = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
  }
}
