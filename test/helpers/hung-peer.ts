/**
 * Shared by the security-notes tests that hang a peer (a replica, Redis) with
 * SIGSTOP: a cluster secret, a server-everything target, a session-era POST and
 * initialize over fetch, and the stop that teardown always undoes.
 */
import type { Test } from 'tap'
import type { ChildProcess } from 'node:child_process'
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
