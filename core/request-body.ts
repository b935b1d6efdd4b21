/**
 * Request bodies at the HTTP edge: whether one is still arriving, and
 * reading one whole within a byte bound. Bytes only: what a body means is
 * its reader's business (the /mcp endpoint parses JSON-RPC, an OAuth route a
 * form).
 */
import type { IncomingMessage } from 'node:http'
import { ProxyError, RPC } from './errors.ts'

/** Whether `req` announced a body that has not fully arrived yet. */
export function bodyPending(req: IncomingMessage): boolean {
  if (req.complete) return false
  const h = req.headers
  return h['transfer-encoding'] !== undefined || (h['content-length'] !== undefined && h['content-length'] !== '0')
}

function tooLarge(limit: number): ProxyError {
  return new ProxyError('MCPP_ERR_BODY_TOO_LARGE', 413, `request body exceeds ${limit} bytes`, { rpcCode: RPC.INVALID_REQUEST })
}

/**
 * Reads the whole body of `req`, 413 beyond `limit` bytes (a declared
 * Content-Length over it fails at once). `reader.rejectBody` is set to the
 * read's reject, so the server's body deadline can fail the read under way.
 */
export function readBounded(req: IncomingMessage, limit: number, reader: { rejectBody: ((err: unknown) => void) | undefined }): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    // For the body deadline; calling it after the promise settled does nothing.
    reader.rejectBody = reject
    const declared = Number(req.headers['content-length'])
    if (Number.isFinite(declared) && declared > limit) {
      req.resume()
      reject(tooLarge(limit))
      return
    }
    const chunks: Buffer[] = []
    let size = 0
    req.on('data', (c: Buffer) => {
      size += c.length
      if (size > limit) {
        req.removeAllListeners('data')
        req.resume()
        reject(tooLarge(limit))
        return
      }
      chunks.push(c)
    })
    req.once('end', () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size)))
    req.once('error', reject)
  })
}
