/**
 * A GatewayServer on 127.0.0.1:0 with the real MCP session layer in front of
 * real targets (core/targets), for the transport tests. No plugins beyond
 * the ones a test passes.
 */
import { readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import type { Test } from 'tap'
import { GatewayServer } from '../../core/server.ts'
import { Pipeline } from '../../core/pipeline.ts'
import { RouteTable } from '../../core/routes.ts'
import { Metrics } from '../../core/observability/metrics.ts'
import type { Plugin } from '../../core/plugin.ts'
import type { TargetConfig, GatewayConfig } from '../../core/config.ts'
import { createUpstreamFactory } from '../../core/targets/index.ts'
import type { UpstreamFactory } from '../../core/targets/types.ts'
import { createMcpEndpoint, type GatewayMcpEndpoint } from '../../core/mcp/index.ts'
import type { CredentialBroker } from '../../core/credentials/types.ts'
import { memoryLogger } from './logger.ts'

const here = dirname(fileURLToPath(import.meta.url))
export const ROOT = join(here, '..', '..')
export const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js')
export const MEMORY = join(ROOT, 'node_modules/@modelcontextprotocol/server-memory/dist/index.js')
export const FAULTY = join(ROOT, 'test/fixtures/faulty-server.mjs')

export function everythingTarget(name = 'everything'): TargetConfig {
  return { name, stdio: { cmd: process.execPath, args: [EVERYTHING, 'stdio'], env: {} } }
}
export function memoryTarget(name = 'memory'): TargetConfig {
  return { name, stdio: { cmd: process.execPath, args: [MEMORY], env: { MEMORY_FILE_PATH: join(tmpdir(), `mcp-proxy-memory-${process.pid}-${name}.jsonl`) } } }
}
export function faultyTarget(name = 'faulty', args: string[] = []): TargetConfig {
  return { name, stdio: { cmd: process.execPath, args: [FAULTY, ...args], env: {} } }
}

export interface GatewayHarness {
  url: string
  endpoint: GatewayMcpEndpoint
  logText: () => string
}

export async function startGateway(
  t: Test,
  opts: {
    targets: TargetConfig[]
    /** Upstream factories to use instead of the targets' own (unit tests with in-memory upstreams). */
    factories?: UpstreamFactory[]
    plugins?: Plugin[]
    session?: Partial<GatewayConfig['mcp']['session']>
    limits?: Partial<GatewayConfig['mcp']['limits']>
    failClosed?: boolean
    /** The targets' credentials (core/credentials/): a test double of the broker. */
    credentials?: CredentialBroker
  }
): Promise<GatewayHarness> {
  const { log, text } = memoryLogger('debug')
  const metrics = new Metrics()
  const plugins = opts.plugins ?? []
  const endpoint = createMcpEndpoint({
    targets: opts.factories ?? opts.targets.map(tc => createUpstreamFactory(tc, { log, baseDir: ROOT, maxLineBytes: 16 * 1024 * 1024, metrics })),
    plugins,
    config: {
      session: { idleTimeoutSeconds: 1800, maxSessions: 1000, maxSessionsPerSubject: 100, requestTimeoutSeconds: 120, ...opts.session },
      failClosed: opts.failClosed ?? false,
      limits: opts.limits,
    },
    log,
    metrics,
    credentials: opts.credentials,
  })
  const server = new GatewayServer({
    pipeline: new Pipeline(plugins),
    routes: new RouteTable(plugins),
    mcp: endpoint,
    log,
    limits: { maxBodyBytes: 4 * 1024 * 1024, headersTimeoutMs: 30000, requestTimeoutMs: 0, keepAliveTimeoutMs: 5000 },
    metrics,
  })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(async () => {
    await endpoint.close()
    await server.close(100)
  })
  return { url: `http://127.0.0.1:${port}/mcp`, endpoint, logText: text }
}

/** True when `pid` no longer runs (a zombie counts as gone). */
export function processGone(pid: number): boolean {
  try {
    process.kill(pid, 0)
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH'
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
  } catch {
    return false
  }
}

/** Polls `fn` until true, a bounded number of times. */
export async function until(fn: () => boolean | Promise<boolean>, tries = 200, stepMs = 25): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    if (await fn()) return true
    await new Promise(resolve => setTimeout(resolve, stepMs))
  }
  return fn()
}

export const INIT_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' } as const

/** Parses the `message` events of an SSE body. */
export function sseMessages(text: string): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = []
  for (const block of text.split('\n\n')) {
    const data = block
      .split('\n')
      .filter(l => l.startsWith('data: '))
      .map(l => l.slice(6))
      .join('\n')
    if (data !== '') out.push(JSON.parse(data) as Record<string, unknown>)
  }
  return out
}

/** Raw initialize over fetch; returns the session id and the result message. */
export async function rawInitialize(
  url: string,
  protocolVersion = '2025-11-25',
  headers: Record<string, string> = {}
): Promise<{ status: number; sessionId: string | null; body: string; response: Response }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...INIT_HEADERS, ...headers },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    }),
  })
  return { status: res.status, sessionId: res.headers.get('mcp-session-id'), body: await res.text(), response: res }
}
