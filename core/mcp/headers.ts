/**
 * Reading the request headers the MCP transport defines, one rule for both
 * eras. A repeated field is read as node:http hands it over: its lines joined
 * with ", " (RFC 9110 §5.3), except the singletons node keeps the first of
 * (Content-Type among them). So a list header split over lines (Accept)
 * reads as one list, and an MCP singleton sent twice (Mcp-Session-Id,
 * MCP-Protocol-Version, Mcp-Method, Mcp-Name, Mcp-Param-*) reads as "a, b",
 * which matches no valid value and is refused where it is checked. An array
 * (node gives one only for Set-Cookie) is joined the same way. Pinned by
 * test/mcp-repeated-headers.test.ts.
 */
import type { RequestContext } from '../context.ts'
import { ProxyError, RPC } from '../errors.ts'

/** The value of request header `name` (lower case), repeated lines joined with ", "; undefined when absent. */
export function header(ctx: RequestContext, name: string): string | undefined {
  const v = ctx.req.headers[name]
  return Array.isArray(v) ? v.join(', ') : v
}

/** Visible ASCII, 0x21 to 0x7E: what MCP allows in a session id (Streamable HTTP, Session Management). */
function isVisibleAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x21 || c > 0x7e) return false
  }
  return true
}

/**
 * 400 for a malformed Mcp-Session-Id, before any lookup (or passthrough):
 * by the rule above a repeated one reads as "a, b", whose space fails the
 * same check; the message then says the header came twice.
 */
export function checkSessionIdSyntax(ctx: RequestContext): void {
  const sid = ctx.req.headers['mcp-session-id']
  if (typeof sid !== 'string' || isVisibleAscii(sid)) return
  let count = 0
  const raw = ctx.req.rawHeaders
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.length === 14 && raw[i]!.toLowerCase() === 'mcp-session-id') count++
  throw new ProxyError(
    'MCPP_ERR_BAD_REQUEST',
    400,
    count > 1 ? 'Bad Request: more than one Mcp-Session-Id header' : 'Bad Request: Mcp-Session-Id must be visible ASCII characters (0x21-0x7E)',
    { rpcCode: RPC.INVALID_REQUEST }
  )
}
