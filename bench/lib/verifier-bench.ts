/**
 * Token verification cost, in process: the mcpAuthentication plugin's own
 * onRequest hook with the verified-token cache on (every call after the
 * first is a cache hit) and off (every call is a full RS256 signature
 * verification), against keys served by the dev IdP.
 */
import { performance } from 'node:perf_hooks'
import type { IncomingMessage } from 'node:http'
import authPlugin from '../../plugins/mcp-authentication/index.ts'
import { createLogger } from '../../core/logger.ts'
import { Metrics } from '../../core/observability/metrics.ts'
import type { Plugin } from '../../core/plugin.ts'
import type { RequestContext } from '../../core/context.ts'
import type { McpAuthenticationOptions } from '../../plugins/mcp-authentication/index.ts'

export interface VerifyResult {
  readonly usPerOpCacheHit: number
  readonly usPerOpFullVerify: number
  readonly speedup: number
  readonly iterationsHit: number
  readonly iterationsFull: number
}

async function makePlugin(issuer: string, clientId: string, cache: boolean): Promise<Plugin> {
  const options = {
    mode: 'strict',
    issuer,
    audiences: [clientId],
    provider: { oss_idp: {} },
    clientId,
    resourceMetadata: { resource: 'http://127.0.0.1:1/mcp' },
    tokenCache: { enabled: cache },
  } as unknown as McpAuthenticationOptions
  return authPlugin.create(options, {
    log: createLogger({ level: 'silent' }),
    config: {},
    baseUrl: 'http://127.0.0.1:1',
    configPath: 'mcp.policies.mcpAuthentication',
    metrics: new Metrics(),
    provided: {},
  })
}

/** A context with only what the hook reads; a new one per call because the hook strips Authorization. */
function ctxFor(token: string): RequestContext {
  const value = `Bearer ${token}`
  const req = { headers: { authorization: value }, headersDistinct: { authorization: [value] }, rawHeaders: ['Authorization', value] }
  return { req: req as unknown as IncomingMessage, path: '/mcp', method: 'POST', query: '', state: new Map() } as unknown as RequestContext
}

async function timeOps(plugin: Plugin, token: string, ms: number, max: number): Promise<{ n: number; us: number }> {
  const hook = plugin.onRequest!.bind(plugin)
  for (let i = 0; i < 50; i++) await hook(ctxFor(token))
  const start = performance.now()
  let n = 0
  while (n < max && performance.now() - start < ms) {
    const ctx = ctxFor(token)
    await hook(ctx)
    if (ctx.auth === undefined) throw new Error('token was not accepted')
    n++
  }
  return { n, us: ((performance.now() - start) * 1000) / n }
}

export async function benchVerifier(issuer: string, clientId: string, token: string, ms: number): Promise<VerifyResult> {
  const cached = await makePlugin(issuer, clientId, true)
  const uncached = await makePlugin(issuer, clientId, false)
  try {
    const a1 = await timeOps(cached, token, ms / 4, 200_000)
    const b1 = await timeOps(uncached, token, ms / 4, 20_000)
    const a2 = await timeOps(cached, token, ms / 4, 200_000)
    const b2 = await timeOps(uncached, token, ms / 4, 20_000)
    const hit = (a1.us * a1.n + a2.us * a2.n) / (a1.n + a2.n)
    const full = (b1.us * b1.n + b2.us * b2.n) / (b1.n + b2.n)
    return { usPerOpCacheHit: hit, usPerOpFullVerify: full, speedup: full / hit, iterationsHit: a1.n + a2.n, iterationsFull: b1.n + b2.n }
  } finally {
    await cached.close?.()
    await uncached.close?.()
  }
}
