/**
 * Issue 22 item 8. Through the real CLI: `workers: 2` with `facade: {}` (no
 * sealing keys configured). Every request goes over a fresh TCP connection,
 * so the primary's round-robin spreads the steps of each flow over both
 * workers: registration on one, authorize on the other, the callback, the
 * consent and the token wherever they land. Before: each worker sealed with
 * a random key of its own and every flow ended in "unknown client_id"; now
 * they seal with a key derived from the per-run secret the primary hands
 * every worker (env.deriveKey), and every flow ends in an MCP session.
 * Two replicas with one `cluster.secret` and `facade: {}`: the same across
 * replicas (the key derived from that secret).
 */
import t from 'tap'
import { request as httpRequest } from 'node:http'
import { Readable } from 'node:stream'
import { configFile, freePort, spawnCli, waitForPort } from './helpers/cli.ts'
import { Agent, CALLBACK, EVERYTHING, authorizeUrl, devIdpFor, facadeGateway, ossAuth, pkce, redeem, register } from './helpers/facade.ts'

// Real CLI processes (and IdP logins): seconds each on a loaded machine, past the 120 s default.
t.setTimeout(300_000)

const FLOWS = 4

/** fetch over a new TCP connection each time (so the primary hands it to the next worker), every Set-Cookie kept apart. */
function fresh(url: string, init: RequestInit = {}): Promise<Response> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = {}
    new Headers(init.headers).forEach((v, k) => {
      headers[k] = v
    })
    const req = httpRequest(url, { method: init.method ?? 'GET', headers, agent: false }, res => {
      const h = new Headers()
      for (const [k, v] of Object.entries(res.headers)) {
        if (v === undefined) continue
        for (const one of Array.isArray(v) ? v : [v]) h.append(k, one)
      }
      const empty = res.statusCode === 204 || res.statusCode === 304
      resolve(new Response(empty ? null : (Readable.toWeb(res) as ReadableStream), { status: res.statusCode, headers: h }))
    })
    req.on('error', reject)
    req.end(typeof init.body === 'string' ? init.body : undefined)
  })
}

/** The browser stand-in of helpers/facade.ts, each of its requests on a fresh connection. */
class FreshAgent extends Agent {
  override async fetch(url: string, init: RequestInit = {}): Promise<Response> {
    const target = this.route(url)
    const cookie = this.cookieHeader(target)
    const res = await fresh(target, { ...init, headers: { ...((init.headers as Record<string, string>) ?? {}), ...(cookie !== undefined ? { cookie } : {}) } })
    this.keep(target, res)
    return res
  }
}

/** Behind a balancer without affinity: every other request to `publicBase` goes to `other`; cookies stay the public origin's. */
class BalancedAgent extends Agent {
  #n = 0
  readonly publicBase: string
  readonly other: string
  constructor(publicBase: string, other: string) {
    super()
    this.publicBase = publicBase
    this.other = other
  }
  override async fetch(url: string, init: RequestInit = {}): Promise<Response> {
    const target = url.startsWith(this.publicBase) && this.#n++ % 2 === 0 ? this.other + url.slice(this.publicBase.length) : url
    const cookie = this.cookieHeader(url)
    const res = await fetch(target, {
      ...init,
      redirect: 'manual',
      headers: { ...((init.headers as Record<string, string>) ?? {}), ...(cookie !== undefined ? { cookie } : {}) },
    })
    this.keep(url, res)
    return res
  }
}

