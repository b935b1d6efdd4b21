/**
 * Session-era requests across replicas (core/mcp/cluster-forward.ts): real
 * gateways on real sockets sharing `cluster.secret`. A session that lives on
 * A is served through B (POST, GET stream, DELETE); a forged, altered or
 * foreign id is just unknown (404, nothing forwarded); a forwarded request is
 * never forwarded again; when the owner is gone the client gets 404 and
 * initializes again.
 */
import t, { type Test } from 'tap'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { faultyTarget, ROOT } from './helpers/gateway-harness.ts'
import { freePort } from './helpers/cli.ts'
import { foundIn } from './helpers/hidden.ts'
import { request as httpRequest } from 'node:http'
import { pino } from 'pino'
import { createClusterForward } from '../core/cluster/forward.ts'
import { createClientRelay } from '../core/cluster/client-address.ts'

const SECRET = 'cluster-secret-for-tests-0123456789abcdef'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

async function replica(t: Test, secret = SECRET, targets: unknown[] = [faultyTarget()]): Promise<FullGateway & { origin: string }> {
  const port = await freePort()
  const origin = `http://127.0.0.1:${port}`
  const g = await fullGateway(t, { port, targets }, 'debug', { cluster: { secret, advertiseUrl: origin } })
  return { ...g, origin }
}

function sseData(text: string): any[] {
  return text
    .split('\n')
    .filter(l => l.startsWith('data: '))
    .map(l => JSON.parse(l.slice(6)))
}

async function initialize(url: string): Promise<string> {
  const res = await fetch(url, {
    method: 'POST',
    headers: HEADERS,
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  })
  await res.text()
  if (res.status !== 200) throw new Error(`initialize: ${res.status}`)
  const sid = res.headers.get('mcp-session-id')!
  const done = await fetch(url, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  })
  await done.text()
  return sid
}

async function call(
  url: string,
  sid: string,
  id: number,
  method: string,
  params: Record<string, unknown> = {},
  extra: Record<string, string> = {}
): Promise<{ status: number; body: any }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid, ...extra },
    body: JSON.stringify({ jsonrpc: '2.0', id, method, params }),
  })
  const text = await res.text()
  const type = res.headers.get('content-type') ?? ''
  return { status: res.status, body: type.startsWith('text/event-stream') ? sseData(text).at(-1) : text === '' ? undefined : JSON.parse(text) }
}

t.test('a session on one replica is served through another: calls, its GET stream, DELETE', async t => {
  const a = await replica(t)
  const b = await replica(t)
  const c = await replica(t)
  const sid = await initialize(a.url)
  // The owner is named in the id by its advertiseUrl's origin: that, its host:port and the IPv4 address's bytes.
  const owner = new URL(a.origin)
  t.same(
    foundIn(sid, [a.origin, owner.host, owner.hostname, Buffer.from(owner.hostname.split('.').map(Number))]),
    [],
    "the id does not show the owner's address (text, hex, base64, base64url, raw bytes)"
  )

  const listed = await call(b.url, sid, 1, 'tools/list')
  t.equal(listed.status, 200, "B serves A's session")
  t.ok(listed.body.result.tools.some((x: { name: string }) => x.name === 'echo'))
  const echoed = await call(c.url, sid, 2, 'tools/call', { name: 'echo', arguments: { message: 'through C' } })
  t.equal(echoed.status, 200)
  t.match(JSON.stringify(echoed.body.result), /through C/)
  t.match(b.logText(), /forwarded to the session owner/)
  t.notMatch(a.logText(), /forwarded to the session owner/, 'the owner answers itself')

  // The session's GET stream, opened through B; a notification the server sends on its own arrives on it.
  const ac = new AbortController()
  t.teardown(() => ac.abort())
  const stream = await fetch(b.url, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal })
  t.equal(stream.status, 200)
  t.match(stream.headers.get('content-type'), /^text\/event-stream/)
  const reader = stream.body!.getReader()
  const chatter = await call(c.url, sid, 3, 'tools/call', { name: 'chatter', arguments: { count: 1, bytes: 10, tag: 'x' } })
  t.equal(chatter.status, 200)
  let seen = ''
  // Guard only: the notification is written right after the call.
  for (let i = 0; i < 50 && !seen.includes('notifications/message'); i++) {
    const { value, done } = await reader.read()
    if (done) break
    seen += Buffer.from(value).toString('utf8')
  }
  t.match(seen, /notifications\/message/, "the owner's stream reaches the client through B")
  ac.abort()

  const del = await fetch(c.url, { method: 'DELETE', headers: { 'mcp-session-id': sid } })
  t.equal(del.status, 200, 'DELETE through C ends the session on A')
  await del.text()
  const after = await call(a.url, sid, 4, 'tools/list')
  t.equal(after.status, 404)
})

