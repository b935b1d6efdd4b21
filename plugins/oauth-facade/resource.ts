/**
 * RFC 8707 resource indicators at the facade: the gateway issues grants for
 * one resource only, itself, exactly as its protected resource metadata
 * (RFC 9728) advertises it. A token asked for another resource would be a
 * token a malicious MCP server could collect and replay here (MCP
 * authorization, "Token Audience Binding and Validation"), so any other
 * value is refused with `invalid_target` (RFC 8707 §2), on authorize, token
 * and refresh. Compared exactly with the advertised value (or its URL
 * serialization, which is what a client that parses it sends): the MCP
 * client takes the value from that metadata, so any other spelling is
 * another resource.
 *
 * No `resource` at all is accepted and bound to this gateway's resource:
 * clients of MCP revisions before 2025-06-18 do not send it, and a grant of
 * this gateway is only ever for this gateway.
 */

/** The advertised resource and its WHATWG URL serialization (what SDK clients send after `new URL(resource)`). */
function spellings(own: string): ReadonlySet<string> {
  try {
    return new Set([own, new URL(own).href])
  } catch {
    return new Set([own])
  }
}
const cache = new Map<string, ReadonlySet<string>>()

/** Why `resources` (every `resource` the request named) are refused, or undefined. */
export function targetProblem(resources: readonly string[], own: string): string | undefined {
  let accepted = cache.get(own)
  if (accepted === undefined) {
    accepted = spellings(own)
    cache.set(own, accepted)
  }
  if (resources.every(r => accepted.has(r))) return undefined
  return `resource must be this gateway's MCP resource (${own}), as its protected resource metadata names it`
}
