/**
 * stdio upstream: one child process speaking newline-delimited JSON-RPC on
 * stdin/stdout (MCP stdio transport). Who the child serves (one legacy
 * session, a subject's pool under `share: subject`, 2026-07-28 requests) is
 * the MCP layer's business; this module only runs the process.
 *
 * Owns: spawning in its own process group (so `npx` grandchildren can be
 * killed with it), the child's environment allow-list, bounded framing of
 * stdout (a flood or a giant line ends that child, never the gateway),
 * rate-limited stderr to the log, the stdin backlog bound, and the shutdown
 * escalation stdin end -> SIGTERM -> SIGKILL to the whole group. A
 * module-level registry of live groups lets the gateway kill every child on
 * shutdown (and on a bare process exit), and lets a cluster worker report
 * its groups to the primary (`watchChildGroups`).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process'
import { stat } from 'node:fs/promises'
import { resolve } from 'node:path'
import type { Logger } from 'pino'
import type { StdioTargetConfig } from '../config.ts'
import { ProxyError } from '../errors.ts'
import type { Metrics, Counter } from '../observability/metrics.ts'
import type { JsonRpcMessage, Upstream, UpstreamObserver } from './types.ts'

/**
 * Variables of the gateway's own environment a child may inherit. Anything
 * else (tokens, client secrets, proxy URLs with credentials, NODE_OPTIONS
 * that could load the gateway's own loaders) must be given explicitly in the
 * target's `env` map, e.g. `env: { HTTPS_PROXY: "${HTTPS_PROXY}" }`.
 * `npm_config_cache` and `NODE_EXTRA_CA_CERTS` are paths, not secrets, and
 * `npx`-launched servers need them in locked-down hosts.
 */
export const CHILD_ENV_ALLOW_LIST: readonly string[] = Object.freeze([
  'PATH',
  'HOME',
  'USER',
  'LOGNAME',
  'SHELL',
  'TERM',
  'LANG',
  'LC_ALL',
  'LC_CTYPE',
  'TZ',
  'TMPDIR',
  'TEMP',
  'TMP',
  'XDG_CACHE_HOME',
  'XDG_CONFIG_HOME',
  'XDG_DATA_HOME',
  'npm_config_cache',
  'NODE_EXTRA_CA_CERTS',
  // Windows basics a process needs to start at all.
  'SYSTEMROOT',
  'SYSTEMDRIVE',
  'WINDIR',
  'COMSPEC',
  'PATHEXT',
  'APPDATA',
  'LOCALAPPDATA',
  'USERPROFILE',
  'HOMEDRIVE',
  'HOMEPATH',
  'USERNAME',
  'PROGRAMFILES',
  'PROCESSOR_ARCHITECTURE',
])

/** The child's environment: the allow-listed part of `parent` plus the target's `env` (which wins). */
export function childEnv(extra: Readonly<Record<string, string>> = {}, parent: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const env: Record<string, string> = {}
  for (const name of CHILD_ENV_ALLOW_LIST) {
    const v = parent[name]
    // Exported shell functions (`() {...`) are never passed on (cf. Shellshock).
    if (v !== undefined && !v.startsWith('()')) env[name] = v
  }
  for (const [k, v] of Object.entries(extra)) env[k] = v
  return env
}

export interface StdioUpstreamOptions {
  /** Target name, on every log line. */
  target: string
  config: Readonly<StdioTargetConfig>
  /** The caller's environment (UpstreamAttachment.env), after the target's own `env`. */
  env?: Readonly<Record<string, string>>
  /** Directory `config.cwd` is relative to (the config file's directory). */
  baseDir: string
  /** Longest stdout line accepted (`mcp.limits.maxLineBytes`). */
  maxLineBytes: number
  log: Logger
  metrics?: Metrics
  /** Told of start and end (lifecycle.ts); never of messages. */
  observer?: UpstreamObserver
  /** How long each shutdown stage waits before escalating. Default 2000 ms. */
  stageTimeoutMs?: number
}

/** Bound on one logged stderr line and on logged excerpts of dropped stdout lines. */
const STDERR_LINE_MAX = 4096
const EXCERPT_MAX = 200
/** stderr lines logged per second per child; the rest are counted and dropped. */
const STDERR_LINES_PER_SEC = 200
/** Unwritten stdin data that means the child has stopped reading: it is ended. */
const STDIN_BACKLOG_MAX = 64 * 1024 * 1024

