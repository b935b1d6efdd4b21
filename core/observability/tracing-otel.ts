/**
 * The OpenTelemetry side of tracing.ts, loaded only when tracing is
 * enabled: a tracer provider with a batching OTLP/HTTP (JSON) exporter, W3C
 * Trace Context in and out, and span attributes after OpenTelemetry's MCP
 * semantic conventions (gen-ai/mcp.md: `{mcp.method.name} {target}` span
 * names, mcp.*, gen_ai.tool.name, jsonrpc.request.id, rpc.response.status_code).
 */
import type { Logger } from 'pino'
import {
  diag,
  DiagLogLevel,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
  type TextMapGetter,
  type Tracer as OtelApiTracer,
} from '@opentelemetry/api'
import { W3CTraceContextPropagator } from '@opentelemetry/core'
import { resourceFromAttributes } from '@opentelemetry/resources'
import { BasicTracerProvider, BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-base'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { denialText, type RequestContext } from '../context.ts'
import { ProxyError } from '../errors.ts'
import type { JsonRpcMessage } from '../jsonrpc.ts'
import type { EndSpan, Tracer, TracingConfig } from './tracer.ts'

const w3c = new W3CTraceContextPropagator()

/** Reads `traceparent` / `tracestate` from request headers or from a `_meta` object alike. */
const getter: TextMapGetter<Record<string, unknown>> = {
  keys: carrier => Object.keys(carrier),
  get(carrier, key) {
    const v = carrier[key]
    return typeof v === 'string' ? v : Array.isArray(v) && typeof v[0] === 'string' ? v[0] : undefined
  },
}

function setter(carrier: Record<string, unknown>, key: string, value: string): void {
  carrier[key] = value
}

/** What the request's method names: the tool or prompt (low cardinality, the span name's target), or a resource URI (attribute only). */
function targetAttributes(method: string | undefined, params: Record<string, unknown> | undefined, attrs: Attributes): string | undefined {
  if (method === 'tools/call' && typeof params?.name === 'string') {
    attrs['gen_ai.tool.name'] = params.name
    attrs['gen_ai.operation.name'] = 'execute_tool'
    return params.name
  }
  if (method === 'prompts/get' && typeof params?.name === 'string') {
    attrs['gen_ai.prompt.name'] = params.name
    return params.name
  }
  if (typeof params?.uri === 'string' && method?.startsWith('resources/') === true) attrs['mcp.resource.uri'] = params.uri
  return undefined
}

function spanName(method: string, target: string | undefined): string {
  return target === undefined ? method : `${method} ${target}`
}

/** The first request (or notification) of a POST /mcp body. */
function firstMessage(body: unknown): JsonRpcMessage | undefined {
  const list = Array.isArray(body) ? body : [body]
  return list.find(m => typeof (m as JsonRpcMessage | null)?.method === 'string') as JsonRpcMessage | undefined
}

/** The session id as logs and the admin UI show it: its first 8 characters (the whole id is a credential of sorts). */
function sessionOf(ctx: RequestContext): string | undefined {
  return ctx.sessionId?.slice(0, 8)
}

export function createTracer(config: TracingConfig, log: Logger, version: string): Tracer {
  // The SDK reports export failures through `diag`: into our log, warnings and up.
  const dlog = log.child({ component: 'tracing' })
  diag.setLogger(
    {
      error: (msg: string) => dlog.warn(msg),
      warn: (msg: string) => dlog.warn(msg),
      info: () => {},
      debug: () => {},
      verbose: () => {},
    },
    { logLevel: DiagLogLevel.WARN, suppressOverrideMessage: true }
  )
  const exporter = new OTLPTraceExporter({ url: config.endpoint, headers: { ...config.headers }, timeoutMillis: config.exportTimeoutMs })
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': config.serviceName, 'service.version': version }),
    // A client that sent a sampled traceparent has decided for its trace; new traces are sampled by ratio.
    sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(config.samplingRatio) }),
    spanProcessors: [
      new BatchSpanProcessor(exporter, {
        maxQueueSize: config.maxQueueSize,
        maxExportBatchSize: Math.min(512, config.maxQueueSize),
        scheduledDelayMillis: config.batchDelayMs,
        exportTimeoutMillis: config.exportTimeoutMs,
      }),
    ],
  })
  return new OtelTracer(config, provider, dlog, version)
}

/** The Tracer hooks over one tracer provider; each request's server span is kept beside its context until it ends. */
class OtelTracer implements Tracer {
  readonly #config: TracingConfig
  readonly #provider: BasicTracerProvider
  readonly #log: Logger
  readonly #otel: OtelApiTracer
  readonly #servers = new WeakMap<RequestContext, { span: Span; context: Context }>()

