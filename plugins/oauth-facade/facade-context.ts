/**
 * What every step of the facade works with, built once at start-up: the
 * gateway's addresses, the identity provider, the sealer, the client
 * resolvers and the stores that make codes and refresh tokens single-use.
 * One explicit record handed to each step (authorize.ts, callback.ts,
 * decision.ts, token.ts, metadata.ts), so no step captures another's state.
 */
import type { PluginEnv } from '../../core/plugin-api.ts'
import { DiscoveryCache } from '../oauth-common/discovery.ts'
import { privateSchemes } from '../oauth-common/redirect-uri.ts'
import { Sealer } from './seal.ts'
import { CimdResolver } from './cimd.ts'
import { ConsentMemory } from './remember.ts'
import { RefreshFamilies } from './refresh-family.ts'
import { facadeIdpOf, type FacadeIdp } from './idp.ts'
import { FACADE_PATH, type FacadeOptions } from './options.ts'
import { MemoryUsedCodes, RedisUsedCodes, SharedUsedCodes, type UsedCodes } from './used-codes.ts'

export interface FacadeContext {
  readonly options: FacadeOptions
  readonly idp: FacadeIdp
  readonly log: PluginEnv['log']
  /** `base_url` without a trailing slash. */
  readonly baseUrl: string
  /** The issuer the facade names (RFC 9207 `iss`): `{base_url}/mcp`. */
  readonly issuer: string
  /** The one redirect URI registered at the IdP. */
  readonly callbackUrl: string
  /** Cookies get `Secure` (and the `__Host-` prefix) on an https base URL. */
  readonly secure: boolean
  readonly sealer: Sealer
  readonly cimd: CimdResolver
  readonly preregistered: ReadonlyMap<string, FacadeOptions['clients'][number]>
  readonly redirectSchemes: ReadonlySet<string>
  /** Redeemed codes by id, until they expire: a code is single-use (RFC 6749 §4.1.2). */
  readonly usedCodes: UsedCodes
  /** Whether `usedCodes` is shared across replicas (facade.redis, or the cluster's Redis store). */
  readonly usedCodesShared: boolean
  readonly families: RefreshFamilies
  readonly remembered: ConsentMemory
  readonly discovery: DiscoveryCache
  /** The cluster's shared state, when there is one (the registration limiter uses it). */
  readonly shared: PluginEnv['shared']
}

export function createFacadeContext(options: FacadeOptions, env: PluginEnv): FacadeContext {
  const idp = facadeIdpOf(env)
  const log = env.log
  const baseUrl = env.baseUrl.replace(/\/+$/, '')
  const callbackUrl = baseUrl + options.callbackPath
  const secure = baseUrl.startsWith('https:')
  const sealer = sealerOf(options, env)
  const cimd = new CimdResolver(options.cimd)
  if (options.cimd.testOnlyAllowLoopback) {
    log.warn(`${FACADE_PATH}.cimd.testOnlyAllowLoopback is on: client metadata documents may be fetched from loopback addresses; never use this outside tests`)
  }
  const { usedCodes, shared: usedCodesShared } = usedCodesOf(options, env)
  const discovery = new DiscoveryCache({
    url: idp.discoveryUrl,
    ttlMs: idp.discovery.ttlSeconds * 1000,
    timeoutMs: idp.discovery.timeoutMs,
    log,
  })
  log.info(
    { provider: idp.family ?? 'oidc', discovery: discovery.url, callback: callbackUrl },
    'oauth facade: the gateway is the authorization server; register only its callback at the identity provider'
  )
  // In the background, as the bridge does: an unreachable IdP must not hold up
  // start-up; a request that needs the document waits for this fetch.
  void discovery.start()
  return {
    options,
    idp,
    log,
    baseUrl,
    issuer: `${baseUrl}/mcp`,
    callbackUrl,
    secure,
    sealer,
    cimd,
    preregistered: new Map(options.clients.map(c => [c.clientId, c])),
    redirectSchemes: privateSchemes(options.allowedRedirectSchemes),
    usedCodes,
    usedCodesShared,
    families: new RefreshFamilies(usedCodes, options.refreshTokenTtlSeconds),
    remembered: new ConsentMemory(sealer, options.consent.rememberSeconds, secure),
    discovery,
    shared: env.shared,
  }
}

function sealerOf(options: FacadeOptions, env: PluginEnv): Sealer {
  // Without keys: one key for every worker and replica, derived from the secret they share (a random key of
  // each process's own would make a flow fail wherever its next step lands: "unknown client_id").
  const sealer = new Sealer(options.keys, options.keys === undefined || options.keys.length === 0 ? env.deriveKey?.('seal') : undefined)
  if (sealer.derived) {
    env.log.info(
      `${FACADE_PATH}.keys is not set: sealing with a key derived from the secret the gateway's processes share (cluster.secret, else this run's); flows cross workers and replicas, and do not survive a change of that secret`
    )
  } else if (sealer.ephemeral) {
    env.log.warn(
      `${FACADE_PATH}.keys is not set: sealing with an ephemeral key; flows, codes and refresh tokens do not survive a restart and do not cross replicas`
    )
  }
  return sealer
}

/**
 * facade.redis wins; else the cluster's shared store when it is Redis (cluster.redis.url), so one setting
 * makes codes single-use across replicas (or, with workers, the primary's store); else this replica's memory.
 */
function usedCodesOf(options: FacadeOptions, env: PluginEnv): { usedCodes: UsedCodes; shared: boolean } {
  const clusterShared = env.shared !== undefined && env.shared.kind !== 'memory' ? env.shared : undefined
  const usedCodes: UsedCodes =
    options.redis !== undefined
      ? new RedisUsedCodes(options.redis.url, options.redis.timeoutMs)
      : clusterShared !== undefined
        ? new SharedUsedCodes(clusterShared)
        : new MemoryUsedCodes(options.maxUsedCodes)
  if (options.redis !== undefined) {
    const u = new URL(options.redis.url)
    env.log.info({ redis: `${u.hostname}:${u.port || 6379}` }, 'oauth facade: redeemed codes are remembered in redis (single-use across replicas)')
  } else if (clusterShared !== undefined) {
    env.log.info(
      { store: clusterShared.kind },
      "oauth facade: redeemed codes are remembered in the gateway's shared state (single-use across replicas and workers)"
    )
  }
  return { usedCodes, shared: options.redis !== undefined || clusterShared !== undefined }
}
