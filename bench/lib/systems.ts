/**
 * The systems under test, each behind one interface: open a session (a
 * worker of the closed loop), call echo, close; and the pid whose RSS is the
 * system's own. Gateway, peers and limits are all started here.
 */
import { join } from 'node:path'
import type { Agent } from 'node:http'
import { McpHttpSession, send } from './http-client.ts'
import { StdioClient } from './stdio-client.ts'
import { freePort, startService, type Service } from './procs.ts'
import { startGatewayProcess, type AuthSettings } from './gateway.ts'
import { peerBins } from './peers.ts'

export type Role = 'gateway' | 'peer' | 'limit'

export interface Worker {
  echo(): Promise<void>
  close(): Promise<void>
}

export interface System {
  readonly name: string
  readonly role: Role
  /** How the system spawns the stdio server: per session, one shared, or none. */
  readonly shape: string
  /** Process whose VmRSS is reported (children excluded); undefined when in-process. */
  readonly pid: number | undefined
  open(agent: Agent): Promise<Worker>
  stop(): Promise<void>
}

export interface Paths {
  readonly root: string
  readonly everything: string
  /** The peers, installed in bench/node_modules (bench/package.json). */
  readonly peers: { readonly supergateway: string; readonly punkpeye: string }
}

export function paths(root: string): Paths {
  return { root, everything: join(root, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js'), peers: peerBins(join(root, 'bench')) }
}

function httpSystem(
  name: string,
  role: Role,
  shape: string,
  url: string,
  service: Service,
  opts: { headers?: () => Record<string, string>; sessionless?: boolean } = {}
): System {
  return {
    name,
    role,
    shape,
    pid: service.pid,
    async open(agent) {
      const s = new McpHttpSession(url, agent, opts.headers?.() ?? {})
      if (opts.sessionless !== true) await s.initialize()
      return s
    },
    stop: () => service.stop(),
  }
}

export async function gatewaySystem(p: Paths, auth: AuthSettings, token: () => string, name = 'gateway (JWT, sessions)'): Promise<System> {
  const gw = await startGatewayProcess(p.root, { stdio: { cmd: process.execPath, args: [p.everything, 'stdio'] } }, auth)
  return httpSystem(name, 'gateway', 'stdio child per session', gw.url, gw.service, { headers: () => ({ authorization: `Bearer ${token()}` }) })
}

/** The same gateway with `share: 'subject'` on the stdio target: every bench session has the same subject, so all share one child. */
/** `tracingEndpoint`: with tracing on; `root`: the gateway built from another checkout (BENCH_BASELINE_ROOT), named `baseline`. */
export async function gatewaySharedSystem(p: Paths, auth: AuthSettings, token: () => string, tracingEndpoint?: string, root = p.root): Promise<System> {
  const gw = await startGatewayProcess(
    root,
    { stdio: { cmd: process.execPath, args: [p.everything, 'stdio'], share: 'subject' } },
    auth,
    'warn',
    tracingEndpoint
  )
  const name = 'gateway (JWT, sessions, shared child' + (tracingEndpoint !== undefined ? ', tracing on' : '') + (root !== p.root ? ', baseline' : '') + ')'
  return httpSystem(name, 'gateway', 'one stdio child per subject (shared)', gw.url, gw.service, { headers: () => ({ authorization: `Bearer ${token()}` }) })
}

export async function supergatewaySystem(p: Paths): Promise<System> {
  const port = await freePort()
  const bin = p.peers.supergateway
  const svc = await startService(
    'supergateway',
    process.execPath,
    [
      bin,
      '--stdio',
      `${process.execPath} ${p.everything} stdio`,
      '--outputTransport',
      'streamableHttp',
      '--stateful',
      '--port',
      String(port),
      '--logLevel',
      'none',
    ],
    { port }
  )
  return httpSystem('supergateway --stateful', 'peer', 'stdio child per session', `http://127.0.0.1:${port}/mcp`, svc)
}

export async function punkpeyeSystem(p: Paths): Promise<System> {
  const port = await freePort()
  const bin = p.peers.punkpeye
  const svc = await startService(
    'punkpeye mcp-proxy',
    process.execPath,
    [bin, '--host', '127.0.0.1', '--port', String(port), '--server', 'stream', '--', process.execPath, p.everything, 'stdio'],
    { port }
  )
  return httpSystem('punkpeye mcp-proxy', 'peer', 'one shared stdio child', `http://127.0.0.1:${port}/mcp`, svc)
}

export async function bareBridgeSystem(p: Paths, childPerSession = false): Promise<System> {
  const port = await freePort()
  const svc = await startService(
    'bare bridge',
    process.execPath,
    ['--import', 'tsx', join(p.root, 'bench/lib/bare-bridge.ts'), String(port), process.execPath, p.everything, 'stdio'],
    { port, cwd: p.root, env: { BARE_CHILD_PER_KEY: childPerSession ? '1' : '0' } }
  )
  const url = `http://127.0.0.1:${port}/mcp`
  if (!childPerSession) return httpSystem('bare HTTP->stdio bridge', 'limit', 'one shared stdio child, no sessions/SSE', url, svc, { sessionless: true })
  let key = 0
  return {
    name: 'bare bridge, child per client',
    role: 'limit',
    shape: 'stdio child per client, no sessions/SSE',
    pid: svc.pid,
    async open(agent) {
      const headers = { 'x-bench-key': String(++key) }
      const s = new McpHttpSession(url, agent, headers)
      // The first call spawns the client's child: done here so spawning is not measured.
      await s.echo()
      return {
        echo: () => s.echo(),
        async close() {
          await send(agent, s.url, 'DELETE', headers)
        },
      }
    },
    stop: () => svc.stop(),
  }
}

export async function everythingHttpSystem(p: Paths): Promise<System> {
  const port = await freePort()
  const svc = await startService('server-everything streamableHttp', process.execPath, [p.everything, 'streamableHttp'], { port, env: { PORT: String(port) } })
  return httpSystem('server-everything streamableHttp', 'limit', 'in-process sessions', `http://127.0.0.1:${port}/mcp`, svc)
}

/** In-process raw stdio clients: one child per worker, no HTTP at all. */
export function rawStdioSystem(p: Paths): System {
  return {
    name: 'raw stdio client',
    role: 'limit',
    shape: 'stdio child per worker, in-process',
    pid: undefined,
    async open() {
      const c = new StdioClient(process.execPath, [p.everything, 'stdio'])
      await c.initialize()
      return c
    },
    async stop() {},
  }
}

export async function sseUpstream(p: Paths): Promise<{ url: string; port: number; service: Service }> {
  const port = await freePort()
  const service = await startService('sse upstream', process.execPath, ['--import', 'tsx', join(p.root, 'bench/lib/sse-upstream.ts'), String(port)], {
    port,
    cwd: p.root,
  })
  return { url: `http://127.0.0.1:${port}/mcp`, port, service }
}

/** Opens `n` workers, at most `parallel` at a time (spawning 64 Node children at once starves a 2-core box). */
export async function openWorkers(sys: System, agent: Agent, n: number, parallel = 8): Promise<Worker[]> {
  const out: Worker[] = []
  let next = 0
  async function lane(): Promise<void> {
    while (next < n) {
      next++
      out.push(await sys.open(agent))
    }
  }
  await Promise.all(Array.from({ length: Math.min(parallel, n) }, lane))
  return out
}

export async function closeWorkers(workers: readonly Worker[]): Promise<void> {
  await Promise.allSettled(workers.map(w => w.close()))
}
