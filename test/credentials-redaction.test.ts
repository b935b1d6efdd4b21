/**
 * Secrets of the credential layer never surface (issue 25 "Safety"): the
 * gateway's client secret and private key, the static secrets, the minted
 * tokens and the callers' tokens appear in none of the log (debug level),
 * the metrics, the exported spans (a real OTLP/HTTP receiver), describe(),
 * the errors answered or the admin's config view, through successful
 * exchanges, cache hits, shared exchanges and every kind of failure,
 * including an IdP that echoes the request back in its error. The
 * `credential.exchange` spans themselves are checked: one per resolve, with
 * target, mode and cache outcome, and the failure reason on a failed one.
 */
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { decodeJwt, exportJWK, exportPKCS8, generateKeyPair } from 'jose'
import type { TargetConfig } from '../core/config.ts'
import { createCredentialBroker, type Caller } from '../core/credentials/index.ts'
import { ProxyError } from '../core/errors.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { startTracing, stopTracing } from '../core/observability/tracing.ts'
import { redactConfig, REDACTED } from '../core/admin/redact.ts'
import { devIdp } from './helpers/idp.ts'
import { memoryLogger } from './helpers/logger.ts'

const SECRET = 'gateway-client-secret-redact-me'
const BEARER = 'static-bearer-redact-me'
const API_KEY = 'static-api-key-redact-me'

interface OtlpSpan {
  name: string
  attributes?: Array<{ key: string; value: { stringValue?: string } }>
  status?: { code?: number }
}

/** An OTLP/HTTP receiver: keeps every export body. */
async function otlpReceiver(t: Test): Promise<{ url: string; bodies: string[] }> {
  const bodies: string[] = []
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      bodies.push(Buffer.concat(chunks).toString('utf8'))
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`, bodies }
}

/** A misbehaving IdP: refuses every request, echoing the form it received (tokens, secret) in its error. */
async function echoingIdp(t: Test): Promise<string> {
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (c: Buffer) => {
      body += c
    })
    req.on('end', () => {
      const text = JSON.stringify({
        error: 'invalid_request',
        error_description: `bad request: ${decodeURIComponent(body)} ${req.headers.authorization ?? ''}`,
      })
      res.writeHead(400, { 'content-type': 'application/json' }).end(text)
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/token`
}

const spanAttr = (s: OtlpSpan, key: string): string | undefined => s.attributes?.find(a => a.key === key)?.value.stringValue

