/**
 * Issue 25 from the outside with `workers: 2`: the real CLI as a primary and
 * two workers on one port, every request on a fresh TCP connection so the
 * primary spreads them over both. Two users (SDK 1.x in a session, SDK 2.x
 * on 2026-07-28, both through the full OAuth flow) call `whoami` on a target
 * that checks its own audience: each call is made as its user, never with
 * the client's token, and each worker exchanges at most once per (user, target).
 * One HTTP target and no per-operation rule: session-era requests take the
 * passthrough (core/mcp/legacy/passthrough.ts), 2026-07-28 ones the stateless path.
 */
import t from 'tap'
import { eventually, freshFetch } from './helpers/cli.ts'
import {
  EXCHANGE_CLIENT,
  EXCHANGE_SECRET,
  audOf,
  exchangeCount,
  exchangeIdp,
  gatewayPorts,
  jwtServer,
  loginSdk1,
  loginSdk2,
  metric,
  modernCall,
  resultOf,
  sha256,
  startCliGateway,
  whoamiOf,
  gatewayHeadYaml,
  exchangeTargetYaml,
} from './helpers/identity-e2e.ts'

/** `name{worker="N",…}` samples of the probe listener's /metrics, summed per worker. */
async function perWorker(probes: number, name: string, match: string): Promise<Record<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${probes}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{worker="`) || !line.includes(match)) continue
    const w = line.slice(name.length + 9, line.indexOf('"', name.length + 9))
    out[w] = (out[w] ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return out
}

t.test('workers: 2: two users through the multi-process gateway, each seen as themselves, never with their own token', async t => {
  const idp = await exchangeIdp(t, ['crm'])
  const crm = await jwtServer(t, idp, 'crm')
  const ports = await gatewayPorts()
  const yaml = [
    ...gatewayHeadYaml(idp, ports),
    ...exchangeTargetYaml(idp, 'crm', crm.url),
    "        headers: { X-User: '{sub}' }",
    'admin: { enabled: false }',
    `probes: { host: 127.0.0.1, port: ${ports.probes} }`,
    'workers: 2',
    '',
  ].join('\n')
  const gw = await startCliGateway(t, yaml, { EXCHANGE_SECRET }, ports)
  // Every request to the gateway on a new connection (the primary hands each to the next worker); the IdP as usual.
  const fresh = ((url: string | URL, init?: RequestInit) =>
    new URL(url).port === String(ports.port) ? freshFetch(url, init) : fetch(url, init)) as typeof fetch

  const alice = await loginSdk1(t, gw.url, 'alice', fresh)
  const bob = await loginSdk2(t, gw.url, 'bob', true, fresh)
  const before = await perWorker(ports.probes, 'mcp_proxy_requests_total', 'method="tools/call"')
  const calls = await Promise.all(
    Array.from({ length: 6 }, () => [
      alice.client.callTool({ name: 'whoami', arguments: {} }).then(r => ({ as: 'alice', w: whoamiOf(r) })),
      bob.client.callTool({ name: 'whoami', arguments: {} }).then(r => ({ as: 'bob', w: whoamiOf(r) })),
      modernCall(gw.url, alice.token, 'tools/call', { name: 'whoami', arguments: {} }, fresh).then(r => ({ as: 'alice', w: whoamiOf(resultOf(r)) })),
    ]).flat()
  )
  // A worker counts a request once its answer has ended, which may come just after the client read the result:
  // the counters are read until both moved (bounded; they only ever grow).
  const servedNow = async (): Promise<number[]> => {
    const after = await perWorker(ports.probes, 'mcp_proxy_requests_total', 'method="tools/call"')
    return ['1', '2'].map(w => (after[w] ?? 0) - (before[w] ?? 0))
  }
  const served = await eventually(servedNow, n => n.every(x => x > 0), 40)
  t.ok(
    served.every(n => n > 0),
    `both workers served calls (${served.join(', ')})`
  )

  t.same(
    calls.filter(c => c.w.sub !== c.as || c.w.headers?.['x-user'] !== c.as),
    [],
    'every call reached the target as the user who made it (sub and X-User)'
  )
  t.ok(
    calls.every(c => audOf(c.w).includes('crm') && c.w.act?.sub === EXCHANGE_CLIENT),
    'always a token for the target, with the gateway as actor'
  )
  const clientTokens = new Set([sha256(alice.token), sha256(bob.token)])
  t.same(
    (await crm.seen()).filter(h => clientTokens.has(h)),
    [],
    "GET /seen: the target never received a client's token"
  )
  for (const user of ['alice', 'bob']) {
    const n = exchangeCount(idp, { subject: user, audience: 'crm' })
    t.ok(n >= 1 && n <= 2, `${user}: at most one exchange per worker (${n})`)
  }
  const misses = await eventually(
    () => metric(`http://127.0.0.1:${ports.probes}/metrics`, 'mcp_proxy_credential_exchanges_total', { result: 'miss' }),
    n => n === exchangeCount(idp),
    40
  )
  t.equal(misses, exchangeCount(idp), 'the workers counted as many misses as the IdP minted tokens')
})
