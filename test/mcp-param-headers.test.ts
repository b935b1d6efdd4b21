/**
 * `Mcp-Param-{Name}` headers of revision 2026-07-28 (SEP-2243, streamable HTTP
 * "Custom Headers from Tool Parameters" and "Server Validation"): a tool
 * argument annotated `x-mcp-header` is mirrored in a header, which the gateway
 * (a server that processes the body) validates against the body before the
 * call goes anywhere: decoded when Base64-wrapped, refused with 400 and -32020
 * when malformed, different, or missing while the body has the value.
 * Raw HTTP against a whole gateway whose target, the conformance fixture over
 * stdio, has `test_x_mcp_header` (`region` mirrored as `Mcp-Param-Region`).
 */
import t from 'tap'
import { join } from 'node:path'
import { ROOT } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'

const MODERN = '2026-07-28'
const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')

function call(name: string, args: Record<string, unknown>, id: number): Record<string, unknown> {
  return {
    jsonrpc: '2.0',
    id,
    method: 'tools/call',
    params: {
      name,
      arguments: args,
      _meta: { 'io.modelcontextprotocol/protocolVersion': MODERN, 'io.modelcontextprotocol/clientCapabilities': {} },
    },
  }
}

t.test('Mcp-Param-* headers are validated against the body (2026-07-28)', async t => {
  const { url, logText } = await fullGateway(t, { targets: [{ name: 'conformance', stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {} } }] })
  let id = 1
  const post = async (args: Record<string, unknown>, params: Record<string, string>, name = 'test_x_mcp_header'): Promise<{ status: number; json: any }> => {
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': MODERN,
        'mcp-method': 'tools/call',
        'mcp-name': name,
        ...params,
      },
      body: JSON.stringify(call(name, args, id++)),
    })
    const text = await res.text()
    const data = text.split('\n').find(l => l.startsWith('data: '))
    return { status: res.status, json: JSON.parse(data !== undefined ? data.slice(6) : text) }
  }
  const accepted = async (what: string, args: Record<string, unknown>, params: Record<string, string>, text: string): Promise<void> => {
    const r = await post(args, params)
    t.equal(r.status, 200, `${what}: accepted`, { body: r.json })
    t.same(r.json.result?.content, [{ type: 'text', text }], `${what}: the tool ran`)
  }
  const refused = async (what: string, args: Record<string, unknown>, params: Record<string, string>, message: RegExp): Promise<void> => {
    const r = await post(args, params)
    t.equal(r.status, 400, `${what}: 400`, { body: r.json })
    t.equal(r.json.error?.code, -32020, `${what}: HeaderMismatch`)
    t.match(r.json.error?.message, message, `${what}: the message says why`)
    t.equal(r.json.result, undefined, `${what}: the tool did not run`)
  }

  await accepted('plain value equal to the body', { region: 'us-west1' }, { 'mcp-param-region': 'us-west1' }, 'region=us-west1')
  await accepted('header name in any case', { region: 'us-west1' }, { 'MCP-PARAM-REGION': 'us-west1' }, 'region=us-west1')
  await accepted(
    'Base64-wrapped value decoded before comparing',
    { region: 'Hello, 世界' },
    { 'mcp-param-region': `=?base64?${Buffer.from('Hello, 世界').toString('base64')}?=` },
    'region=Hello, 世界'
  )
  await accepted('no wrapper suffix: a literal', { region: '=?base64?SGVsbG8=' }, { 'mcp-param-region': '=?base64?SGVsbG8=' }, 'region==?base64?SGVsbG8=')
  await accepted('no argument, no header', {}, {}, 'region=<none>')
  const nul = await post({ region: null }, {})
  t.not(nul.json.error?.code, -32020, 'a null argument needs no header')
  await accepted('unannotated arguments need no header', { level: 3 }, { 'mcp-param-other': 'ignored' }, 'region=<none>')

  await refused('header differs from the body', { region: 'us-west1' }, { 'mcp-param-region': 'eu-west1' }, /Mcp-Param-Region.*does not match/)
  await refused('header missing while the body has the value', { region: 'us-west1' }, {}, /Mcp-Param-Region header is missing/)
  await refused('Base64 with bad padding', { region: 'Hello' }, { 'mcp-param-region': '=?base64?SGVsbG8?=' }, /Mcp-Param-Region.*Base64/)
  await refused(
    'Base64 with characters outside the alphabet',
    { region: 'Hello' },
    { 'mcp-param-region': '=?base64?SGVs!!!bG8=?=' },
    /Mcp-Param-Region.*Base64/
  )
  await refused('header without a body value', {}, { 'mcp-param-region': 'us-west1' }, /Mcp-Param-Region.*does not match/)
  t.match(logText(), /Mcp-Param-Region/, 'refusals are logged')
})
