/**
 * Reading the bearer token off a request, once, by the rules MCP and RFC 6750
 * set (no token in the query string, one Authorization header at most), and
 * removing it so nothing downstream can forward it. On the hot path of every
 * /mcp request: one pass over the raw headers, no regex over the token.
 */
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http'
import { ProxyError } from '../../core/plugin-api.ts'

function isAuthorizationName(name: string): boolean {
  return name.length === 13 && name.toLowerCase() === 'authorization'
}

/** Extracts the bearer token: `undefined` when there is none; throws 400 for ambiguous requests. */
export function readBearer(req: IncomingMessage, query: string, challenge: (extra: string) => string): string | undefined {
  if (query !== '' && new URLSearchParams(query).has('access_token')) {
    // RFC 6750 §2.3 tokens in URIs leak into logs and referrers; MCP forbids them.
    throw new ProxyError('MCPP_ERR_BAD_REQUEST', 400, 'access tokens in the query string are not accepted', {
      oauthError: 'invalid_request',
      headers: { 'www-authenticate': challenge('error="invalid_request"') },
    })
  }
  // One pass over rawHeaders: headersDistinct would build arrays for every header.
  const raw = req.rawHeaders
  let value: string | undefined
  for (let i = 0; i < raw.length; i += 2) {
    if (!isAuthorizationName(raw[i]!)) continue
    if (value !== undefined) {
      throw new ProxyError('MCPP_ERR_BAD_REQUEST', 400, 'more than one Authorization header', {
        oauthError: 'invalid_request',
        headers: { 'www-authenticate': challenge('error="invalid_request"') },
      })
    }
    value = raw[i + 1]!
  }
  if (value === undefined) return undefined
  return bearerOf(value)
}

function isAsciiLetter(c: number): boolean {
  return (c >= 65 && c <= 90) || (c >= 97 && c <= 122)
}

/**
 * The credentials of a `Bearer` Authorization value, '' when it has none, or
 * undefined for another scheme. Same result as matching
 * `/^([A-Za-z]+)(?:[ \t]+(.*))?$/` on the trimmed value and trimming the
 * credentials, without running a regex over a token of a few hundred bytes.
 */
function bearerOf(header: string): string | undefined {
  const v = header.trim()
  let i = 0
  while (i < v.length && isAsciiLetter(v.charCodeAt(i))) i++
  if (i !== 6 || v.slice(0, 6).toLowerCase() !== 'bearer') return undefined
  if (i === v.length) return ''
  const sep = v.charCodeAt(i)
  if (sep !== 32 && sep !== 9) return undefined
  // The regex's `.` stops at line terminators, so a value holding one did not match.
  if (v.includes('\n') || v.includes('\r') || v.includes('\u2028') || v.includes('\u2029')) return undefined
  return v.slice(i).trim()
}

/** Removes every Authorization header from the request so nothing downstream can forward it. */
export function stripAuthorization(req: IncomingMessage): void {
  const raw = req.rawHeaders
  for (let i = raw.length - 2; i >= 0; i -= 2) {
    if (isAuthorizationName(raw[i]!)) raw.splice(i, 2)
  }
  const headers = req.headers
  if (!Object.hasOwn(headers, 'authorization')) return
  // A copy without it rather than `delete`: a deleted key turns the object
  // into a slow dictionary, and every later read and copy of the request's
  // headers (plugins, the HTTP passthrough, http-proxy) would pay for that.
  const kept: IncomingHttpHeaders = {}
  for (const k of Object.keys(headers)) if (k !== 'authorization') kept[k] = headers[k]
  req.headers = kept
}

/** Escapes a value for a quoted-string of `WWW-Authenticate` (RFC 9110 §5.6.4). */
export function quote(s: string): string {
  return s.replace(/[\\"]/g, '\\$&')
}
