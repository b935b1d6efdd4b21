/**
 * The bare bridge the issue measures against: HTTP POST -> stdio child ->
 * JSON answer. No sessions, no SSE, no auth, no limits; ids are remapped so
 * concurrent clients can share a child. With BARE_CHILD_PER_KEY=1 each
 * distinct `x-bench-key` header gets its own child (the gateway's shape:
 * one child per session), otherwise all clients share one.
 * Usage: node --import tsx bench/lib/bare-bridge.ts <port> <cmd> [args...]
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { createServer, type ServerResponse } from 'node:http'
import { createInterface } from 'node:readline'

const [port, cmd, ...args] = process.argv.slice(2)
const waiting = new Map<number, { res: ServerResponse; id: unknown }>()
const children = new Map<string, ChildProcess>()
let seq = 0
function childFor(key: string): ChildProcess {
  let child = children.get(key)
  if (child !== undefined) return child
  child = spawn(cmd!, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  children.set(key, child)
  createInterface({ input: child.stdout! }).on('line', line => {
    const msg = JSON.parse(line) as { id?: number; method?: string }
    const w = msg.id === undefined || msg.method !== undefined ? undefined : waiting.get(msg.id)
    if (w === undefined) return
    waiting.delete(msg.id!)
    w.res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...msg, id: w.id }))
  })
  const init = {
    jsonrpc: '2.0',
    id: -1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'bare', version: '1' } },
  }
  child.stdin!.write(JSON.stringify(init) + '\n' + JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) + '\n')
  return child
}
const perKey = process.env.BARE_CHILD_PER_KEY === '1'
if (!perKey) childFor('')
createServer((req, res) => {
  if (req.method === 'DELETE') {
    const key = String(req.headers['x-bench-key'])
    children.get(key)?.kill()
    children.delete(key)
    res.writeHead(200).end()
    return
  }
  let body = ''
  req
    .setEncoding('utf8')
    .on('data', (d: string) => {
      body += d
    })
    .on('end', () => {
      const msg = JSON.parse(body) as { id?: unknown }
      if (msg.id === undefined) {
        res.writeHead(202).end()
        return
      }
      const id = ++seq
      waiting.set(id, { res, id: msg.id })
      childFor(perKey ? String(req.headers['x-bench-key']) : '').stdin!.write(JSON.stringify({ ...msg, id }) + '\n')
    })
}).listen(Number(port), '127.0.0.1')
process.on('SIGTERM', () => {
  for (const c of children.values()) c.kill()
  process.exit(0)
})
