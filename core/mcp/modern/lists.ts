/**
 * The 2026-07-28 requests answered from every target or the one a reference names: server/discover
 * (capabilities and instructions merged), the lists (one target's page as it is, or merged pages),
 * and completion/complete.
 */
import type { JsonRpcMessage, UpstreamFactory } from '../../targets/types.ts'
import { RPC } from '../../errors.ts'
import { mergeCapabilities } from '../routing/naming.ts'
import { GATEWAY_INFO, LIST_KEYS, type ListMethod } from '../protocol.ts'
import { invalidList } from '../routing/namespace.ts'
import type { PooledUpstream } from '../upstreams/pool.ts'
import type { ModernContext } from './context.ts'
import { decorate, serverInfoOf, toolsOf } from './answer.ts'
import type { ModernRequest } from './request.ts'
import { forward, lease } from './upstream-call.ts'
import { SUPPORTED_VERSIONS } from './validation.ts'
import { authOf, mayStandIn, refusalAmong } from '../credentials.ts'

export async function discover(cx: ModernContext, ex: ModernRequest): Promise<void> {
  const parts = await Promise.allSettled(cx.opts.targets.map(f => lease(cx, ex, f)))
  const live: PooledUpstream[] = []
  const failed: string[] = []
  const reasons: unknown[] = []
  parts.forEach((p, i) => {
    if (p.status === 'fulfilled') {
      live.push(p.value)
      cx.pool.release(p.value)
    } else {
      failed.push(cx.opts.targets[i]!.target)
      reasons.push(p.reason)
    }
  })
  if (live.length === 0 || (failed.length > 0 && cx.opts.failClosed)) {
    // A target whose credential was refused is left out like one that is down; when that fails the
    // request, the refusal is the answer (its status and challenge tell the client what to do).
    const refusal = refusalAmong(reasons)
    if (refusal !== undefined) throw refusal
    await ex.fail(RPC.SERVER_ERROR, `upstream ${failed.join(', ')} failed to start`, 502)
    return
  }
  const caps = (e: PooledUpstream): Record<string, unknown> => {
    const c = { ...((e.initResult?.capabilities ?? {}) as Record<string, unknown>) }
    delete c.tasks // tasks are an extension from 2026-07-28 on; the gateway does not bridge them
    return c
  }
  const result: Record<string, unknown> = {
    supportedVersions: SUPPORTED_VERSIONS,
    capabilities: cx.multi ? mergeCapabilities(live.map(caps)) : caps(live[0]!),
  }
  const instructions = cx.namespace.instructions(live)
  if (instructions !== undefined) result.instructions = instructions
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, 'server/discover', result, serverInfoOf(cx, live[0])) })
}

export async function list(cx: ModernContext, ex: ModernRequest, method: ListMethod, params: Record<string, unknown>): Promise<void> {
  if (!cx.multi) {
    const { res, entry } = await forward(cx, ex, cx.opts.targets[0]!, method, params)
    if (res.error !== undefined) {
      await ex.answer(res)
      return
    }
    // The result is decorated below, so it must be an object even when no rule reads its items.
    const invalid =
      cx.namespace.checkList(entry.target, method, res.result) ??
      (res.result === null || typeof res.result !== 'object' ? invalidList(entry.target, method, LIST_KEYS[method], res.result) : undefined)
    if (invalid !== undefined) {
      cx.log.warn({ target: entry.target, method, err: invalid.message }, 'invalid upstream list result')
      await ex.fail(invalid.code, invalid.message)
      return
    }
    const result = res.result as Record<string, unknown>
    if (method === 'tools/list') cx.paramHeaders.learn(entry.target, toolsOf(result), params.cursor === undefined)
    cx.namespace.filterResult(ex.ctx, method, result, entry.target)
    await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, method, result, serverInfoOf(cx, entry)) })
    return
  }
  const fetch = async (f: UpstreamFactory, page: Record<string, unknown>): Promise<JsonRpcMessage> => {
    const { res } = await forward(cx, ex, f, method, page)
    if (method === 'tools/list') cx.paramHeaders.learn(f.target, toolsOf(res.result), page.cursor === undefined)
    return res
  }
  const merged = await cx.namespace.mergeLists(ex.ctx, method, fetch, () => ex.aborted, cx.log, cx.opts.failClosed)
  if (merged.error !== undefined) {
    await ex.answer(merged)
    return
  }
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, method, merged.result as Record<string, unknown>, GATEWAY_INFO) })
}

export async function complete(cx: ModernContext, ex: ModernRequest, params: Record<string, unknown>): Promise<void> {
  const routed = cx.namespace.completion(ex.ctx, params.ref as { type?: string; name?: unknown; uri?: unknown } | undefined)
  if (routed === undefined) {
    await ex.fail(RPC.INVALID_PARAMS, 'Unknown completion reference')
    return
  }
  const factory = routed.target
  ex.ctx.target = factory.target
  // A refused completion costs no credential: unless one is cached, the gateway's answer for a reference it does not know.
  const auth = routed.standIn === undefined ? undefined : authOf(cx.opts.credentials, factory.target)
  if (auth !== undefined && !mayStandIn(auth, ex.caller)) {
    await ex.fail(RPC.INVALID_PARAMS, 'Unknown completion reference')
    return
  }
  const forwarded = await forward(cx, ex, factory, 'completion/complete', params)
  const { entry } = forwarded
  // Refused: the upstream's answer for a reference it does not have, with the caller's name.
  const res = routed.standIn === undefined ? forwarded.res : routed.standIn.restore(forwarded.res)
  if (res.error !== undefined) {
    await ex.answer(res)
    return
  }
  await ex.answer({ jsonrpc: '2.0', result: decorate(cx, ex, 'completion/complete', (res.result ?? {}) as Record<string, unknown>, serverInfoOf(cx, entry)) })
}
