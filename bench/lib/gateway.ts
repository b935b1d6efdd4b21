/**
 * A collector stand-in for BENCH_TRACING=1: its own process (the export load
 * stays off the load generator's event loop), reads each OTLP export and
 * answers 200.
 */
export async function startOtlpSink(): Promise<{ endpoint: string; service: Service }> {
  const port = await freePort()
  const code = `require('node:http').createServer((q, s) => { q.resume(); q.on('end', () => s.writeHead(200, { 'content-type': 'application/json' }).end('{}')) }).listen(${port}, '127.0.0.1')`
  const service = await startService('otlp-sink', process.execPath, ['-e', code], { port })
  return { endpoint: `http://127.0.0.1:${port}/v1/traces`, service }
}

/**
 * Runs our gateway as its own process (the built `dist/bin/mcp-proxy.js`,
 * what `npm i -g` users run; BENCH_GATEWAY_TSX=1 runs bin/mcp-proxy.ts through tsx) from a
 * generated config, so its RSS and CPU are its own and the load generator
 * does not share its event loop.
 */
import { mkdtemp, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort, startService, type Service } from './procs.ts'

export interface AuthSettings {
  readonly issuer: string
  readonly clientId: string
  readonly tokenCache?: boolean
}

export interface GatewayTarget {
  /** `share: 'subject'`: the sessions of one token subject share one child (default: one child per session). */
  readonly stdio?: { readonly cmd: string; readonly args: readonly string[]; readonly share?: string }
  readonly url?: string
}

export interface RunningGatewayProcess {
  readonly url: string
  readonly service: Service
}

const USE_TSX = process.env.BENCH_GATEWAY_TSX === '1'

/** Builds dist/ from the working tree (tsc, as `npm run build`) so the bench measures the code as it is now. */
export async function buildGateway(root: string): Promise<void> {
  if (USE_TSX) return
  const { execFile } = await import('node:child_process')
  const tsc = join(root, 'node_modules/typescript/bin/tsc')
  await new Promise<void>((resolve, reject) => {
    execFile(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { cwd: root }, (err, stdout) => {
      if (err !== null) reject(new Error(`building the gateway failed: ${stdout}`))
      else resolve()
    })
  })
}

/**
 * `tracingEndpoint`: export spans there (`tracing.enabled`, every trace sampled); default: tracing off.
 * `workers`: processes on the port (`workers: N`); with more than one, start-up waits for the primary's /readyz.
 */
export async function startGatewayProcess(
  root: string,
  target: GatewayTarget,
  auth: AuthSettings | undefined,
  logLevel = 'warn',
  tracingEndpoint?: string,
  workers = 1
): Promise<RunningGatewayProcess> {
  const port = await freePort()
  const probesPort = workers > 1 ? await freePort() : undefined
  const dir = await mkdtemp(join(tmpdir(), 'mcp-proxy-bench-'))
  const config = {
    mcp: {
      host: '127.0.0.1',
      port,
      ...(auth !== undefined
        ? {
            policies: {
              mcpAuthentication: {
                mode: 'strict',
                issuer: auth.issuer,
                audiences: [auth.clientId],
                provider: { oss_idp: {} },
                clientId: auth.clientId,
                resourceMetadata: { resource: `http://127.0.0.1:${port}/mcp` },
                tokenCache: { enabled: auth.tokenCache ?? true },
              },
            },
          }
        : {}),
      targets: [
        target.stdio !== undefined
          ? {
              name: 'everything',
              stdio: { cmd: target.stdio.cmd, args: [...target.stdio.args], ...(target.stdio.share !== undefined ? { share: target.stdio.share } : {}) },
            }
          : { name: 'upstream', mcp: { url: target.url } },
      ],
      session: { maxSessions: 2000, maxSessionsPerSubject: 2000 },
    },
    admin: { enabled: false },
    logging: { level: logLevel },
    ...(tracingEndpoint !== undefined ? { tracing: { enabled: true, endpoint: tracingEndpoint, samplingRatio: 1 } } : {}),
    ...(probesPort !== undefined ? { workers, probes: { host: '127.0.0.1', port: probesPort } } : {}),
  }
  const file = join(dir, 'gateway.yaml')
  // JSON is YAML.
  await writeFile(file, JSON.stringify(config, null, 2))
  // BENCH_CPU_PROF=<dir>: profile the gateway (node --cpu-prof), written when it exits on SIGTERM.
  const prof = process.env.BENCH_CPU_PROF !== undefined && process.env.BENCH_CPU_PROF !== '' ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_CPU_PROF] : []
  const service = await startService(
    'gateway',
    process.execPath,
    [...prof, ...(USE_TSX ? ['--import', 'tsx', join(root, 'bin/mcp-proxy.ts')] : [join(root, 'dist/bin/mcp-proxy.js')]), '-f', file],
    { cwd: root, port, tempDir: dir }
  )
  const url = `http://127.0.0.1:${port}/mcp`
  // The port opens before the plugins are ready; /mcp answers 503 until then.
  for (let i = 0; i < 200; i++) {
    const res = await fetch(url, { method: 'POST', body: '{}' }).catch(() => undefined)
    await res?.body?.cancel()
    if (res !== undefined && res.status !== 503) break
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  // Every worker serving, not just the first: the primary's readiness asks each.
  for (let i = 0; probesPort !== undefined && i < 400; i++) {
    const res = await fetch(`http://127.0.0.1:${probesPort}/readyz`).catch(() => undefined)
    await res?.body?.cancel()
    if (res?.status === 200) break
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  return { url, service }
}
