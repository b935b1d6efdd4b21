/**
 * The per-request context every plugin hook and terminal handler receives.
 * Built once per request by `core/server.ts`; what is learnt on the way is
 * added as typed fields (verified claims, the parsed MCP message, the MCP
 * session and target) so later hooks never parse anything twice.
 */
import type { IncomingMessage, ServerResponse, OutgoingHttpHeaders } from 'node:http'
import type { Logger } from 'pino'

/** What the authentication plugin learned about the caller. */
export interface AuthInfo {
  /** The token's `sub` (or `oid`/`client_id` fallback); used to bind sessions. */
  readonly subject: string
  /** Verified JWT claims. Frozen. */
  readonly claims: Readonly<Record<string, unknown>>
  /** `exp` in seconds since the epoch, when present. */
  readonly expiresAt?: number
}

/** The JSON-RPC message(s) of a POST /mcp, parsed once. */
export interface McpMessageInfo {
  /** The parsed body: one message, or an array for a JSON-RPC batch. */
  readonly body: unknown
  /** Method of the (first) request or notification, if any. */
  readonly method?: string
  /** For the access log: `params.name` of tools/call and prompts/get, `params.uri` of resources/* requests. */
  readonly name?: string
}

/** A ready answer a hook or route returns instead of going on. */
export interface Reply {
  status: number
  headers?: OutgoingHttpHeaders
  /** A string or Buffer is sent as is; anything else is sent as JSON. */
  body?: unknown
}

export interface RequestContext {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  /** Request id, also on every log line of this request. */
  readonly id: string
  readonly method: string
  /** Path without the query string. */
  readonly path: string
  /** Raw query string without `?`, or '' */
  readonly query: string
  /** Per-request child logger. */
  readonly log: Logger
  readonly startedAt: bigint
  /**
   * The caller's IP address: the TCP peer, or when the peer is one of
   * `mcp.trustedProxies` the client it names in X-Forwarded-For. Rate limits
   * and anything else keyed per caller use this, never the header itself.
   */
  readonly clientAddress: string
  /** Which error body shape this path uses: JSON-RPC on /mcp, OAuth elsewhere. */
  readonly kind: 'mcp' | 'oauth' | 'other'
  /** Set by the authentication plugin after a token was verified. */
  auth?: AuthInfo
  /** Set the first time `readMcpMessage()` has a POST /mcp body parsed. */
  mcp?: McpMessageInfo
  /** The MCP session this request belongs to (or opened), set by the MCP layer: the access log and traces name it. */
  sessionId?: string
  /** The target that serves this request, set by the MCP layer when one target does (access log). */
  target?: string
  /** Why the request was refused, for the access log and admin UI (never secrets). */
  denial?: Denial
  /** Scratch space for plugins, keyed by plugin name. */
  readonly state: Map<string, unknown>
  /**
   * Reads the whole body once (bounded by `limits.maxBodyBytes`, or by the
   * smaller `maxBytes` a route asks for: 413 beyond it); later calls share
   * the result of the first.
   */
  readBody(maxBytes?: number): Promise<Buffer>
  /**
   * Reads a POST /mcp body once and has the /mcp endpoint parse it
   * (`McpEndpoint.parse`); throws a ProxyError (-32700 / -32600) for invalid
   * JSON or JSON-RPC.
   */
  readMcpMessage(): Promise<McpMessageInfo>
  /**
   * Runs the `onResponse` hooks (in reverse) and writes the status line and headers.
   * Every writer (replies, errors, proxies, SSE streams) goes through here exactly once.
   */
  writeHead(status: number, headers?: OutgoingHttpHeaders): Promise<void>
  /** True once `writeHead` ran. */
  readonly headersSent: boolean
}

/**
 * Why a request was refused, structured so that the access log and the admin
 * view read it as fields instead of parsing a string.
 */
export interface Denial {
  /** Short reason: the refusing rule's text, an error code, a phrase. Never a secret. */
  readonly reason: string
  /** Index of the refusing rule in its plugin's rule list (authorization's `describe().rules`). */
  readonly rule?: number
}

/** A denial as one line of text for the access log and the admin view: `rule[i]: text` for a rule. */
export function denialText(d: Denial): string {
  // A JavaScript plugin written against the earlier contract may still set a string.
  if (typeof d !== 'object' || d === null) return String(d)
  return d.rule !== undefined ? `rule[${d.rule}]: ${String(d.reason)}` : String(d.reason)
}

/** What an `onResponse` hook sees and may change: status and headers, never the body. */
export interface ResponseContext {
  readonly request: RequestContext
  statusCode: number
  readonly headers: OutgoingHttpHeaders
}