  constructor(config: TracingConfig, provider: BasicTracerProvider, log: Logger, version: string) {
    this.#config = config
    this.#provider = provider
    this.#log = log
    this.#otel = provider.getTracer('mcp-idp-gateway', version)
  }

  /** A client span for a call of `msg` to `target`, child of the request's server span. */
  #clientSpan(ctx: RequestContext, target: string, msg: JsonRpcMessage | undefined): Span {
    const method = msg?.method ?? `${ctx.method} ${ctx.path}`
    const attrs: Attributes = { 'mcp_proxy.target': target }
    let name: string | undefined
    if (msg?.method !== undefined) {
      attrs['mcp.method.name'] = msg.method
      attrs['jsonrpc.protocol.version'] = '2.0'
      name = targetAttributes(msg.method, msg.params, attrs)
    }
    const session = sessionOf(ctx)
    if (session !== undefined) attrs['mcp.session.id'] = session
    return this.#otel.startSpan(spanName(method, name), { kind: SpanKind.CLIENT, attributes: attrs }, this.#contextOf(ctx))
  }

  /** The context children of the request's server span start in. */
  #contextOf(ctx: RequestContext): Context {
    return this.#servers.get(ctx)?.context ?? ROOT_CONTEXT
  }

  requestStarted(ctx: RequestContext): void {
    const parent = w3c.extract(ROOT_CONTEXT, ctx.req.headers as Record<string, unknown>, getter)
    const attrs: Attributes = { 'http.request.method': ctx.method, 'url.path': ctx.path, 'network.protocol.name': 'http' }
    const peer = ctx.req.socket.remoteAddress
    if (peer !== undefined) attrs['client.address'] = peer
    const span = this.#otel.startSpan(`${ctx.method} ${ctx.path}`, { kind: SpanKind.SERVER, attributes: attrs }, parent)
    this.#servers.set(ctx, { span, context: trace.setSpan(parent, span) })
  }

  requestFinished(ctx: RequestContext, status: number): void {
    const entry = this.#servers.get(ctx)
    if (entry === undefined) return
    this.#servers.delete(ctx)
    const { span } = entry
    const attrs: Attributes = { 'http.response.status_code': status }
    const msg = ctx.mcp === undefined ? undefined : firstMessage(ctx.mcp.body)
    if (msg?.method !== undefined) messageAttributes(span, msg, msg.method, attrs)
    const version = ctx.req.headers['mcp-protocol-version']
    if (typeof version === 'string') attrs['mcp.protocol.version'] = version
    const session = sessionOf(ctx)
    if (session !== undefined) attrs['mcp.session.id'] = session
    if (this.#config.recordSubject && ctx.auth !== undefined) attrs['user.id'] = ctx.auth.subject
    if (ctx.denial !== undefined) attrs['mcp_proxy.denial'] = denialText(ctx.denial)
    if (status >= 500 || status === 0) {
      attrs['error.type'] = status === 0 ? 'aborted' : String(status)
      span.setStatus({ code: SpanStatusCode.ERROR })
    }
    span.setAttributes(attrs)
    span.end()
  }

  verification(ctx: RequestContext, cached: boolean): EndSpan {
    const span = this.#otel.startSpan('verify token', { kind: SpanKind.INTERNAL, attributes: { 'mcp_proxy.token.cached': cached } }, this.#contextOf(ctx))
    if (cached) {
      span.end()
      return () => {}
    }
    return (error?: string) => {
      if (error !== undefined) {
        span.setAttribute('error.type', error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: error })
      }
      span.end()
    }
  }

  credentialExchange(ctx: RequestContext | undefined, target: string, mode: string, cache: 'hit' | 'miss' | 'shared'): EndSpan {
    const attrs: Attributes = { 'mcp_proxy.target': target, 'mcp_proxy.credential.mode': mode, 'mcp_proxy.credential.cache': cache }
    const span = this.#otel.startSpan(
      'credential.exchange',
      { kind: SpanKind.INTERNAL, attributes: attrs },
      ctx === undefined ? ROOT_CONTEXT : this.#contextOf(ctx)
    )
    return (error?: string) => {
      if (error !== undefined) {
        span.setAttribute('error.type', error)
        span.setStatus({ code: SpanStatusCode.ERROR, message: error })
      }
      span.end()
    }
  }

  upstreamCall(ctx: RequestContext, target: string, msg: JsonRpcMessage): (answer: JsonRpcMessage) => void {
    const span = this.#clientSpan(ctx, target, msg)
    withContext(msg, span)
    return (answer: JsonRpcMessage) => {
      if (answer.error !== undefined) {
        const code = String(answer.error.code)
        span.setAttributes({ 'rpc.response.status_code': code, 'error.type': code })
        span.setStatus({ code: SpanStatusCode.ERROR, message: answer.error.message })
      } else if ((answer.result as { isError?: unknown } | undefined)?.isError === true) {
        // A tool's own failure (MCP tools: isError) is an error of this call.
        span.setAttribute('error.type', 'tool_error')
        span.setStatus({ code: SpanStatusCode.ERROR })
      }
      span.end()
    }
  }

  async passthroughCall(ctx: RequestContext, target: string): Promise<Buffer | undefined> {
    const isPost = ctx.method === 'POST'
    let body: unknown
    let unparsed: Buffer | undefined
    if (isPost) {
      try {
        body = (await ctx.readMcpMessage()).body
      } catch (err) {
        // Not JSON-RPC: the passthrough forwards such a body as it came and the upstream answers it,
        // as with tracing off; tracing only watches. What is wrong with the body itself (413, 408) stands.
        if (!ProxyError.is(err) || (err.code !== 'MCPP_ERR_PARSE' && err.code !== 'MCPP_ERR_INVALID_REQUEST')) throw err
        unparsed = await ctx.readBody()
      }
    }
    const list = (Array.isArray(body) ? body : body === undefined ? [] : [body]) as JsonRpcMessage[]
    const span = this.#clientSpan(
      ctx,
      target,
      list.find(m => m.method !== undefined)
    )
    const carrier: Record<string, unknown> = {}
    w3c.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, { set: setter })
    const headers = ctx.req.headers
    headers.traceparent = carrier.traceparent as string
    if (typeof carrier.tracestate === 'string') headers.tracestate = carrier.tracestate
    // Removed, not set to undefined: the upstream request copies every key, and an undefined value is an invalid header.
    else if (headers.tracestate !== undefined) delete headers.tracestate
    ctx.res.once('close', () => endWithResponse(span, ctx))
    if (!isPost) return undefined
    if (unparsed !== undefined) return unparsed
    for (const m of list) if (m.method !== undefined) withContext(m, span)
    // The body sent upstream is the rewritten one: its length, not the client's framing.
    const out = Buffer.from(JSON.stringify(body))
    headers['content-length'] = String(out.length)
    if (headers['transfer-encoding'] !== undefined) delete headers['transfer-encoding']
    return out
  }

  httpHeaders(msg: JsonRpcMessage, headers: Record<string, string>): void {
    const meta = msg.params?._meta as Record<string, unknown> | undefined
    if (typeof meta?.traceparent !== 'string') return
    headers.traceparent = meta.traceparent
    if (typeof meta.tracestate === 'string') headers.tracestate = meta.tracestate
  }

  async shutdown(): Promise<void> {
    await this.#provider.shutdown().catch((err: unknown) => {
      this.#log.warn({ err: (err as Error).message }, 'tracing: final export failed')
    })
    diag.disable()
  }
}

