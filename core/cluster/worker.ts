/**
 * A worker's end of the IPC channel to its primary (`workers: N`): it
 * receives the per-run secret, asks the primary's store for every shared
 * state operation (so caps, limits and single-use codes hold across workers),
 * answers the primary's readiness and metrics questions, and reports the
 * process groups of its stdio children so that the primary can kill them if
 * this worker dies.
 */
import type { Logger } from 'pino'
import type { ProbeReadiness } from '../admin/probes.ts'
import { ProxyError } from '../errors.ts'
import { ASK_TIMEOUT_MS, WORKER_ENV, type StateOp, type ToPrimary, type ToWorker } from './messages.ts'
import type { SharedState } from './shared-state.ts'

export interface WorkerChannel {
  readonly slot: number
  /** The per-run secret that seals session ids (drawn by the primary). */
  readonly secret: string
  /** Caps, limits and codes in the primary's store (the SharedState contract). */
  readonly shared: SharedState
  /** Tells the primary the worker serves (and where its admin listener is). */
  up(adminUrl: string | undefined): void
  /** Answers the primary's readiness and metrics questions. */
  answer(handlers: WorkerAnswers): void
}

export interface WorkerAnswers {
  ready(): ProbeReadiness | undefined
  metrics(): Promise<string>
}

export interface ConnectWorkerOptions {
  readonly log: Logger
  /**
   * Installs the one watcher of this process's stdio child process groups
   * (core/targets/stdio.ts `watchChildGroups`, handed in by the composition
   * root: the cluster knows no transport). Each group is reported to the
   * primary from then on.
   */
  readonly watchChildGroups: (watcher: (pid: number, alive: boolean) => void) => void
}

function send(message: ToPrimary): void {
  // The channel is gone when the primary died: the worker is shutting down then ('disconnect').
  if (process.connected) process.send!(message)
}

function unavailable(why: string): ProxyError {
  return new ProxyError('MCPP_ERR_SHARED_STATE', 503, 'Service Unavailable: shared state (the primary process) is unreachable', {
    cause: new Error(why),
    headers: { 'retry-after': '1' },
    expose: true,
  })
}

interface Pending {
  resolve(v: unknown): void
  reject(e: unknown): void
  timer: NodeJS.Timeout
}

/** The SharedState contract over IPC: each operation is one question to the primary's store, answered or timed out. */
class PrimaryStateClient {
  readonly #pending = new Map<number, Pending>()
  #nextId = 1

  call(op: StateOp, args: unknown[]): Promise<unknown> {
    if (!process.connected) return Promise.reject(unavailable('IPC channel closed'))
    const id = this.#nextId++
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id)
        reject(unavailable(`no answer within ${ASK_TIMEOUT_MS} ms`))
      }, ASK_TIMEOUT_MS)
      this.#pending.set(id, { resolve, reject, timer })
      send({ t: 'mcpp:state', id, op, args })
    })
  }

  settle(m: Extract<ToWorker, { t: 'mcpp:state' }>): void {
    const p = this.#pending.get(m.id)
    if (p === undefined) return
    this.#pending.delete(m.id)
    clearTimeout(p.timer)
    if (m.ok) p.resolve(m.value)
    else p.reject(unavailable(m.error ?? 'failed'))
  }

  failAll(): void {
    for (const [id, p] of this.#pending) {
      clearTimeout(p.timer)
      p.reject(unavailable('closing'))
      this.#pending.delete(id)
    }
  }

  state(): SharedState {
    const call = (op: StateOp, args: unknown[]): Promise<unknown> => this.call(op, args)
    return {
      kind: 'primary',
      take: (key, capacity, windowMs) => call('take', [key, capacity, windowMs]) as Promise<number>,
      join: (key, member, limit, leaseMs) => call('join', [key, member, limit, leaseMs]) as Promise<boolean>,
      renew: async (entries, leaseMs) => {
        if (entries.length > 0) await call('renew', [entries, leaseMs])
      },
      leave: async (key, member) => {
        await call('leave', [key, member])
      },
      putOnce: (key, value, ttlMs) => call('putOnce', [key, value, ttlMs]) as Promise<boolean>,
      takeOnce: key => call('takeOnce', [key]) as Promise<string | undefined>,
      ready: () => (process.connected ? { ready: true } : { ready: false, reason: 'the primary process is gone' }),
      close: async () => {
        this.failAll()
      },
    }
  }
}

/** The primary's readiness or metrics question, answered with what the gateway says (nothing yet while it starts). */
function answerQuestion(m: Extract<ToWorker, { t: 'mcpp:ask' }>, handlers: WorkerAnswers | undefined, log: Logger): void {
  const reply = (value: unknown): void => send({ t: 'mcpp:answer', id: m.id, value })
  if (handlers === undefined) reply(m.what === 'ready' ? undefined : '')
  else if (m.what === 'ready') reply(handlers.ready())
  else
    handlers.metrics().then(reply, (err: unknown) => {
      log.warn({ err }, 'rendering metrics for the primary failed')
      reply('')
    })
}

/** In a worker: says hello, waits for the primary's secret, and reports child process groups from now on. */
export function connectWorker(o: ConnectWorkerOptions): Promise<WorkerChannel> {
  const slot = Number(process.env[WORKER_ENV])
  const client = new PrimaryStateClient()
  const shared = client.state()
  let handlers: WorkerAnswers | undefined
  o.watchChildGroups((pid, alive) => send({ t: 'mcpp:group', pid, alive }))

  return new Promise((resolve, reject) => {
    process.on('message', (m: ToWorker) => {
      if (m === null || typeof m !== 'object') return
      if (m.t === 'mcpp:init') {
        resolve({
          slot,
          secret: m.secret,
          shared,
          up: adminUrl => send({ t: 'mcpp:up', adminUrl }),
          answer: h => {
            handlers = h
          },
        })
      } else if (m.t === 'mcpp:state') client.settle(m)
      else if (m.t === 'mcpp:ask') answerQuestion(m, handlers, o.log)
    })
    process.once('disconnect', () => reject(new Error('the primary process went away before start-up')))
    send({ t: 'mcpp:hello' })
  })
}
