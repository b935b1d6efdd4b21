/**
 * The gateway as an OAuth client of an IdP's token endpoint: one form POST
 * (RFC 6749 §3.2) with the gateway's own client authentication
 * (client_secret_basic §2.3.1, client_secret_post, or private_key_jwt per
 * RFC 7523 §2.2 / OIDC Core §9, with `x5t` for Entra's certificate
 * credentials), a timeout over the whole exchange, a bounded answer and no
 * redirects (a redirected POST would carry the secret and the caller's token
 * elsewhere). It sorts the answer into success, an error the IdP stated, or
 * an IdP that could not be used; what those mean is the modes' business.
 */
import { createPrivateKey, randomUUID, type KeyObject } from 'node:crypto'
import { SignJWT } from 'jose'
import { BodyTooLargeError, readCapped } from '../read-capped.ts'
import type { TokenClientConfig } from '../config.ts'

/** Bytes a token endpoint's answer may hold: a token answer is a few KiB. */
export const MAX_ANSWER_BYTES = 64 * 1024
/** Lifetime of a private_key_jwt client assertion: short, it is used once. */
const ASSERTION_SECONDS = 120

const ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer'

export type ClientAuthMethod = 'client_secret_basic' | 'client_secret_post' | 'private_key_jwt'

/** What the token endpoint answered. */
export type TokenAnswer =
  /** 200 with a JSON object. */
  | { readonly kind: 'ok'; readonly status: number; readonly body: Readonly<Record<string, unknown>> }
  /** 4xx with a JSON object that names an `error` (RFC 6749 §5.2). */
  | { readonly kind: 'error'; readonly status: number; readonly body: Readonly<Record<string, unknown>>; readonly raw: string }
  /** Not reached, timed out, 5xx, a redirect, or an answer that is not what RFC 6749 says (text for the log). */
  | { readonly kind: 'unavailable'; readonly why: string; readonly status?: number; readonly raw?: string }

/** Parameters of one token request: a repeated name (RFC 8693 `audience`, `resource`) takes an array. */
export type TokenParams = Readonly<Record<string, string | readonly string[] | undefined>>

export interface TokenClient {
  readonly tokenEndpoint: string
  readonly method: ClientAuthMethod
  request(params: TokenParams): Promise<TokenAnswer>
}

/** The default client authentication: private_key_jwt with a key; a secret by `secretDefault`. */
export function authMethodOf(cfg: TokenClientConfig, secretDefault: 'client_secret_basic' | 'client_secret_post'): ClientAuthMethod {
  return cfg.clientAuthMethod ?? (cfg.privateKey !== undefined ? 'private_key_jwt' : secretDefault)
}

/** RFC 6749 §2.3.1: the client id and secret are form-encoded before they are joined for Basic. */
function formEncode(s: string): string {
  return encodeURIComponent(s).replace(/%20/g, '+')
}

function formOf(params: TokenParams): URLSearchParams {
  const form = new URLSearchParams()
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined) continue
    if (typeof v === 'string') form.append(k, v)
    else for (const x of v) form.append(k, x)
  }
  return form
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

/** Sorts a token endpoint's answer; `raw` is kept for the log of failures only (a 200 holds the token). */
function sortAnswer(status: number, text: string): TokenAnswer {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  if (status === 200) return isObject(body) ? { kind: 'ok', status, body } : { kind: 'unavailable', why: 'answered what is not a JSON object', status }
  if (status >= 400 && status < 500 && status !== 429 && isObject(body) && typeof body.error === 'string') return { kind: 'error', status, body, raw: text }
  const why = status >= 500 ? `answered ${status}` : status === 429 ? 'is rate limiting the gateway (429)' : `answered ${status} without an OAuth error`
  return { kind: 'unavailable', why, status, raw: text }
}

export interface TokenClientOptions {
  readonly fetch?: typeof fetch
  /** The client authentication when `clientAuthMethod` is not set and a secret is configured. */
  readonly secretDefault: 'client_secret_basic' | 'client_secret_post'
}

/** A client of `cfg.tokenEndpoint`; the private key (if any) is parsed here, once. */
export function createTokenClient(cfg: TokenClientConfig, opts: TokenClientOptions): TokenClient {
  const method = authMethodOf(cfg, opts.secretDefault)
  const doFetch = opts.fetch ?? fetch
  const timeoutMs = cfg.timeoutMs ?? 10_000
  const key: KeyObject | undefined = cfg.privateKey !== undefined ? createPrivateKey(cfg.privateKey.pem) : undefined

  async function assertion(): Promise<string> {
    const pk = cfg.privateKey!
    const now = Math.floor(Date.now() / 1000)
    // RFC 7523 §3: iss and sub the client id, aud the token endpoint, a jti, a short exp.
    return new SignJWT({ jti: randomUUID() })
      .setProtectedHeader({ alg: pk.alg, typ: 'JWT', ...(pk.kid !== undefined ? { kid: pk.kid } : {}), ...(pk.x5t !== undefined ? { x5t: pk.x5t } : {}) })
      .setIssuer(cfg.clientId)
      .setSubject(cfg.clientId)
      .setAudience(cfg.tokenEndpoint)
      .setIssuedAt(now)
      .setNotBefore(now)
      .setExpirationTime(now + ASSERTION_SECONDS)
      .sign(key!)
  }

  async function authenticate(form: URLSearchParams, headers: Record<string, string>): Promise<void> {
    if (method === 'client_secret_basic') {
      headers.authorization = 'Basic ' + Buffer.from(`${formEncode(cfg.clientId)}:${formEncode(cfg.clientSecret ?? '')}`).toString('base64')
      return
    }
    form.set('client_id', cfg.clientId)
    if (method === 'client_secret_post') {
      form.set('client_secret', cfg.clientSecret ?? '')
      return
    }
    form.set('client_assertion_type', ASSERTION_TYPE)
    form.set('client_assertion', await assertion())
  }

  async function request(params: TokenParams): Promise<TokenAnswer> {
    const form = formOf(params)
    const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' }
    await authenticate(form, headers)
    const signal = AbortSignal.timeout(timeoutMs)
    try {
      const res = await doFetch(cfg.tokenEndpoint, { method: 'POST', headers, body: form.toString(), redirect: 'manual', signal })
      if (res.status >= 300 && res.status < 400) {
        await res.body?.cancel()
        return { kind: 'unavailable', why: `redirected (${res.status}); the token endpoint must answer itself`, status: res.status }
      }
      const text = (await readCapped(res, MAX_ANSWER_BYTES)).toString('utf8')
      return sortAnswer(res.status, text)
    } catch (err) {
      if (err instanceof BodyTooLargeError) return { kind: 'unavailable', why: `answered more than ${MAX_ANSWER_BYTES} bytes` }
      const name = (err as Error).name
      if (name === 'TimeoutError' || (name === 'AbortError' && signal.aborted)) return { kind: 'unavailable', why: `did not answer within ${timeoutMs} ms` }
      const cause = (err as { cause?: { code?: string; message?: string } }).cause
      return { kind: 'unavailable', why: `could not be reached (${cause?.code ?? cause?.message ?? (err as Error).message})` }
    }
  }

  return { tokenEndpoint: cfg.tokenEndpoint, method, request }
}
