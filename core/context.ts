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
  /**
   * The caller's validated access token, for the credential layer only (core/credentials/: the
   * `subject_token` of a token exchange, the `assertion` of an on-behalf-of request); it never
   * reaches a target. Never enumerable: JSON.stringify, a log line, structuredClone, a spread or
   * util.inspect of an AuthInfo do not show it. Build one with `authInfo()`; the context re-wraps
   * an AuthInfo whose token is an ordinary property.
   */
  readonly token?: string
}

/** What `authInfo()` is given: the fields of an AuthInfo, the token as a plain value. */
export interface AuthInfoInit {
  readonly subject: string
  readonly claims: Readonly<Record<string, unknown>>
  readonly expiresAt?: number | undefined
  readonly token?: string | undefined
}

const INSPECT = Symbol.for('nodejs.util.inspect.custom')

/** An AuthInfo whose token is a getter over a private field: not an own property, so no copy or serialiser sees it. */
class VerifiedAuth implements AuthInfo {
  readonly subject: string
  readonly claims: Readonly<Record<string, unknown>>
  declare readonly expiresAt?: number
  readonly #token: string | undefined

  constructor(init: AuthInfoInit) {
    this.subject = init.subject
    this.claims = init.claims
    if (init.expiresAt !== undefined) this.expiresAt = init.expiresAt
    this.#token = init.token
    Object.freeze(this)
  }

  get token(): string | undefined {
    return this.#token
  }

  /** util.inspect (console.log, a debugger, `getters: true` included) shows what JSON.stringify shows. */
  [INSPECT](): Record<string, unknown> {
    return this.expiresAt === undefined
      ? { subject: this.subject, claims: this.claims }
      : { subject: this.subject, claims: this.claims, expiresAt: this.expiresAt }
  }
}

/** An AuthInfo (frozen) carrying `token` where only `auth.token` reads it. */
export function authInfo(init: AuthInfoInit): AuthInfo {
  return new VerifiedAuth(init)
}

/**
 * `auth` as the context keeps it: unchanged, unless its token is an ordinary (enumerable) property,
 * as a plugin written without `authInfo()` may set it; then a copy with the token hidden.
 */
export function concealToken(auth: AuthInfo): AuthInfo {
  return Object.prototype.propertyIsEnumerable.call(auth, 'token') ? new VerifiedAuth(auth) : auth
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
  /** Set by the authentication plugin after a token was verified (its token hidden: `concealToken`). */
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
