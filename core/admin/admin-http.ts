/**
 * How the admin listener answers: the security headers every answer
 * carries (a strict CSP: no inline script or style), JSON and OAuth-style
 * error bodies, and a bounded request body.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { readBounded } from '../request-body.ts'

const MAX_BODY = 64 * 1024

const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

export const BASE_HEADERS = {
  'cache-control': 'no-store',
  'x-content-type-options': 'nosniff',
  // Not `no-referrer`: with it, browsers send `Origin: null` on same-origin POSTs and the Origin check could not tell them apart.
  'referrer-policy': 'same-origin',
  'x-frame-options': 'DENY',
  'cross-origin-resource-policy': 'same-origin',
  'cross-origin-opener-policy': 'same-origin',
  'content-security-policy': CSP,
} as const

export function send(res: ServerResponse, status: number, body: unknown, type = 'application/json; charset=utf-8', extra: Record<string, string> = {}): void {
  const payload = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body, null, 2)
  res.writeHead(status, { ...BASE_HEADERS, 'content-type': type, 'content-length': Buffer.byteLength(payload), ...extra })
  res.end(payload)
}

export function apiError(res: ServerResponse, status: number, error: string, description: string, extra: Record<string, string> = {}): void {
  send(res, status, { error, error_description: description }, undefined, extra)
}

/** The request body, at most 64 KiB (rejects beyond), read as the HTTP edge reads one (core/request-body.ts). */
export function readBody(req: IncomingMessage): Promise<Buffer> {
  return readBounded(req, MAX_BODY, { rejectBody: undefined })
}