/** Live children (including ones whose group is still being reaped). */
const registry = new Set<StdioUpstream>()
let exitHookInstalled = false
/** Told of each child process group as it starts and once it is gone (`workers`: the primary kills a dead worker's groups). */
let groupWatcher: ((pid: number, alive: boolean) => void) | undefined

/** Reports every child process group from now on (one watcher: the worker's channel to its primary, core/cluster/worker.ts). */
export function watchChildGroups(watcher: (pid: number, alive: boolean) => void): void {
  groupWatcher = watcher
}

function installExitHook(): void {
  if (exitHookInstalled) return
  exitHookInstalled = true
  // Last resort when the gateway exits without closing its sessions: the
  // 'exit' event allows only synchronous work, so no escalation, just SIGKILL.
  process.on('exit', function killChildrenOnExit() {
    for (const u of registry) killGroup(u.pid, 'SIGKILL')
  })
}

/** Sends a signal to a whole process group; false when the group no longer exists. */
function killGroup(pid: number | undefined, signal: NodeJS.Signals | 0): boolean {
  if (pid === undefined || pid <= 0) return false
  try {
    process.kill(process.platform === 'win32' ? pid : -pid, signal)
    return true
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false
    // EPERM: a member changed credentials; nothing more we can do.
    return false
  }
}

function delay(ms: number): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms))
}

/** Waits for `p` or `ms`, whichever comes first; true when `p` settled. */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const t = new Promise<false>(resolve => {
    timer = setTimeout(resolve, ms, false)
  })
  try {
    return await Promise.race([p.then(() => true), t])
  } finally {
    clearTimeout(timer)
  }
}

function excerpt(buf: Buffer | string): string {
  const s = typeof buf === 'string' ? buf : buf.subarray(0, EXCERPT_MAX * 4).toString('utf8')
  return s.length > EXCERPT_MAX ? s.slice(0, EXCERPT_MAX) + '…' : s
}

/** Kills every live stdio child (stdin end -> SIGTERM -> SIGKILL per group) and waits for them. */
export async function killAllChildren(): Promise<void> {
  await Promise.all([...registry].map(u => u.close()))
}

/** Number of live stdio children (for metrics and tests). */
export function liveChildCount(): number {
  return registry.size
}

/** `reason` of mcp_proxy_upstream_exits_total: every value, so each series can start at 0. */
export const STDIO_EXIT_REASONS = ['start_failed', 'exited', 'stdin_backlog', 'line_too_long'] as const
export type StdioExitReason = (typeof STDIO_EXIT_REASONS)[number]

export class StdioUpstream implements Upstream {
  readonly target: string
  readonly kind = 'stdio' as const
  onMessage: (message: JsonRpcMessage) => void = () => {}
  onClose: (error: Error | undefined) => void = () => {}

  readonly #opts: StdioUpstreamOptions
  readonly #log: Logger
  readonly #stage: number
  #child: ChildProcessWithoutNullStreams | undefined
  #pid: number | undefined
  #startedAt: number | undefined
  #lastError: string | undefined
  #state: 'new' | 'starting' | 'running' | 'stopping' | 'exited' = 'new'
  #closeReported = false
  #exited: Promise<void> = Promise.resolve()
  #markExited: () => void = () => {}
  #reaped: Promise<void> | undefined
  #closing: Promise<void> | undefined
  #startDone: Promise<unknown> = Promise.resolve()
  /** Set when stdout must no longer be parsed (flood, failure). */
  #discardStdout = false
  // stdout framing: pieces of the current (unterminated) line
  #pending: Buffer[] = []
  #pendingBytes = 0
  // stderr framing
  #errPending = ''
  #errWindowStart = 0
  #errWindowCount = 0
  #errDropped = 0
  readonly #dropped: Counter | undefined
  readonly #exits: Counter | undefined

  constructor(opts: StdioUpstreamOptions) {
    this.#opts = opts
    this.target = opts.target
    this.#log = opts.log.child({ target: opts.target })
    this.#stage = opts.stageTimeoutMs ?? 2000
    this.#dropped = opts.metrics?.counter('mcp_proxy_upstream_dropped_lines_total', 'Non-JSON stdout lines of stdio targets that were dropped')
    this.#exits = opts.metrics?.counter('mcp_proxy_upstream_exits_total', 'Upstream ends by target and reason')
  }

  get pid(): number | undefined {
    return this.#pid
  }
  get startedAt(): number | undefined {
    return this.#startedAt
  }
  get lastError(): string | undefined {
    return this.#lastError
  }
  get alive(): boolean {
    return this.#state === 'running'
  }

