/**
 * The primary's admin listener with `workers`: one UI port, never N
 * listeners racing for it. Each request is relayed to one worker's loopback
 * admin listener: the lowest live one, or the one named by `?worker=N` or an
 * `Mcp-Proxy-Worker` header; the answer names the worker that gave it.
 */
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Logger } from 'pino'
import { WORKER_HEADER } from './messages.ts'
import type { Slot } from './worker-slots.ts'

function answerJson(res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}): void {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...extra })
  res.end(text)
}

/** The slot a request asks for (or the first serving one); undefined when the request was answered already. */
function chooseSlot(req: IncomingMessage, res: ServerResponse, slots: readonly Slot[], log: Logger): Slot | undefined {
  const url = new URL(req.url ?? '/', 'http://admin')
  const asked = url.searchParams.get('worker') ?? (typeof req.headers[WORKER_HEADER] === 'string' ? req.headers[WORKER_HEADER] : undefined)
  if (asked !== undefined && (!/^\d{1,2}$/.test(asked) || Number(asked) < 1 || Number(asked) > slots.length)) {
    log.info({ worker: asked.slice(0, 20) }, 'admin request for a worker that does not exist')
    answerJson(res, 400, { error: 'invalid_request', error_description: `worker must be an integer from 1 to ${slots.length}` })
    return undefined
  }
  const slot = asked !== undefined ? slots[Number(asked) - 1]! : slots.find(s => s.adminUrl !== undefined)
  if (slot?.adminUrl === undefined) {
    answerJson(
      res,
      503,
      { error: 'unavailable', error_description: asked !== undefined ? `worker ${asked} is not serving` : 'no worker is serving yet' },
      { 'retry-after': '1' }
    )
    return undefined
  }
  return slot
}

/** The request handler of the primary's admin listener. */
export function createAdminRelay(slots: readonly Slot[], log: Logger): (req: IncomingMessage, res: ServerResponse) => void {
  return function relayAdmin(req, res) {
    const slot = chooseSlot(req, res, slots, log)
    if (slot === undefined) return
    const headers = { ...req.headers }
    delete headers[WORKER_HEADER]
    const up = httpRequest(new URL(req.url ?? '/', slot.adminUrl), { method: req.method, headers }, answer => {
      const out: Record<string, string | string[]> = { [WORKER_HEADER]: String(slot.n) }
      // RFC 9110 §7.6.1: the connection's own fields stay with that connection (the body is re-framed here).
      for (const [name, value] of Object.entries(answer.headers)) {
        if (value !== undefined && name !== 'connection' && name !== 'keep-alive' && name !== 'transfer-encoding') out[name] = value
      }
      res.writeHead(answer.statusCode ?? 502, out)
      answer.pipe(res)
    })
    up.once('error', err => {
      log.warn({ worker: slot.n, err: err.message }, 'admin request to a worker failed')
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'application/json' })
        res.end('{"error":"bad_gateway","error_description":"the worker did not answer"}')
      } else res.destroy()
    })
    res.once('close', () => {
      if (!up.destroyed) up.destroy()
    })
    req.pipe(up)
  }
}