t.test('forged, altered and foreign ids are unknown (404), never forwarded; a forwarded request is not forwarded again', async t => {
  const a = await replica(t)
  const b = await replica(t)
  const other = await replica(t, 'another-secret-entirely-0123456789abcdef')
  const sid = await initialize(a.url)
  const raw = Buffer.from(sid, 'base64url')
  raw[raw.length - 20]! ^= 1
  const altered = raw.toString('base64url')
  for (const [name, id] of [
    ['altered', altered],
    ['made up', 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'],
    ['sealed under another secret', await initialize(other.url)],
  ] as const) {
    const r = await call(b.url, id, 1, 'tools/list')
    t.equal(r.status, 404, `${name}: 404`)
    t.equal(r.body.error.code, -32001)
  }
  t.notMatch(b.logText(), /forwarded to the session owner|session owner cannot be reached/, 'nothing was forwarded')
  // Relayed means carrying a relay's authenticated client address (issue 22 item 12): a marker a client sets changes nothing.
  const relayed = createClientRelay(SECRET, pino({ level: 'silent' })).sign('127.0.0.1', 'POST', '/mcp', sid)
  const looped = await call(b.url, sid, 2, 'tools/list', {}, { 'mcp-proxy-client': relayed })
  t.equal(looped.status, 404, 'a request a relay sent is answered where it lands')
  const marked = await call(b.url, sid, 2, 'tools/list', {}, { 'mcp-proxy-forwarded': '1' })
  t.equal(marked.status, 200, 'a client-set Mcp-Proxy-Forwarded does not stop the relay')
  t.equal((await call(b.url, sid, 3, 'tools/list')).status, 200, 'the real id still works')
})

t.test('owner gone: 404, and the client initializes again on any replica', async t => {
  const a = await replica(t)
  const b = await replica(t)
  const sid = await initialize(a.url)
  t.equal((await call(b.url, sid, 1, 'tools/list')).status, 200)
  await a.gw.close()
  const gone = await call(b.url, sid, 2, 'tools/list')
  t.equal(gone.status, 404, 'the session is gone with its owner')
  t.equal(gone.body.error.code, -32001)
  t.match(b.logText(), /the session owner cannot be reached/)
  const again = await initialize(b.url)
  t.equal((await call(b.url, again, 3, 'tools/call', { name: 'echo', arguments: { message: 'back' } })).status, 200, 'a new session works')
})

/** test/fixtures/conformance-server.mjs over streamable HTTP: one MCP server both replicas reach. */
async function httpServer(t: Test): Promise<string> {
  const child = spawn(process.execPath, [join(ROOT, 'test/fixtures/conformance-server.mjs'), 'http'], {
    env: { ...process.env, PORT: '0' },
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  const exited = new Promise<void>(resolve => child.once('exit', () => resolve()))
  t.teardown(async () => {
    child.kill('SIGTERM')
    await exited
  })
  return new Promise((resolve, reject) => {
    let err = ''
    child.stderr!.on('data', d => {
      err += d
      const m = /listening on port (\d+)/.exec(err)
      if (m !== null) resolve(`http://127.0.0.1:${m[1]}/mcp`)
    })
    child.once('exit', code => reject(new Error(`conformance server exited ${code}: ${err}`)))
  })
}

t.test('one HTTP target (passthrough): the gateway session id carries the upstream session, so any replica serves it without a relay', async t => {
  const upstream = await httpServer(t)
  const targets = [{ name: 'remote', mcp: { url: upstream } }]
  const a = await replica(t, SECRET, targets)
  const b = await replica(t, SECRET, targets)
  const sid = await initialize(a.url)
  const listed = await call(b.url, sid, 1, 'tools/list')
  t.equal(listed.status, 200, 'B opens the id and talks to the upstream session itself')
  t.ok(Array.isArray(listed.body.result.tools) && listed.body.result.tools.length > 0)
  t.notMatch(b.logText(), /forwarded to the session owner/)
  // A replica with another secret cannot open it (nor relay it anywhere).
  const other = await replica(t, 'another-cluster-secret-0123456789abcdef', targets)
  t.equal((await call(other.url, sid, 2, 'tools/list')).status, 404, "another cluster's replica: unknown")
})

t.test('sealed passthrough ids are bound to the target and the subject, and are not owner ids', async t => {
  const log = pino({ level: 'silent' })
  const cf = createClusterForward({
    secret: SECRET,
    advertiseUrl: 'http://127.0.0.1:1',
    forwardTimeoutMs: 1000,
    log,
    clientRelay: createClientRelay(SECRET, log),
  })
  t.teardown(() => cf.close())
  const id = cf.sealUpstream('remote', 'alice', 'upstream-session-1')!
  t.equal(cf.openUpstream('remote', 'alice', id), 'upstream-session-1', 'opens for its target and subject')
  t.equal(cf.openUpstream('remote', 'bob', id), undefined, 'another subject: unknown')
  t.equal(cf.openUpstream('remote', undefined, id), undefined, 'no token: unknown')
  t.equal(cf.openUpstream('other', 'alice', id), undefined, 'another target: unknown')
  t.equal(cf.openUpstream('remote', 'alice', cf.newSessionId()), undefined, 'an owner id is not a passthrough id')
  const ctx = { req: { headers: {} } } as unknown as Parameters<typeof cf.remoteOwner>[0]
  t.equal(cf.remoteOwner(ctx, id), undefined, 'nor the reverse')
  t.same(
    foundIn(id, ['upstream-session-1', 'remote', 'alice']),
    [],
    'neither the upstream id, the target nor the subject shows in the id (text, hex, base64, base64url, raw bytes)'
  )
  t.equal(cf.sealUpstream('remote', 'alice', 'x'.repeat(257)), undefined, 'too long to seal: the caller names an owner instead')
})

/** A POST from a chosen loopback source address (Linux routes all of 127.0.0.0/8 to lo), so replicas see distinct clients. */
function postFrom(
  localAddress: string,
  url: string,
  sid: string | undefined,
  body: unknown,
  extra: Record<string, string> = {}
): Promise<{ status: number; sid: string | undefined; body: any }> {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body)
    const req = httpRequest(
      url,
      {
        method: 'POST',
        localAddress,
        agent: false,
        headers: { ...HEADERS, ...(sid !== undefined ? { 'mcp-session-id': sid } : {}), ...extra, 'content-length': Buffer.byteLength(payload) },
      },
      res => {
        let text = ''
        res.setEncoding('utf8')
        res.on('data', d => {
          text += d
        })
        res.on('end', () => {
          const type = res.headers['content-type'] ?? ''
          resolve({
            status: res.statusCode!,
            sid: res.headers['mcp-session-id'] as string | undefined,
            body: type.startsWith('text/event-stream') ? sseData(text).at(-1) : text === '' ? undefined : JSON.parse(text),
          })
        })
      }
    )
    req.once('error', reject)
    req.end(payload)
  })
}

