/**
 * A stdio child whose environment carries a minted token (`auth.env` with `{credential}`) has it for
 * its whole life, so it goes stale with the token: the pool (core/mcp/upstreams/pool.ts) gives such a
 * child no new lease, spawns a fresh one with a freshly exchanged token for the next request, and
 * closes the stale one once its leases end, in both eras (2026-07-28 requests; `share: subject`
 * sessions, which move to the fresh child at a quiet request). A `share: session` child keeps the token it started with (README "Identity to targets").
 * Real parts: the dev IdP's RFC 8693 grant mints the tokens, mcpAuthentication verifies the callers,
 * the credential layer is the one the gateway builds (its clock moved by the test instead of waiting
 * for the token to expire), and test/fixtures/env-server.mjs says which process answered and with what.
 */
import t, { type Test } from 'tap'
import { decodeJwt } from 'jose'
import type { TargetConfig } from '../core/config.ts'
import { createCredentialBroker, type CredentialBroker } from '../core/credentials/index.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { INIT_HEADERS, processGone, sseMessages, startGateway, until } from './helpers/gateway-harness.ts'
import { call } from './helpers/conformance-fixture.ts'
import { ENV_SERVER } from './helpers/identity-fixture.ts'
import { realAuth } from './helpers/real-auth.ts'
import { memoryLogger } from './helpers/logger.ts'

const SECRET = 'gateway-exchange-secret-0123'
const RMD = 'https://gateway.example.test/.well-known/oauth-protected-resource/mcp'

const auth = await realAuth(t, ['alice'], {
  tokenExchange: { clients: { 'mcp-gateway': { secret: SECRET, audiences: ['tools'], scopes: ['tools.run'] } } },
})

function toolsTarget(share: 'session' | 'subject'): TargetConfig {
  return {
    name: 'tools',
    protocol: 'session',
    stdio: { cmd: process.execPath, args: [ENV_SERVER, 'USER_ID', 'CRM_TOKEN'], env: {}, share },
    auth: {
      tokenExchange: { tokenEndpoint: auth.idp.tokenEndpoint, clientId: 'mcp-gateway', clientSecret: SECRET, audience: ['tools'] },
      env: { USER_ID: '{sub}', CRM_TOKEN: '{credential}' },
    },
  }
}

/** The gateway with the broker it would build from `target`, on a clock the test moves. */
async function gateway(t: Test, target: TargetConfig) {
  let offset = 0
  const now = (): number => Date.now() + offset
  const { log } = memoryLogger('warn')
  const broker: CredentialBroker = createCredentialBroker([target], { log, metrics: new Metrics(), resourceMetadataUrl: RMD, scopesSupported: [], now })
  t.teardown(() => broker.close())
  const g = await startGateway(t, { targets: [target], plugins: [auth.plugin], credentials: broker })
  return {
    ...g,
    now,
    /** Moves the gateway's credential clock to 30 s before `token` expires: past its freshness (exp minus the 60 s skew). */
    pastFreshness(token: string): void {
      offset = (decodeJwt(token).exp as number) * 1000 - 30_000 - Date.now()
    },
  }
}

interface Seen {
  pid: number
  user: string
  token: string
}

function seenOf(result: any): Seen {
  const r = JSON.parse(result.content[0].text) as { pid: number; env: { USER_ID: string; CRM_TOKEN: string } }
  return { pid: r.pid, user: r.env.USER_ID, token: r.env.CRM_TOKEN }
}

/** A session-era session of alice: initialize, then `env` calls; `end()` deletes it. */
async function session(url: string) {
  const authorization = `Bearer ${await auth.token('alice')}`
  const init = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, authorization },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'stale', version: '1' } },
    }),
  })
  await init.text()
  const sid = init.headers.get('mcp-session-id')
  if (sid === null) throw new Error(`initialize refused: ${init.status}`)
  const headers = { ...INIT_HEADERS, authorization, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' }
  await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) }).then(r => r.arrayBuffer())
  let seq = 0
  return {
    async env(): Promise<Seen> {
      const res = await fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: ++seq, method: 'tools/call', params: { name: 'env', arguments: {} } }),
      })
      const text = await res.text()
      const msg = (res.headers.get('content-type') ?? '').startsWith('application/json') ? JSON.parse(text) : sseMessages(text).at(-1)
      return seenOf(msg.result)
    },
    async end(): Promise<void> {
      await fetch(url, { method: 'DELETE', headers }).then(r => r.arrayBuffer())
    },
  }
}

