// A dependency-free stdio MCP server for the container image test
// (deploy/container/test-image.sh): the image holds the gateway's production
// dependencies only, so the target it runs must need nothing else.
// Answers initialize, ping, tools/list and tools/call echo (session era, one
// JSON-RPC message per line); ignores notifications.
import { createInterface } from 'node:readline'

const answers = {
  initialize: params => ({
    protocolVersion: params?.protocolVersion ?? '2025-11-25',
    capabilities: { tools: {} },
    serverInfo: { name: 'image-echo', version: '1.0.0' },
  }),
  ping: () => ({}),
  'tools/list': () => ({
    tools: [{ name: 'echo', inputSchema: { type: 'object', properties: { message: { type: 'string' } } } }],
  }),
  'tools/call': params => ({ content: [{ type: 'text', text: `Echo: ${params?.arguments?.message ?? ''}` }] }),
}

for await (const line of createInterface({ input: process.stdin })) {
  let message
  try {
    message = JSON.parse(line)
  } catch {
    continue
  }
  if (message.id === undefined || typeof message.method !== 'string') continue
  const answer = answers[message.method]
  const reply =
    answer === undefined
      ? { jsonrpc: '2.0', id: message.id, error: { code: -32601, message: 'Method not found' } }
      : { jsonrpc: '2.0', id: message.id, result: answer(message.params) }
  process.stdout.write(`${JSON.stringify(reply)}\n`)
}
