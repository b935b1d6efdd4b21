/**
 * `admin.token`: the bearer token over the whole admin listener, or the
 * cookie the sign-in form sets once it was presented. The cookie holds an
 * HMAC of the token under a key of this process, so it proves the token
 * was presented without being the token itself.
 */
import { timingSafeEqual, createHmac, randomBytes } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { loginPage } from './ui.ts'
import { apiError, readBody, send, BASE_HEADERS } from './admin-http.ts'

const COOKIE = 'mcpp_admin'

function cookieValue(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined
  for (const part of header.split(';')) {
    const i = part.indexOf('=')
    if (i !== -1 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim()
  }
  return undefined
}

function equal(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b)
}

/** State-changing requests must come from this listener's own page (or a non-browser client, which sends no Origin). */
export function sameOrigin(req: IncomingMessage): boolean {
  const origin = req.headers.origin
  if (origin === undefined) return true
  try {
    return new URL(origin).host === (req.headers.host ?? '').toLowerCase()
  } catch {
    return false
  }
}

export class AdminToken {
  // Keyed per process: the cookie proves the token was presented without being the token itself.
  readonly #cookieKey = randomBytes(32)
  readonly #expected: Buffer
  readonly #cookie: string

  constructor(token: string) {
    this.#expected = this.#mac(token)
    this.#cookie = this.#expected.toString('base64url')
  }

  #mac(t: string): Buffer {
    return createHmac('sha256', this.#cookieKey).update(t).digest()
  }

  /** Whether the request carries the token (Authorization: Bearer) or the sign-in cookie. */
  authorized(req: IncomingMessage): boolean {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '')
    if (m !== null) return equal(this.#mac(m[1]!), this.#expected)
    const c = cookieValue(req.headers.cookie, COOKIE)
    if (c !== undefined) return equal(Buffer.from(c), Buffer.from(this.#cookie))
    return false
  }

  /** POST /ui/login: the sign-in form's token, answered with the cookie and a redirect to the page. */
  async login(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== 'POST') return apiError(res, 405, 'method_not_allowed', 'use POST', { allow: 'POST' })
    if (!sameOrigin(req)) return apiError(res, 403, 'forbidden', 'cross-origin request refused')
    const form = new URLSearchParams((await readBody(req)).toString('utf8'))
    const given = form.get('token') ?? ''
    if (!equal(this.#mac(given), this.#expected)) return send(res, 401, loginPage('That token is not valid.'), 'text/html; charset=utf-8')
    res.writeHead(303, {
      ...BASE_HEADERS,
      location: '/ui',
      'set-cookie': `${COOKIE}=${this.#cookie}; Path=/; HttpOnly; SameSite=Strict`,
      'content-length': 0,
    })
    res.end()
  }
}
