/**
 * A tiny fixed streamable-HTTP MCP server for the HTTP-target workload: every
 * request is answered with one SSE `message` event at once, so the time
 * measured is the proxies', not a real server's.
 * Usage: node --import tsx bench/lib/sse-upstream.ts <port>
 */
import { createServer } from 'node:http'
import { randomUUID } from 'node:crypto'

interface Msg {
  id?: unknown
  method?: string
  params?: { arguments?: { message?: string } }
}

function resultOf(msg: Msg): unknown {
  if (msg.method === 'initialize') {
    return { protocolVersion: '2025-06-18', capabilities: { tools: {} }, serverInfo: { name: 'bench-sse-upstream', version: '1' } }
  }
  if (msg.method === 'tools/list') {
    return { tools: [{ name: 'echo', description: 'Echoes the message', inputSchema: { type: 'object', properties: { message: { type: 'string' } } } }] }
  }
  return { content: [{ type: 'text', text: `Echo: ${msg.params?.arguments?.message ?? ''}` }] }
}

createServer((req, res) => {
  if (req.method === 'DELETE') {
    res.writeHead(200, { 'content-length': 0 }).end()
    return
  }
  if (req.method !== 'POST') {
    res.writeHead(405, { 'content-length': 0 }).end()
    return
  }
  let body = ''
  req
    .setEncoding('utf8')
    .on('data', (d: string) => {
      body += d
    })
    .on('end', () => {
      const msg = JSON.parse(body) as Msg
      if (msg.id === undefined) {
        res.writeHead(202, { 'content-length': 0 }).end()
        return
      }
      const headers: Record<string, string> = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }
      headers['mcp-session-id'] = msg.method === 'initialize' ? randomUUID() : String(req.headers['mcp-session-id'] ?? '')
      res.writeHead(200, headers)
      res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: resultOf(msg) })}\n\n`)
    })
}).listen(Number(process.argv[2]), '127.0.0.1')
process.on('SIGTERM', () => process.exit(0))
