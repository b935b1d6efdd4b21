/**
 * README "Security notes", tracing (issue 22 item 18), from the outside: a
 * whole gateway exporting to a local collector that refuses every export
 * (401), so that the exporter fails and says so. `tracing.headers` (the
 * collector's credentials) are sent to the collector and appear in no log
 * line, at any level.
 */
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { fullGateway } from './helpers/full-gateway.ts'
import { eventually } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/facade.ts'

const COLLECTOR_TOKEN = 'collector-credential-5d1e9a7b3c'
const COLLECTOR_KEY = 'collector-api-key-0f2468ace'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

t.test('tracing.headers reach the collector and are never logged, even when exports fail', async t => {
  const seen: Array<{ authorization?: string; key?: string }> = []
  const collector = createServer((req, res) => {
    seen.push({ authorization: req.headers.authorization, key: req.headers['x-api-key'] as string | undefined })
    req.resume()
    req.on('end', () => res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"unauthorized"}'))
  })
  await new Promise<void>(resolve => collector.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        collector.closeAllConnections()
        collector.close(() => resolve())
      })
  )
  const endpoint = `http://127.0.0.1:${(collector.address() as AddressInfo).port}/v1/traces`
  const g = await fullGateway(t, { targets: [{ name: 'everything', stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'] } }] }, 'debug', {
    tracing: {
      enabled: true,
      endpoint,
      headers: { authorization: `Bearer ${COLLECTOR_TOKEN}`, 'x-api-key': COLLECTOR_KEY },
      batchDelayMs: 50,
      exportTimeoutMs: 1000,
    },
  })
  const init = await fetch(g.url, {
    method: 'POST',
    headers: HEADERS,
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } },
    }),
  })
  await init.text()
  const session = { ...HEADERS, 'mcp-session-id': init.headers.get('mcp-session-id')!, 'mcp-protocol-version': '2025-06-18' }
  // Requests make spans; each round of them is one more export the collector refuses.
  const traffic = async (): Promise<number> => {
    const res = await fetch(g.url, { method: 'POST', headers: session, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }) })
    await res.text()
    return seen.length
  }
  const exports = await eventually(traffic, n => n >= 3, 100, 100)
  t.ok(exports >= 3, `the collector got ${exports} exports and refused them all`)
  t.equal(seen[0]!.authorization, `Bearer ${COLLECTOR_TOKEN}`, 'the configured credential is sent to the collector')
  t.equal(seen[0]!.key, COLLECTOR_KEY)
  const FAILED = /"component":"tracing"/
  const log = await eventually(g.logText, text => FAILED.test(text))
  t.match(log, FAILED, "the failed exports are logged (the SDK's diagnostics, as warnings)")
  t.notOk(log.includes(COLLECTOR_TOKEN), 'the collector token is in no log line')
  t.notOk(log.includes(COLLECTOR_KEY), 'nor the API key')
})
