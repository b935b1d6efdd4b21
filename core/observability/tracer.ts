/**
 * The tracing contract: the config block and the hooks the request path
 * calls. Its own module so that core/observability/tracing.ts (which loads
 * the implementation lazily) and tracing-otel.ts (the implementation) both
 * depend on it, not on each other.
 */
import type { RequestContext } from '../context.ts'
import type { JsonRpcMessage } from '../jsonrpc.ts'

/** `tracing:` of the config (schemas/config.schema.json has the defaults). */
export interface TracingConfig {
  readonly enabled: boolean
  /** OTLP/HTTP traces endpoint, the full URL (`…/v1/traces`). */
  readonly endpoint: string
  /** Extra headers on every export (an API key, say); never logged. */
  readonly headers: Readonly<Record<string, string>>
  /** Share of new traces recorded (0..1); a client's sampled flag decides for its own traces. */
  readonly samplingRatio: number
  readonly serviceName: string
  /** Whether the caller's token subject may be recorded (`user.id`). */
  readonly recordSubject: boolean
  /** Spans waiting for export at most; more are dropped. */
  readonly maxQueueSize: number
  /** Time between exports. */
  readonly batchDelayMs: number
  /** Time one export may take. */
  readonly exportTimeoutMs: number
}

/** Ends a span begun by a hook: `error` marks it failed, with a short reason (never a secret). */
export type EndSpan = (error?: string) => void

/** The hooks the request path calls; implemented in tracing-otel.ts. */
export interface Tracer {
  /** The server span of a request (GatewayServer.handle); its parent is the client's `traceparent` header. */
  requestStarted(ctx: RequestContext): void
  /** Ends the request's server span with what the request turned out to be (method, tool, status, session). */
  requestFinished(ctx: RequestContext, status: number): void
  /** A child of the request's server span for token verification; `cached` for a token verified before. */
  verification(ctx: RequestContext, cached: boolean): EndSpan
  /**
   * A client span for one request forwarded to `target`. Puts the span's
   * context into the message's `params._meta` (traceparent, tracestate), as
   * OpenTelemetry's MCP conventions propagate it; the returned function ends
   * the span with the upstream's answer.
   */
  upstreamCall(ctx: RequestContext, target: string, msg: JsonRpcMessage): (answer: JsonRpcMessage) => void
  /**
   * For the single-HTTP-target passthrough: a client span for the exchange,
   * its context in the request's `traceparent` header and, for a POST, in
   * `params._meta` of each message of the body, which is returned rewritten
   * (undefined for GET and DELETE: nothing to rewrite). A body that is not
   * JSON-RPC is returned as it came: the passthrough forwards it and the
   * upstream answers it, exactly as with tracing off. The span ends with
   * the response.
   */
  passthroughCall(ctx: RequestContext, target: string): Promise<Buffer | undefined>
  /**
   * A span for one credential resolve of `target` (core/credentials/), a
   * child of the request's server span when `ctx` is given: `cache` says
   * whether a cached token answered (hit), an exchange with the IdP was made
   * (miss) or another request's exchange was waited for (shared). Never a
   * token; the end names the failure reason, if any.
   */
  credentialExchange(ctx: RequestContext | undefined, target: string, mode: string, cache: 'hit' | 'miss' | 'shared'): EndSpan
  /** Copies the message's `_meta` trace context into the headers of its HTTP request (W3C Trace Context). */
  httpHeaders(msg: JsonRpcMessage, headers: Record<string, string>): void
  /** Exports what is left and stops. */
  shutdown(): Promise<void>
}
