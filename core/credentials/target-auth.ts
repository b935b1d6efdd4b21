/**
 * One target's credential source (TargetAuth), built at start-up from its
 * `auth` block: a static secret (`bearer`, `apiKey`) is one frozen object for
 * every caller; claim templates are rendered per caller (kept per claims
 * object, so a caller's next request is a lookup); an exchange mode mints a
 * token per caller key through the cache, claims checked before the IdP is
 * asked (a missing claim costs no exchange). Every failure is counted,
 * remembered as the target's last failure and thrown as its ProxyError.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../context.ts'
import type { TargetConfig } from '../config.ts'
import { tracer } from '../observability/tracing.ts'
import { CredentialCache } from './cache.ts'
import { isFailure, mint, type ExchangeSpec, type Exchanger } from './exchange.ts'
import { claimRefused, noCallerToken, type ChallengeInfo, type Failure, type FailureReason } from './failures.ts'
import type { TargetMetrics } from './metrics.ts'
import { onBehalfOfSpec } from './on-behalf-of.ts'
import { outlineOf } from './outline.ts'
import { compileTemplate, describeProblem, headerValue, isClaimProblem, renderTemplate, type Template } from './templates.ts'
import { createTokenClient } from './token-client.ts'
import { tokenExchangeSpec } from './token-exchange.ts'
import type { Caller, TargetAuth, TargetAuthSummary, TargetCredential } from './types.ts'

/** Minted tokens cached per target when `cacheMaxEntries` is not set. */
export const DEFAULT_CACHE_ENTRIES = 10_000

/** A target's credential source as the broker holds it: it can also drop its cache. */
export interface OwnedTargetAuth extends TargetAuth {
  close(): void
}

export interface TargetAuthDeps {
  readonly log: Logger
  readonly metrics: TargetMetrics
  readonly challenge: ChallengeInfo
  readonly fetch?: typeof fetch
  readonly now: () => number
}

interface Compiled {
  /** Lower-cased header name -> template. */
  readonly headers: ReadonlyArray<readonly [string, Template]>
  readonly env: ReadonlyArray<readonly [string, Template]>
}

/** The templates of an `auth` block; config-check.ts has refused any that do not compile. */
function compile(target: TargetConfig): Compiled {
  const one = (name: string, source: string): Template => {
    const t = compileTemplate(source)
    if (typeof t === 'string') throw new Error(`mcp.targets ${target.name}: auth template of ${name}: ${t}`)
    return t
  }
  const headers = Object.entries(target.auth?.headers ?? {}).map(([k, v]) => [k.toLowerCase(), one(k, v)] as const)
  const env = Object.entries(target.auth?.env ?? {}).map(([k, v]) => [k, one(k, v)] as const)
  return { headers, env }
}

/** The headers and env of `claims` (with `token` for `{credential}`), or the first claim that cannot be used. */
function render(c: Compiled, claims: Readonly<Record<string, unknown>>, fixed: Readonly<Record<string, string>>, token?: string): TargetCredential | string {
  const headers: Record<string, string> = { ...fixed }
  const env: Record<string, string> = {}
  for (const [name, t] of c.headers) {
    const v = renderTemplate(t, claims, token)
    if (isClaimProblem(v)) return describeProblem(v)
    headers[name] = headerValue(v)
  }
  for (const [name, t] of c.env) {
    const v = renderTemplate(t, claims, token)
    if (isClaimProblem(v)) return describeProblem(v)
    env[name] = v
  }
  return { headers: Object.freeze(headers), env: Object.freeze(env), freshUntil: Number.POSITIVE_INFINITY }
}

/** The static part of every request's headers: a `bearer` or `apiKey` secret. */
function fixedHeaders(target: TargetConfig): Record<string, string> {
  const a = target.auth
  if (a?.bearer !== undefined) return { authorization: `Bearer ${a.bearer}` }
  if (a?.apiKey !== undefined) return { [a.apiKey.header.toLowerCase()]: a.apiKey.value }
  return {}
}

/** The exchange mode of `target`, if it has one. */
function specOf(target: TargetConfig): ExchangeSpec | undefined {
  const a = target.auth
  if (a?.tokenExchange !== undefined) return tokenExchangeSpec(a.tokenExchange)
  if (a?.onBehalfOf !== undefined) return onBehalfOfSpec(a.onBehalfOf)
  return undefined
}

