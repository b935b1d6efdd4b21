/**
 * README "Security notes", token limits of mcpAuthentication (issue 22 item
 * 18), from the outside: a real gateway on a real socket in front of the real
 * development IdP (oidc-provider). `clockToleranceSeconds` at its edge (the
 * default 30 and 0), and `keySet.refreshSeconds`: a rotated key set is picked
 * up by the background refresh, with no unknown `kid` to trigger a fetch;
 * `keySet.maxBytes` and `keySet.timeoutMs` through the gateway.
 */
import t from 'tap'
import type * as Tap from 'tap'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { devIdp, authGateway, ossOptions } from './helpers/idp.ts'
import { eventually } from './helpers/cli.ts'

async function status(url: string, token: string): Promise<number> {
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
  const after = await eventually(
    () => idp.jwksRequests,
    n => n > before,
    150,
    100
  )
  t.ok(after > before, `the key set was fetched again by the refresh (${before} → ${after} requests)`)
  const fetched = idp.jwksRequests
  t.equal(await status(gw.url, await idp.mintToken({ sub: 'alice' })), 200, `a token signed with the new key (${kid}) passes`)
  t.equal(idp.jwksRequests, fetched, 'and needed no unknown-kid fetch: the refresh had brought the key')
})

/** A JWKS endpoint in front of the dev IdP's: `pad` bytes added to the set, or no answer at all. */
async function jwksHop(t: Tap.Test, upstream: string, mode: { pad?: number; hang?: boolean }): Promise<{ url: string; hits: () => number }> {
  let hits = 0
  const hanging: ServerResponse[] = []
  const server = createServer((_req, res) => {
    hits++
    if (mode.hang === true) {
      hanging.push(res)
      return
    }
    fetch(upstream)
      .then(r => r.json() as Promise<Record<string, unknown>>)
      .then(
        set => {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...set, pad: 'x'.repeat(mode.pad ?? 0) }))
        },
        () => res.writeHead(502).end()
      )
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        for (const r of hanging) r.destroy()
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks/`, hits: () => hits }
}

t.test('keySet.maxBytes and keySet.timeoutMs: a key set too large or too slow is not used; callers get 503 + Retry-After, not a hung request', async t => {
  const idp = await devIdp(t)
  const token = await idp.mintToken({ sub: 'alice' })
  const small = await jwksHop(t, idp.jwksUrl, { pad: 600 })
  const fits = await authGateway(t, ossOptions(idp, { jwks: small.url, keySet: { maxBytes: 4096 } }))
  t.equal(await status(fits.url, token), 200, 'control: the padded set within maxBytes is used')
  const big = await jwksHop(t, idp.jwksUrl, { pad: 5000 })
  const capped = await authGateway(t, ossOptions(idp, { jwks: big.url, keySet: { maxBytes: 4096 } }))
  const tooBig = await fetch(capped.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  t.equal(tooBig.status, 503, 'a key set over maxBytes: no keys, 503 (the token is not judged invalid)')
  t.ok(Number(tooBig.headers.get('retry-after')) > 0, 'with Retry-After')
  await tooBig.text()
  t.match(capped.logText(), /exceeds 4096 bytes/, 'the reason is logged')
  const slow = await jwksHop(t, idp.jwksUrl, { hang: true })
  const timed = await authGateway(t, ossOptions(idp, { jwks: slow.url, keySet: { timeoutMs: 200 } }))
  t.ok(slow.hits() > 0, 'the slow key set was asked')
  const hung = await fetch(timed.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  })
  t.equal(hung.status, 503, 'a key set not answering within timeoutMs: 503, the request is answered')
  t.ok(Number(hung.headers.get('retry-after')) > 0, 'with Retry-After')
  await hung.text()
})
