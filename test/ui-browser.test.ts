/**
 * The management page in a real browser: headless Debian chromium driven by
 * playwright-core, against a whole gateway (server-everything over stdio,
 * the dev IdP, admin.token set). One browser launch for the whole file.
 */
import t from 'tap'
import { mkdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { chromium, type Browser, type Page } from 'playwright-core'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { adminGateway, SECRETS, RULE } from './helpers/admin.ts'

const ARTIFACTS = join(dirname(fileURLToPath(import.meta.url)), 'artifacts')
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

t.test('management page in chromium', async t => {
  const g = await adminGateway(t)
  const browser: Browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS })
  t.teardown(() => browser.close())
  const context = await browser.newContext({ viewport: { width: 1400, height: 1800 } })
  const page: Page = await context.newPage()
  page.setDefaultTimeout(20_000)
  const problems: string[] = []
  page.on('console', msg => {
    if (msg.type() === 'error' || msg.type() === 'warning') problems.push(`console.${msg.type()}: ${msg.text()}`)
  })
  page.on('pageerror', err => problems.push(`pageerror: ${err.message}`))

  // A live session from a real SDK client, plus a denied request for the requests table.
  const aliceToken = await g.aliceToken()
  const client = new Client({ name: 'ui-browser-test', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(g.mcp), { requestInit: { headers: { authorization: `Bearer ${aliceToken}` } } })
  await client.connect(transport)
  t.teardown(() => client.close().catch(() => {}))
  await client.callTool({ name: 'echo', arguments: { message: 'from the browser test' } })
  const bobToken = await g.bobToken()
  const denied = await fetch(g.mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${bobToken}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(denied.status, 403)
  // A caller the rules let in whose claim cannot go into the child's environment: the target's credential fails.
  const noCredential = await fetch(g.mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${await g.malloryToken()}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    }),
  })
  t.equal(noCredential.status, 403)
  const handle = transport.sessionId!.slice(0, 8)

  await t.test('sign in with admin.token through the form', async t => {
    const res = await page.goto(g.admin + '/ui')
    t.equal(res?.status(), 200)
    t.equal(await page.locator('#token').count(), 1, 'the page asks for the admin token first')
    await page.fill('#token', SECRETS.adminToken)
    await Promise.all([page.waitForURL(g.admin + '/ui'), page.click('button[type=submit]')])
    await page.waitForSelector('#targets tr[data-target="everything"]')
    t.equal(await page.title(), 'mcp-proxy', 'the management page itself, not the sign-in form')
  })

  await t.test('shows the target and the live session', async t => {
    const target = page.locator('#targets tr[data-target="everything"]')
    await target.locator('td:nth-child(4)').filter({ hasText: /^1$/ }).waitFor()
    t.match(await target.innerText(), /everything\s+stdio/)
    const creds = target.locator('td.creds')
    t.equal(await creds.locator('.creds-mode').innerText(), 'claims', "the target's credential mode")
    t.equal(await creds.locator('.creds-sets').innerText(), 'env MCP_PROXY_USER, env MCP_PROXY_GROUPS', 'what it sets, by name')
    t.match(await creds.locator('.creds-failure').innerText(), /^last failure: claim \(\d+s ago\)$/, 'its last failure')
    const row = page.locator(`#sessions tr[data-handle="${handle}"]`)
    await row.waitFor()
    const text = await row.innerText()
    t.match(text, new RegExp(`${handle}…`))
    t.match(text, /alice/)
    t.match(text, /everything/)
    t.notOk(text.includes(transport.sessionId!), 'only the id prefix is shown')
  })

  await t.test('requests table shows the decisions, the chart is drawn', async t => {
    await page.locator('#requests td.decision.forbidden').first().waitFor()
    const forbidden = await page
      .locator('#requests tr', { has: page.locator('td.decision.forbidden'), hasText: 'bob' })
      .first()
      .innerText()
    t.match(forbidden, /403/)
    t.ok(forbidden.includes(RULE), 'the failing rule is named')
    const noCredential = await page
      .locator('#requests tr', { has: page.locator('td.decision.forbidden'), hasText: 'mallory' })
      .first()
      .innerText()
    t.match(noCredential, /403/)
    t.ok(noCredential.includes('MCPP_ERR_TARGET_CREDENTIAL'), "a refused credential: the layer's code")
    t.ok((await page.locator('#requests td.decision.allowed').count()) >= 1)
    t.ok((await page.locator('#chart rect.bar').count()) >= 1, 'the chart has bars')
    await page.locator('#keyset dd').first().waitFor()
    t.match(await page.locator('#keyset').innerText(), new RegExp(g.idp!.currentKid))
    t.match(await page.locator('#oauth-docs').innerText(), /oauth-protected-resource\/mcp/)
    t.match(await page.locator('#ready').innerText(), /^ready$/)
  })

  await t.test('try it runs initialize, tools/list, tools/call', async t => {
    await page.fill('#try-token', aliceToken)
    await page.click('#try-run')
    await page.locator('#try-tool option[value="echo"]').waitFor({ state: 'attached' })
    await page.selectOption('#try-tool', 'echo')
    await page.fill('#try-args', '{"message":"typed in the page"}')
    await page.click('#try-run')
    await page.locator('#try-output li', { hasText: 'tools/call' }).waitFor()
    const out = await page.locator('#try-output').innerText()
    t.match(out, /initialize\s+HTTP 200/)
    t.match(out, /tools\/call\s+HTTP 200/)
    t.match(out, /typed in the page/)
  })

  await t.test('no secret in the page', async t => {
    const html = await page.content()
    const text = await page.locator('body').innerText()
    for (const [name, secret] of Object.entries(SECRETS)) {
      t.notOk(html.includes(secret), `page HTML does not contain ${name}`)
      t.notOk(text.includes(secret), `page text does not contain ${name}`)
    }
    t.notOk(html.includes(transport.sessionId!), 'nor the whole session id')
    t.notOk(text.includes(aliceToken), 'the pasted token is not rendered as text')
    await mkdir(ARTIFACTS, { recursive: true })
    await page.screenshot({ path: join(ARTIFACTS, 'admin-ui.png'), fullPage: true })
  })

  await t.test('the tool column names the tool of each tools/call', async t => {
    const row = page.locator('#requests tr', { has: page.locator('td.tool', { hasText: /^echo$/ }) }).first()
    await row.waitFor()
    t.match(await row.innerText(), /tools\/call\s+echo\s+200/)
  })

  await t.test(
    "the page's own reads of the /.well-known documents are not traffic: not in Recent requests, the chart, the access log or the metrics",
    async t => {
      // /api/oauth is what the page polls every 15 s; each call reads every /.well-known document of the MCP listener.
      const headers = { authorization: `Bearer ${SECRETS.adminToken}` }
      const before = (await (await fetch(`${g.admin}/api/requests`, { headers })).json()) as Array<{ id: string }>
      const metricsBefore = await (await fetch(`${g.admin}/metrics`, { headers })).text()
      const logBefore = g.logText().length
      const oauth = (await (await fetch(`${g.admin}/api/oauth`, { headers })).json()) as { documents: Record<string, unknown> }
      t.ok(
        Object.keys(oauth.documents).some(p => p.startsWith('/.well-known/')),
        'the documents were read'
      )
      const after = (await (await fetch(`${g.admin}/api/requests`, { headers })).json()) as Array<{ id: string; path: string }>
      t.same(
        after.filter(r => !before.some(b => b.id === r.id)).map(r => r.path),
        [],
        'no new row in Recent requests (nor in the chart, fed by the same log)'
      )
      const wellKnown = (text: string): string[] =>
        text
          .split('\n')
          .filter(l => l.startsWith('mcp_proxy_requests_total') && l.includes('well-known'))
          .sort()
      t.same(wellKnown(await (await fetch(`${g.admin}/metrics`, { headers })).text()), wellKnown(metricsBefore), 'mcp_proxy_requests_total unchanged')
      const accessLines = g
        .logText()
        .slice(logBefore)
        .split('\n')
        .filter(l => l.includes('"msg":"request"') && l.includes('well-known'))
      t.same(accessLines, [], 'no access-log line')
      // A client sending the header with another value is still traffic.
      const own = await fetch(`${g.mcp.replace(/\/mcp$/, '')}/.well-known/oauth-protected-resource/mcp`, { headers: { 'x-mcp-proxy-internal': 'guess' } })
      t.equal(own.status, 200)
      const latest = (await (await fetch(`${g.admin}/api/requests`, { headers })).json()) as Array<{ path: string }>
      t.equal(latest[0]?.path, '/.well-known/oauth-protected-resource/mcp', 'a request with a guessed marker is listed like any other')
    }
  )

  await t.test('ending a session asks first: dismissed, the session stays', async t => {
    const dialog = new Promise<string>(resolve =>
      page.once('dialog', d => {
        const m = d.message()
        void d.dismiss().then(() => resolve(m))
      })
    )
    await page.click(`#sessions button[data-handle="${handle}"]`)
    t.match(await dialog, new RegExp(`End session ${handle}… of alice\\?`))
    t.equal(await page.locator(`#sessions button[data-handle="${handle}"]`).isEnabled(), true, 'nothing happened')
    const tools = await client.listTools()
    t.ok(tools.tools.length > 0, 'the client still uses its session')
  })

  await t.test('ending the session from the page: the client gets 404', async t => {
    page.once('dialog', d => {
      void d.accept()
    })
    await page.click(`#sessions button[data-handle="${handle}"]`)
    await page.locator(`#sessions tr[data-handle="${handle}"]`).waitFor({ state: 'detached' })
    const err = (await client.listTools().then(
      () => undefined,
      (e: unknown) => e
    )) as { code?: unknown } | undefined
    t.equal(err?.code, 404, 'the SDK client sees HTTP 404 for the ended session')
    t.match(await page.locator('#notice').innerText(), new RegExp(`session ${handle}… ended`))
  })

  t.same(problems, [], 'no console errors or warnings, no uncaught page errors (CSP included)')
})
