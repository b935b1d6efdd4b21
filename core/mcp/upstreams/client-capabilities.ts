/**
 * The one table of client capabilities the gateway bridges between a client and a pooled upstream
 * (MCP client features: sampling, elicitation, roots): which capability each server-to-client
 * request needs, which of a client's declared capabilities an upstream is told of, and what the
 * gateway declares upstream as their session-era client. Used by the 2026-07-28 handler (modern/)
 * and by shared children of the session era (legacy/shared-upstream.ts), which bridge all but roots.
 */

/** Client capabilities the gateway can bridge. */
export type Bridged = 'sampling' | 'elicitation' | 'roots'

export const BRIDGED: readonly Bridged[] = ['sampling', 'elicitation', 'roots']

/** What a shared child is declared: never roots (it asks for them outside any one client's request, which no lease can answer). */
export const SHARED_CHILD_BRIDGED: readonly Bridged[] = ['sampling', 'elicitation']

/** Server-to-client request method -> the client capability it needs. */
export const CAPABILITY_OF_REQUEST: Readonly<Record<string, Bridged>> = {
  'sampling/createMessage': 'sampling',
  'elicitation/create': 'elicitation',
  'roots/list': 'roots',
}

/** What the gateway declares to pooled upstreams as their (session-era) client, unless told a narrower set. */
export const UPSTREAM_CAPABILITIES = { sampling: {}, elicitation: { form: {} } } as const

/** The bridgeable capabilities `caps` declares (present and not null). */
export function bridgedOf(caps: Readonly<Record<string, unknown>>, among: readonly Bridged[] = BRIDGED): Bridged[] {
  return among.filter(k => caps[k] !== undefined && caps[k] !== null)
}

/**
 * The session-era client capabilities declaring exactly `kinds` (form elicitation only; roots
 * without listChanged: a stateless client cannot tell of a change).
 */
export function upstreamCapabilities(kinds: readonly Bridged[]): Record<string, unknown> {
  const caps: Record<string, unknown> = {}
  if (kinds.includes('sampling')) caps.sampling = {}
  if (kinds.includes('elicitation')) caps.elicitation = { form: {} }
  if (kinds.includes('roots')) caps.roots = {}
  return caps
}
