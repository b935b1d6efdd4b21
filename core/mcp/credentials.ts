/**
 * The one door from the MCP layer to the credential layer (core/credentials/): the caller of a
 * request as that layer sees it, what an upstream serving one caller carries (an HTTP target's
 * headers asked for before each exchange, a stdio child's environment fixed at its spawn), and the
 * pre-flight that awaits a caller's credential before a request is forwarded, so that a refusal is
 * answered as the broker's ProxyError (status, WWW-Authenticate) before any response header.
 * Every upstream serves one caller key (a session, or a pooled upstream of one subject), and the
 * object that owns it keeps the latest Caller of that key (`CallerOwner`): a refreshed client token
 * replaces the old one for the next exchange. Targets without `auth` take none of these paths.
 */
import type { Logger } from 'pino'
import type { AuthInfo, RequestContext } from '../context.ts'
import type { Caller, CredentialBroker, TargetAuth, TargetCredential } from '../credentials/index.ts'
import type { Upstream, UpstreamAttachment, UpstreamFactory } from '../targets/types.ts'
import { ProxyError } from '../errors.ts'
import { subjectKeyOf } from './routing/subject-key.ts'
import { DeferredUpstream } from './upstreams/deferred-upstream.ts'

export type { Caller, CredentialBroker, TargetAuth, TargetCredential }

const INSPECT = Symbol.for('nodejs.util.inspect.custom')
const NO_CLAIMS: Readonly<Record<string, unknown>> = Object.freeze({})

/** A Caller over a request's AuthInfo: its token read through it (never an own property: no log or copy shows it). */
class RequestCaller implements Caller {
  readonly key: string
  readonly subject: string | undefined
  readonly claims: Readonly<Record<string, unknown>>
  declare readonly expiresAt?: number
  readonly #auth: AuthInfo | undefined

  constructor(key: string, auth: AuthInfo | undefined) {
    this.key = key
    this.subject = auth?.subject
    this.claims = auth?.claims ?? NO_CLAIMS
    if (auth?.expiresAt !== undefined) this.expiresAt = auth.expiresAt
    this.#auth = auth
    Object.freeze(this)
  }

  get token(): string | undefined {
    return this.#auth?.token
  }

  [INSPECT](): Record<string, unknown> {
    return { key: this.key, subject: this.subject, claims: this.claims, expiresAt: this.expiresAt }
  }
}

/** The caller of `ctx`: `{ key: subjectKeyOf(ctx), subject, claims, token, expiresAt }` from `ctx.auth`. */
export function callerOf(ctx: RequestContext): Caller {
  return new RequestCaller(subjectKeyOf(ctx), ctx.auth)
}

/** A caller known only by its key (no token, no claims): what an owner holds before any request of its own. */
export function keyOnlyCaller(key: string, subject: string | undefined): Caller {
  return { key, subject, claims: NO_CLAIMS, token: undefined }
}

/** What owns the upstreams of one caller key (a session, a pooled upstream): the latest Caller of that key. */
export interface CallerOwner {
  readonly caller: Caller
}

/** The target's credential source, or undefined for a target without `auth` (and for a gateway without any). */
export function authOf(broker: CredentialBroker | undefined, target: string): TargetAuth | undefined {
  return broker?.forTarget(target)
}

/** The clock credentials' freshness is on (the broker's; Date.now without one): staleAt is compared on it. */
export function credentialClock(broker: CredentialBroker | undefined): () => number {
  return broker === undefined ? Date.now : () => broker.now()
}

/** Rejections that came from the broker (refusals of a caller's credential), as opposed to a target that is down. */
const refusals = new WeakSet<object>()

/** Whether `err` is a refusal of a caller's credential (the broker's ProxyError), to be answered as it is. */
export function isCredentialRefusal(err: unknown): err is ProxyError {
  return typeof err === 'object' && err !== null && refusals.has(err) && ProxyError.is(err)
}

/** The first credential refusal among `reasons` (rejections of a fan-out), if any. */
export function refusalAmong(reasons: readonly unknown[]): ProxyError | undefined {
  for (const r of reasons) if (isCredentialRefusal(r)) return r
  return undefined
}

/** What a client may read of a refusal: the broker's message (it names the target) when exposed, else a generic one. */
export function refusalText(target: string, err: unknown): string {
  return ProxyError.is(err) && err.expose ? err.message : `target ${target}: no credential for this request`
}

function refused(auth: TargetAuth, log: Logger, err: unknown): never {
  if (typeof err === 'object' && err !== null) refusals.add(err)
  // The target and the code only: the broker logs the identity provider's answer itself (never a token).
  log.warn({ target: auth.target, code: ProxyError.is(err) ? err.code : undefined, err: (err as Error | undefined)?.message }, 'credential for target refused')
  throw err
}

/**
 * The caller's credential for `auth`'s target: the cached one, else resolved (a refusal is logged and
 * marked). `ctx`: the request it is resolved for (its trace parents the exchange's span).
 */
export function credentialOf(auth: TargetAuth, caller: Caller, log: Logger, ctx?: RequestContext): Promise<TargetCredential> {
  const cached = auth.peek(caller)
  return cached !== undefined ? Promise.resolve(cached) : auth.resolve(caller, ctx).catch((err: unknown) => refused(auth, log, err))
}

/**
 * The pre-flight of a request forwarded to a target with `auth`: undefined (nothing to await) for a
 * target without one or a cached credential, else the resolution, rejecting with the broker's
 * ProxyError (logged with the target and its code). Call it after the per-operation rules and
 * before any response header: a refused call costs no exchange, and the refusal is the answer.
 * `ctx`: the request it runs for (its trace parents the exchange's span).
 */
export function credentialReady(auth: TargetAuth | undefined, caller: Caller, log: Logger, ctx?: RequestContext): Promise<unknown> | undefined {
  return auth?.ready(caller, ctx)?.catch((err: unknown) => refused(auth, log, err))
}

/**
 * Whether a call the rules refused may go on to the target under its stand-in (routing/policy.ts):
 * only when that costs no new credential (the target has no `auth`, or the caller's credential is
 * cached). Otherwise it is answered as an unknown item by the gateway: a denied call never costs a
 * token exchange.
 */
export function mayStandIn(auth: TargetAuth | undefined, caller: Caller): boolean {
  return auth === undefined || auth.peek(caller) !== undefined
}

/**
 * A new upstream of `factory` serving `owner`'s caller. Without `auth` the factory's own (no
 * attachment: the target's static config only). HTTP: the latest caller's headers before each
 * exchange, synchronously while cached. stdio: the child is spawned once the caller's environment
 * is resolved (start() rejects with the refusal), fixed for its life; it reports the credential's
 * `freshUntil` as its `staleAt`, from which a pool gives it no new work. A session's own child (no
 * pool: `share: session`) keeps the environment it started with for the session's life.
 */
export function upstreamFor(factory: UpstreamFactory, auth: TargetAuth | undefined, owner: CallerOwner, log: Logger): Upstream {
  if (auth === undefined) return factory.create()
  if (factory.kind === 'http') {
    const attach: UpstreamAttachment = {
      headers: () => auth.peek(owner.caller)?.headers ?? auth.resolve(owner.caller).then(c => c.headers),
    }
    return factory.create(attach)
  }
  // The environment is the credential's, so it goes stale with it: a pool then retires the child (upstreams/pool.ts).
  return new DeferredUpstream(factory, () => credentialOf(auth, owner.caller, log).then(c => ({ env: c.env, staleAt: c.freshUntil })))
}
