#!/usr/bin/env node
/**
 * mcp-proxy CLI: argv -> loadConfig -> startGateway, both handed the
 * built-in plugins (plugins/index.ts); signals; exit codes.
 *
 * Exit codes: 0 success (or clean shutdown), 1 invalid configuration
 * (including `environment variable not found`; with `workers`, also more
 * dead workers within a minute than workerRestartsPerMinute), 2 usage error,
 * 3 start-up failure (port in use, a plugin failed to start).
 */
import cluster from 'node:cluster'
import { parseArgs } from 'node:util'
import { loadConfig, packagePath, type LoadedConfig, type TargetConfig } from '../core/config.ts'
import { startGateway, VERSION, type RunningGateway } from '../core/gateway.ts'
import { describePipeline, type PipelineStage } from '../core/plugin-loader.ts'
import { outlineOf } from '../core/credentials/index.ts'
import { redactConfig } from '../core/admin/redact.ts'
import { ProxyError } from '../core/errors.ts'
import { createLogger } from '../core/logger.ts'
import { builtins } from '../plugins/index.ts'
import type { McpAuthenticationOptions } from '../plugins/mcp-authentication/index.ts'
import { runPrimary } from '../core/cluster/primary.ts'
import { connectWorker, type WorkerChannel } from '../core/cluster/worker.ts'
import { WORKER_ENV } from '../core/cluster/messages.ts'
import { parseWorkersFlag, workerCount } from '../core/cluster/worker-count.ts'
import { watchChildGroups } from '../core/targets/stdio.ts'

export const EXIT = { OK: 0, CONFIG: 1, USAGE: 2, STARTUP: 3 } as const

const HELP = `Usage: mcp-proxy -f <config.yaml> [--check] [--workers N|auto]

An MCP gateway: one /mcp endpoint in front of stdio and HTTP MCP servers,
with JWT authentication, OAuth metadata bridging and authorization rules.

Options:
  -f, --file <path>   configuration file (YAML; \${NAME} expands environment variables)
      --check         validate the configuration, print a summary, and exit
      --schema        print the path of this install's editor schema (for the
                      yaml-language-server modeline) and exit
      --workers <N>   processes serving the MCP port together (1-64, or auto:
                      one per core); overrides the config's \`workers\`
  -h, --help          show this help
  -v, --version       print the version

Exit codes: 0 ok, 1 invalid configuration, 2 usage error, 3 start-up failure.
Docs: README.md`

function fail(code: number, message: string): never {
  process.stderr.write(`mcp-proxy: ${message}\n`)
  process.exit(code)
}

/** A URL as --check prints it: without userinfo (a literal `user:password@` is a credential). */
function shownUrl(url: string): string {
  try {
    const u = new URL(url)
    u.username = ''
    u.password = ''
    return u.href
  } catch {
    return url
  }
}

/**
 * One target's --check line: where it runs (from the redacted config: a value that came from a
 * `${NAME}` shows as redacted), `share subject`, and its credential mode with the headers or
 * environment variables it sets (names only, never a value).
 */
function targetLine(target: TargetConfig, shown: TargetConfig): string {
  const parts = [shown.stdio !== undefined ? `stdio ${[shown.stdio.cmd, ...(shown.stdio.args ?? [])].join(' ')}` : `http ${shownUrl(shown.mcp?.url ?? '')}`]
  if (target.stdio?.share === 'subject') parts.push('share subject')
  const auth = outlineOf(target)
  if (auth !== undefined) {
    const names = auth.envNames.length > 0 ? `env ${auth.envNames.join(', ')}` : auth.headerNames.join(', ')
    parts.push(`auth ${auth.mode}${names === '' ? '' : ` (${names})`}`)
  }
  return `    ${target.name}: ${parts.join(', ')}`
}

/**
 * `--check`: the pipeline that will actually run (every start-up check
 * passed, nothing created), in order, with what each stage enforces; the
 * authentication line follows from that pipeline, never from a policy block
 * alone.
 */
function checkSummary(file: string, loaded: LoadedConfig, stages: readonly PipelineStage[], workers: number, auto: boolean): string {
  const cfg = loaded.config
  const auth = stages.find(s => s.name === 'mcpAuthentication') === undefined ? undefined : (cfg.mcp.policies.mcpAuthentication as McpAuthenticationOptions)
  const shown = (redactConfig(cfg, loaded.secretPaths) as typeof cfg).mcp.targets
  return [
    `config OK: ${file}`,
    `  listen: ${cfg.mcp.host}:${cfg.mcp.port} (admin ${cfg.admin.enabled ? `${cfg.admin.host}:${cfg.admin.port}` : 'disabled'})`,
    '  targets:',
    ...cfg.mcp.targets.map((t, i) => targetLine(t, shown[i]!)),
    `  pipeline: ${stages.map(p => p.name).join(' -> ') || '(none)'}${cfg.mcp.plugins !== undefined ? ' (mcp.plugins)' : ' (default, from mcp.policies)'}`,
    ...stages.map((s, i) => `    ${i + 1}. ${s.name} (${s.optionsPath}): ${s.summary ?? 'third-party plugin, enforces what its module does'}`),
    `  workers: ${workers === 1 ? '1 (one process)' : `${workers}${auto ? ' (auto: one per core)' : ''}, behind one primary`}`,
    `  authentication: ${auth === undefined ? 'off (no mcpAuthentication stage in the pipeline)' : `${auth.mode}, issuer ${auth.issuer}${auth.provider !== undefined ? `, provider ${Object.keys(auth.provider)[0]}` : ''}`}`,
  ].join('\n')
}

