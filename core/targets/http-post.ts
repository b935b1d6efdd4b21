/**
 * The POST of the HTTP transport, on node:http(s) and one keep-alive pool
 * per process, shaped like the part of a fetch Response the readers use.
 * Its own module because the pooled socket's life (cancel, late aborts) has
 * rules of its own that the MCP exchange logic should not carry.
 */
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http'
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https'

/** What the readers need of an answer: a fetch Response, or the answer of `post`. */
export interface Answer {
  readonly status: number
  readonly ok: boolean
  readonly headers: { get(name: string): string | null }
  readonly body: (AsyncIterable<Uint8Array> & { cancel(): Promise<void> }) | null
}

// One keep-alive pool per process for every HTTP target: POSTs are the hot path of
// each call (both eras), and node:http costs a fraction of fetch's CPU per request
// (no WHATWG Request/Response/Headers objects, no web streams, no AbortError per
// cancelled body): measured in docs/performance.md, "Workers: 2 vs 1 process".
const ignore = (): void => {}
const agents = { http: new HttpAgent({ keepAlive: true }), https: new HttpsAgent({ keepAlive: true }) }

/**
 * POSTs `body` with node:http(s). The answer's body is the IncomingMessage
 * itself (an async iterable of Buffers); `cancel` drops the rest: read to its
 * end when it is all here already (the connection goes back to the pool),
 * else destroyed.
 */
export function post(url: URL, headers: Record<string, string>, body: string, signal: AbortSignal): Promise<Answer> {
  const https = url.protocol === 'https:'
  return new Promise((resolve, reject) => {
    let answer: IncomingMessage | undefined
    const req = (https ? httpsRequest : httpRequest)(
      url,
      {
        method: 'POST',
        headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) },
        agent: https ? agents.https : agents.http,
      },
      (res: IncomingMessage) => {
        // A reader sees the stream's errors through its iterator; one that is done with it (or an
        // abort after the answer) must not turn a late 'error' into an uncaught exception.
        res.on('error', ignore)
        answer = res
        // Leaving the loop early (the answer came) must not destroy the response, which would
        // close the connection even when the body is complete: cancel() decides.
        const stream = {
          [Symbol.asyncIterator]: () => res.iterator({ destroyOnReturn: false }) as AsyncIterator<Uint8Array>,
          async cancel() {
            if (res.complete) res.resume()
            else res.destroy()
          },
        }
        const status = res.statusCode ?? 0
        resolve({
          status,
          ok: status >= 200 && status < 300,
          headers: {
            get: (name: string) => {
              const v = res.headers[name.toLowerCase()]
              return v === undefined ? null : Array.isArray(v) ? v.join(', ') : v
            },
          },
          body: stream,
        })
      }
    )
    // Not `signal` in the options: node would keep it bound to the request after the exchange,
    // and a late abort would destroy the pooled socket another request may be using by then.
    // A complete answer has nothing left to abort (its socket may be back in the pool already).
    const abort = (): void => {
      if (answer?.complete !== true) req.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted'))
    }
    if (signal.aborted) abort()
    signal.addEventListener('abort', abort, { once: true })
    req.once('close', () => signal.removeEventListener('abort', abort))
    req.on('error', reject)
    req.end(body)
  })
}
