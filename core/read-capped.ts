/**
 * Reads a fetch() response body with a size cap: a declared Content-Length
 * over the cap fails at once, and a body streamed past it is cancelled, so a
 * huge answer is never buffered. Used wherever the gateway reads what another
 * server sends (key sets, discovery documents, its own /mcp for "try it").
 */

export class BodyTooLargeError extends Error {
  readonly maxBytes: number
  constructor(maxBytes: number) {
    super(`response exceeds ${maxBytes} bytes`)
    this.name = 'BodyTooLargeError'
    this.maxBytes = maxBytes
  }
}

export async function readCapped(res: Response, maxBytes: number): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length'))
  if (Number.isFinite(declared) && declared > maxBytes) {
    await res.body?.cancel()
    throw new BodyTooLargeError(maxBytes)
  }
  if (res.body === null) return Buffer.alloc(0)
  const reader = res.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > maxBytes) {
      await reader.cancel()
      throw new BodyTooLargeError(maxBytes)
    }
    chunks.push(value)
  }
  return Buffer.concat(chunks, size)
}
