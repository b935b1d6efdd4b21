/**
 * Minimal typings for the parts of `oidc-provider` (v9, ships no types) that
 * the development identity provider uses. Deliberately loose: only what
 * bin/dev-idp.ts and bin/dev-idp-token-exchange.ts touch is typed.
 */
declare module 'oidc-provider' {
  import type { IncomingMessage, ServerResponse } from 'node:http'

  export interface OidcCtx {
    path: string
    method: string
    status: number
    body: unknown
    response: { get(field: string): string }
    redirect(url: string): void
    oidc: {
      route: string
      client?: { clientId: string }
      params?: Record<string, unknown>
      session?: { accountId?: string; loginAccount(details: { accountId: string; loginTs?: number }): void }
      requestParamScopes: Set<string>
      resourceServers?: Record<string, unknown>
      provider: Provider
    }
  }

  export interface GrantInstance {
    jti?: string
    accountId?: string
    clientId?: string
    addOIDCScope(scope: string): void
    addOIDCClaims(claims: string[]): void
    addResourceScope(resource: string, scope: string): void
    save(ttl?: number): Promise<string>
  }

  export class Provider {
    constructor(issuer: string, configuration: Record<string, unknown>)
    callback(): (req: IncomingMessage, res: ServerResponse) => void
    use(fn: (ctx: OidcCtx, next: () => Promise<void>) => Promise<void>): void
    registerGrantType(
      name: string,
      handler: (ctx: OidcCtx, next: () => Promise<void>) => Promise<void>,
      params?: string[] | Set<string>,
      dupes?: string[] | Set<string>
    ): void
    on(event: string, fn: (...args: unknown[]) => void): this
    proxy: boolean
    readonly Client: { prototype: { redirectUriAllowed(value: string): boolean } }
    readonly Grant: new (init: {
      accountId: string
      clientId: string
    }) => GrantInstance
  }

  export const errors: {
    InvalidGrant: new (description?: string) => Error
    InvalidRequest: new (description?: string) => Error
    InvalidScope: new (description?: string, scope?: string) => Error
    InvalidTarget: new (description?: string) => Error
    UnauthorizedClient: new (description?: string) => Error
  }

  export const interactionPolicy: {
    base(): Array<{ name: string; checks: unknown[] }>
  }

  export default Provider
}
