/**
 * README "Security notes", token limits of mcpAuthentication (issue 22 item
 * 18), from the outside: a real gateway on a real socket in front of the real
 * development IdP (oidc-provider). `clockToleranceSeconds` at its edge (the
 * default 30 and 0), and `keySet.refreshSeconds`: a rotated key set is picked
 * up by the background refresh, with no unknown `kid` to trigger a fetch.
 */
import t from 'tap'
import { devIdp, authGateway, ossOptions } from './helpers/idp.ts'
import { eventually } from './helpers/cli.ts'

async function status (url: string, token: string): Promise<number> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  await res.text()
  return res.status
}

t.test('clockToleranceSeconds: exp and nbf within the default 30 s pass, beyond it 401; 0 allows no leeway', async t => {
  const idp = await devIdp(t)
  const lenient = await authGateway(t, ossOptions(idp))
  const strict = await authGateway(t, ossOptions(idp, { clockToleranceSeconds: 0 }))
  const now = Math.floor(Date.now() / 1000)
  // Margins of 10 s or more on either side of each edge: no test depends on how long a request takes.
  const mint = (exp: number, nbf?: number) => idp.mintToken({ sub: 'alice', iat: now - 120, exp, ...(nbf !== undefined ? { nbf } : {}) })
  t.equal(await status(lenient.url, await mint(now - 15)), 200, 'expired 15 s ago: inside the default 30 s tolerance')
  t.equal(await status(lenient.url, await mint(now - 45)), 401, 'expired 45 s ago: outside the tolerance')
  t.equal(await status(lenient.url, await mint(now + 600, now + 15)), 200, 'not before 15 s from now: inside the tolerance')
  t.equal(await status(lenient.url, await mint(now + 600, now + 45)), 401, 'not before 45 s from now: outside the tolerance')
  t.equal(await status(strict.url, await mint(now - 15)), 401, 'clockToleranceSeconds 0: expired 15 s ago is refused')
  t.equal(await status(strict.url, await mint(now + 600, now + 15)), 401, 'clockToleranceSeconds 0: a future nbf is refused')
  t.equal(await status(strict.url, await mint(now + 600)), 200, 'clockToleranceSeconds 0: a current token passes')
  t.match(lenient.logText(), /expired|"exp"/, 'the refusal is logged with its reason')
})

t.test('keySet.refreshSeconds: a rotated key set is fetched in the background, no unknown kid needed', async t => {
  const idp = await devIdp(t)
  const gw = await authGateway(t, ossOptions(idp, { keySet: { refreshSeconds: 10 } }))
  const oldToken = await idp.mintToken({ sub: 'alice' })
  t.equal(await status(gw.url, oldToken), 200, 'the first key signs')
  const before = idp.jwksRequests
  // The old key leaves the served set: only a fetch can tell the gateway.
  const kid = await idp.rotateKeys({ keepOld: false })
  // Bounded wait for the background refresh (10 s, the schema's minimum); nothing here presents the new kid.
  const after = await eventually(() => idp.jwksRequests, n => n > before, 150, 100)
  t.ok(after > before, `the key set was fetched again by the refresh (${before} → ${after} requests)`)
  const fetched = idp.jwksRequests
  t.equal(await status(gw.url, await idp.mintToken({ sub: 'alice' })), 200, `a token signed with the new key (${kid}) passes`)
  t.equal(idp.jwksRequests, fetched, 'and needed no unknown-kid fetch: the refresh had brought the key')
})
