/**
 * The MCP vocabulary of the gateway: the revisions it serves, every
 * `io.modelcontextprotocol/*` key, the revision's error codes, and the one
 * place that decides, per request, which
 * era serves it: the session era (initialize + Mcp-Session-Id, revisions
 * 2024-11-05 .. 2025-11-25) or the modern stateless era (2026-07-28: no
 * initialize, protocol version in every request's `_meta` and in the
 * `MCP-Protocol-Version` header). Everything else in core/mcp/ asks this file; protocol literals live
 * nowhere else (test/dependency-rules.test.ts).
 */
import type { RequestContext } from '../context.ts'
import type { JsonRpcMessage } from '../targets/types.ts'
import { VERSION } from '../version.ts'

/** Session-era revisions we serve, newest first. */
export const SESSION_REVISIONS = ['2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'] as const
export type SessionRevision = (typeof SESSION_REVISIONS)[number]
export const LATEST_SESSION_REVISION: SessionRevision = '2025-11-25'
/** The stateless revision (modern/). */
export const MODERN_REVISION = '2026-07-28'
/** Revision assumed when a session-era request carries no MCP-Protocol-Version (MCP 2025-06-18, transports). */
export const DEFAULT_HEADER_REVISION: SessionRevision = '2025-03-26'

/** `_meta` keys of the revision (MCP 2026-07-28 basic: `_meta`), and the prefix they share. */
export const META = {
  protocolVersion: 'io.modelcontextprotocol/protocolVersion',
  clientInfo: 'io.modelcontextprotocol/clientInfo',
  clientCapabilities: 'io.modelcontextprotocol/clientCapabilities',
  logLevel: 'io.modelcontextprotocol/logLevel',
  serverInfo: 'io.modelcontextprotocol/serverInfo',
  subscriptionId: 'io.modelcontextprotocol/subscriptionId',
} as const
export const META_PREFIX = 'io.modelcontextprotocol/'
/** `_meta` key tying a message to a task (MCP 2025-11-25 tasks: related-task). */
export const RELATED_TASK = 'io.modelcontextprotocol/related-task'
/** The tasks extension (SEP-2663): negotiated per request under `clientCapabilities.extensions`. */
export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks'

/** Error codes the 2026-07-28 revision defines (MCP 2026-07-28 basic: Error Codes). */
export const MODERN_RPC = {
  HEADER_MISMATCH: -32020,
  MISSING_REQUIRED_CLIENT_CAPABILITY: -32021,
  UNSUPPORTED_PROTOCOL_VERSION: -32022,
} as const
/** What MCP SDK servers answer for an unknown session (and so do we, on every path). */
export const SESSION_NOT_FOUND_RPC = -32001

/** How the gateway names itself to clients (several targets) and to upstreams (pooled clients). */
export const GATEWAY_INFO: Readonly<{ name: string; version: string }> = Object.freeze({
  name: 'mcp-proxy',
  version: VERSION,
})

/*
 * The method tables both eras dispatch by (legacy/session.ts, modern/handler.ts): which requests
 * name one item, list the items of every target, or address one task.
 */

export type ListKey = 'tools' | 'prompts' | 'resources' | 'resourceTemplates'

/** List methods and the result field that holds their items (MCP server features). */
export const LIST_KEYS = {
  'tools/list': 'tools',
  'prompts/list': 'prompts',
  'resources/list': 'resources',
  'resources/templates/list': 'resourceTemplates',
} as const satisfies Readonly<Record<string, ListKey>>

export type ListMethod = keyof typeof LIST_KEYS

/** Narrows a method once, so that the list code needs no lookup that might miss. */
export function isListMethod(method: string): method is ListMethod {
  return Object.hasOwn(LIST_KEYS, method)
}