t.test(
  'anonymous callers: the owner keys a relayed request by the original client address, authenticated by the relay; a forged address header is ignored',
  async t => {
    const a = await replica(t)
    const b = await replica(t)
    const init = await postFrom('127.0.0.2', a.url, undefined, {
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    })
    t.equal(init.status, 200)
    const sid = init.sid!
    t.equal((await postFrom('127.0.0.2', a.url, sid, { jsonrpc: '2.0', method: 'notifications/initialized' })).status, 202)

    const direct = await postFrom('127.0.0.2', a.url, sid, { jsonrpc: '2.0', id: 1, method: 'tools/list' })
    t.equal(direct.status, 200, 'the owner serves its anonymous caller directly')
    const relayed = await postFrom('127.0.0.2', b.url, sid, { jsonrpc: '2.0', id: 2, method: 'tools/list' })
    t.equal(relayed.status, 200, 'through the other replica, the owner finds the session of the same anonymous caller')
    t.match(b.logText(), /forwarded to the session owner/)

    // Another caller cannot borrow the session, neither through the relay nor by writing the header itself.
    const stranger = await postFrom('127.0.0.3', b.url, sid, { jsonrpc: '2.0', id: 3, method: 'tools/list' })
    t.equal(stranger.status, 404, 'another address through the relay: not its session')
    for (const forged of ['127.0.0.2', 'v1 0 127.0.0.2 AAAA', `v1 ${Math.floor(Date.now() / 1000)} 127.0.0.2 ${'A'.repeat(43)}`]) {
      const r = await postFrom(
        '127.0.0.3',
        a.url,
        sid,
        { jsonrpc: '2.0', id: 4, method: 'tools/list' },
        { 'mcp-proxy-client': forged, 'mcp-proxy-forwarded': '1' }
      )
      t.equal(r.status, 404, `a forged client address header (${forged.slice(0, 12)}…) is ignored`)
    }
    const viaRelay = await postFrom('127.0.0.3', b.url, sid, { jsonrpc: '2.0', id: 5, method: 'tools/list' }, { 'mcp-proxy-client': '127.0.0.2' })
    t.equal(viaRelay.status, 404, "the relay replaces a client's own header with the address it saw")
    t.match(a.logText(), /client address header not authenticated/, 'the forged header is logged')
  }
)
