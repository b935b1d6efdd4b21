/**
 * README "Security notes", shared state in Redis (issue 22 item 18), from the
 * outside with a hung redis-server rather than a dead one (SIGSTOP; continued
 * with SIGCONT and killed in teardown): the 2 s Redis command deadline of
 * `cluster.redis` (503 MCPP_ERR_SHARED_STATE) and the facade's
 * `redis.timeoutMs` (503 temporarily_unavailable, a code never accepted
 * unchecked).
 */
import t from 'tap'
import type { Test } from 'tap'
import type { ChildProcess } from 'node:child_process'
import { freePort, eventually } from './helpers/cli.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { startRedis } from './helpers/redis.ts'
import { EVERYTHING, facadeGateway, devIdpFor, ossAuth, Agent, FACADE_KEY, CALLBACK, pkce, register, authorizeUrl, redeem } from './helpers/facade.ts'

const SECRET = 'cluster-secret-for-tests-0123456789abcdef'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const INIT = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } })
const everything = { name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }

/** Stops `child` now; teardown continues it whatever the test did (startRedis kills it). */
function stop (t: Test, child: ChildProcess): void {
  child.kill('SIGSTOP')
  t.teardown(() => { child.kill('SIGCONT') })
}

async function post (url: string, body: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(url, { method: 'POST', headers: { ...HEADERS, ...headers }, body })
  return { status: res.status, headers: res.headers, text: await res.text() }
}

async function initialize (url: string): Promise<string> {
  const res = await post(url, INIT)
  if (res.status !== 200) throw new Error(`initialize: ${res.status} ${res.text}`)
  const sid = res.headers.get('mcp-session-id')!
  await post(url, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), { 'mcp-session-id': sid })
  return sid
}

t.test('cluster.redis hung (SIGSTOP): initialize gets 503 MCPP_ERR_SHARED_STATE with Retry-After, then recovers', async t => {
  const redis = await startRedis(t)
  const g = await fullGateway(t, { targets: [everything] }, 'info', {
    cluster: { secret: SECRET, advertiseUrl: 'http://127.0.0.1:1', redis: { url: redis.url } },
  })
  await initialize(g.url)
  stop(t, redis.child)
  const hung = await post(g.url, INIT)
  t.equal(hung.status, 503, 'Redis does not answer within its deadline: 503')
  t.ok(hung.headers.get('retry-after'), 'with Retry-After')
  t.match(JSON.parse(hung.text).error, { code: -32603, message: /shared state \(Redis\) is unreachable/ }, 'a JSON-RPC error naming the shared state', { got: hung.text })
  t.match(g.logText(), /"code":"MCPP_ERR_SHARED_STATE"/, "logged with its code")
  redis.child.kill('SIGCONT')
  // Bounded: the client reconnects or the queued commands drain once Redis runs again.
  const back = await eventually(() => post(g.url, INIT), r => r.status === 200, 100, 100)
  t.equal(back.status, 200, 'Redis answers again: initialize works')
})

t.test('facade redis.timeoutMs: Redis hung (SIGSTOP) makes a code 503 temporarily_unavailable, never accepted unchecked', async t => {
  const redis = await startRedis(t)
  const port = await freePort()
  const idp = await devIdpFor(t, () => [`http://127.0.0.1:${port}/oauth/callback`])
  const g = await facadeGateway(t, ossAuth(idp, { keys: [FACADE_KEY], redis: { url: redis.url, timeoutMs: 500 } }), { port })
  const clientId = await register(g.base)
  const agent = new Agent()
  const codeFor = async (): Promise<Record<string, string>> => {
    const { verifier, challenge } = pkce()
    const cb = await agent.follow(authorizeUrl(g.base, clientId, challenge), CALLBACK)
    return { grant_type: 'authorization_code', code: cb.searchParams.get('code')!, client_id: clientId, redirect_uri: CALLBACK, code_verifier: verifier }
  }
  t.equal((await redeem(g.base, await codeFor())).status, 200, 'control: a code is redeemed while Redis answers')
  const form = await codeFor()
  stop(t, redis.child)
  const hung = await redeem(g.base, form)
  t.equal(hung.status, 503, 'Redis does not answer within timeoutMs')
  t.equal(hung.body.error, 'temporarily_unavailable')
  t.notOk('access_token' in hung.body, 'no tokens')
})
