/**
 * core/mcp/passthrough.ts: what the passthrough rewrites between a client
 * and one remote streamable-HTTP target — credentials and hop-by-hop
 * headers dropped, session ids mapped both ways and bound to the subject —
 * against a bare node:http upstream that records what it got, behind real
 * authentication (dev IdP tokens, mcpAuthentication). The SDK
 * end-to-end runs are in test/http-target.test.ts.
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { GatewayServer } from '../core/server.ts'
import { Pipeline } from '../core/pipeline.ts'
import { RouteTable } from '../core/routes.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { createHttpPassthrough, newSessionId } from '../core/mcp/legacy/passthrough.ts'
import { memoryLogger } from './helpers/logger.ts'
import { realAuth, type RealAuth } from './helpers/real-auth.ts'

/** An upstream that mints `up-1` for a request without a session id and records every request's headers. */
async function upstream(t: Test) {
  const seen: IncomingHttpHeaders[] = []
  const server = createServer((req, res) => {
    seen.push(req.headers)
    req.resume()
    req.on('end', () => {
      const head: Record<string, string> = { 'content-type': 'application/json', 'keep-alive': 'timeout=5', 'x-upstream': 'yes' }
      if (req.headers['mcp-session-id'] === undefined) head['mcp-session-id'] = 'up-1'
      res.writeHead(200, head).end(JSON.stringify({ jsonrpc: '2.0', id: 1, result: {} }))
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
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/remote/mcp`, seen }
}

/** The passthrough behind real authentication (mcpAuthentication, dev IdP tokens). */
async function gateway(t: Test, url: string, auth: RealAuth) {
  const { log } = memoryLogger()
  const passthrough = createHttpPassthrough({ name: 'remote', mcp: { url, headers: { 'X-Static': 'from-config' } } }, { log })
  const plugins = [auth.plugin]
  const gw = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: passthrough,
    log,
    metrics: new Metrics(),
    limits: { maxBodyBytes: 1 << 20, headersTimeoutMs: 5000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
  })
  const { port } = await gw.listen(0, '127.0.0.1')
  t.teardown(async () => {
    await passthrough.close()
    await gw.close(0)
  })
  return { url: `http://127.0.0.1:${port}/mcp`, passthrough }
}

const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} })
const base = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

t.test('credentials and hop-by-hop headers never go upstream; static headers do', async t => {
  const u = await upstream(t)
  const auth = await realAuth(t, ['alice'])
  const gw = await gateway(t, u.url, auth)
  const token = await auth.token('alice')
  const res = await fetch(gw.url, {
    method: 'POST',
    body,
    headers: { ...base, authorization: `Bearer ${token}`, cookie: 'sid=1', 'proxy-authorization': 'Basic eDp5', connection: 'close', 'x-client': 'kept' },
  })
  t.equal(res.status, 200)
  const h = u.seen[0]!
  t.equal(h.authorization, undefined, 'no Authorization (MCP forbids token passthrough)')
  t.notOk(JSON.stringify(h).includes(token.split('.')[2]!), "the client's token is in no upstream header")
  t.equal(h.cookie, undefined)
  t.equal(h['proxy-authorization'], undefined)
  t.not(h.connection, 'close', "the client's Connection: close does not end the upstream connection")
  t.equal(h['x-client'], 'kept', 'other client headers pass')
  t.equal(h['x-static'], 'from-config', "the target's static headers are added")
  t.equal(res.headers.get('keep-alive'), null, "the upstream's hop-by-hop headers stay there")
  t.equal(res.headers.get('x-upstream'), 'yes')
})

t.test("session ids: the client sees the gateway's, bound to its subject; the upstream sees its own", async t => {
  const u = await upstream(t)
  const auth = await realAuth(t, ['alice', 'mallory'])
  const gw = await gateway(t, u.url, auth)
  const alice = await auth.as('alice')
  const init = await fetch(gw.url, { method: 'POST', body, headers: { ...base, ...alice } })
  const sid = init.headers.get('mcp-session-id')!
  t.not(sid, 'up-1', "never the upstream's id")
  t.match(sid, /^[A-Za-z0-9_-]{43}$/, '32 random bytes, base64url')
  const again = await fetch(gw.url, { method: 'POST', body, headers: { ...base, ...alice, 'mcp-session-id': sid } })
  t.equal(again.status, 200)
  t.equal(again.headers.get('mcp-session-id'), sid)
  t.equal(u.seen[1]!['mcp-session-id'], 'up-1', "mapped to the upstream's id")
  const mallory = await fetch(gw.url, { method: 'POST', body, headers: { ...base, ...(await auth.as('mallory')), 'mcp-session-id': sid } })
  t.equal(mallory.status, 404, 'another subject is told the session does not exist')
  t.match(await mallory.json(), { error: { code: -32001, message: 'Session not found' } })
  t.equal(u.seen.length, 2, 'and nothing reached the upstream')
  t.same(
    gw.passthrough.sessions().map(s => [s.id, s.subject]),
    [[sid.slice(0, 8), 'alice']]
  )
  const del = await fetch(gw.url, { method: 'DELETE', headers: { ...alice, 'mcp-session-id': sid } })
  t.equal(del.status, 200)
  t.same(gw.passthrough.sessions(), [], 'DELETE forgets the mapping')
  t.not(newSessionId(), newSessionId())
})
