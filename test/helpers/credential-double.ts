/**
 * A stand-in for the credential layer behind core/credentials/types.ts (TargetAuth, CredentialBroker),
 * for the tests of its plumbing through the MCP layer and the transports: each caller's credential is
 * made from its subject (`Authorization: Bearer minted-<subject>-<n>`, `X-User: <subject>`, and the same
 * as environment), cached per caller key as the real broker caches, counted per resolve, and refused on
 * demand with the broker's errors (a step-up 403 with its challenge, an unavailable IdP 503 with
 * Retry-After). A caller without a token is refused, as the real broker refuses one for a per-caller mode.
 */
import { ProxyError, RPC } from '../../core/errors.ts'
import type { Caller, CredentialBroker, TargetAuth, TargetAuthSummary, TargetCredential } from '../../core/credentials/types.ts'

export const STEP_UP_CHALLENGE =
  'Bearer error="insufficient_scope", scope="crm.write", resource_metadata="https://gateway.example.test/.well-known/oauth-protected-resource/mcp"'

export type Refusal = 'step_up' | 'unavailable'

export function refusalError(target: string, kind: Refusal): ProxyError {
  return kind === 'step_up'
    ? new ProxyError('MCPP_ERR_TARGET_STEP_UP', 403, `target ${target}: the identity provider needs more consent (consent_required)`, {
        headers: { 'www-authenticate': STEP_UP_CHALLENGE },
        rpcCode: RPC.SERVER_ERROR,
      })
    : new ProxyError('MCPP_ERR_IDP_UNAVAILABLE', 503, `target ${target}: the identity provider is unavailable`, {
        headers: { 'retry-after': '5' },
        rpcCode: RPC.SERVER_ERROR,
        expose: true,
      })
}

export interface CredentialDouble extends TargetAuth {
  /** resolve() calls, in order, by the caller's subject (undefined: no token). */
  readonly resolves: Array<string | undefined>
  /** The tokens resolve() was given (the caller's own, as the IdP's token endpoint would get them). */
  readonly tokens: Array<string | undefined>
  /** Refuse these subjects (every subject: '*'), with this error, until cleared. */
  refuse(subject: string, kind: Refusal): void
  allow(subject: string): void
  /** Forgets the cached credentials: the next exchange resolves again. */
  clear(): void
  /** Makes resolve() wait until `release()` (single-flight and ordering tests). */
  hold(): () => void
}

export function credentialDouble(target: string, opts: { mode?: TargetAuth['mode']; headers?: boolean; env?: boolean } = {}): CredentialDouble {
  const cache = new Map<string, TargetCredential>()
  const refused = new Map<string, Refusal>()
  const resolves: Array<string | undefined> = []
  const tokens: Array<string | undefined> = []
  let gate: Promise<void> | undefined
  let lastFailure: TargetAuthSummary['lastFailure']
  let n = 0
  const made = (caller: Caller): TargetCredential => {
    const minted = `minted-${caller.subject}-${++n}`
    return {
      headers: opts.headers === false ? {} : { authorization: `Bearer ${minted}`, 'x-user': String(caller.subject) },
      env: opts.env === false ? {} : { USER_ID: String(caller.subject), CRM_TOKEN: minted },
      freshUntil: Number.POSITIVE_INFINITY,
    }
  }
  return {
    target,
    mode: opts.mode ?? 'tokenExchange',
    perCaller: true,
    resolves,
    tokens,
    peek(caller) {
      return cache.get(caller.key)
    },
    ready(caller) {
      return cache.has(caller.key) ? undefined : this.resolve(caller)
    },
    async resolve(caller) {
      resolves.push(caller.subject)
      tokens.push(caller.token)
      if (gate !== undefined) await gate
      if (caller.token === undefined) {
        lastFailure = { at: Date.now(), reason: 'invalid_token' }
        throw new ProxyError('MCPP_ERR_TARGET_CREDENTIAL', 403, `target ${target}: the caller has no token to exchange`, { rpcCode: RPC.SERVER_ERROR })
      }
      const kind = refused.get(caller.subject ?? '') ?? refused.get('*')
      if (kind !== undefined) {
        lastFailure = { at: Date.now(), reason: kind }
        throw refusalError(target, kind)
      }
      const c = cache.get(caller.key) ?? made(caller)
      cache.set(caller.key, c)
      return c
    },
    describe() {
      return {
        target,
        mode: opts.mode ?? 'tokenExchange',
        headerNames: opts.headers === false ? [] : ['authorization', 'x-user'],
        envNames: opts.env === false ? [] : ['USER_ID', 'CRM_TOKEN'],
        cached: cache.size,
        ...(lastFailure === undefined ? {} : { lastFailure }),
      }
    },
    refuse(subject, kind) {
      refused.set(subject, kind)
      cache.clear()
    },
    allow(subject) {
      refused.delete(subject)
    },
    clear() {
      cache.clear()
    },
    hold() {
      let release!: () => void
      gate = new Promise<void>(resolve => {
        release = () => {
          gate = undefined
          resolve()
        }
      })
      return release
    },
  }
}

/** A broker over the given doubles (a target without one has no `auth`). */
export function brokerOf(...auths: TargetAuth[]): CredentialBroker & { closed: boolean } {
  const byTarget = new Map(auths.map(a => [a.target, a]))
  return {
    closed: false,
    forTarget: name => byTarget.get(name),
    describe: () => auths.map(a => a.describe()),
    now: Date.now,
    close() {
      this.closed = true
    },
  }
}
