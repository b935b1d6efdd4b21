/**
 * Real authentication for the in-process gateway tests (test/helpers/gateway-harness.ts): the
 * mcpAuthentication plugin as the loader builds it (options validated against its schema, oss_idp
 * profile) in front of the dev IdP (bin/dev-idp.ts: a real oidc-provider on loopback), and one
 * service account per subject a test needs. Each subject's token comes from the IdP's token
 * endpoint (client_credentials), so the tests that tell subjects apart (session binding, caps per
 * subject, shared children) do it on verified tokens instead of a header a test plugin trusts
 * (issue 22 item 15).
 */
import type { Test } from 'tap'
import type { DevIdp, DevIdpOptions } from '../../bin/dev-idp.ts'
import type { Plugin } from '../../core/plugin.ts'
import { Metrics } from '../../core/observability/metrics.ts'
import mcpAuthentication from '../../plugins/mcp-authentication/index.ts'
import { devIdp, firstKeyFetch, ossOptions, validated, BASE } from './idp.ts'
import { memoryLogger } from './logger.ts'

export interface RealAuth {
  /** The mcpAuthentication plugin, first key-set fetch settled. */
  plugin: Plugin
  /** `{ authorization: 'Bearer <token>' }` for `subject` (one token per subject, fetched once). */
  as: (subject: string) => Promise<Record<string, string>>
  /** The token itself. */
  token: (subject: string) => Promise<string>
  /** The IdP itself (its token endpoint, exchange log). */
  idp: DevIdp
}

/**
 * The dev IdP with a service account for each of `subjects`, and the plugin that trusts it.
 * `idpOptions`: more of the IdP's options (e.g. `tokenExchange`, for targets that exchange the caller's token).
 */
export async function realAuth(t: Test, subjects: readonly string[], idpOptions: DevIdpOptions = {}): Promise<RealAuth> {
  const passwords = new Map(subjects.map(s => [s, `${s}-dev-password`]))
  const idp = await devIdp(t, {
    ...idpOptions,
    serviceAccounts: Object.fromEntries(subjects.map(s => [s, { password: passwords.get(s)!, groups: ['mcp-users'] }])),
  })
  const { log } = memoryLogger('warn')
  const plugin = await mcpAuthentication.create(validated(mcpAuthentication.optionsSchema, ossOptions(idp)), {
    log,
    config: {},
    baseUrl: BASE,
    configPath: 'mcp.policies.mcpAuthentication',
    metrics: new Metrics(),
    provided: {},
  })
  t.teardown(async () => {
    await plugin.close?.()
  })
  await firstKeyFetch(plugin)
  const tokens = new Map<string, Promise<string>>()
  const token = (subject: string): Promise<string> => {
    const password = passwords.get(subject)
    if (password === undefined) throw new Error(`realAuth: no service account for ${subject}: list it in realAuth(t, [...])`)
    let p = tokens.get(subject)
    if (p === undefined) {
      p = idp.clientCredentialsToken(subject, password)
      tokens.set(subject, p)
    }
    return p
  }
  return { plugin, token, idp, as: async subject => ({ authorization: `Bearer ${await token(subject)}` }) }
}
