/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`,
 * server scenarios) run twice: against server-everything's own streamable-HTTP
 * mode (direct) and against the gateway fronting server-everything over stdio
 * (no auth). Rule (issue 3, point 8): every scenario, and every check, that
 * passes directly passes through the gateway.
 *
 * The suite needs Node 22: `npx -p node@22` provides it (from the npm
 * registry; the first run downloads it, later runs use the npx cache).
 * RUNS is the list of suite invocations; a protocol revision with its own
 * scenarios (e.g. 2026-07-28) is one more entry with its own CLI arguments.
 */
import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { EVERYTHING, ROOT, everythingTarget } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'

const SUITE = '@modelcontextprotocol/conformance@0.1.16'
const NODE = 'node@22'

interface ConformanceRun {
  /** Label in test names and the README table. */
  name: string
  /** Extra `conformance server` arguments: `--spec-version <v>`, `--scenario <s>`, `--suite all`, ... */
  args: string[]
}

/** Default: the suite's active server scenarios (every revision it knows, 2025-06-18 and 2025-11-25). */
const RUNS: ConformanceRun[] = [
  { name: 'active server scenarios', args: [] },
]

interface Check { id: string; status: string; errorMessage?: string }
type Results = Map<string, Check[]>

// Whole-file budget: a cold npx cache downloads Node 22 first (~30-60 s); each run takes ~10-20 s.
t.setTimeout(240_000)

/** The environment without the test runner's: tap's NODE_OPTIONS loader and TAP variables would load into (and slow down) every child. */
function cleanEnv (extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k === 'TAP' || k.startsWith('TAP_') || k.startsWith('_TAPJS_')) continue
    env[k] = v
  }
  return { ...env, ...extra }
}

async function freePort (): Promise<number> {
  const s = createServer()
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  const port = (s.address() as AddressInfo).port
  await new Promise<void>(resolve => s.close(() => resolve()))
  return port
}

function stop (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise(resolve => {
    child.once('exit', () => resolve())
    child.kill('SIGTERM')
    setTimeout(() => child.kill('SIGKILL'), 3000).unref()
  })
}

/** server-everything in its own streamable-HTTP mode on 127.0.0.1 (it reads PORT). Retries when the port was taken meanwhile. */
async function startDirect (t: Test): Promise<string> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const child = spawn(process.execPath, [EVERYTHING, 'streamableHttp'], { env: cleanEnv({ PORT: String(port) }), stdio: ['ignore', 'ignore', 'pipe'] })
    const listening = await new Promise<boolean>(resolve => {
      let err = ''
      child.stderr!.setEncoding('utf8')
      child.stderr!.on('data', (d: string) => {
        err += d
        if (err.includes('listening on port')) resolve(true)
      })
      child.once('exit', () => resolve(false))
    })
    if (listening) {
      t.teardown(() => stop(child))
      return `http://127.0.0.1:${port}/mcp`
    }
    if (attempt >= 2) throw new Error('server-everything (streamableHttp) did not start')
  }
}

interface Suite { node: string; bin: string }

/**
 * Node 22 and the suite's bin, resolved once through npx (which installs them into its
 * cache on first use); every run then starts them directly, a fraction of a second each.
 */
async function resolveSuite (): Promise<Suite> {
  const { code, output } = await exec('npx', ['-y', '-p', NODE, '-p', SUITE, '--', 'sh', '-c', 'command -v node && command -v conformance'], 180_000)
  const lines = output.split('\n').map(l => l.trim()).filter(l => l.startsWith('/'))
  const node = lines.find(l => /\/node$/.test(l))
  const bin = lines.find(l => /\/conformance$/.test(l))
  if (code !== 0 || node === undefined || bin === undefined) throw new Error(`could not install ${SUITE} with ${NODE}:\n${output.slice(-2000)}`)
  return { node, bin }
}

