/**
 * The serverInfo a 2026-07-28 answer carries is that of the upstream that answered it: with one
 * target, each pooled upstream (one per subject and declared capability set) reports its own
 * `initialize` serverInfo (an HTTP target behind a load balancer mid-rollout: two versions at
 * once), and one client's answer must not carry the serverInfo of whichever upstream another
 * client's request leased last. Through the real gateway and a real HTTP upstream.
 */
import t, { type Test } from 'tap'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { fullGateway } from './helpers/full-gateway.ts'
import { call } from './helpers/conformance-fixture.ts'

const SERVER_INFO = 'io.modelcontextprotocol/serverInfo'

/** A session-era HTTP upstream: each `initialize` gets the next version; `slow` answers when released. */
async function rollingUpstream(t: Test): Promise<{ url: string; release: () => void; slowArrived: Promise<void> }> {
  let version = 0
  let held: (() => void) | undefined
  let arrived!: () => void
  const slowArrived = new Promise<void>(resolve => {
    arrived = resolve
  })
  const server = createServer((req, res) => {
    if (req.method !== 'POST') {
      res.writeHead(req.method === 'DELETE' ? 200 : 405).end()
      return
    }
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        const reply = (out: ServerResponse, result: unknown, headers: Record<string, string> = {}): void => {
          out.writeHead(200, { 'content-type': 'application/json', ...headers }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result }))
        }
        if (body.id === undefined) {
          res.writeHead(202).end()
          return
        }
        if (body.method === 'initialize') {
          version++
          reply(
            res,
            { protocolVersion: body.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'rolling', version: String(version) } },
            { 'mcp-session-id': 'session-' + version }
          )
          return
        }
        if (body.method === 'tools/call' && body.params.name === 'slow') {
          held = () => reply(res, { content: [{ type: 'text', text: 'slow done' }] })
          arrived()
          return
        }
        if (body.method === 'tools/call') {
          reply(res, { content: [{ type: 'text', text: 'fast done' }] })
          return
        }
        reply(res, {})
      })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`, release: () => held?.(), slowArrived }
}

t.test('one target, two upstreams with different serverInfo, interleaved requests: each answer carries its own', async t => {
  const up = await rollingUpstream(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'rolling', protocol: 'session', mcp: { url: up.url } }] })
  // A: no client capabilities -> the upstream initialized first (version 1); held until B is answered.
  const a = call(url, 'tools/call', { name: 'slow', arguments: {} }, {})
  await up.slowArrived
  // B: sampling declared -> another pooled upstream (version 2).
  const b = await call(url, 'tools/call', { name: 'fast', arguments: {} }, { sampling: {} })
  t.equal(b.json.result?.content?.[0]?.text, 'fast done', 'B answered', { got: b.json })
  t.same(b.json.result?._meta?.[SERVER_INFO], { name: 'rolling', version: '2' }, 'B carries the serverInfo of its upstream')
  up.release()
  const got = await a
  t.equal(got.json.result?.content?.[0]?.text, 'slow done', 'A answered', { got: got.json })
  t.same(got.json.result?._meta?.[SERVER_INFO], { name: 'rolling', version: '1' }, 'A carries the serverInfo of its own upstream, not of the one B leased')
})