t.test('no secret in logs, metrics, spans, describe(), errors or the config view; one span per resolve', async t => {
  const key = await generateKeyPair('RS256', { extractable: true })
  const pem = await exportPKCS8(key.privateKey)
  const idp = await devIdp(t, {
    tokenExchange: {
      clients: {
        'mcp-gateway': { secret: SECRET, audiences: ['crm'], scopes: ['crm.read'] },
        'mcp-gateway-jwt': { jwks: [{ ...(await exportJWK(key.publicKey)), kid: 'gw-1', alg: 'RS256' }], audiences: ['crm'], scopes: ['crm.read'] },
      },
    },
  })
  const echo = await echoingIdp(t)
  const otlp = await otlpReceiver(t)
  const { log, text } = memoryLogger('debug')
  await startTracing(
    {
      enabled: true,
      endpoint: otlp.url,
      headers: {},
      samplingRatio: 1,
      serviceName: 'creds',
      recordSubject: false,
      maxQueueSize: 512,
      batchDelayMs: 50,
      exportTimeoutMs: 5000,
    },
    log,
    'test'
  )
  t.teardown(() => stopTracing())
  const http = (name: string, auth: TargetConfig['auth']): TargetConfig => ({ name, mcp: { url: `https://${name}.example/mcp`, headers: {} }, auth })
  const targets: TargetConfig[] = [
    http('crm', {
      tokenExchange: { tokenEndpoint: idp.tokenEndpoint, clientId: 'mcp-gateway', clientSecret: SECRET, audience: ['crm'] },
      headers: { 'X-User': '{sub}' },
    }),
    http('signed', {
      tokenExchange: { tokenEndpoint: idp.tokenEndpoint, clientId: 'mcp-gateway-jwt', privateKey: { pem, alg: 'RS256', kid: 'gw-1' }, audience: ['crm'] },
    }),
    http('refused', { tokenExchange: { tokenEndpoint: idp.tokenEndpoint, clientId: 'mcp-gateway', clientSecret: SECRET, audience: ['elsewhere'] } }),
    http('echo', { tokenExchange: { tokenEndpoint: echo, clientId: 'mcp-gateway', clientSecret: SECRET, audience: ['crm'] } }),
    http('echo-post', { tokenExchange: { tokenEndpoint: echo, clientId: 'mcp-gateway', clientSecret: SECRET, clientAuthMethod: 'client_secret_post' } }),
    http('legacy', { bearer: BEARER }),
    http('keyed', { apiKey: { header: 'X-API-Key', value: API_KEY } }),
  ]
  const metrics = new Metrics()
  const broker = createCredentialBroker(targets, {
    log,
    metrics,
    resourceMetadataUrl: 'https://gw.example/.well-known/oauth-protected-resource/mcp',
    scopesSupported: [],
  })
  const callers: Caller[] = []
  for (const sub of ['alice', 'bob']) {
    const token = await idp.mintToken({ sub })
    callers.push({ key: `sub:${sub}`, subject: sub, claims: Object.freeze(decodeJwt(token)), token })
  }
  const [alice, bob] = callers as [Caller, Caller]
  const minted: string[] = []
  const errors: string[] = []
  const collect = async (p: Promise<{ headers: Readonly<Record<string, string>> }>): Promise<void> => {
    try {
      const cred = await p
      const bearer = /^Bearer (.+)$/.exec(cred.headers.authorization ?? '')?.[1]
      if (bearer !== undefined) minted.push(bearer)
    } catch (err) {
      t.ok(ProxyError.is(err))
      errors.push(JSON.stringify({ message: (err as ProxyError).message, headers: (err as ProxyError).headers, data: (err as ProxyError).data }))
    }
  }
  const crm = broker.forTarget('crm')!
  await Promise.all([collect(crm.resolve(alice)), collect(crm.resolve(alice)), collect(crm.resolve(bob))]) // miss, shared, miss
  await collect(crm.resolve(alice)) // hit
  await collect(broker.forTarget('signed')!.resolve(alice))
  await collect(broker.forTarget('refused')!.resolve(alice))
  await collect(broker.forTarget('echo')!.resolve(alice))
  await collect(broker.forTarget('echo-post')!.resolve(bob))
  await collect(broker.forTarget('legacy')!.resolve(alice))
  await collect(broker.forTarget('keyed')!.resolve(alice))
  t.equal(minted.length, 6, 'six bearer tokens handed out (four of crm, one signed, one static)')
  t.equal(errors.length, 3)
  t.match(text(), /bad request: /, "the echoing IdP's refusal is in the log (scrubbed)")
  await stopTracing()

  const spans = otlp.bodies
    .flatMap(b => (JSON.parse(b) as { resourceSpans: Array<{ scopeSpans: Array<{ spans: OtlpSpan[] }> }> }).resourceSpans)
    .flatMap(r => r.scopeSpans.flatMap(s => s.spans))
    .filter(s => s.name === 'credential.exchange')
  const crmSpans = spans.filter(s => spanAttr(s, 'mcp_proxy.target') === 'crm')
  t.same(
    crmSpans.map(s => spanAttr(s, 'mcp_proxy.credential.cache')).sort(),
    ['hit', 'miss', 'miss', 'shared'],
    'one span per resolve: miss, shared, miss, hit'
  )
  t.ok(crmSpans.every(s => spanAttr(s, 'mcp_proxy.credential.mode') === 'tokenExchange'))
  const refused = spans.find(s => spanAttr(s, 'mcp_proxy.target') === 'refused')
  t.equal(refused?.status?.code, 2, 'a failed exchange is an error span')
  t.equal(refused === undefined ? undefined : spanAttr(refused, 'error.type'), 'refused')
  t.equal(spans.filter(s => ['legacy', 'keyed'].includes(spanAttr(s, 'mcp_proxy.target') ?? '')).length, 0, 'a static secret is no exchange: no span')

  const secrets: Array<[string, string]> = [
    ['client secret', SECRET],
    ['private key', pem.split('\n')[1]!],
    ['static bearer', BEARER],
    ['API key', API_KEY],
    ["alice's token", alice.token!],
    ["bob's token", bob.token!],
    ...minted.filter(m => m !== BEARER).map((m, i): [string, string] => [`minted token ${i}`, m]),
    ...[alice.token!, bob.token!].map((tok, i): [string, string] => [`caller token ${i} signature`, tok.split('.')[2]!]),
  ]
  const places: Array<[string, string]> = [
    ['log', text()],
    ['metrics', metrics.render()],
    ['spans', otlp.bodies.join('\n')],
    ['describe()', JSON.stringify(broker.describe())],
    ['errors', errors.join('\n')],
  ]
  for (const [where, content] of places) for (const [what, secret] of secrets) t.notOk(content.includes(secret), `${what} is not in the ${where}`)
  t.ok(otlp.bodies.length > 0, 'spans were exported')

  const view = JSON.stringify(redactConfig({ mcp: { targets } }, new Set()))
  const configSecrets: Array<[string, string]> = [
    ['client secret', SECRET],
    ['private key', pem.split('\n')[1]!],
    ['static bearer', BEARER],
    ['API key', API_KEY],
  ]
  for (const [what, secret] of configSecrets) t.notOk(view.includes(secret), `${what} is not in the admin config view`)
  t.ok(view.includes(REDACTED))
  t.ok(view.includes('X-API-Key'), 'the API key header name is not a secret')
})
