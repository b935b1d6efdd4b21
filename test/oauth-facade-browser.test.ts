/**
 * The facade's consent page in a real browser (headless Debian chromium,
 * JavaScript off: the page must work without it): deny sends access_denied
 * to the client, approve sends a code that redeems, and the approval is
 * remembered for the next authorization of the same user and client. A
 * trusted CIMD domain is never asked. One browser launch for the file.
 */
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { chromium, type Browser } from 'playwright-core'
import { ossSetup, cimdServer, FACADE_KEY, pkce, register, authorizeUrl, redeem } from './helpers/facade.ts'

const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

t.test('consent in chromium', async t => {
  const cimd = await cimdServer(t)
  const { g } = await ossSetup(t, {
    keys: [FACADE_KEY],
    consent: { trustedDomains: ['127.0.0.1'] },
    cimd: { testOnlyAllowLoopback: true, testOnlyCa: cimd.cert },
  })
  // The client's redirect URI: a loopback page that shows what it got.
  const app = createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`client got ${req.url}`)
  })
  await new Promise<void>(resolve => app.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        app.closeAllConnections()
        app.close(() => resolve())
      })
  )
  const redirect = `http://127.0.0.1:${(app.address() as AddressInfo).port}/callback`
  const clientId = await register(g.base, [redirect])

  const browser: Browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS })
  t.teardown(() => browser.close())
  const context = await browser.newContext({ javaScriptEnabled: false })
  const page = await context.newPage()
  page.setDefaultTimeout(20_000)

  const { verifier, challenge } = pkce()
  const start = authorizeUrl(g.base, clientId, challenge, { redirect_uri: redirect })

  await page.goto(start)
  t.equal(new URL(page.url()).pathname, '/oauth/callback', 'the consent page is served at the callback, after the IdP login')
  t.equal(await page.textContent('#client-name'), 'manual client')
  t.equal(await page.textContent('#redirect-host'), new URL(redirect).host)
  t.match((await page.textContent('#scopes')) ?? '', /openid/)
  await page.click('#deny')
  await page.waitForURL(u => u.href.startsWith(redirect))
  const denied = new URL(page.url())
  t.equal(denied.searchParams.get('error'), 'access_denied', 'deny: access_denied to the client')
  t.equal(denied.searchParams.get('state'), 'client-state-1')
  t.equal(denied.searchParams.get('iss'), `${g.base}/mcp`)
  t.notOk(denied.searchParams.has('code'))

  await page.goto(start)
  t.ok(await page.isVisible('#approve'), 'a denial is not remembered: asked again')
  await page.click('#approve')
  await page.waitForURL(u => u.href.startsWith(redirect))
  const approved = new URL(page.url())
  const code = approved.searchParams.get('code')
  t.type(code, 'string', 'approve: a code for the client')
  const tokens = await redeem(g.base, { grant_type: 'authorization_code', code: code!, client_id: clientId, redirect_uri: redirect, code_verifier: verifier })
  t.equal(tokens.status, 200)

  await page.goto(start)
  await page.waitForURL(u => u.href.startsWith(redirect))
  t.type(new URL(page.url()).searchParams.get('code'), 'string', 'remembered: straight back to the client with a code')

  // A client whose metadata document lives on a trusted domain is not asked.
  const doc = `${cimd.origin}/trusted/client.json`
  cimd.docs.set('/trusted/client.json', u => ({ body: JSON.stringify({ client_id: u, client_name: 'Trusted', redirect_uris: [redirect] }) }))
  await page.goto(authorizeUrl(g.base, doc, challenge, { redirect_uri: redirect }))
  await page.waitForURL(u => u.href.startsWith(redirect))
  t.type(new URL(page.url()).searchParams.get('code'), 'string', 'trusted CIMD domain: no consent page')
})
