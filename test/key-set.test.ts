/**
 * Key set location per variant, and the remote key set's fetching rules,
 * against real loopback servers.
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { randomUUID } from 'node:crypto'
import { generateKeyPair, exportJWK } from 'jose'
import { deriveKeySetSource, cloudKeySetUrl, baseUrlOf } from '../plugins/mcp-authentication/identity.ts'
import { RemoteKeySet, NoMatchingKeyError, KeysUnavailableError } from '../plugins/mcp-authentication/key-set.ts'

t.test('derivation per variant', async t => {
  t.same(
    deriveKeySetSource({ issuer: 'https://auth.example.com/application/o/mcp/', provider: { oss_idp: {} } }),
    { kind: 'url', url: 'https://auth.example.com/application/o/mcp/jwks/' },
    'oss_idp with trailing slash'
  )
  t.same(
    deriveKeySetSource({ issuer: 'https://auth.example.com/application/o/mcp', provider: { oss_idp: {} } }),
    { kind: 'url', url: 'https://auth.example.com/application/o/mcp/jwks/' },
    'oss_idp without trailing slash'
  )
  const tenant = '11111111-2222-3333-4444-555555555555'
  t.equal(cloudKeySetUrl(`https://login.microsoftonline.com/${tenant}/v2.0`), `https://login.microsoftonline.com/${tenant}/discovery/v2.0/keys`, 'v2')
  t.equal(cloudKeySetUrl(`https://sts.windows.net/${tenant}/`), `https://login.microsoftonline.com/${tenant}/discovery/v2.0/keys`, 'v1')
  t.equal(cloudKeySetUrl(`https://sts.chinacloudapi.cn/${tenant}/`), `https://login.chinacloudapi.cn/${tenant}/discovery/v2.0/keys`, 'v1 China cloud')
  t.equal(
    cloudKeySetUrl(`https://login.microsoftonline.us/${tenant}/v2.0`),
    `https://login.microsoftonline.us/${tenant}/discovery/v2.0/keys`,
    'v2 US government cloud'
  )
  t.equal(cloudKeySetUrl(`http://127.0.0.1:8080/${tenant}/v2.0`), `http://127.0.0.1:8080/${tenant}/discovery/v2.0/keys`, 'v2 on an emulator origin')
  // One issuer parser with the provider bridge (issue 13 item 15): a v1 issuer on another host is served by its own origin.
  t.equal(cloudKeySetUrl(`https://sts.microsoftonline.de/${tenant}/`), `https://login.microsoftonline.de/${tenant}/discovery/v2.0/keys`, 'v1 German cloud')
  t.equal(cloudKeySetUrl(`https://sts.example.com/${tenant}/`), `https://sts.example.com/${tenant}/discovery/v2.0/keys`, 'v1 on another host: its own origin')
  t.throws(() => cloudKeySetUrl('https://login.microsoftonline.com/'), { code: 'MCPP_ERR_CONFIG', message: /cloud_idp needs/ })
  t.same(deriveKeySetSource({ issuer: `https://login.microsoftonline.com/${tenant}/v2.0`, provider: { cloud_idp: {} } }), {
    kind: 'url',
    url: `https://login.microsoftonline.com/${tenant}/discovery/v2.0/keys`,
  })
  t.same(
    deriveKeySetSource({ issuer: 'https://idp.example.com/realm/', jwks: 'https://keys.example.com/k' }),
    { kind: 'url', url: 'https://keys.example.com/k' },
    'jwks wins'
  )
  t.same(
    deriveKeySetSource({ issuer: 'https://idp.example.com/realm/' }),
    { kind: 'discovery', discoveryUrl: 'https://idp.example.com/realm/.well-known/openid-configuration' },
    'no provider: discovery'
  )
  t.equal(baseUrlOf('https://gw.example.com/mcp'), 'https://gw.example.com')
  t.equal(baseUrlOf('https://gw.example.com/prefix/mcp'), 'https://gw.example.com/prefix')
})

interface KeyServer {
  url: string
  hits: () => number
  set: (h: (req: IncomingMessage, res: ServerResponse) => void) => void
}

async function keyServer(t: Test, handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<KeyServer> {
  let h = handler
  let hits = 0
  const s = createServer((req, res) => {
    hits++
    h(req, res)
  })
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        s.close(() => resolve())
        s.closeAllConnections()
      })
  )
  return {
    url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/jwks/`,
    hits: () => hits,
    set: n => {
      h = n
    },
  }
}

async function publicJwk(kid: string): Promise<Record<string, unknown>> {
  const { publicKey } = await generateKeyPair('RS256', { extractable: true })
  return { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' }
}

function keySet(url: string, over: Partial<ConstructorParameters<typeof RemoteKeySet>[0]> = {}): RemoteKeySet {
  const s = new RemoteKeySet({ source: { kind: 'url', url }, refreshMs: 3600_000, cooldownMs: 600_000, timeoutMs: 2000, maxBytes: 65536, ...over })
  return s
}

t.test('fetch, unknown-kid cooldown under a flood, failed refresh keeps keys', async t => {
  const k1 = await publicJwk('k1')
  let keys = [k1]
  let fail = false
  const srv = await keyServer(t, (_req, res) => {
    if (fail) {
      res.writeHead(500).end()
      return
    }
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ keys }))
  })
  const ks = keySet(srv.url)
  t.teardown(() => ks.close())
  await ks.start()
  t.equal(ks.loaded, true)
  t.equal(srv.hits(), 1)
  t.ok(await ks.getKey({ alg: 'RS256', kid: 'k1' }))
  t.equal(srv.hits(), 1, 'known kid: no fetch')

  const k2 = await publicJwk('k2')
  keys = [k1, k2]
  t.ok(await ks.getKey({ alg: 'RS256', kid: 'k2' }), 'rotated key found after a refetch')
  t.equal(srv.hits(), 2)

  const results = await Promise.allSettled(Array.from({ length: 100 }, () => ks.getKey({ alg: 'RS256', kid: randomUUID() })))
  t.ok(results.every(r => r.status === 'rejected' && r.reason instanceof NoMatchingKeyError))
  t.equal(srv.hits(), 2, 'a flood of random kids causes no fetch within the cooldown')

  fail = true
  await ks.refresh()
  t.equal(srv.hits(), 3)
  t.match(ks.state().lastError, /HTTP 500/)
  t.same(ks.state().kids, ['k1', 'k2'], 'failed refresh keeps the last good keys')
  t.ok(await ks.getKey({ alg: 'RS256', kid: 'k1' }))
})

t.test('concurrent unknown kids share one fetch once the cooldown allows', async t => {
  const srv = await keyServer(t, (_req, res) => {
    res.end(JSON.stringify({ keys: [] }))
  })
  const k1 = await publicJwk('k1')
  srv.set((_req, res) => res.end(JSON.stringify({ keys: [k1] })))
  const ks = keySet(srv.url, { cooldownMs: 1 })
  t.teardown(() => ks.close())
  await ks.start()
  const before = srv.hits()
  await Promise.allSettled(Array.from({ length: 20 }, () => ks.getKey({ alg: 'RS256', kid: randomUUID() })))
  t.equal(srv.hits(), before + 1, 'one in-flight fetch is shared')
})

t.test('limits: size cap, redirects not followed, not a key set, no usable keys', async t => {
  const big = await keyServer(t, (_req, res) => {
    res.end(JSON.stringify({ keys: [], pad: 'x'.repeat(5000) }))
  })
  const ks1 = keySet(big.url, { maxBytes: 1024 })
  t.teardown(() => ks1.close())
  await ks1.start()
  t.equal(ks1.loaded, false)
  t.match(ks1.state().lastError, /exceeds 1024 bytes/)

  const target = await keyServer(t, (_req, res) => res.end(JSON.stringify({ keys: [r1Key] })))
  const r1Key = await publicJwk('r1')
  const redirect = await keyServer(t, (_req, res) => {
    res.writeHead(302, { location: target.url }).end()
  })
  const ks2 = keySet(redirect.url)
  t.teardown(() => ks2.close())
  await ks2.start()
  t.equal(ks2.loaded, false)
  t.match(ks2.state().lastError, /redirects are not followed/)
  t.equal(target.hits(), 0, 'redirect target never contacted')
  await t.rejects(ks2.getKey({ alg: 'RS256', kid: 'r1' }), KeysUnavailableError)

  const notJwks = await keyServer(t, (_req, res) => res.end('{"hello":1}'))
  const ks3 = keySet(notJwks.url)
  t.teardown(() => ks3.close())
  await ks3.start()
  t.match(ks3.state().lastError, /not a JWK set/)

  const symmetric = await keyServer(t, (_req, res) => res.end(JSON.stringify({ keys: [{ kty: 'oct', k: 'c2VjcmV0', kid: 's' }] })))
  const ks4 = keySet(symmetric.url)
  t.teardown(() => ks4.close())
  await ks4.start()
  t.match(ks4.state().lastError, /no usable signature keys/, 'symmetric keys are never used')
})

t.test('no provider: the key set comes from the discovery document', async t => {
  const k = await publicJwk('d1')
  const srv = await keyServer(t, (req, res) => {
    if (req.url === '/realm/.well-known/openid-configuration') res.end(JSON.stringify({ issuer: 'x', jwks_uri: `http://${req.headers.host}/realm/keys` }))
    else if (req.url === '/realm/keys') res.end(JSON.stringify({ keys: [k] }))
    else res.writeHead(404).end()
  })
  const origin = new URL(srv.url).origin
  const ks = new RemoteKeySet({
    source: deriveKeySetSource({ issuer: `${origin}/realm/` }) as never,
    refreshMs: 3600_000,
    cooldownMs: 600_000,
    timeoutMs: 2000,
    maxBytes: 65536,
  })
  t.teardown(() => ks.close())
  await ks.start()
  t.equal(ks.state().url, `${origin}/realm/keys`)
  t.same(ks.state().kids, ['d1'])
})

t.test(
  'while the key set cannot be fetched: unknown kids are "unavailable", fetches back off, recovery picks up the rotation (issue 13 items 19, 20)',
  async t => {
    const k1 = await publicJwk('k1')
    let keys = [k1]
    let fail = false
    const srv = await keyServer(t, (_req, res) => {
      if (fail) {
        res.writeHead(503).end()
        return
      }
      res.end(JSON.stringify({ keys }))
    })
    // The key set's own clock, moved by the test: no sleeping, no wall-clock bounds.
    let now = 1_000_000
    const fetchedAt: number[] = []
    const ks = keySet(srv.url, {
      cooldownMs: 100,
      maxBackoffMs: 400,
      now: () => now,
      onFetch: () => {
        fetchedAt.push(now)
      },
    })
    t.teardown(() => ks.close())
    await ks.start()
    fail = true
    now += 120
    const before = srv.hits()
    const burst = await Promise.allSettled(Array.from({ length: 50 }, () => ks.getKey({ alg: 'RS256', kid: randomUUID() })))
    t.ok(
      burst.every(r => r.status === 'rejected' && r.reason instanceof KeysUnavailableError),
      'an unknown kid the set cannot be refreshed for is "unavailable", not "no such key"'
    )
    t.equal(srv.hits(), before + 1, 'the burst shares one fetch')
    t.equal((burst[0] as PromiseRejectedResult).reason.retryAfterSeconds, 1, 'with a Retry-After: the next fetch is 100 ms away, rounded up to 1 s')
    t.ok(await ks.getKey({ alg: 'RS256', kid: 'k1' }), 'known kids keep working from the last good keys')

    // Unknown kids asked every 10 ms of the key set's clock for 1.5 s: the interval between fetches
    // doubles from the cooldown (100, 200) up to maxBackoffMs (400), where it stays.
    const firstFailure = now
    for (let step = 1; step <= 150; step++) {
      now = firstFailure + step * 10
      await ks.getKey({ alg: 'RS256', kid: randomUUID() }).catch(() => {})
    }
    const since = fetchedAt.filter(at => at >= firstFailure).map(at => at - firstFailure)
    t.same(since, [0, 100, 300, 700, 1100, 1500], 'fetches at the back-off pace: +100, +200, then +400 each')
    t.ok(ks.state().lastError !== undefined && /HTTP 503/.test(ks.state().lastError!), 'the error is kept for readiness')

    const k2 = await publicJwk('k2')
    keys = [k1, k2]
    fail = false
    await t.rejects(ks.getKey({ alg: 'RS256', kid: 'k2' }), KeysUnavailableError, 'before the next slot the set is not asked again, even with the IdP back')
    now += 400
    t.ok(await ks.getKey({ alg: 'RS256', kid: 'k2' }), 'the rotated key is found at the next slot once the IdP is back')
    now += 100
    await t.rejects(ks.getKey({ alg: 'RS256', kid: randomUUID() }), NoMatchingKeyError, 'with the set fetched again, a bogus kid is "no such key" again')
    t.equal(ks.state().lastError, undefined)
  }
)

t.test('a rotation under a flood of bogus kids: no fetch within the cooldown, one when it allows (issue 13 item 20)', async t => {
  const k1 = await publicJwk('k1')
  let keys = [k1]
  const srv = await keyServer(t, (_req, res) => {
    res.end(JSON.stringify({ keys }))
  })
  let now = 5_000_000
  // The next slot more than the fetch timeout away: a request does not wait for it (it would within the timeout).
  const ks = keySet(srv.url, { cooldownMs: 3000, timeoutMs: 1000, now: () => now })
  t.teardown(() => ks.close())
  await ks.start()
  const bogus = (): Promise<unknown> => ks.getKey({ alg: 'RS256', kid: randomUUID() }).catch((e: unknown) => e)
  t.type(await bogus(), NoMatchingKeyError, 'a first bogus kid: one fetch, then "no such key"')
  const afterFirst = srv.hits()
  keys = [k1, await publicJwk('k2')]
  now += 1500
  const flood = await Promise.all(Array.from({ length: 200 }, bogus))
  t.ok(
    flood.every(e => e instanceof NoMatchingKeyError),
    'bogus kids within the cooldown: "no such key"'
  )
  t.type(await ks.getKey({ alg: 'RS256', kid: 'k2' }).catch((e: unknown) => e), NoMatchingKeyError, 'the rotated key too, until the cooldown allows a fetch')
  t.equal(srv.hits(), afterFirst, 'no fetch within the cooldown, however many requests')
  now += 1500
  const [rotated] = await Promise.all([ks.getKey({ alg: 'RS256', kid: 'k2' }), ...Array.from({ length: 50 }, bogus)])
  t.ok(rotated, 'the rotated key is accepted once the cooldown allows a fetch')
  t.equal(srv.hits(), afterFirst + 1, 'exactly one fetch for the rotation and the flood at once')
})