  start(): Promise<void> {
    if (this.#state !== 'new') return Promise.reject(new Error('StdioUpstream.start() called twice'))
    this.#state = 'starting'
    const obs = this.#opts.observer
    obs?.started(this)
    const p = this.#start()
    this.#startDone = p.catch((err: unknown) => {
      obs?.ended(this, err as Error)
    })
    return p
  }

  async #start(): Promise<void> {
    const { config, baseDir } = this.#opts
    const cwd = resolve(baseDir, config.cwd ?? '.')
    try {
      const s = await stat(cwd)
      if (!s.isDirectory()) throw Object.assign(new Error(`cwd ${cwd} is not a directory`), { code: 'ENOTDIR' })
    } catch (err) {
      return this.#startFailed(err, `working directory ${cwd}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
    }
    if (this.#state !== 'starting') return this.#startFailed(undefined, 'closed before it started')
    let child: ChildProcessWithoutNullStreams
    try {
      child = spawn(config.cmd, config.args ?? [], {
        cwd,
        env: childEnv(this.#opts.env === undefined ? config.env : { ...config.env, ...this.#opts.env }),
        stdio: ['pipe', 'pipe', 'pipe'],
        // Own process group: close() and crashes kill the whole group, so
        // grandchildren (npx -> node server) never outlive the session.
        detached: true,
        windowsHide: true,
      })
    } catch (err) {
      // Synchronous failures: invalid arguments (e.g. a NUL byte in cmd).
      return this.#startFailed(err, (err as Error).message)
    }
    this.#child = child
    try {
      await new Promise<void>((resolve, reject) => {
        const onSpawn = (): void => {
          child.off('error', onError)
          resolve()
        }
        const onError = (err: Error): void => {
          child.off('spawn', onSpawn)
          reject(err)
        }
        child.once('spawn', onSpawn)
        child.once('error', onError)
      })
    } catch (err) {
      this.#child = undefined
      child.stdin.destroy()
      child.stdout.destroy()
      child.stderr.destroy()
      const e = err as NodeJS.ErrnoException
      return this.#startFailed(err, e.code === 'ENOENT' ? `${config.cmd}: command not found (ENOENT)` : `${config.cmd}: ${e.code ?? e.message}`)
    }
    this.#pid = child.pid
    this.#startedAt = Date.now()
    this.#exited = new Promise<void>(resolve => {
      this.#markExited = resolve
    })
    registry.add(this)
    if (child.pid !== undefined) groupWatcher?.(child.pid, true)
    installExitHook()
    child.on('error', err => {
      this.#log.warn({ err: err.message }, 'child process error')
    })
    child.once('exit', (code, signal) => {
      this.#onExit(code, signal)
    })
    child.stdout.on('data', (chunk: Buffer) => {
      this.#onStdout(chunk)
    })
    child.stdout.on('error', err => {
      this.#log.debug({ err: err.message }, 'child stdout error')
    })
    child.stderr.on('data', (chunk: Buffer) => {
      this.#onStderr(chunk)
    })
    child.stderr.on('error', err => {
      this.#log.debug({ err: err.message }, 'child stderr error')
    })
    // EPIPE / ECONNRESET when the child dies with writes in flight: its exit
    // follows and reports the close; never let it throw in the gateway.
    child.stdin.on('error', err => {
      this.#log.debug({ err: (err as NodeJS.ErrnoException).code ?? err.message }, 'child stdin error')
    })
    if (this.#state === 'starting') {
      this.#state = 'running'
      this.#log.info({ pid: child.pid, cmd: config.cmd }, 'target started')
    } else {
      // close() ran while we were spawning: it is now waiting for this child.
      child.stdin.end()
      throw this.#notRunning()
    }
  }

  #startFailed(err: unknown, detail: string): never {
    if (this.#state !== 'stopping') this.#state = 'exited'
    this.#lastError = detail
    this.#exits?.inc({ target: this.target, reason: 'start_failed' })
    this.#log.error({ detail }, 'target failed to start')
    throw new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} failed to start: ${detail}`, { cause: err })
  }

  #notRunning(): ProxyError {
    return new ProxyError('MCPP_ERR_UPSTREAM', 502, `target ${this.target} is not running`)
  }

  #corked = false
  readonly #uncork = (): void => {
    this.#corked = false
    this.#child?.stdin.uncork()
  }

  send(message: JsonRpcMessage): void {
    const child = this.#child
    if (this.#state !== 'running' || child === undefined || !child.stdin.writable) throw this.#notRunning()
    // Lines sent in one tick (concurrent requests of a shared child, a
    // session's batch) go out in one write.
    if (!this.#corked) {
      this.#corked = true
      child.stdin.cork()
      process.nextTick(this.#uncork)
    }
    child.stdin.write(JSON.stringify(message) + '\n')
    // A child that stops reading its stdin would make the gateway buffer
    // without bound; past a generous backlog the child is treated as stuck.
    if (child.stdin.writableLength > STDIN_BACKLOG_MAX) {
      this.#fail(new Error(`target ${this.target} stopped reading its stdin (backlog over ${STDIN_BACKLOG_MAX} bytes)`), 'stdin_backlog')
    }
  }

  #deliver(value: unknown, raw: Buffer): void {
    if (value === null || typeof value !== 'object' || (value as { jsonrpc?: unknown }).jsonrpc !== '2.0') {
      this.#dropped?.inc({ target: this.target })
      this.#log.warn({ line: excerpt(raw) }, 'dropped stdout line that is not a JSON-RPC message')
      return
    }
    try {
      this.onMessage(value as JsonRpcMessage)
    } catch (err) {
      this.#log.error({ err }, 'onMessage handler threw')
    }
  }

  #onLine(line: Buffer): void {
    let end = line.length
    if (end > 0 && line[end - 1] === 0x0d) end--
    const body = end === line.length ? line : line.subarray(0, end)
    const text = body.toString('utf8')
    if (text.trim() === '') return
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch {
      this.#dropped?.inc({ target: this.target })
      this.#log.warn({ line: excerpt(text) }, 'dropped stdout line that is not JSON')
      return
    }
    // A JSON-RPC batch answer: deliver each member.
    if (Array.isArray(value)) for (const v of value) this.#deliver(v, body)
    else this.#deliver(value, body)
  }

  #onStdout(chunk: Buffer): void {
    const max = this.#opts.maxLineBytes
    let start = 0
    // Framing works on bytes: a multi-byte UTF-8 character split across two
    // chunks is only decoded once its line is complete.
    while (start < chunk.length && !this.#discardStdout) {
      const nl = chunk.indexOf(0x0a, start)
      const piece = chunk.subarray(start, nl === -1 ? chunk.length : nl)
      if (this.#pendingBytes + piece.length > max) {
        this.#pending = []
        this.#pendingBytes = 0
        this.#fail(new Error(`target ${this.target} wrote a stdout line longer than ${max} bytes`), 'line_too_long')
        return
      }
      if (nl === -1) {
        this.#pending.push(piece)
        this.#pendingBytes += piece.length
        return
      }
      const line = this.#pending.length === 0 ? piece : Buffer.concat([...this.#pending, piece])
      this.#pending = []
      this.#pendingBytes = 0
      this.#onLine(line)
      start = nl + 1
    }
  }

  #onStderr(chunk: Buffer): void {
    let text = this.#errPending + chunk.toString('utf8')
    const lines = text.split('\n')
    text = lines.pop() ?? ''
    // An unterminated stderr line is bounded too: log what we have.
    if (text.length > STDERR_LINE_MAX) {
      lines.push(text)
      text = ''
    }
    this.#errPending = text
    for (const l of lines) this.#logStderr(l)
  }

  #logStderr(line: string): void {
    const l = line.endsWith('\r') ? line.slice(0, -1) : line
    if (l === '') return
    const now = Date.now()
    if (now - this.#errWindowStart >= 1000) {
      if (this.#errDropped > 0) this.#log.warn({ dropped: this.#errDropped }, 'stderr lines dropped (rate limit)')
      this.#errWindowStart = now
      this.#errWindowCount = 0
      this.#errDropped = 0
    }
    if (++this.#errWindowCount > STDERR_LINES_PER_SEC) {
      this.#errDropped++
      return
    }
    this.#log.info({ pid: this.#pid, stderr: l.length > STDERR_LINE_MAX ? l.slice(0, STDERR_LINE_MAX) + '…' : l }, 'target stderr')
  }

  #reportClose(error: Error | undefined): void {
    if (this.#closeReported) return
    this.#closeReported = true
    if (error !== undefined) this.#lastError = error.message
    this.#opts.observer?.ended(this, error)
    try {
      this.onClose(error)
    } catch (err) {
      this.#log.error({ err }, 'onClose handler threw')
    }
  }

  /** Ends the child because of something it did: report now, then escalate. */
  #fail(error: Error, reason: StdioExitReason): void {
    if (this.#state !== 'running') return
    this.#state = 'stopping'
    this.#exits?.inc({ target: this.target, reason })
    this.#log.error({ pid: this.#pid, reason }, error.message)
    this.#discardStdout = true
    this.#child?.stdout.destroy()
    this.#reportClose(error)
    this.#closing = this.#terminate(false)
    this.#closing.catch(() => {})
  }

  #onExit(code: number | null, signal: NodeJS.Signals | null): void {
    const wasRunning = this.#state === 'running'
    this.#state = 'exited'
    if (this.#errPending !== '') {
      this.#logStderr(this.#errPending)
      this.#errPending = ''
    }
    if (wasRunning) {
      const how = signal !== null ? `signal ${signal}` : `code ${code}`
      const error = new Error(`target ${this.target} exited unexpectedly (${how})`)
      this.#exits?.inc({ target: this.target, reason: 'exited' })
      this.#log.warn({ pid: this.#pid, code, signal }, 'target exited')
      // Give stdout a moment to drain answers written just before the exit;
      // bounded because a grandchild may hold the pipe open.
      const out = this.#child?.stdout
      const drained =
        out === undefined || out.readableEnded || out.destroyed
          ? Promise.resolve()
          : new Promise<void>(resolve => {
              out.once('close', resolve)
              out.once('end', resolve)
            })
      void within(drained, 200).then(() => {
        this.#reportClose(error)
        this.#markExited()
      })
      // Orphaned grandchildren of a crashed child are reaped in the background.
      this.#reaped = this.#reapGroup()
    } else {
      this.#log.info({ pid: this.#pid, code, signal }, 'target stopped')
      this.#markExited()
    }
  }

  /** After the leader exited: SIGTERM, then SIGKILL, whatever remains of its group. */
  async #reapGroup(): Promise<void> {
    const pid = this.#pid
    try {
      if (!killGroup(pid, 0)) return
      killGroup(pid, 'SIGTERM')
      if (await this.#groupGone(this.#stage)) return
      killGroup(pid, 'SIGKILL')
      await this.#groupGone(this.#stage)
    } finally {
      this.#child?.stdout.destroy()
      this.#child?.stderr.destroy()
      this.#child?.stdin.destroy()
      if (registry.delete(this) && this.#pid !== undefined) groupWatcher?.(this.#pid, false)
    }
  }

  /** Polls (bounded) until no process of the group is left. */
  async #groupGone(ms: number): Promise<boolean> {
    const step = 25
    for (let waited = 0; waited < ms; waited += step) {
      if (!killGroup(this.#pid, 0)) return true
      await delay(step)
    }
    return !killGroup(this.#pid, 0)
  }

  /** stdin end (when `gentle`) -> SIGTERM -> SIGKILL, to the leader's whole group. */
  async #terminate(gentle: boolean): Promise<void> {
    const child = this.#child
    if (child === undefined) return
    const pid = this.#pid
    const exited = (): boolean => this.#state === 'exited'
    if (!exited()) {
      let done = false
      if (gentle) {
        child.stdin.end()
        done = await within(this.#exited, this.#stage)
      }
      if (!done && !exited()) {
        this.#log.debug({ pid }, 'sending SIGTERM to process group')
        killGroup(pid, 'SIGTERM')
        done = await within(this.#exited, this.#stage)
      }
      if (!done && !exited()) {
        this.#log.warn({ pid }, 'target ignored SIGTERM; sending SIGKILL to process group')
        killGroup(pid, 'SIGKILL')
      }
    }
    await this.#exited
    this.#reaped ??= this.#reapGroup()
    await this.#reaped
  }

  close(): Promise<void> {
    if (this.#closing !== undefined) return this.#closing
    const state = this.#state
    if (state === 'new' || (state === 'exited' && this.#child === undefined)) {
      this.#state = 'exited'
      this.#reportClose(undefined)
      this.#closing = Promise.resolve()
      return this.#closing
    }
    if (state === 'exited') {
      // Crashed earlier: onClose(error) already ran; finish reaping.
      this.#closing = this.#exited.then(() => this.#reaped)
      return this.#closing
    }
    this.#state = 'stopping'
    this.#closing = (async () => {
      if (state === 'starting') {
        // start() is still running; once spawned it ends stdin itself.
        await this.#startDone
        if (this.#child === undefined) {
          this.#state = 'exited'
          this.#reportClose(undefined)
          return
        }
      }
      await this.#terminate(true)
      this.#reportClose(undefined)
    })()
    return this.#closing
  }
}
