/**
 * An HTTP upstream that closes a request's event stream before the answer, so
 * that its client reconnects (MCP 2025-11-25 transports, SEP-1699 polling:
 * `retry:` and event ids): HttpUpstream resumes with a GET carrying
 * `Last-Event-ID` and delivers the answer, instead of failing the call. The
 * upstream is the conformance fixture in its HTTP mode (its test_reconnection
 * tool closes its own POST stream mid-call), a real server on loopback.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { pino } from 'pino'
import type { Logger } from '../core/logger.ts'
import { HttpUpstream } from '../core/targets/http.ts'
import type { JsonRpcMessage } from '../core/targets/types.ts'
import { ROOT } from './helpers/gateway-harness.ts'

const log = pino({ level: 'silent' }) as unknown as Logger
const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')

t.test('a request stream closed early by the upstream is resumed with Last-Event-ID', async t => {
  const child = spawn(process.execPath, [FIXTURE, 'http'], { env: { ...process.env, NODE_OPTIONS: '', PORT: '0' }, stdio: ['ignore', 'ignore', 'pipe'] })
  t.teardown(() => { child.kill('SIGKILL') })
  const port = await new Promise<string>((resolve, reject) => {
    let err = ''
    child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      err += d
      const m = /listening on port (\d+)/.exec(err)
      if (m !== null) resolve(m[1]!)
    })
    child.once('exit', code => reject(new Error(`fixture exited with ${String(code)}: ${err}`)))
  })

  const up = new HttpUpstream({ target: 'fixture', url: `http://127.0.0.1:${port}/mcp`, headers: {}, log })
  const waiting = new Map<unknown, (m: JsonRpcMessage) => void>()
  up.onMessage = m => { if (m.method === undefined) waiting.get(m.id)?.(m) }
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
  t.match((res.result as { content?: Array<{ text?: string }> } | undefined)?.content?.[0]?.text, /Reconnection test completed/, 'its answer arrives on the resumed stream')
})
