/**
 * One exchange of a caller's token for a target's token, whichever the mode
 * (RFC 8693 token exchange, Entra on-behalf-of): the request, the IdP's
 * answer sorted into a minted token or a Failure, the audience check, and
 * how long the token may be used. What the IdP said when it refused goes to
 * the log at warn (its body and error_description are not secrets, but are
 * scrubbed of the tokens and the secret all the same); the client gets the
 * Failure's message only.
 */
import type { Logger } from 'pino'
import type { TokenClientConfig } from '../config.ts'
import { readMinted } from './audience.ts'
import { idpUnavailable, unusableToken, wrongAudience, type ChallengeInfo, type Failure } from './failures.ts'
import { classifyRefusal, readRefusal } from './idp-errors.ts'
import type { TokenClient, TokenParams } from './token-client.ts'

/** One exchange mode: how it asks and what a good answer holds. */
export interface ExchangeSpec {
  readonly mode: 'tokenExchange' | 'onBehalfOf'
  /** The exchange named in messages. */
  readonly what: string
  readonly config: TokenClientConfig
  readonly secretDefault: 'client_secret_basic' | 'client_secret_post'
  /** Audiences a minted JWT's `aud` must name one of; empty: nothing to check. */
  readonly expectedAudience: readonly string[]
  params(callerToken: string): TokenParams
  /** The bearer token of a 200 answer, or undefined when it holds none the gateway can send. */
  tokenOf(body: Readonly<Record<string, unknown>>): { readonly token: string; readonly expiresIn: number | undefined } | undefined
}

/** A token minted for one caller and target. */
export interface Minted {
  readonly token: string
  /** Epoch ms until which it is used: `exp` (or `expires_in`) minus the skew; now when its lifetime is unknown. */
  readonly freshUntil: number
}

export interface Exchanger {
  readonly target: string
  readonly spec: ExchangeSpec
  readonly client: TokenClient
  readonly challenge: ChallengeInfo
  readonly log: Logger
  readonly now: () => number
}

/** Bytes of an IdP's refusal kept in the log line. */
const LOGGED_BODY_BYTES = 2048

/** The IdP's text for the log: bounded, and never holding the caller's token or the gateway's secret. */
function forLog(raw: string | undefined, secrets: ReadonlyArray<string | undefined>): string | undefined {
  if (raw === undefined) return undefined
  let out = raw.length > LOGGED_BODY_BYTES ? raw.slice(0, LOGGED_BODY_BYTES) + '…' : raw
  for (const s of secrets) if (s !== undefined && s.length >= 8) out = out.split(s).join('[redacted]')
  return out
}

/**
 * How long a minted token is used: until `exp` (a JWT) or `expires_in`
 * (opaque), minus the skew, which is at most half the token's remaining
 * life (a 60 s token is used for 30 s, not exchanged on every request). A
 * token whose lifetime is unknown is used for the request at hand only.
 */
function freshUntilOf(x: Exchanger, exp: number | undefined, expiresIn: number | undefined): number {
  const now = x.now()
  const until = exp !== undefined ? exp * 1000 : expiresIn !== undefined && expiresIn > 0 ? now + expiresIn * 1000 : now
  const skewMs = Math.min((x.spec.config.refreshSkewSeconds ?? 60) * 1000, (until - now) / 2)
  return Math.max(now, until - skewMs)
}

/** RFC 6750 §2.1 b64token: what may follow `Bearer ` (a token with other characters would break the header it goes in). */
const B64TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/

/** Exchanges `callerToken`; resolves with the minted token or the Failure to answer (never rejects for the IdP's doing). */
export async function mint(x: Exchanger, callerToken: string): Promise<Minted | Failure> {
  const { target, spec, log } = x
  const secrets = [callerToken, spec.config.clientSecret]
  const answer = await x.client.request(spec.params(callerToken))
  if (answer.kind === 'unavailable') {
    log.warn(
      { target, mode: spec.mode, status: answer.status, why: answer.why, body: forLog(answer.raw, secrets) },
      `credential exchange for target ${target}: the identity provider ${answer.why}`
    )
    return idpUnavailable(target, answer.why)
  }
  if (answer.kind === 'error') {
    const r = readRefusal(answer.body)
    const failure = classifyRefusal(target, spec.what, r, x.challenge)
    log.warn(
      {
        target,
        mode: spec.mode,
        status: answer.status,
        error: r.error,
        aadsts: r.aadsts,
        suberror: r.suberror,
        description: forLog(r.description, secrets),
        body: forLog(answer.raw, secrets),
        reason: failure.reason,
      },
      `credential exchange for target ${target}: the identity provider refused (${r.error})`
    )
    return failure
  }
  const got = spec.tokenOf(answer.body)
  if (got === undefined || !B64TOKEN.test(got.token)) {
    const type = typeof answer.body.token_type === 'string' ? answer.body.token_type.slice(0, 32) : typeof answer.body.token_type
    log.warn({ target, mode: spec.mode, tokenType: type }, `credential exchange for target ${target}: the answer holds no usable bearer token`)
    return unusableToken(target, spec.what)
  }
  const minted = readMinted(got.token, spec.expectedAudience)
  if (!minted.audienceOk) {
    log.warn(
      { target, mode: spec.mode, expected: spec.expectedAudience, aud: minted.aud.slice(0, 8) },
      `credential exchange for target ${target}: the minted token is for another audience`
    )
    return wrongAudience(target)
  }
  const freshUntil = freshUntilOf(x, minted.exp, got.expiresIn)
  log.debug({ target, mode: spec.mode, freshForMs: freshUntil - x.now() }, `credential exchange for target ${target}: token minted`)
  return { token: got.token, freshUntil }
}

export function isFailure(v: Minted | Failure): v is Failure {
  return (v as Failure).reason !== undefined
}