/** Requests addressed to one named item: its kind and the param that names it. */
export const NAMED = {
  'tools/call': { kind: 'tool', field: 'name' },
  'prompts/get': { kind: 'prompt', field: 'name' },
  'resources/read': { kind: 'resource', field: 'uri' },
  'resources/subscribe': { kind: 'resource', field: 'uri' },
  'resources/unsubscribe': { kind: 'resource', field: 'uri' },
} as const satisfies Readonly<Record<string, { readonly kind: 'tool' | 'prompt' | 'resource'; readonly field: 'name' | 'uri' }>>

export type NamedMethod = keyof typeof NAMED

export function isNamedMethod(method: string): method is NamedMethod {
  return Object.hasOwn(NAMED, method)
}

/** Task methods addressed to one task by `params.taskId` (MCP 2025-11-25 basic/utilities/tasks). */
export const TASK_METHODS: ReadonlySet<string> = new Set(['tasks/get', 'tasks/result', 'tasks/cancel'])

/** An error answer the gateway makes itself (its id is set where it is sent). */
export function rpcError(code: number, message: string): JsonRpcMessage {
  return { jsonrpc: '2.0', error: { code, message } }
}

/** The least time an upstream gets to answer `initialize` / `server/discover`, whatever the request timeout. */
export const INIT_TIMEOUT_MIN_MS = 15_000
/** Interval of SSE keep-alive comments on long-lived streams (GET streams, subscriptions/listen). */
export const KEEPALIVE_MS = 15_000

const SESSION_SET: ReadonlySet<string> = new Set(SESSION_REVISIONS)

export function isSessionRevision(v: unknown): v is SessionRevision {
  return typeof v === 'string' && SESSION_SET.has(v)
}

/** The lifecycle rule: the client's revision when we support it, else our latest. */
export function negotiateRevision(requested: unknown): SessionRevision {
  return isSessionRevision(requested) ? requested : LATEST_SESSION_REVISION
}

/** JSON-RPC batches exist only in 2025-03-26 (added there, removed in 2025-06-18). */
export function allowsBatch(rev: SessionRevision): boolean {
  return rev === '2025-03-26'
}

/**
 * The era of a client's request: `legacy` (sessions, 2024-11-05 .. 2025-11-25, as the SDK names it; the
 * config value `protocol: session` keeps its name) or `modern` (2026-07-28). Not the era a target
 * speaks (upstreams/pool.ts `TargetEra`).
 */
export type Era = 'legacy' | 'modern'

/**
 * Decides the era of one request (MCP 2026-07-28, Versioning: a dual-era
 * server selects its behaviour from how the client opens). Modern when the
 * `MCP-Protocol-Version` header says 2026-07-28; or (POST) the body's first
 * message carries a `_meta` protocol version — a modern envelope, whatever
 * version it names, so that an unknown one gets the revision's
 * UnsupportedProtocolVersion error — without a session id (with one, only
 * 2026-07-28 itself counts: the session id is then ignored); or the body is
 * `server/discover` without session and version headers; or the header names
 * no session-era revision and there is no session id. `initialize` is
 * always session era (`legacy`). Called once per request, by endpoint.ts,
 * which hands the decision on.
 */
export function eraOf(ctx: RequestContext, body?: unknown): Era {
  const header = ctx.req.headers['mcp-protocol-version']
  if (header === MODERN_REVISION) return 'modern'
  const sid = ctx.req.headers['mcp-session-id']
  if (body !== undefined && !Array.isArray(body) && body !== null && typeof body === 'object') {
    const m = body as { method?: unknown; params?: { _meta?: Record<string, unknown> } }
    if (m.method === 'initialize') return 'legacy'
    const v = m.params?._meta?.[META.protocolVersion]
    if (v === MODERN_REVISION) return 'modern'
    if (typeof v === 'string' && sid === undefined) return 'modern'
    if (m.method === 'server/discover' && header === undefined && sid === undefined) return 'modern'
  }
  if (typeof header === 'string' && !isSessionRevision(header) && sid === undefined) return 'modern'
  return 'legacy'
}
