/**
 * One request's trip through the passthrough: the headers each way (what is
 * dropped, what is added) and the piping of the upstream's body. Bodies and
 * SSE streams are piped, never buffered (node-http-proxy's web-outgoing
 * passes: headers rewritten, then the body piped).
 */
import type { IncomingMessage, ServerResponse, OutgoingHttpHeaders, IncomingHttpHeaders } from 'node:http'
import type { RequestContext } from '../../context.ts'
import type { Mapping } from './passthrough-sessions.ts'
import type { Caller } from '../credentials.ts'

/** One request under way, settled when its response is over (or failed). */
export interface Exchange {
  readonly ctx: RequestContext
  /** Gateway session id the client presented, if any. */
  readonly gatewayId: string | undefined
  /** The session the client presented, if any: not idle while this exchange lasts. */
  readonly mapping: Mapping | undefined
  /** A target with `auth`: the request's caller (a session it opens keeps it, for its idle DELETE). */
  caller?: Caller
  resolve: () => void
  reject: (err: unknown) => void
}

/** Response headers that belong to one hop only (RFC 9110 §7.6.1). */
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade'])

/**
 * Request headers never sent upstream: the caller's credentials (MCP forbids
 * token passthrough), the client's session id (replaced by the upstream's),
 * and the hop-by-hop connection headers (the keep-alive agent owns the
 * upstream connection; a client's `Connection: close` must not end it).
 */
const DROP = new Set(['authorization', 'cookie', 'proxy-authorization', 'mcp-session-id', 'connection', 'keep-alive', 'proxy-connection', 'upgrade'])

/**
 * What the caller's credential (../credentials.ts) may not set: the exchange's own headers. Its
 * Authorization is the one minted for this target (the client's was dropped).
 */
const NOT_ATTACHED = new Set([
  'mcp-session-id',
  'content-type',
  'content-length',
  'accept',
  'host',
  'connection',
  'transfer-encoding',
  'last-event-id',
  'cookie',
])

/**
 * The headers sent upstream: the client's without DROP, the upstream session
 * id, the target's static headers and then the caller's attached ones (a
 * target with `auth`), built once before http-proxy copies
 * them (no `proxyReq` listener, so no removeHeader/setHeader pass that
 * validates each name again). A new object rather than `delete` on the
 * client's: a deleted key turns an object into a slow dictionary that
 * http-proxy's copy and node's ClientRequest then walk. The pipeline has run
 * by then, so nothing downstream reads the dropped headers.
 */
export function upstreamRequestHeaders(
  headers: IncomingHttpHeaders,
  upstreamId: string | undefined,
  staticHeaders: ReadonlyArray<readonly [string, string]>,
  attached?: Readonly<Record<string, string>>
): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {}
  for (const k of Object.keys(headers)) if (!DROP.has(k)) out[k] = headers[k]
  if (upstreamId !== undefined) out['mcp-session-id'] = upstreamId
  for (const [k, v] of staticHeaders) out[k] = v
  if (attached !== undefined) {
    for (const [k, v] of Object.entries(attached)) {
      const name = k.toLowerCase()
      if (!NOT_ATTACHED.has(name) && !name.startsWith('mcp-')) out[name] = v
    }
  }
  return out
}

/**
 * The upstream's response headers the client may see: without hop-by-hop
 * ones, the upstream's session id (the caller maps it) and its
 * `WWW-Authenticate` (the target's authorization server is not the client's).
 */
export function clientResponseHeaders(src: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {}
  for (const k of Object.keys(src)) {
    const v = src[k]
    if (v !== undefined && !HOP.has(k) && k !== 'mcp-session-id' && k !== 'www-authenticate') out[k] = v
  }
  return out
}

/** Sends the upstream's body after the head; settles the exchange when the response is done. */
export function forwardBody(proxyRes: IncomingMessage, res: ServerResponse, ex: Exchange): void {
  if (res.destroyed) {
    // The client is gone ('close' has been emitted already): drain the upstream answer.
    proxyRes.resume()
    ex.resolve()
    return
  }
  if (proxyRes.complete) {
    // The whole answer is here already (a short SSE answer comes in one
    // read): written and ended in this tick, so head, body and the chunked
    // terminator leave in one write instead of two. Nothing is held back:
    // the data has been received; reading it to the end also hands the
    // upstream connection back to the agent.
    for (let chunk: Buffer | null = proxyRes.read(); chunk !== null; chunk = proxyRes.read()) res.write(chunk)
    res.end()
    ex.resolve()
    return
  }
  // The head goes out with the first chunk. An SSE stream whose first
  // event is not here yet still gets its head at once: flushed if nothing
  // has been read after this turn.
  proxyRes.pipe(res)
  if (proxyRes.readableLength === 0) {
    setImmediate(function flushIdleHead() {
      if (!proxyRes.readableDidRead && !res.writableEnded && !res.destroyed) res.flushHeaders()
    })
  }
  proxyRes.once('error', () => res.destroy())
  // 'close' follows 'finish' on a finished response, and comes alone when the client goes away.
  res.once('close', function responseClosed() {
    if (!proxyRes.complete) proxyRes.destroy()
    ex.resolve()
  })
}
