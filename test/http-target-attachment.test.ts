/**
 * HttpUpstream with an UpstreamAttachment (core/targets/http.ts): the attached headers asked for before
 * each exchange, after the target's static ones and never over the transport's own, and a refused
 * attachment failing that exchange only. Against the conformance fixture (official SDK 2.x) over HTTP,
 * behind a hop that records what reached it.
 */
import t from 'tap'
import { pino } from 'pino'
import type { Logger } from '../core/logger.ts'
import { ProxyError } from '../core/errors.ts'
import { HttpUpstream } from '../core/targets/http.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { fixtureHttp, MODERN } from './helpers/conformance-fixture.ts'
import { recordingProxy } from './helpers/recording-proxy.ts'

const log = pino({ level: 'silent' }) as unknown as Logger
const proxy = await recordingProxy(t, await fixtureHttp(t))

/** An upstream of `name` whose answers are collected; `next(id)` waits for the answer to `id`. */
async function upstream(name: string, attach: () => Record<string, string> | Promise<Record<string, string>>) {
  const answers = new Map<unknown, JsonRpcMessage>()
  const waiting = new Map<unknown, (m: JsonRpcMessage) => void>()
  const up = new HttpUpstream({ target: name, url: proxy.url(name), headers: { 'x-static': 'static', 'X-Other': 'other' }, attach, log })
  up.onMessage = m => {
    if (m.method !== undefined) return
    const w = waiting.get(m.id)
    if (w !== undefined) w(m)
    else answers.set(m.id, m)
  }
  await up.start()
  const next = (id: number): Promise<JsonRpcMessage> => (answers.has(id) ? Promise.resolve(answers.get(id)!) : new Promise(resolve => waiting.set(id, resolve)))
  t.teardown(() => up.close())
  return { up, next }
}

const INIT = { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '1' } }

t.test('attached headers go after the static ones, never over the transport own', async t => {
  let asked = 0
  const { up, next } = await upstream('order', () => {
    asked++
    return {
      'X-Static': 'attached',
      Authorization: 'Bearer minted',
      'Mcp-Session-Id': 'forged',
      'MCP-Protocol-Version': '1999-01-01',
      'Content-Type': 'text/plain',
      'Mcp-Method': 'forged',
      Host: 'forged.example',
    }
  })
  up.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT })
  const init = await next(1)
  t.ok(init.result, 'initialized')
  up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  up.send({ jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} })
  t.ok((await next(2)).result)
  up.sendModern!(
    {
      jsonrpc: '2.0',
      id: 3,
      method: 'tools/list',
      params: {
        _meta: {
          'io.modelcontextprotocol/protocolVersion': MODERN,
          'io.modelcontextprotocol/clientInfo': { name: 't', version: '1' },
          'io.modelcontextprotocol/clientCapabilities': {},
        },
      },
    },
    { 'mcp-protocol-version': MODERN, 'mcp-method': 'tools/list' },
    () => {}
  )
  const m = await next(3)
  t.ok(m.result, `a 2026-07-28 request too: ${JSON.stringify(m.error)}`)
  const seen = proxy.of('order').filter(r => r.method === 'POST')
  t.equal(seen.length, 4)
  for (const r of seen) {
    t.equal(r.headers['x-static'], 'attached', 'an attached header wins over a static one')
    t.equal(r.headers['x-other'], 'other', 'the other static headers stay')
    t.equal(r.headers.authorization, 'Bearer minted')
    t.equal(r.headers['content-type'], 'application/json', 'Content-Type is the transport own')
    t.not(r.headers['mcp-session-id'], 'forged')
    t.not(r.headers['mcp-protocol-version'], '1999-01-01')
    t.not(r.headers['mcp-method'], 'forged')
    t.not(r.headers.host, 'forged.example')
  }
  const sid = seen[1]!.headers['mcp-session-id']
  t.ok(typeof sid === 'string' && sid !== 'forged', "the upstream's own session id")
  t.equal(seen[3]!.headers['mcp-method'], 'tools/list', "the revision's own Mcp-Method")
  t.equal(seen[3]!.headers['mcp-session-id'], undefined, 'a 2026-07-28 request has no session, attached or not')
  t.ok(asked >= 4, 'asked before each exchange')
})

t.test('a refused attachment fails that request only, with its message; the upstream and its other requests go on', async t => {
  let refuse: unknown
  const { up, next } = await upstream('refused', () => {
    if (refuse !== undefined) {
      const err = refuse
      refuse = undefined
      return Promise.reject(err)
    }
    return Promise.resolve({ authorization: 'Bearer minted' })
  })
  up.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT })
  t.ok((await next(1)).result)
  up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  refuse = new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 503, 'target refused: the identity provider is unavailable', { expose: true })
  up.send({ jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} })
  up.send({ jsonrpc: '2.0', id: 3, method: 'tools/list', params: {} })
  t.match(await next(2), { id: 2, error: { code: -32000, message: 'target refused: the identity provider is unavailable' } }, "the refusal's message")
  t.ok((await next(3)).result, 'the neighbour request is answered')
  t.ok(up.alive, 'the upstream is still running')
  refuse = new Error('a secret detail of the credential layer')
  up.send({ jsonrpc: '2.0', id: 4, method: 'tools/list', params: {} })
  t.match(await next(4), { error: { message: 'target refused: no credential for this request' } }, 'an unexposed refusal: a generic message naming the target')
  up.send({ jsonrpc: '2.0', id: 5, method: 'tools/list', params: {} })
  t.ok((await next(5)).result)
  const lists = proxy.of('refused').filter(r => r.body?.method === 'tools/list')
  t.same(
    lists.map(r => r.body.id),
    [3, 5],
    'the refused requests never reached the target'
  )
})

t.test('a DELETE goes with the attached headers', async t => {
  const { up, next } = await upstream('deleted', () => ({ authorization: 'Bearer minted-delete' }))
  up.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: INIT })
  t.ok((await next(1)).result)
  await up.close()
  const del = proxy.of('deleted').find(r => r.method === 'DELETE')
  t.equal(del?.headers.authorization, 'Bearer minted-delete')
})
