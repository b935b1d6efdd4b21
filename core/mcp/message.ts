/**
 * The /mcp endpoint's parser of a POST body (`McpEndpoint.parse`): JSON-RPC
 * 2.0 framing (core/jsonrpc.ts), checked once for both protocol eras, plus
 * what the access log names of an MCP request. Core hands the bytes over and
 * keeps the result, so a body is parsed once however many readers it has.
 */
import type { McpMessageInfo } from '../context.ts'
import { parseJsonRpcBody, type JsonRpcCall } from '../jsonrpc.ts'

/** What the access log names: the tool or prompt of tools/call and prompts/get, the URI of resources/*. */
function nameOf(m: JsonRpcCall | undefined): string | undefined {
  const v =
    m?.method === 'tools/call' || m?.method === 'prompts/get' ? m.params?.name : m?.method?.startsWith('resources/') === true ? m.params?.uri : undefined
  return typeof v === 'string' ? v : undefined
}

/**
 * Parses one POST /mcp body: a message or a non-empty batch of messages.
 * Throws a ProxyError with -32700 for invalid JSON and -32600 for anything
 * that is not JSON-RPC 2.0 (JSON-RPC 2.0 §5.1).
 */
export function parseMcpBody(buf: Buffer): McpMessageInfo {
  return parseJsonRpcBody(buf, nameOf)
}