function readArgs() {
  try {
    return parseArgs({
      options: {
        file: { type: 'string', short: 'f' },
        check: { type: 'boolean' },
        schema: { type: 'boolean' },
        workers: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
        version: { type: 'boolean', short: 'v' },
      },
      strict: true,
      allowPositionals: false,
    })
  } catch (err) {
    fail(EXIT.USAGE, `${(err as Error).message}\n\n${HELP}`)
  }
}

async function main(): Promise<void> {
  const v = readArgs().values
  if (v.help === true) {
    process.stdout.write(HELP + '\n')
    return
  }
  if (v.version === true) {
    process.stdout.write(VERSION + '\n')
    return
  }
  if (v.schema === true) {
    process.stdout.write(packagePath('schemas/editor.schema.json') + '\n')
    return
  }
  if (v.file === undefined) fail(EXIT.USAGE, `missing -f <config.yaml>\n\n${HELP}`)

  let loaded: LoadedConfig
  try {
    loaded = await loadConfig(v.file, process.env, builtins)
  } catch (err) {
    fail(EXIT.CONFIG, ProxyError.is(err) ? err.message : String(err))
  }
  const cfg = loaded.config
  // The whole pipeline checked before any port is bound or worker forked: a
  // configured block no stage acts on fails here (exit 1), never half-started.
  let stages: PipelineStage[]
  try {
    stages = await describePipeline({ config: cfg, baseDir: loaded.baseDir, registry: builtins })
  } catch (err) {
    fail(EXIT.CONFIG, ProxyError.is(err) ? err.message : String(err))
  }
  let workersSetting = cfg.workers
  if (v.workers !== undefined) {
    const parsed = parseWorkersFlag(v.workers)
    if (typeof parsed === 'string' && parsed !== 'auto') fail(EXIT.USAGE, `${parsed}\n\n${HELP}`)
    workersSetting = parsed as number | 'auto'
  }
  const workers = workerCount(workersSetting)

  if (v.check === true) {
    process.stdout.write(checkSummary(v.file, loaded, stages, workers, workersSetting === 'auto') + '\n')
    return
  }

  if (workers > 1 && cluster.isPrimary) {
    try {
      await runPrimary({ loaded, count: workers, log: createLogger(cfg.logging), exit: code => process.exit(code) })
    } catch (err) {
      const errno = (err as NodeJS.ErrnoException).code as string | undefined
      fail(
        EXIT.STARTUP,
        errno === 'EADDRINUSE' || errno === 'EACCES' || errno === 'EADDRNOTAVAIL' ? `cannot listen: ${(err as Error).message}` : (err as Error).message
      )
    }
    return
  }
  // A worker of a primary (core/cluster/primary.ts): its secret and shared state come over the IPC channel,
  // and the process groups of its stdio children go back to the primary (which kills them if this worker dies).
  let channel: WorkerChannel | undefined
  if (cluster.isWorker && process.env[WORKER_ENV] !== undefined) {
    try {
      channel = await connectWorker({ log: createLogger(cfg.logging), watchChildGroups })
    } catch (err) {
      fail(EXIT.STARTUP, (err as Error).message)
    }
  }

  let gateway: RunningGateway
  try {
    gateway = await startGateway(loaded, {
      registry: builtins,
      worker: channel === undefined ? undefined : { slot: channel.slot, secret: channel.secret, shared: channel.shared },
    })
  } catch (err) {
    const code = ProxyError.is(err) && err.code === 'MCPP_ERR_CONFIG' ? EXIT.CONFIG : EXIT.STARTUP
    const errno = (err as NodeJS.ErrnoException).code as string | undefined
    const message = (err as Error).message
    fail(code, errno === 'EADDRINUSE' || errno === 'EACCES' || errno === 'EADDRNOTAVAIL' ? `cannot listen: ${message}` : message)
  }

  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) {
      gateway.log.warn({ signal }, 'second signal: exiting now')
      // core/targets/stdio.ts SIGKILLs remaining process groups on 'exit'.
      process.exit(1)
    }
    stopping = true
    gateway.log.info({ signal }, 'shutting down')
    gateway.close().then(
      () => {
        gateway.log.info('stopped')
        process.exit(EXIT.OK)
      },
      (err: unknown) => {
        gateway.log.error({ err }, 'shutdown failed')
        process.exit(1)
      }
    )
  }
  process.on('SIGINT', () => stop('SIGINT'))
  process.on('SIGTERM', () => stop('SIGTERM'))
  if (channel !== undefined) {
    const gw = gateway
    channel.answer({
      ready: () => gw.ready(),
      metrics: async () => {
        await gw.metrics.collect()
        return gw.metrics.render()
      },
    })
    channel.up(gateway.adminUrl)
    // The primary is gone (killed): nobody relays probes, restarts or cleans up after this worker; it drains and exits.
    process.once('disconnect', () => {
      if (!stopping) stop('primary gone')
    })
  }
}

void main()
