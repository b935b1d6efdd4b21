/**
 * An OAuth client provider for the official SDK clients (1.x and 2.x) that
 * runs the authorization code + PKCE flow headless: the authorize redirects
 * are followed until the redirect URI, whose code `finishAuth` then redeems.
 */
export class HeadlessProvider {
  readonly redirectUrl = 'http://127.0.0.1:53682/callback'
  callback: URL | undefined
  hops: string[] = []
  #client: unknown
  #tokens: unknown
  #verifier = ''
  readonly scope: string | undefined
  constructor(scope?: string) {
    this.scope = scope
  }
  get clientMetadata() {
    return {
      client_name: 'oauth-flow test',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
      ...(this.scope !== undefined ? { scope: this.scope } : {}),
    }
  }
  clientInformation() {
    return this.#client as never
  }
  saveClientInformation(info: unknown) {
    this.#client = info
  }
  tokens() {
    return this.#tokens as never
  }
  saveTokens(tokens: unknown) {
    this.#tokens = tokens
  }
  saveCodeVerifier(v: string) {
    this.#verifier = v
  }
  codeVerifier() {
    return this.#verifier
  }
  #discovery: unknown
  saveDiscoveryState(state: unknown) {
    this.#discovery = state
  }
  discoveryState() {
    return this.#discovery as never
  }
  get registered() {
    return this.#client as { client_id: string } | undefined
  }
  get accessToken() {
    return (this.#tokens as { access_token?: string } | undefined)?.access_token
  }
  async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    let next = authorizationUrl.href
    for (let i = 0; i < 10; i++) {
      this.hops.push(next)
      if (next.startsWith(this.redirectUrl)) {
        this.callback = new URL(next)
        return
      }
      const res = await fetch(next, { redirect: 'manual' })
      const location = res.headers.get('location')
      if (res.status < 300 || res.status >= 400 || location === null) {
        throw new Error(`authorize stopped at ${new URL(next).pathname} with ${res.status}: ${(await res.text()).slice(0, 300)}`)
      }
      next = new URL(location, next).href
    }
    throw new Error('too many redirects')
  }
  code(): string {
    const cb = this.callback
    if (cb === undefined) throw new Error('no callback')
    const code = cb.searchParams.get('code')
    if (code === null) throw new Error(`callback without code: ${cb.searchParams.get('error')} ${cb.searchParams.get('error_description')}`)
    return code
  }
}