/** What the request's first message says, on its server span (the span is renamed after it). */
function messageAttributes(span: Span, msg: JsonRpcMessage, method: string, attrs: Attributes): void {
  attrs['mcp.method.name'] = method
  attrs['jsonrpc.protocol.version'] = '2.0'
  if (msg.id !== undefined && msg.id !== null) attrs['jsonrpc.request.id'] = String(msg.id)
  const target = targetAttributes(method, msg.params, attrs)
  span.updateName(spanName(method, target))
  // A client that sends its context only in _meta (OpenTelemetry's MCP convention) is linked.
  const meta = msg.params?._meta
  if (meta !== null && typeof meta === 'object') {
    const linked = trace.getSpanContext(w3c.extract(ROOT_CONTEXT, meta as Record<string, unknown>, getter))
    if (linked !== undefined && linked.traceId !== span.spanContext().traceId) span.addLink({ context: linked })
  }
}

/** Puts `span`'s context into the message's `params._meta`, replacing the caller's: the upstream's spans are children of this call. */
function withContext(msg: JsonRpcMessage, span: Span): void {
  const meta: Record<string, unknown> = {}
  const given = msg.params?._meta as Record<string, unknown> | undefined
  if (given !== null && typeof given === 'object') for (const k of Object.keys(given)) if (k !== 'traceparent' && k !== 'tracestate') meta[k] = given[k]
  w3c.inject(trace.setSpan(ROOT_CONTEXT, span), meta, { set: setter })
  msg.params = { ...msg.params, _meta: meta }
}

/** Ends a passthrough span with the response's status (0: the client went away before an answer). */
function endWithResponse(span: Span, ctx: RequestContext): void {
  const status = ctx.res.headersSent ? ctx.res.statusCode : 0
  span.setAttribute('http.response.status_code', status)
  if (status >= 500 || status === 0) {
    span.setAttribute('error.type', status === 0 ? 'aborted' : String(status))
    span.setStatus({ code: SpanStatusCode.ERROR })
  }
  span.end()
}