export function createTargetAuth(target: TargetConfig, deps: TargetAuthDeps): OwnedTargetAuth {
  const name = target.name
  // The broker makes one only for a target with `auth`.
  const outline = outlineOf(target)!
  const mode = outline.mode
  const compiled = compile(target)
  const fixed = fixedHeaders(target)
  const spec = specOf(target)
  const perCaller = spec !== undefined || [...compiled.headers, ...compiled.env].some(([, t]) => !t.constant)
  let lastFailure: { at: number; reason: FailureReason } | undefined
  /** The reason of each error thrown, for the spans of the requests that shared its exchange. */
  const reasons = new WeakMap<object, FailureReason>()

  const fail = (f: Failure): never => {
    lastFailure = { at: deps.now(), reason: f.reason }
    deps.metrics.failed(f.reason)
    reasons.set(f.error, f.reason)
    throw f.error
  }

  // Nothing of the caller: one frozen credential for everyone.
  const constant = perCaller ? undefined : (render(compiled, {}, fixed) as TargetCredential)
  const rendered = new WeakMap<object, TargetCredential>()
  const claimsOnly = (caller: Caller): TargetCredential | string => {
    const cred = rendered.get(caller.claims)
    if (cred !== undefined) return cred
    const out = render(compiled, caller.claims, fixed)
    if (typeof out !== 'string') rendered.set(caller.claims, out)
    return out
  }

  const cache =
    spec === undefined ? undefined : new CredentialCache(spec.config.cacheMaxEntries ?? DEFAULT_CACHE_ENTRIES, deps.now, n => deps.metrics.entries(n))
  const exchanger: Exchanger | undefined =
    spec === undefined
      ? undefined
      : {
          target: name,
          spec,
          client: createTokenClient(spec.config, { fetch: deps.fetch, secretDefault: spec.secretDefault }),
          challenge: deps.challenge,
          log: deps.log,
          now: deps.now,
        }

  /** One exchange for `caller`: claims first (no exchange for a caller who lacks one), then the IdP. */
  async function exchange(caller: Caller, token: string): Promise<TargetCredential> {
    const check = render(compiled, caller.claims, fixed, '')
    if (typeof check === 'string') return fail(claimRefused(name, check))
    const minted = await mint(exchanger!, token)
    if (isFailure(minted)) return fail(minted)
    const withToken = render(compiled, caller.claims, { ...fixed, authorization: `Bearer ${minted.token}` }, minted.token) as TargetCredential
    const cred: TargetCredential = { headers: withToken.headers, env: withToken.env, freshUntil: minted.freshUntil }
    if (minted.freshUntil > deps.now()) cache!.set(caller.key, cred)
    return cred
  }

  async function resolveExchange(caller: Caller, ctx: RequestContext | undefined): Promise<TargetCredential> {
    const token = caller.token
    if (token === undefined) return fail(noCallerToken(name, deps.challenge))
    const hit = cache!.get(caller.key)
    if (hit !== undefined) {
      deps.metrics.hit.inc()
      tracer?.credentialExchange(ctx, name, mode, 'hit')()
      return hit
    }
    const { promise, shared } = cache!.flight(caller.key, () => exchange(caller, token))
    ;(shared ? deps.metrics.hit : deps.metrics.miss).inc()
    const end = tracer?.credentialExchange(ctx, name, mode, shared ? 'shared' : 'miss')
    try {
      const cred = await promise
      end?.()
      return cred
    } catch (err) {
      end?.(reasons.get(err as object) ?? 'error')
      throw err
    }
  }

  return {
    target: name,
    mode,
    perCaller,
    peek(caller) {
      if (constant !== undefined) return constant
      if (cache !== undefined) return cache.get(caller.key)
      const out = claimsOnly(caller)
      return typeof out === 'string' ? undefined : out
    },
    ready(caller, ctx) {
      if (cache === undefined) return this.peek(caller) === undefined ? this.resolve(caller, ctx) : undefined
      if (cache.get(caller.key) === undefined) return resolveExchange(caller, ctx)
      // Served from the cache: counted (and traced) like resolve()'s hits, so the hit rate covers every request.
      deps.metrics.hit.inc()
      tracer?.credentialExchange(ctx, name, mode, 'hit')()
      return undefined
    },
    async resolve(caller, ctx) {
      if (constant !== undefined) return constant
      if (exchanger !== undefined) return resolveExchange(caller, ctx)
      const out = claimsOnly(caller)
      return typeof out === 'string' ? fail(claimRefused(name, out)) : out
    },
    describe(): TargetAuthSummary {
      return {
        target: name,
        mode,
        headerNames: outline.headerNames,
        envNames: outline.envNames,
        cached: cache?.size ?? 0,
        ...(lastFailure !== undefined ? { lastFailure: { ...lastFailure } } : {}),
      }
    },
    close() {
      cache?.clear()
    },
  }
}
