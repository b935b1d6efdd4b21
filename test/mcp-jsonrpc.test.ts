/**
 * core/mcp/jsonrpc.ts: the one parser of POST /mcp bodies (both eras).
 */
import t from 'tap'
import { isJsonRpcMessage } from '../core/jsonrpc.ts'
import { parseMcpBody } from '../core/mcp/message.ts'
import { ProxyError } from '../core/errors.ts'

const buf = (v: unknown): Buffer => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v))

t.test('isJsonRpcMessage accepts requests, notifications and responses', async t => {
  t.ok(isJsonRpcMessage({ jsonrpc: '2.0', id: 1, method: 'ping' }), 'request')
  t.ok(isJsonRpcMessage({ jsonrpc: '2.0', id: 'a', method: 'tools/call', params: { name: 'x' } }), 'string id, object params')
  t.ok(isJsonRpcMessage({ jsonrpc: '2.0', method: 'notifications/initialized' }), 'notification')
  t.ok(isJsonRpcMessage({ jsonrpc: '2.0', id: 1, result: {} }), 'result')
  t.ok(isJsonRpcMessage({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'x' } }), 'error with id null')
})

t.test('isJsonRpcMessage refuses what JSON-RPC 2.0 does not allow', async t => {
  const bad: Array<[unknown, string]> = [
    [null, 'null'],
    [[], 'an array'],
    [{ id: 1, method: 'ping' }, 'no jsonrpc member'],
    [{ jsonrpc: '1.0', id: 1, method: 'ping' }, 'wrong version'],
    [{ jsonrpc: '2.0', id: {}, method: 'ping' }, 'object id'],
    [{ jsonrpc: '2.0', id: Number.NaN, method: 'ping' }, 'NaN id'],
    [{ jsonrpc: '2.0', id: null, method: 'ping' }, 'null id on a request'],
    [{ jsonrpc: '2.0', id: 1, method: '' }, 'empty method'],
    [{ jsonrpc: '2.0', id: 1, method: 7 }, 'method not a string'],
    [{ jsonrpc: '2.0', id: 1, method: 'ping', params: null }, 'null params'],
    [{ jsonrpc: '2.0', id: 1, method: 'ping', result: {} }, 'request with a result'],
    [{ jsonrpc: '2.0', result: {} }, 'response without id'],
    [{ jsonrpc: '2.0', id: 1, result: {}, error: { code: 1, message: 'x' } }, 'both result and error'],
    [{ jsonrpc: '2.0', id: 1 }, 'neither method nor result nor error'],
  ]
  for (const [m, why] of bad) t.notOk(isJsonRpcMessage(m), why)
})

t.test('parseMcpBody: one message or a batch, method of the first request', async t => {
  t.same(parseMcpBody(buf({ jsonrpc: '2.0', id: 1, method: 'tools/list' })), { body: { jsonrpc: '2.0', id: 1, method: 'tools/list' }, method: 'tools/list' })
  const batch = [
    { jsonrpc: '2.0', id: 1, result: {} },
    { jsonrpc: '2.0', method: 'notifications/progress', params: {} },
    { jsonrpc: '2.0', id: 2, method: 'ping' },
  ]
  const info = parseMcpBody(buf(batch))
  t.same(info.body, batch)
  t.equal(info.method, 'notifications/progress', 'the first message that has a method names the batch')
  t.equal(parseMcpBody(buf({ jsonrpc: '2.0', id: 1, result: {} })).method, undefined, 'a response has no method')
  // For the access log: the tool, prompt or URI a request names, nothing else.
  t.equal(parseMcpBody(buf({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'x' } })).name, 'x')
  t.equal(parseMcpBody(buf({ jsonrpc: '2.0', id: 1, method: 'resources/read', params: { uri: 'test://a' } })).name, 'test://a')
  t.equal(
    parseMcpBody(buf({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { name: 'x' } })).name,
    undefined,
    'only for tools/call, prompts/get and resources/*'
  )
  t.equal(parseMcpBody(buf({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 7 } })).name, undefined)
})

t.test('parseMcpBody: -32700 for invalid JSON, -32600 for anything else that is not JSON-RPC', async t => {
  const cases: Array<[string, string, number]> = [
    ['{"jsonrpc":', 'MCPP_ERR_PARSE', -32700],
    ['', 'MCPP_ERR_PARSE', -32700],
    ['[]', 'MCPP_ERR_INVALID_REQUEST', -32600],
    ['42', 'MCPP_ERR_INVALID_REQUEST', -32600],
    ['[{"jsonrpc":"2.0","id":1,"method":"ping"},{"id":2}]', 'MCPP_ERR_INVALID_REQUEST', -32600],
  ]
  for (const [text, code, rpcCode] of cases) {
    let err: unknown
    try {
      parseMcpBody(buf(text))
    } catch (e) {
      err = e
    }
    t.ok(ProxyError.is(err), `${JSON.stringify(text)} throws a ProxyError`)
    t.match(err, { code, statusCode: 400, rpcCode }, JSON.stringify(text))
  }
})
