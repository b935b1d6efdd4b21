/**
 * The IdP identity mcpAuthentication provides (plugins/mcp-authentication/identity.ts):
 * one issuer parser for the key set, the discovery document and the bridge,
 * and the cross-field checks that used to live in core's config loader.
 */
import t from 'tap'
import { identityOf } from '../plugins/mcp-authentication/identity.ts'
import { validateConfig } from '../core/config.ts'
import { loadPlugins } from '../core/plugin-loader.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { builtins } from '../plugins/index.ts'
import { memoryLogger } from './helpers/logger.ts'

const cloud = { issuer: 'https://sts.microsoftonline.de/t1/', provider: { cloud_idp: {} }, clientId: 'c1' }

t.test('one parse of a cloud issuer gives the key set, the discovery document and the tenant', async t => {
  const idp = identityOf(cloud)
  t.same(idp.cloud, { origin: 'https://login.microsoftonline.de', tenant: 't1', version: 'v1' })
  t.same(idp.keySet, { kind: 'url', url: 'https://login.microsoftonline.de/t1/discovery/v2.0/keys' })
  t.equal(idp.discoveryUrl, 'https://login.microsoftonline.de/t1/v2.0/.well-known/openid-configuration')
  t.equal(idp.family, 'cloud_idp')
  const oss = identityOf({ issuer: 'https://auth.example/application/o/mcp/', provider: { oss_idp: {} }, clientId: 'c' })
  t.same(oss.keySet, { kind: 'url', url: 'https://auth.example/application/o/mcp/jwks/' })
  t.equal(oss.discoveryUrl, 'https://auth.example/application/o/mcp/.well-known/openid-configuration')
  t.equal(identityOf({ issuer: 'https://idp.example/' }).family, undefined)
})

async function check(auth: Record<string, unknown>): Promise<unknown> {
  const policies = { mcpAuthentication: { mode: 'strict', audiences: ['c1'], resourceMetadata: { resource: 'https://gw.example/mcp' }, ...auth } }
  const config = await validateConfig({ mcp: { port: 0, policies, targets: [{ name: 'a', stdio: { cmd: 'node' } }] } }, builtins)
  return loadPlugins({
    config,
    baseDir: '.',
    registry: builtins,
    dryRun: true,
    env: { log: memoryLogger().log, config: config as never, baseUrl: '', metrics: new Metrics() },
  }).then(
    () => undefined,
    (e: unknown) => e
  )
}

t.test('cross-field checks belong to mcpAuthentication and name the path, in --check as at start-up', async t => {
  t.equal(await check(cloud), undefined)
  t.match(await check({ ...cloud, clientId: undefined }), {
    code: 'MCPP_ERR_CONFIG',
    message: /^mcp\.policies\.mcpAuthentication\.clientId: is required for cloud_idp$/,
  })
  t.match(await check({ ...cloud, provider: { oss_idp: {} }, clientSecret: 's3cr3t-value' }), {
    code: 'MCPP_ERR_CONFIG',
    message: /^mcp\.policies\.mcpAuthentication\.clientSecret: is only used with provider cloud_idp$/,
  })
  const bad = (await check({ ...cloud, issuer: 'https://login.microsoftonline.com/a/b/v2.0' })) as Error
  t.match(bad, { code: 'MCPP_ERR_CONFIG', message: /^mcp\.policies\.mcpAuthentication\.issuer: cloud_idp needs / })
})