function exec (cmd: string, args: string[], timeoutMs: number): Promise<{ code: number | null; output: string }> {
  const child = spawn(cmd, args, { cwd: ROOT, env: cleanEnv({ NO_COLOR: '1', npm_config_update_notifier: 'false' }), stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout!.setEncoding('utf8').on('data', (d: string) => { output += d })
  child.stderr!.setEncoding('utf8').on('data', (d: string) => { output += d })
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  return new Promise(resolve => child.once('close', code => { clearTimeout(timer); resolve({ code, output }) }))
}

/** Runs `conformance server --url <url> [args]` and reads the per-scenario checks it saves. */
async function runSuite (suite: Suite, url: string, args: string[]): Promise<{ results: Results; output: string }> {
  const outDir = await mkdtemp(join(tmpdir(), 'mcp-conformance-'))
  try {
    const { output } = await exec(suite.node, [suite.bin, 'server', '--url', url, '-o', outDir, ...args], 120_000)
    const results: Results = new Map()
    for (const dir of await readdir(outDir)) {
      // <outDir>/server-<scenario>-<ISO timestamp with - for :>/checks.json
      const scenario = dir.replace(/^server-/, '').replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, '')
      const checks = JSON.parse(await readFile(join(outDir, dir, 'checks.json'), 'utf8')) as Check[]
      results.set(scenario, checks)
    }
    return { results, output }
  } finally {
    await rm(outDir, { recursive: true, force: true })
  }
}

/** Runs each scenario on its own (`--scenario`), `parallel` at a time, and merges the results. */
async function runScenarios (suite: Suite, url: string, args: string[], scenarios: string[], parallel = 2): Promise<Results> {
  const results: Results = new Map()
  const queue = [...scenarios]
  const worker = async (): Promise<void> => {
    for (let s = queue.shift(); s !== undefined; s = queue.shift()) {
      const { results: r } = await runSuite(suite, url, [...args, '--scenario', s])
      for (const [k, v] of r) results.set(k, v)
    }
  }
  await Promise.all(Array.from({ length: parallel }, worker))
  return results
}

/** A scenario passes when it has checks and none of them failed (warnings and infos do not fail it). */
function passed (checks: Check[] | undefined): boolean {
  return checks !== undefined && checks.length > 0 && checks.every(c => c.status !== 'FAILURE')
}

function successes (checks: Check[] | undefined): Set<string> {
  return new Set((checks ?? []).filter(c => c.status === 'SUCCESS').map(c => c.id))
}

/** Scenarios (and checks) that pass directly but not through the gateway. */
function regressions (direct: Results, gateway: Results): Array<{ scenario: string; checks: string[] }> {
  const out: Array<{ scenario: string; checks: string[] }> = []
  for (const [scenario, checks] of direct) {
    const through = gateway.get(scenario)
    const ok = successes(through)
    const lost = [...successes(checks)].filter(id => !ok.has(id))
    if ((passed(checks) && !passed(through)) || lost.length > 0) out.push({ scenario, checks: lost })
  }
  return out
}

function table (direct: Results, gateway: Results): string {
  const mark = (c: Check[] | undefined): string => c === undefined ? 'not run' : passed(c) ? 'pass' : 'fail'
  const lines = ['| Scenario | Direct | Through the gateway |', '|---|---|---|']
  for (const scenario of new Set([...direct.keys(), ...gateway.keys()])) {
    lines.push(`| ${scenario} | ${mark(direct.get(scenario))} | ${mark(gateway.get(scenario))} |`)
  }
  return lines.join('\n')
}

/** CONFORMANCE_ALL=1 also runs, through the gateway, the scenarios that fail directly (for the README table). */
const ALL = process.env.CONFORMANCE_ALL === '1'

for (const run of RUNS) {
  t.test(`conformance (${run.name}): what passes directly passes through the gateway`, async t => {
    const t0 = Date.now()
    const suite = await resolveSuite()
    t.comment(`resolve: ${Date.now() - t0} ms`)
    const directUrl = await startDirect(t)
    // Clients of the suite never DELETE their sessions: a short idle TTL reaps their children.
    const { url: gatewayUrl } = await fullGateway(t, { targets: [everythingTarget()], session: { idleTimeoutSeconds: 5 } })

    let mark = Date.now()
    const lap = (what: string): void => { t.comment(`${what}: ${Date.now() - mark} ms`); mark = Date.now() }
    const direct = await runSuite(suite, directUrl, run.args)
    lap('direct')
    t.ok(direct.results.size > 0, 'the suite ran against server-everything directly', { output: direct.output.slice(-2000) })
    t.ok(passed(direct.results.get('server-initialize')), 'server-initialize passes directly (the baseline is meaningful)')
    // Only what passes (in part) directly can regress; the rest runs through the gateway with CONFORMANCE_ALL=1.
    const wanted = [...direct.results].filter(([, checks]) => ALL || successes(checks).size > 0).map(([s]) => s)
    const gateway = await runScenarios(suite, gatewayUrl, run.args, wanted)
    lap('gateway')
    t.equal(gateway.size, wanted.length, 'every scenario ran through the gateway')

    // A scenario that regressed is run once more, both ways, so that a timing hiccup of the
    // suite or the host cannot fail the build; a real regression fails twice.
    const again = regressions(direct.results, gateway).map(r => r.scenario)
    if (again.length > 0) {
      t.comment(`re-running ${again.join(', ')} (failed only through the gateway)`)
      for (const [k, v] of await runScenarios(suite, gatewayUrl, run.args, again)) gateway.set(k, v)
      for (const [k, v] of await runScenarios(suite, directUrl, run.args, again)) direct.results.set(k, v)
    }

    t.comment('\n' + table(direct.results, gateway))
    for (const [scenario, checks] of direct.results) {
      const through = gateway.get(scenario)
      if (passed(checks)) {
        t.ok(passed(through), `${scenario}: passes directly and through the gateway`, { checks: through })
      }
      const ok = successes(through)
      for (const id of successes(checks)) {
        t.ok(ok.has(id), `${scenario}/${id}: check passes directly and through the gateway`, { checks: through })
      }
    }
  })
}
