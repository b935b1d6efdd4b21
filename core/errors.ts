/**
 * One error type for everything the gateway answers with a non-2xx status.
 *
 * Every error carries a stable `code` (documented in docs/errors.md, pinned by a
 * test), an HTTP status and whether its message may be shown to the caller.
 * `core/error-writer.ts` is the only place that turns one into a response.
 */

const kProxyError = Symbol.for('mcp-proxy.ProxyError')

/**
 * The codes core itself raises. `UNAUTHORIZED`, `FORBIDDEN` and `BAD_REQUEST`
 * are generic: any plugin that authenticates or refuses uses them. Codes only
 * one plugin raises are declared by that plugin (`PluginModule.errors`).
 */
export const ERROR_CODES = {
  MCPP_ERR_CONFIG: 'Configuration is invalid',
  MCPP_ERR_ENV_NOT_FOUND: 'A ${NAME} reference names an unset environment variable',
  MCPP_ERR_PLUGIN_LOAD: 'A plugin module could not be loaded or created',
  MCPP_ERR_NOT_FOUND: 'No route for this path',
  MCPP_ERR_METHOD_NOT_ALLOWED: 'HTTP method not allowed on this path',
  MCPP_ERR_BODY_TOO_LARGE: 'Request body exceeds the configured limit',
  MCPP_ERR_BAD_REQUEST: 'Malformed HTTP request',
  MCPP_ERR_TOO_MANY_HEADERS: 'More header fields than mcp.limits.maxHeaders',
  MCPP_ERR_REQUEST_TIMEOUT: 'Request body not received within mcp.limits.bodyTimeoutMs',
  MCPP_ERR_UNAUTHORIZED: 'Missing or invalid bearer token',
  MCPP_ERR_FORBIDDEN: 'Authenticated but not allowed (authorization rule or origin)',
  MCPP_ERR_NOT_ACCEPTABLE: 'Accept header does not allow the response types MCP needs',
  MCPP_ERR_UNSUPPORTED_MEDIA_TYPE: 'Content-Type is not application/json',
  MCPP_ERR_PARSE: 'Body is not valid JSON',
  MCPP_ERR_INVALID_REQUEST: 'Body is not a valid JSON-RPC request',
  MCPP_ERR_SESSION_REQUIRED: 'Mcp-Session-Id header is required',
  MCPP_ERR_SESSION_NOT_FOUND: 'Unknown or ended MCP session',
  MCPP_ERR_PROTOCOL_VERSION: 'Unsupported MCP-Protocol-Version',
  MCPP_ERR_HEADER_MISMATCH: 'Mcp-Method / Mcp-Name header does not match the body',
  MCPP_ERR_SHUTTING_DOWN: 'The gateway is shutting down: no new sessions or listen streams',
  MCPP_ERR_SESSION_LIMIT: 'Open sessions reached mcp.session.maxSessions',
  MCPP_ERR_SUBJECT_SESSION_LIMIT: "The caller's sessions reached mcp.session.maxSessionsPerSubject",
  MCPP_ERR_PROCESS_LIMIT: 'Pooled upstream processes reached mcp.session.maxSessions',
  MCPP_ERR_STREAM_CONFLICT: 'The session already has an open GET stream',
  MCPP_ERR_UPSTREAM: 'Upstream MCP server failed',
  MCPP_ERR_TARGET_STEP_UP: "The identity provider needs the user's consent or more authentication before it issues a target's credential",
  MCPP_ERR_TARGET_CREDENTIAL: "A target's credential cannot be made for this caller (a claim missing or invalid, the exchange refused, another audience)",
  MCPP_ERR_IDP_UNAVAILABLE: 'The identity provider could not be reached, timed out or answered what cannot be read',
  MCPP_ERR_STARTING: 'The gateway is still starting',
  MCPP_ERR_SHARED_STATE: 'Shared state (Redis) is unreachable',
  MCPP_ERR_INTERNAL: 'Unexpected internal error',
} as const

export type CoreErrorCode = keyof typeof ERROR_CODES
/** A core code, or one a plugin declared with `createError` (upper-case, e.g. `MCPP_ERR_KEYS_UNAVAILABLE`). */
export type ErrorCode = CoreErrorCode | (string & {})

export interface ProxyErrorOptions {
  /** Extra response headers, e.g. `WWW-Authenticate` or `Retry-After`. */
  headers?: Record<string, string>
  /** OAuth `error` value; when set the body is `{error, error_description}` on every route. */
  oauthError?: string
  /** JSON-RPC error code used when the error is answered on `/mcp`. */
  rpcCode?: number
  /** Whether `message` may be sent to the caller. Defaults to `statusCode < 500`. */
  expose?: boolean
  /** Extra JSON fields merged into an OAuth-style body, or the JSON-RPC error's `data` on `/mcp` (never secrets). */
  data?: Record<string, unknown>
  cause?: unknown
}

export class ProxyError extends Error {
  readonly code: ErrorCode
  readonly statusCode: number
  readonly expose: boolean
  readonly headers: Readonly<Record<string, string>>
  readonly oauthError: string | undefined
  readonly rpcCode: number | undefined
  readonly data: Readonly<Record<string, unknown>> | undefined

  constructor(code: ErrorCode, statusCode: number, message: string, options: ProxyErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause })
    this.name = 'ProxyError'
    this.code = code
    this.statusCode = statusCode
    this.expose = options.expose ?? statusCode < 500
    this.headers = options.headers ?? {}
    this.oauthError = options.oauthError
    this.rpcCode = options.rpcCode
    this.data = options.data
  }

  get [kProxyError](): true {
    return true
  }

  /** Works across copies of this package (third-party plugins may bundle their own). */
  static is(value: unknown): value is ProxyError {
    return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[kProxyError] === true
  }
}

/** Upper-case letters, digits and `_`: what a declared error code may be. */
export const ERROR_CODE_RE = /^[A-Z][A-Z0-9_]*$/

/**
 * An error code bound to its HTTP status in one place (fastify's
 * `createError`): call it to get a ProxyError. Plugins list the factories
 * they use in `PluginModule.errors`; the loader refuses a code declared twice.
 */
export interface ErrorFactory {
  (message?: string, options?: ProxyErrorOptions): ProxyError
  readonly code: string
  readonly statusCode: number
  /** One line for the error table (docs/errors.md) and the admin view. */
  readonly description: string
}

export function createError(code: string, statusCode: number, description: string, defaults: ProxyErrorOptions = {}): ErrorFactory {
  if (!ERROR_CODE_RE.test(code)) throw new TypeError(`error code ${code} must match ${ERROR_CODE_RE}`)
  const make = (message: string = description, options: ProxyErrorOptions = {}): ProxyError =>
    new ProxyError(code, statusCode, message, { ...defaults, ...options, headers: { ...defaults.headers, ...options.headers } })
  return Object.assign(make, { code, statusCode, description })
}

/** JSON-RPC 2.0 and MCP error codes used by the gateway. */
export const RPC = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  /** Implementation-defined server errors (-32000..-32099). */
  SERVER_ERROR: -32000,
  CONNECTION_CLOSED: -32000,
  REQUEST_TIMEOUT: -32001,
  RESOURCE_NOT_FOUND: -32002,
} as const