/** `mcp_proxy_requests_total` of the OAuth routes, summed per worker, from the primary's probe listener. */
async function oauthRequestsPerWorker(probes: number): Promise<Record<string, number>> {
  const text = await (await fresh(`http://127.0.0.1:${probes}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const line of text.split('\n')) {
    const m = /^mcp_proxy_requests_total\{worker="(\d+)",.*(oauth|client-registration).* (\d+)$/.exec(line)
    if (m !== null) out[m[1]!] = (out[m[1]!] ?? 0) + Number(m[3])
  }
  return out
}

t.test('workers: 2 with facade: {}: register, authorize, IdP login, consent, token and initialize across both workers', async t => {
  const [port, probes] = await Promise.all([freePort(), freePort()])
  const base = `http://127.0.0.1:${port}`
  const idp = await devIdpFor(t, () => [`${base}/oauth/callback`])
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      `      issuer: ${idp.issuer}`,
      `      audiences: [${idp.clientId}]`,
      `      clientId: ${idp.clientId}`,
      '      provider: { oss_idp: {} }',
      `      resourceMetadata: { resource: "${base}/mcp", scopesSupported: [openid, profile] }`,
      '      facade: {}',
      '  targets:',
      `    - { name: everything, stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] } }`,
      'admin: { enabled: false }',
      `probes: { host: 127.0.0.1, port: ${probes}, shutdownDelayMs: 0 }`,
      'workers: 2',
    ].join('\n'),
    'mcpp-facade-workers-'
  )
  const cli = spawnCli(['-f', file])
  t.teardown(async () => {
    if (cli.child.exitCode !== null || cli.child.signalCode !== null) return
    cli.child.kill('SIGTERM')
    const gone = await Promise.race([cli.exited.then(() => true), new Promise<false>(resolve => setTimeout(() => resolve(false), 20_000).unref())])
    if (!gone) cli.child.kill('SIGKILL')
  })
  await waitForPort(port, cli.exited)

  const outcomes: string[] = []
  for (let i = 0; i < FLOWS; i++) {
    const step = async (): Promise<string> => {
      const reg = await fresh(`${base}/.well-known/oauth-authorization-server/client-registration`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ client_name: `flow ${i}`, redirect_uris: [CALLBACK], token_endpoint_auth_method: 'none' }),
      })
      const regBody = (await reg.json()) as { client_id?: string }
      if (reg.status !== 201 || regBody.client_id === undefined) return `registration ${reg.status}: ${JSON.stringify(regBody)}`
      const { verifier, challenge } = pkce()
      let callback: URL
      try {
        callback = await new FreshAgent().follow(authorizeUrl(base, regBody.client_id, challenge), CALLBACK)
      } catch (err) {
        return `authorize: ${(err as Error).message}`
      }
      const code = callback.searchParams.get('code')
      if (code === null) return `no code: ${callback.search}`
      const tok = await fresh(`${base}/oauth/token`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({
          grant_type: 'authorization_code',
          code,
          client_id: regBody.client_id,
          redirect_uri: CALLBACK,
          code_verifier: verifier,
        }).toString(),
      })
      const tokBody = (await tok.json()) as { access_token?: string }
      if (tok.status !== 200 || tokBody.access_token === undefined) return `token ${tok.status}: ${JSON.stringify(tokBody)}`
      const init = await fresh(`${base}/mcp`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${tokBody.access_token}` },
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'initialize',
          params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: `flow ${i}`, version: '1' } },
        }),
      })
      const text = await init.text()
      return init.status === 200 && text.includes('"serverInfo"') ? 'ok' : `initialize ${init.status}: ${text.slice(0, 200)}`
    }
    outcomes.push(await step())
  }
  t.same(outcomes, Array(FLOWS).fill('ok'), 'every flow ends in an MCP session')
  const perWorker = await oauthRequestsPerWorker(probes)
  t.equal(Object.keys(perWorker).length, 2, `both workers served steps of the flows: ${JSON.stringify(perWorker)}`)
  t.ok(
    Object.values(perWorker).every(n => n > 0),
    'each of them more than none'
  )
})

t.test('two replicas with one cluster.secret and facade: {}: a flow whose steps alternate between them ends in an MCP session', async t => {
  const [port, bPort] = await Promise.all([freePort(), freePort()])
  const publicBase = `http://127.0.0.1:${port}`
  const idp = await devIdpFor(t, () => [`${publicBase}/oauth/callback`])
  const cluster = (advertiseUrl: string) => ({ secret: 'replicas-share-this-secret-0123456789', advertiseUrl })
  const a = await facadeGateway(t, ossAuth(idp, {}), { port, cluster: cluster(publicBase) })
  const b = await facadeGateway(t, ossAuth(idp, {}), { port: bPort, publicBase, cluster: cluster(`http://127.0.0.1:${bPort}`) })
  t.match(a.logText(), /keys is not set: sealing with a key derived from the secret/)
  const clientId = await register(a.base)
  const agent = new BalancedAgent(publicBase, b.base)
  const { verifier, challenge } = pkce()
  const cb = await agent.follow(authorizeUrl(publicBase, clientId, challenge), CALLBACK)
  t.ok(agent.hops.filter(h => h.startsWith(publicBase)).length >= 2, 'several steps at the gateway, split between A and B')
  const code = cb.searchParams.get('code')
  t.type(code, 'string', 'a code, whichever replica each step landed on')
  const tok = await redeem(b.base, { grant_type: 'authorization_code', code: code!, client_id: clientId, redirect_uri: CALLBACK, code_verifier: verifier })
  t.equal(tok.status, 200, `redeemed on B (${String(tok.body.error ?? '')} ${String(tok.body.error_description ?? '')})`)
  const init = await fetch(`${a.base}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${String(tok.body.access_token)}` },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'replicas', version: '1' } },
    }),
  })
  t.equal(init.status, 200, 'and the token opens a session on A')
  await init.text()
})
