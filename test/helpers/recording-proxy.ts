/**
 * A recording hop in front of a real MCP server over HTTP: every request the gateway sends a target
 * (its path names the target, the rest of the URL is dropped) is recorded with its headers and body,
 * then forwarded as it is to the server, whose answer (JSON, or an SSE stream) is piped back
 * unbuffered. What the tests of the credential plumbing read: which headers reached the target on
 * each kind of exchange (POST, GET stream, resumed GET, DELETE).
 */
import { createServer, request, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Test } from 'tap'

export interface Recorded {
  /** The target the gateway meant: the path it was given (`/crm`). */
  readonly path: string
  readonly method: string
  readonly headers: IncomingHttpHeaders
  /** The JSON-RPC body of a POST, parsed (undefined for GET and DELETE). */
  readonly body: any
}

export interface RecordingProxy {
  /** The URL to configure as the target `name`'s `mcp.url`. */
  url(name: string): string
  readonly seen: Recorded[]
  /** What reached the target `name`. */
  of(name: string): Recorded[]
}

/** `hold`: a promise a recorded request waits for before it is forwarded (e.g. to keep a handshake in flight). */
export async function recordingProxy(t: Test, upstream: string, hold?: (r: Recorded) => Promise<void> | undefined): Promise<RecordingProxy> {
  const to = new URL(upstream)
  const seen: Recorded[] = []
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const raw = Buffer.concat(chunks)
      let body: unknown
      try {
        body = raw.length > 0 ? JSON.parse(raw.toString('utf8')) : undefined
      } catch {
        body = raw.toString('utf8')
      }
      const recorded: Recorded = { path: (req.url ?? '/').split('?')[0]!, method: req.method ?? '', headers: { ...req.headers }, body }
      seen.push(recorded)
      const forward = (): void => {
        const headers = { ...req.headers, host: to.host }
        const out = request({ host: to.hostname, port: to.port, path: to.pathname, method: req.method, headers }, up => {
          res.writeHead(up.statusCode ?? 502, up.headers)
          up.pipe(res)
          res.on('close', () => up.destroy())
        })
        out.on('error', () => res.destroy())
        res.on('close', () => out.destroy())
        out.end(raw)
      }
      const held = hold?.(recorded)
      if (held === undefined) forward()
      else void held.then(forward)
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  const { port } = server.address() as AddressInfo
  return {
    url: name => `http://127.0.0.1:${port}/${name}`,
    seen,
    of: name => seen.filter(r => r.path === `/${name}`),
  }
}