/** One 2026-07-28 `env` call of alice. */
async function modernEnv(url: string): Promise<Seen> {
  const r = await call(url, 'tools/call', { name: 'env', arguments: {} }, {}, { authorization: `Bearer ${await auth.token('alice')}` })
  if (r.status !== 200) throw new Error(`env call answered ${r.status}: ${JSON.stringify(r.json)}`)
  return seenOf(r.json.result)
}

/** `later` was minted after `earlier`, and only `earlier` is past its freshness on the gateway's clock. */
function newer(t: Test, later: string, earlier: string, now: number): void {
  const a = decodeJwt(later)
  const b = decodeJwt(earlier)
  t.not(a.jti, b.jti, 'another token')
  t.ok((a.iat as number) >= (b.iat as number), 'issued no earlier')
  t.ok((b.exp as number) * 1000 - 60_000 <= now, 'the old token is past its freshness')
  t.ok((a.exp as number) * 1000 > now, 'the new one is valid on it')
}

t.test('2026-07-28: the request after the credential went stale reaches a fresh child with a newer token; the stale child is closed', async t => {
  const g = await gateway(t, toolsTarget('subject'))
  const exchanged = auth.idp.exchanges
  const first = await modernEnv(g.url)
  t.equal(first.user, 'alice')
  t.equal(decodeJwt(first.token).sub, 'alice', 'the child holds a token minted for alice')
  const again = await modernEnv(g.url)
  t.equal(again.pid, first.pid, 'while the credential is fresh, requests share the child')
  t.equal(again.token, first.token)
  t.equal(auth.idp.exchanges, exchanged + 1, 'one exchange for both')

  g.pastFreshness(first.token)
  const fresh = await modernEnv(g.url)
  t.not(fresh.pid, first.pid, 'the next request reaches another child')
  t.equal(fresh.user, 'alice')
  newer(t, fresh.token, first.token, g.now())
  t.equal(auth.idp.exchanges, exchanged + 2, 'exchanged again for it')
  t.ok(await until(() => processGone(first.pid)), 'the stale child, idle, exited')
  const after = await modernEnv(g.url)
  t.equal(after.pid, fresh.pid, 'later requests stay on the fresh child')
  t.equal(after.token, fresh.token)
})

t.test(
  'share: subject sessions: once the credential went stale, new sessions and live ones at their next quiet request move to a fresh child; the stale one then exits',
  async t => {
    const g = await gateway(t, toolsTarget('subject'))
    const a = await session(g.url)
    const b = await session(g.url)
    const fromA = await a.env()
    const fromB = await b.env()
    t.equal(fromB.pid, fromA.pid, "alice's sessions share her child while its credential is fresh")

    g.pastFreshness(fromA.token)
    const exchanged = auth.idp.exchanges
    const c = await session(g.url)
    const fromC = await c.env()
    t.not(fromC.pid, fromA.pid, 'the session opened after the credential went stale has another child')
    t.equal(fromC.user, 'alice')
    newer(t, fromC.token, fromA.token, g.now())
    t.equal(auth.idp.exchanges, exchanged + 1, 'exchanged again, once')

    // A live session with nothing in flight on the stale child moves at its next request, to the child
    // its subject's fresh credential got (no task or call of it was on the stale one).
    const movedA = await a.env()
    t.equal(movedA.pid, fromC.pid, 'a session that was on the stale child answers from the fresh one')
    t.equal(movedA.token, fromC.token, 'with the fresh token')
    t.notOk(processGone(fromA.pid), 'the stale child still serves the session that has not moved yet')
    t.equal((await b.env()).pid, fromC.pid, 'the other live session moves too')
    t.ok(await until(() => processGone(fromA.pid)), 'its last lease gone, the stale child exited')
    t.equal(auth.idp.exchanges, exchanged + 1, 'the moves cost no further exchange')
    await a.end()
    t.equal((await c.env()).pid, fromC.pid, 'the fresh child goes on')
    const d = await session(g.url)
    t.equal((await d.env()).pid, fromC.pid, 'and takes the next session')
  }
)

t.test('share: session: the child keeps the token it started with for the life of its session', async t => {
  const g = await gateway(t, toolsTarget('session'))
  const s = await session(g.url)
  const first = await s.env()
  g.pastFreshness(first.token)
  const later = await s.env()
  t.equal(later.pid, first.pid, 'the same child (it holds the session state)')
  t.equal(later.token, first.token, 'with the token it was spawned with')
  const other = await session(g.url)
  const fromOther = await other.env()
  t.not(fromOther.pid, first.pid, 'a new session has a child of its own')
  newer(t, fromOther.token, first.token, g.now())
  await s.end()
  t.ok(await until(() => processGone(first.pid)), 'the child ends with its session')
})
