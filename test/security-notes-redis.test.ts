/**
 * README "Security notes", shared state in Redis (issue 22 item 18), from the
 * outside with a hung redis-server rather than a dead one (SIGSTOP; continued
 * with SIGCONT and killed in teardown): the 2 s Redis command deadline of
 * `cluster.redis` (503 MCPP_ERR_SHARED_STATE) and the facade's
 * `redis.timeoutMs` (503 temporarily_unavailable, a code never accepted
 * unchecked).
 */
import t from 'tap'
import { freePort, eventually } from './helpers/cli.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { startRedis } from './helpers/redis.ts'
import { facadeGateway, devIdpFor, ossAuth, Agent, FACADE_KEY, CALLBACK, pkce, register, authorizeUrl, redeem } from './helpers/facade.ts'
import { SECRET, INIT, everything, stop, post, initialize } from './helpers/hung-peer.ts'

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
  t.match(JSON.parse(hung.text).error, { code: -32603, message: /shared state \(Redis\) is unreachable/ }, 'a JSON-RPC error naming the shared state', {
    got: hung.text,
  })
  t.match(g.logText(), /"code":"MCPP_ERR_SHARED_STATE"/, 'logged with its code')
  redis.child.kill('SIGCONT')
  // Bounded: the client reconnects or the queued commands drain once Redis runs again.
  const back = await eventually(
    () => post(g.url, INIT),
    r => r.status === 200,
    100,
    100
  )
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
