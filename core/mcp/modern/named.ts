/**
 * tools/call, prompts/get and resources/read in 2026-07-28: routed by name or URI through the shared
 * target namespace (routing/named-call.ts, the step both eras run), refused calls answered as the upstream answers an item it does not have, native targets
 * given the request as it is, translated ones parked on input requests (input-required.ts).
 */
import { NAMED, type NamedMethod } from '../protocol.ts'
import { markNamedAnswer, resolveNamedCall } from '../routing/named-call.ts'
import type { ModernContext, Settled } from './context.ts'
import { decorate, errorStatus, modernError, serverInfoOf } from './answer.ts'
import { resume, settle } from './input-required.ts'
import { checkParamHeaders } from './param-check.ts'
import type { ModernRequest } from './request.ts'
import { adoptTask } from './tasks.ts'
import { start } from './upstream-call.ts'
import { authOf, credentialReady, mayStandIn } from '../credentials.ts'

/** tools/call, prompts/get, resources/read: route by name or URI, refuse what the rules deny. */
export async function named(cx: ModernContext, ex: ModernRequest, method: NamedMethod, params: Record<string, unknown>): Promise<void> {
  const { kind, field } = NAMED[method]
  const value = params[field]
  // An unknown target prefix (the gateway's own namespace), or a resource URI refused (resource-uri.ts).
  const routed = typeof value === 'string' ? resolveNamedCall(cx.namespace, ex.ctx, method, params) : { answer: cx.namespace.unknown(kind, value) }
  if ('answer' in routed) {
    await ex.answer(modernError(routed.answer))
    return
  }
  const { target: factory, name, standIn } = routed
  ex.ctx.target = factory.target
  // After the rules: a refused call costs no credential (unless one is cached, it is the gateway's unknown
  // item), an allowed one has the caller's before anything reaches the target (a refusal is the answer).
  const auth = authOf(cx.opts.credentials, factory.target)
  if (auth !== undefined && standIn !== undefined && !mayStandIn(auth, ex.caller)) {
    await ex.answer(modernError(cx.namespace.unknown(kind, value)))
    return
  }
  if (auth !== undefined && standIn === undefined) await credentialReady(auth, ex.caller, cx.log, ex.ctx)
  let settled: Settled | undefined
  if (standIn === undefined && kind === 'tool') await checkParamHeaders(cx, ex, factory, name, params.arguments)
  // The target's era, asked once for this request (not for a refused call: it never reaches the target as itself).
  const era = standIn === undefined ? await cx.eras.of(factory, ex.subjectKey, ex.subject, auth === undefined ? undefined : ex.caller) : undefined
  const native = era === 'modern'
  if (standIn !== undefined) {
    // Refused: answered exactly as the upstream answers an item it does not have.
    delete params.inputResponses
    delete params.requestState
    settled = await settle(cx, ex, await start(cx, ex, factory, method, params, true), method, value)
    if (settled !== undefined) settled = { res: standIn.restore(settled.res), entry: settled.entry }
  } else if (native) {
    // inputResponses and requestState are the upstream's own (MCP 2026-07-28 Multi Round-Trip Requests): as they are.
    settled = await settle(cx, ex, await start(cx, ex, factory, method, params, true, era), method, value)
  } else if (params.requestState !== undefined) {
    settled = await resume(cx, ex, method, value, params)
  } else {
    delete params.inputResponses
    settled = await settle(cx, ex, await start(cx, ex, factory, method, params, true, era), method, value)
  }
  if (settled === undefined) return
  const { res, entry } = settled
  if (res.error !== undefined) {
    await ex.answer(res, errorStatus(res))
    return
  }
  if (native && kind === 'tool' && (res.result as { resultType?: unknown } | undefined)?.resultType === 'task') {
    await adoptTask(cx, ex, factory, name, res, entry)
    return
  }
  // As in the session era: URIs in results carry their target, so the gateway's resources/read takes them.
  markNamedAnswer(cx.namespace, factory.target, method, res)
  const result = (res.result ?? {}) as Record<string, unknown>
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, method, result, serverInfoOf(cx, entry)) })
}
