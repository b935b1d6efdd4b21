/**
 * The key that sessions, per-subject caps and pooled upstreams are bound to:
 * the authenticated subject, or for a caller without one its client address.
 * Without authentication every caller used to be one subject, so the
 * 101st anonymous session anywhere got 429 from maxSessionsPerSubject and
 * `share: subject` children were shared by everyone. Behind a reverse proxy
 * all anonymous callers have the proxy's address and share one key again,
 * unless the proxy is one of `mcp.trustedProxies` (then X-Forwarded-For names them).
 */
import type { RequestContext } from '../../context.ts'

export function subjectKeyOf(ctx: RequestContext): string {
  const subject = ctx.auth?.subject
  if (subject !== undefined) return subject
  // The NUL prefix keeps it apart from real subjects: those come from IdP-signed claims,
  // and identity providers do not issue subjects that start with a control character.
  return `\u0000anonymous@${ctx.clientAddress}`
}
