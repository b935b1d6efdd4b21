/**
 * Multi round-trip requests of a translated call (MCP 2026-07-28, Multi Round-Trip Requests): the
 * session-era upstream's server-to-client requests (sampling, elicitation, roots) of one round become
 * an InputRequiredResult, the upstream call parked under a single-use `requestState` until the
 * client retries with `inputResponses` (resume) or it expires.
 */
import { randomBytes } from 'node:crypto'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { MODERN_RPC } from '../protocol.ts'
import { CAPABILITY_OF_REQUEST } from '../upstreams/client-capabilities.ts'
import type { Ask, Continuation, ModernContext, Running, Settled } from './context.ts'
import { decorate, modernError, serverInfoOf } from './answer.ts'
import { hookTo, type ModernRequest } from './request.ts'

/** How long a parked upstream call waits for the client's retry with `inputResponses`. */
const INPUT_TTL_MS = 120_000
/** Upstream calls one subject may have parked on InputRequiredResults at once. */
const MAX_PARKED_PER_SUBJECT = 32
/**
 * An upstream sends the input requests of one round together (the SDK awaits them all at once):
 * after one arrives, the round is collected until none follows for this long.
 */
const ROUND_GATHER_MS = 25

/**
 * Waits for the upstream's answer to a tools/call, prompts/get or
 * resources/read. A server-to-client request arriving first (sampling,
 * elicitation) becomes an InputRequiredResult (MCP 2026-07-28, Multi
 * Round-Trip Requests): the upstream call stays open, its lease held, under
 * a single-use random `requestState` bound to the subject, the method and
 * the name, until the client retries with `inputResponses` or it expires
 * (with workers or replicas the retry is relayed to this process: endpoint.ts).
 * Resolves with the final answer and the upstream that gave it, or undefined when `ex` was answered here.
 */
export async function settle(cx: ModernContext, ex: ModernRequest, run: Running, method: string, name: unknown): Promise<Settled | undefined> {
  ex.calls.add(run.call)
  let answered: JsonRpcMessage | undefined
  void run.call.done.then(res => {
    answered = res
    run.wake?.()
  })
  const wait = (ms?: number): Promise<void> =>
    new Promise<void>(resolve => {
      const timer =
        ms === undefined
          ? undefined
          : setTimeout(() => {
              run.wake = undefined
              resolve()
            }, ms)
      run.wake = () => {
        clearTimeout(timer)
        run.wake = undefined
        resolve()
      }
    })
  // The first server request (or the answer), then the rest of its round.
  while (answered === undefined && run.asked.length === 0) await wait()
  if (answered === undefined) {
    let seen = run.asked.length
    for (;;) {
      await wait(ROUND_GATHER_MS)
      if (answered !== undefined || run.asked.length === seen || run.asked.length >= cx.maxInputs) break
      seen = run.asked.length
    }
  }
  ex.calls.delete(run.call)
  const reqs = run.asked.splice(0)
  // Past the bound the round is cut: the rest are refused, the tool decides what that means.
  for (const req of reqs.splice(cx.maxInputs))
    run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'too many input requests in one round' })
  if (answered !== undefined || reqs.length === 0) {
    // Asked and answered without waiting for the client: its requests are moot, the answer stands.
    for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'request already answered' })
    cx.pool.release(run.entry)
    return { res: modernError(answered ?? (await run.call.done)), entry: run.entry }
  }
  const refuse = (why: string): void => {
    for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.METHOD_NOT_FOUND, message: 'Method not found' })
    run.call.cancel(why)
    cx.pool.release(run.entry)
  }
  const missing = reqs.map(r => CAPABILITY_OF_REQUEST[String(r.method)] ?? String(r.method)).find(need => ex.clientCapabilities[need] === undefined)
  if (missing !== undefined || ex.aborted) {
    // A server MUST NOT rely on capabilities the client did not declare (MCP 2026-07-28 `_meta`).
    refuse('client lacks a required capability')
    await ex.fail(MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY, 'Missing required client capability', 400, {
      requiredCapabilities: { [missing ?? 'sampling']: {} },
    })
    return undefined
  }
  const parked = [...cx.parked.values()].filter(c => c.subjectKey === ex.subjectKey).length
  if (parked >= MAX_PARKED_PER_SUBJECT) {
    for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'too many pending input requests' })
    run.call.cancel('too many pending input requests')
    cx.pool.release(run.entry)
    await ex.fail(RPC.SERVER_ERROR, 'Too many requests waiting for input', 429)
    return undefined
  }
  const state = cx.mintState?.() ?? randomBytes(24).toString('base64url')
  const asks: Ask[] = []
  const inputRequests: Record<string, unknown> = {}
  for (const req of reqs) {
    const key = 'input-' + String(++cx.inputSeq.n)
    asks.push({ key, serverRequestId: req.id! })
    const params = { ...(req.params ?? {}) }
    const meta = params._meta as Record<string, unknown> | undefined
    if (meta !== undefined) {
      // The upstream's progress token (the gateway's mapped one) is no business of the client's.
      const { progressToken: _, ...rest } = meta
      if (Object.keys(rest).length === 0) delete params._meta
      else params._meta = rest
    }
    inputRequests[key] = { method: req.method, params }
  }
  const timer = setTimeout(() => {
    if (cx.parked.get(state) !== cont) return
    cx.parked.delete(state)
    run.call.cancel('input request expired')
    cx.pool.release(run.entry)
  }, INPUT_TTL_MS)
  timer.unref()
  const cont: Continuation = { run, subjectKey: ex.subjectKey, method, name, asks, timer }
  cx.parked.set(state, cont)
  // Parked: another call on this upstream may take a server request meanwhile (stdio routes by "the only one").
  run.hooks.onServerRequest = undefined
  const result = { resultType: 'input_required', inputRequests, requestState: state }
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, method, result, serverInfoOf(cx, run.entry)) })
  return undefined
}

/** A retry carrying `requestState`: answers the upstream's request and goes on waiting for the original call. */
export async function resume(
  cx: ModernContext,
  ex: ModernRequest,
  method: string,
  name: unknown,
  params: Record<string, unknown>
): Promise<Settled | undefined> {
  const state = params.requestState
  const cont = typeof state === 'string' ? cx.parked.get(state) : undefined
  // requestState is attacker-controlled: only an unexpired, unused state of this subject, method and name counts.
  if (cont === undefined || cont.subjectKey !== ex.subjectKey || cont.method !== method || cont.name !== name) {
    await ex.fail(RPC.INVALID_PARAMS, 'Invalid params: unknown or expired requestState')
    return undefined
  }
  cx.parked.delete(state as string)
  clearTimeout(cont.timer)
  // Keys the gateway did not ask for are ignored (MCP 2026-07-28 MRTR, error handling).
  cont.run.hooks.onServerRequest = cont.run.take
  const responses = params.inputResponses as Record<string, unknown> | undefined
  for (const ask of cont.asks) {
    const answer = responses?.[ask.key]
    if (answer === undefined) cont.run.entry.answer(ask.serverRequestId, undefined, { code: RPC.INVALID_PARAMS, message: 'no input response' })
    else cont.run.entry.answer(ask.serverRequestId, answer)
  }
  hookTo(ex, cont.run.hooks)
  return settle(cx, ex, cont.run, method, cont.name)
}

/** Cancels every parked call and releases its upstream (the gateway closing). */
export function closeParked(cx: ModernContext): void {
  for (const [state, c] of cx.parked) {
    cx.parked.delete(state)
    clearTimeout(c.timer)
    c.run.call.cancel('gateway closing')
    cx.pool.release(c.run.entry)
  }
}
