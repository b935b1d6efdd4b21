/**
 * Lingering close for a request refused before its body arrived (413, 401,
 * 408...). Node ends a `Connection: close` answer with `socket.destroySoon()`:
 * the file descriptor is closed as soon as the answer is written, and a
 * socket closed with unread data makes the kernel send a reset, which can
 * discard the answer at a client still writing its body (EPIPE/ECONNRESET
 * instead of the 413). RFC 9112 §9.6 (Tear-down): close in stages, half-close
 * the writing side, go on reading until the client is done, then close.
 * Bounded so that a client cannot keep a refused connection busy: at most
 * LINGER_MAX_BYTES more body bytes, read and dropped (never buffered), and at
 * most LINGER_MAX_MS; then the connection is closed whatever remains.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'

/** Body bytes read and dropped after the answer before the connection is closed anyway. */
export const LINGER_MAX_BYTES = 8 * 1024 * 1024
/** How long a refused connection may go on sending after the answer. */
export const LINGER_MAX_MS = 2000

const lingering = new WeakSet<Socket>()

/** Call before the refusal's answer is written with `Connection: close`. */
export function lingerClose(req: IncomingMessage, res: ServerResponse): void {
  const socket = req.socket
  if (lingering.has(socket)) return
  lingering.add(socket)
  const destroySoon = socket.destroySoon.bind(socket)
  const timer = setTimeout(() => socket.destroy(), LINGER_MAX_MS)
  timer.unref()
  socket.once('close', () => clearTimeout(timer))
  // What Node calls once the answer is written: only the FIN for now (the client reads the
  // answer, then end of stream), the reading side stays open.
  socket.destroySoon = function halfClose(): void {
    if (socket.writable) socket.end()
  }
  let dropped = 0
  res.once('finish', function drainRefusedBody() {
    if (req.complete && req.readableEnded) {
      destroySoon()
      return
    }
    // Node's own handler ran first ('finish' listeners in order) and removed any reader of the body.
    req.on('data', (chunk: Buffer) => {
      dropped += chunk.length
      if (dropped > LINGER_MAX_BYTES) socket.destroy()
    })
    // The whole body arrived: nothing unread, so the usual close sends no reset.
    req.once('end', destroySoon)
    req.resume()
  })
}
