/**
 * The named-call step both eras share (tools/call, prompts/get, resources/read, and the session
 * era's resources/subscribe and unsubscribe): resolve the client's name or URI to its target and
 * the upstream's name, refuse what the rules deny (the call goes on under a stand-in, so that the
 * refusal reads exactly as the upstream's answer for an item it does not have: policy.ts), and
 * mark the answer's names and URIs as the client sees them. Forwarding is the era's own (a
 * session's link: legacy/session.ts; a pooled upstream: modern/named.ts).
 */
import type { RequestContext } from '../../context.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { NAMED, type NamedMethod } from '../protocol.ts'
import type { StandIn, TargetNamespace } from './namespace.ts'

export interface NamedCall<T> {
  readonly target: T
  /** The upstream's own name (several targets), or the URI the rules saw (resource-uri.ts). */
  readonly name: string
  /** Set when the rules refused the call: it goes on under `standIn.value`. */
  readonly standIn: StandIn | undefined
}

/**
 * Resolves and checks one named call; `params[field]` is rewritten to what the upstream is sent
 * (its own name, or the stand-in). Or the answer to give instead (an unknown target prefix, a
 * resource URI refused).
 */
export function resolveNamedCall<T extends { readonly target: string }>(
  namespace: TargetNamespace<T>,
  ctx: RequestContext,
  method: NamedMethod,
  params: Record<string, unknown>
): NamedCall<T> | { readonly answer: JsonRpcMessage } {
  const { kind, field } = NAMED[method]
  const routed = namespace.route(kind, params[field])
  if ('answer' in routed) return routed
  const { target } = routed
  const name = String(routed.name)
  // A subscription the rules deny goes on under a stand-in too: the upstream never hears of the
  // denied URI, and the answer is its answer for a URI it does not have.
  const standIn =
    kind !== 'resource' || method === 'resources/read'
      ? namespace.refuse(ctx, method, kind, name, target.target)
      : namespace.refuseWatch(ctx, name, target.target)
  params[field] = standIn === undefined ? routed.name : standIn.value
  return { target, name, standIn }
}

/**
 * The answer of a named call with the names and URIs in it as the client sees them (several
 * targets): a read's contents, the links and embedded resources of a call or a prompt.
 */
export function markNamedAnswer<T extends { readonly target: string }>(
  namespace: TargetNamespace<T>,
  target: string,
  method: NamedMethod,
  r: JsonRpcMessage
): JsonRpcMessage {
  if (method === 'resources/read') return namespace.markContents(target, r)
  return NAMED[method].kind === 'resource' ? r : namespace.markUris(target, r)
}
