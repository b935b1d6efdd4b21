/**
 * One upstream call of a 2026-07-28 request: lease an upstream of the target in its era (native,
 * or translated onto a pooled session-era one declaring this client's bridgeable capabilities),
 * start the request on it with the revision's headers and `_meta` when native, and (forward)
 * wait for its answer and release the lease.
 */
import type { JsonRpcMessage, UpstreamFactory } from '../../targets/types.ts'
import { MODERN_REVISION } from '../protocol.ts'
import { tracer } from '../../observability/tracing.ts'
import { bridgedOf } from '../upstreams/client-capabilities.ts'
import { isNotModern, type PoolCall, type PooledUpstream, type TargetEra } from '../upstreams/pool.ts'
import { NATIVE_PER_KEY } from '../upstreams/target-era.ts'
import type { ModernContext, Running } from './context.ts'
import { modernError } from './answer.ts'
import { hookTo, type ModernRequest } from './request.ts'
import { header } from '../headers.ts'
import { NAME_SOURCE, encodeHeaderValue } from './validation.ts'
import { authOf, credentialReady } from '../credentials.ts'

/**
 * A leased upstream of `factory` in its era; a native one that stopped speaking the revision is asked
 * again. `known`: the era the caller already asked for this request, after its own credential
 * pre-flight (named.ts); without it, a target with `auth` first has the caller's credential
 * (../credentials.ts): a refusal rejects with the broker's ProxyError, before any exchange. One
 * pre-flight per request and target, so a cache hit is counted once.
 */
export async function lease(cx: ModernContext, ex: ModernRequest, factory: UpstreamFactory, known?: TargetEra): Promise<PooledUpstream> {
  const auth = authOf(cx.opts.credentials, factory.target)
  const caller = auth === undefined ? undefined : ex.caller
  if (caller !== undefined && known === undefined) await credentialReady(auth, caller, cx.log, ex.ctx)
  const era = known ?? (await cx.eras.of(factory, ex.subjectKey, ex.subject, caller))
  // A translated upstream declares exactly the bridgeable capabilities this client declared (pooled per set).
  const capabilities = bridgedOf(ex.clientCapabilities)
  try {
    return era === 'modern'
      ? await cx.pool.acquire(factory, ex.subjectKey, ex.subject, NATIVE_PER_KEY, { era, caller })
      : await cx.pool.acquire(factory, ex.subjectKey, ex.subject, undefined, { capabilities, caller })
  } catch (err) {
    if (era !== 'modern' || factory.protocol === '2026-07-28' || !isNotModern(err)) throw err
    cx.eras.demote(factory.target)
    return cx.pool.acquire(factory, ex.subjectKey, ex.subject, undefined, { capabilities, caller })
  }
}

/** The revision's request headers for a native HTTP upstream (MCP 2026-07-28 streamable HTTP, "Standard Headers"). */
export function modernHeaders(cx: ModernContext, ex: ModernRequest, target: string, method: string, params: Record<string, unknown>): Record<string, string> {
  const h: Record<string, string> = { 'mcp-protocol-version': MODERN_REVISION, 'mcp-method': method }
  const source = NAME_SOURCE[method]
  const name = source === undefined ? undefined : params[source]
  if (typeof name === 'string') h['mcp-name'] = encodeHeaderValue(name)
  if (method === 'tools/call' && typeof name === 'string') {
    // Mirrored where the upstream's tool declares them; the client's values were checked against the arguments.
    for (const a of cx.paramHeaders.lookup(target, name) ?? []) {
      const v = header(ex.ctx, 'mcp-param-' + a.name.toLowerCase())
      if (v !== undefined) h['mcp-param-' + a.name.toLowerCase()] = v
    }
  }
  return h
}

/** Leases an upstream of `factory` and starts one request on it; the caller releases the lease. */
export async function start(
  cx: ModernContext,
  ex: ModernRequest,
  factory: UpstreamFactory,
  method: string,
  params: Record<string, unknown>,
  bridge = false,
  era?: TargetEra
): Promise<Running> {
  const entry = await lease(cx, ex, factory, era)
  try {
    const caps = entry.initResult?.capabilities as Record<string, unknown> | undefined
    const native = entry.era === 'modern'
    if (!native && ex.logLevel !== undefined && caps?.logging !== undefined) {
      // The session-era upstream keeps one level per process; set it for this request.
      await entry.call({ jsonrpc: '2.0', method: 'logging/setLevel', params: { level: ex.logLevel } }).done
    }
    const hooks = hookTo(ex, {})
    if (native) {
      // As the client sent it: protocol version, client info, per-request capabilities, log level.
      params = { ...params, _meta: { ...ex.meta, ...((params._meta ?? {}) as Record<string, unknown>) } }
      hooks.headers = modernHeaders(cx, ex, factory.target, method, params)
    }
    const msg: JsonRpcMessage = { jsonrpc: '2.0', method, params }
    const traced = tracer?.upstreamCall(ex.ctx, factory.target, msg)
    const asked: JsonRpcMessage[] = []
    const take =
      bridge && !native
        ? (req: JsonRpcMessage): void => {
            asked.push(req)
            run.wake?.()
          }
        : undefined
    const run: Running & { call: PoolCall } = { entry, hooks, call: undefined as unknown as PoolCall, asked, wake: undefined, take }
    hooks.onServerRequest = take
    run.call = entry.call(msg, hooks)
    if (traced !== undefined) void run.call.done.then(traced)
    return run
  } catch (err) {
    cx.pool.release(entry)
    throw err
  }
}

/** Leases an upstream, forwards one request, releases. */
export async function forward(
  cx: ModernContext,
  ex: ModernRequest,
  factory: UpstreamFactory,
  method: string,
  params: Record<string, unknown>
): Promise<{ res: JsonRpcMessage; entry: PooledUpstream }> {
  // The access log's target: with one target every request is its; fan-outs name none.
  if (!cx.multi) ex.ctx.target = factory.target
  const run = await start(cx, ex, factory, method, params)
  try {
    ex.calls.add(run.call)
    const res = await run.call.done
    ex.calls.delete(run.call)
    return { res: modernError(res), entry: run.entry }
  } finally {
    cx.pool.release(run.entry)
  }
}
