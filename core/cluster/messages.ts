/**
 * The IPC vocabulary between the primary and its workers (`workers: N`,
 * node:cluster): what each side may send, and the names both sides agree on.
 * Every message carries `t: 'mcpp:…'` so that other users of the channel are
 * told apart; either side ignores what it does not know.
 */

/** Set in a worker's environment: its slot, 1..N (stable across replacements, so metric labels are too). */
export const WORKER_ENV = 'MCP_PROXY_WORKER'
/** Selects the worker whose admin listener a request is relayed to. */
export const WORKER_HEADER = 'mcp-proxy-worker'

/** How long the primary waits for a worker's answer (readiness, metrics, a state operation). */
export const ASK_TIMEOUT_MS = 2000

/** The SharedState operations a worker asks its primary's store for. */
export type StateOp = 'take' | 'join' | 'renew' | 'leave' | 'putOnce' | 'takeOnce'
export const STATE_OPS: ReadonlySet<string> = new Set<StateOp>(['take', 'join', 'renew', 'leave', 'putOnce', 'takeOnce'])

/** What the primary asks a worker. */
export type Question = 'ready' | 'metrics'

export type ToPrimary =
  | { t: 'mcpp:hello' }
  | { t: 'mcpp:up'; adminUrl?: string }
  | { t: 'mcpp:state'; id: number; op: StateOp; args: unknown[] }
  | { t: 'mcpp:group'; pid: number; alive: boolean }
  | { t: 'mcpp:answer'; id: number; value: unknown }
export type ToWorker =
  | { t: 'mcpp:init'; secret: string }
  | { t: 'mcpp:state'; id: number; ok: boolean; value?: unknown; error?: string }
  | { t: 'mcpp:ask'; id: number; what: Question }
