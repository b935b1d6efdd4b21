/**
 * Shared by the security-notes tests that hang a peer (a replica, Redis) with
 * SIGSTOP: a cluster secret, a server-everything target, a session-era POST and
 * initialize over fetch, and the stop that teardown always undoes; and a peer
 * that accepts and never answers (a hung IdP token endpoint).
 */
import type { Test } from 'tap'
import type { ChildProcess } from 'node:child_process'
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net'
import { EVERYTHING } from './facade.ts'

export const SECRET = 'cluster-secret-for-tests-0123456789abcdef'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
export const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
})
export const everything = { name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }

/** Stops `child` now; teardown continues it whatever the test did (its owner kills it). */
export function stop(t: Test, child: ChildProcess): void {
  child.kill('SIGSTOP')
  t.teardown(() => {
    child.kill('SIGCONT')
  })
}

export async function post(url: string, body: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(url, { method: 'POST', headers: { ...HEADERS, ...headers }, body })
  return { status: res.status, headers: res.headers, text: await res.text() }
}

/** A session-era session, initialized; its id. */
export async function initialize(url: string): Promise<string> {
  const res = await post(url, INIT)
  if (res.status !== 200) throw new Error(`initialize: ${res.status} ${res.text}`)
  const sid = res.headers.get('mcp-session-id')!
  await post(url, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), { 'mcp-session-id': sid })
  return sid
}

/**
 * A loopback server that accepts connections and never answers (an IdP or
 * upstream that hangs); every socket is destroyed and the server closed in
 * teardown. `accepted` counts the connections it took.
 */
export async function silentPeer(t: Test): Promise<{ url: string; accepted: () => number }> {
  const sockets = new Set<Socket>()
  let accepted = 0
  const server = createNetServer(socket => {
    accepted++
    sockets.add(socket)
    socket.on('error', () => {})
    socket.on('close', () => sockets.delete(socket))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      })
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, accepted: () => accepted }
}
