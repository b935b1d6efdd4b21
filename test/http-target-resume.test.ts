/**
 * An HTTP upstream that closes a request's event stream before the answer, so
 * that its client reconnects (MCP 2025-11-25 transports, SEP-1699 polling:
 * `retry:` and event ids): HttpUpstream resumes with a GET carrying
 * `Last-Event-ID` and delivers the answer, instead of failing the call. The
 * upstream is the conformance fixture in its HTTP mode (its test_reconnection
 * tool closes its own POST stream mid-call), a real server on loopback.
 */
import t from 'tap'
import { pino } from 'pino'
import type { Logger } from '../core/logger.ts'
import { HttpUpstream } from '../core/targets/http.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { fixtureHttp } from './helpers/conformance-fixture.ts'

const log = pino({ level: 'silent' }) as unknown as Logger

t.test('a request stream closed early by the upstream is resumed with Last-Event-ID', async t => {
  const url = await fixtureHttp(t)

  const up = new HttpUpstream({ target: 'fixture', url, headers: {}, log })
  const waiting = new Map<unknown, (m: JsonRpcMessage) => void>()
  up.onMessage = m => {
    if (m.method === undefined) waiting.get(m.id)?.(m)
  }
  const request = (id: number, method: string, params: Record<string, unknown>): Promise<JsonRpcMessage> => {
    const answered = new Promise<JsonRpcMessage>(resolve => waiting.set(id, resolve))
    up.send({ jsonrpc: '2.0', id, method, params })
    return answered
  }
  await up.start()
  t.teardown(() => up.close())
  const init = await request(1, 'initialize', { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'test', version: '1' } })
  t.equal((init.result as { protocolVersion?: string } | undefined)?.protocolVersion, '2025-11-25')
  up.send({ jsonrpc: '2.0', method: 'notifications/initialized' })

  const res = await request(2, 'tools/call', { name: 'test_reconnection', arguments: {} })
  t.equal(res.error, undefined, 'the call is not failed when the upstream closes its stream early', { res })
  t.match(
    (res.result as { content?: Array<{ text?: string }> } | undefined)?.content?.[0]?.text,
    /Reconnection test completed/,
    'its answer arrives on the resumed stream'
  )
})
