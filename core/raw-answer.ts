/**
 * Answers written straight to a socket the HTTP parser gave up on (no
 * request object exists, so no pipeline runs): a status line, then the
 * caller's X-Request-ID, then a small JSON body, and the connection closes.
 */
import { STATUS_CODES } from 'node:http'
import { RPC } from './errors.ts'

/** A parser-level answer: the status line, then (per connection) X-Request-ID, then the rest of the head and the body. */
export interface RawAnswer {
  readonly status: number
  readonly statusLine: string
  readonly rest: string
}

export function rawAnswer(status: number, description: string, mcp = false): RawAnswer {
  // On /mcp the body is a JSON-RPC error, as every other refusal there (no request, so no id).
  const body = JSON.stringify(
    mcp
      ? { jsonrpc: '2.0', id: null, error: { code: RPC.INVALID_REQUEST, message: description } }
      : { error: 'invalid_request', error_description: description }
  )
  return {
    status,
    statusLine: `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n`,
    rest: `connection: close\r\ncontent-type: application/json\r\ncache-control: no-store\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  }
}

export const HEADERS_TOO_LARGE = rawAnswer(431, 'request header fields too large')
export const REQUEST_TIMEOUT = rawAnswer(408, 'request not received in time')
export const BAD_REQUEST = rawAnswer(400, 'malformed HTTP request')
