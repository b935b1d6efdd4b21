/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`,
 * server scenarios, the version pinned in package.json) run per requirement set
 * (`--requirements 2025-11-25` and `--requirements 2026-07-28`: exactly the
 * scenarios each revision requires, frozen at its release, plus the not-scored
 * ones it runs for visibility) against a server directly and through the
 * gateway on each of its paths:
 *
 *   http     the server as the only HTTP target: session-era traffic is proxied
 *            as is (http-proxy), 2026-07-28 requests forwarded natively (the
 *            fixture answers server/discover)
 *   stdio    the server as a stdio target: the gateway speaks MCP to it (2026-07-28
 *            natively: the fixture's stdio mode serves both eras)
 *   rule     the HTTP target with a per-operation authorization rule, so every
 *            message crosses the gateway's own MCP layer (message by message)
 *
 * Rule (issue 15 item 5): every scenario (scored or not: the not-scored tasks-*
 * scenarios of the tasks extension included), and every check, that passes directly
 * passes through the gateway, on every path, except the gaps listed in
 * KNOWN_GAPS, which must still fail there (a gap that closes fails the test
 * until its entry is removed, so the list only shrinks). The scored totals are
 * printed as TAP comments.
 *
 * Servers: test/fixtures/conformance-server.mjs (both eras, HTTP and stdio) on
 * every path and set; server-everything (as issue 3 asked; it lacks most of the
 * tools the suite calls by name) for 2025-11-25 over stdio.
 *
 * The suite is the copy in node_modules, pinned exactly in package.json; it needs Node 22
 * (test/helpers/conformance-suite.ts says which binary runs it). Scenario re-runs (a loaded host
 * can miss one of the suite's short timeouts) are counted, capped and printed: see `Reruns`.
 */
import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { TargetConfig } from '../core/config.ts'
import { EVERYTHING, ROOT, everythingTarget } from './helpers/gateway-harness.ts'
import { fullGateway } from './helpers/full-gateway.ts'
import { freePort } from './helpers/cli.ts'
import { Reruns, resolveSuite, type Suite } from './helpers/conformance-suite.ts'

const REVISIONS = ['2025-11-25', '2026-07-28'] as const
type Revision = (typeof REVISIONS)[number]
type Path = 'direct' | 'http' | 'stdio' | 'rule'
const PATHS: Path[] = ['direct', 'http', 'stdio', 'rule']

/**
 * Scenarios that pass directly and are known to fail through the gateway, by
 * revision and path, with the reason. Each must still fail there.
 */
const KNOWN_GAPS: Partial<Record<Revision, Record<string, { paths: Path[]; why: string }>>> = {
  '2025-11-25': {},
  '2026-07-28': {},
}

interface Check {
  id: string
  status: string
  errorMessage?: string
}
type Results = Map<string, Check[]>

// Whole-file budget: the runs go in
// parallel, three at a time: about 30-50 s each on an idle 2-core machine, up to 150 s on one
// loaded twentyfold (a stdio session starts a child). Generous, so a slow machine fails only on a real hang.
t.setTimeout(600_000)

/** The environment without the test runner's: tap's NODE_OPTIONS loader and TAP variables would load into (and slow down) every child. */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k === 'TAP' || k.startsWith('TAP_') || k.startsWith('_TAPJS_')) continue
    env[k] = v
  }
  return { ...env, ...extra }
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise(resolve => {
    child.once('exit', () => resolve())
    child.kill('SIGTERM')
    setTimeout(() => child.kill('SIGKILL'), 3000).unref()
  })
}

/** The server in its own streamable-HTTP mode on a free port (it reads PORT). Retries when the port was taken meanwhile. */
async function startDirect(t: Test, args: string[]): Promise<string> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const child = spawn(process.execPath, args, { env: cleanEnv({ PORT: String(port) }), stdio: ['ignore', 'ignore', 'pipe'] })
    const listening = await new Promise<string | undefined>(resolve => {
      let err = ''
      child.stderr!.setEncoding('utf8')
      child.stderr!.on('data', (d: string) => {
        err += d
        const m = /listening on port (\d+)/.exec(err)
        if (m !== null) resolve(m[1])
      })
      child.once('exit', () => resolve(undefined))
    })
    if (listening !== undefined) {
      t.teardown(() => stop(child))
      return `http://127.0.0.1:${listening}/mcp`
    }
    if (attempt >= 2) throw new Error(`${args.join(' ')} did not start`)
  }
}

/**
 * A whole gateway (no authentication) in front of `targets`. Its origin is allowed by the cors
 * policy, which is how the gateway validates Origin (MCP transports, security warning), so the
 * port is chosen first; dns-rebinding-protection is in both requirement sets.
 */
async function startGateway(t: Test, targets: TargetConfig[], policies: Record<string, unknown> = {}, mcp: Record<string, unknown> = {}): Promise<string> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    try {
      const { url } = await fullGateway(t, {
        port,
        policies: { cors: { allowOrigins: [`http://127.0.0.1:${port}`, `http://localhost:${port}`] }, ...policies },
        targets,
        // Clients of the suite never DELETE their sessions: a short idle TTL reaps their upstreams.
        session: { idleTimeoutSeconds: 5 },
        ...mcp,
      })
      return url
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE' || attempt >= 2) throw err
    }
  }
}

function exec(cmd: string, args: string[], timeoutMs: number): Promise<{ code: number | null; output: string }> {
  const child = spawn(cmd, args, { cwd: ROOT, env: cleanEnv({ NO_COLOR: '1', npm_config_update_notifier: 'false' }), stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout!.setEncoding('utf8').on('data', (d: string) => {
    output += d
  })
  child.stderr!.setEncoding('utf8').on('data', (d: string) => {
    output += d
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  return new Promise(resolve =>
    child.once('close', code => {
      clearTimeout(timer)
      resolve({ code, output })
    })
  )
}

/** Runs `conformance server --url <url> [args]` and reads the per-scenario checks it saves. */
async function runSuite(suite: Suite, url: string, args: string[]): Promise<{ results: Results; output: string }> {
  const outDir = await mkdtemp(join(tmpdir(), 'mcp-conformance-'))
  try {
    const { output } = await exec(suite.node, [suite.bin, 'server', '--url', url, '-o', outDir, ...args], 300_000)
    const results: Results = new Map()
    for (const dir of await readdir(outDir)) {
      // <outDir>/server-<scenario>-<ISO timestamp with - for :>/checks.json
      const scenario = dir.replace(/^server-/, '').replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, '')
      // A run cut short by its timeout leaves the scenario it was in without checks.
      const checks = await readFile(join(outDir, dir, 'checks.json'), 'utf8').then(
        s => JSON.parse(s) as Check[],
        () => []
      )
      results.set(scenario, checks)
    }
    return { results, output }
  } finally {
    await rm(outDir, { recursive: true, force: true })
  }
}

/** Runs `jobs` with at most `parallel` at a time. */
async function pool<T>(jobs: Array<() => Promise<T>>, parallel: number): Promise<T[]> {
  const out: T[] = new Array(jobs.length)
  let next = 0
  const worker = async (): Promise<void> => {
    for (let i = next++; i < jobs.length; i = next++) out[i] = await jobs[i]!()
  }
  await Promise.all(Array.from({ length: parallel }, worker))
  return out
}

/** A scenario passes when it has checks and none of them failed (warnings and infos do not fail it). */
function passed(checks: Check[] | undefined): boolean {
  return checks !== undefined && checks.length > 0 && checks.every(c => c.status !== 'FAILURE')
}

function successes(checks: Check[] | undefined): Set<string> {
  return new Set((checks ?? []).filter(c => c.status === 'SUCCESS').map(c => c.id))
}

/** True when the scenario passes directly (or has a check that does) but not through the gateway. */
function lost(direct: Check[] | undefined, through: Check[] | undefined): boolean {
  const ok = successes(through)
  return (passed(direct) && !passed(through)) || [...successes(direct)].some(id => !ok.has(id))
}

function regressions(direct: Results, gateway: Results): string[] {
  return [...direct].filter(([scenario, checks]) => lost(checks, gateway.get(scenario))).map(([scenario]) => scenario)
}

function mark(c: Check[] | undefined): string {
  if (c === undefined) return 'not run'
  if (passed(c)) return 'pass'
  return `fail (${c
    .filter(x => x.status === 'FAILURE')
    .map(x => x.id)
    .join(', ')})`
}

const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')
/** mcp.streams.pollAfterMs well below test_reconnection's 100 ms. */
const POLLING = { streams: { pollAfterMs: 30 } }
const fixtureStdio: TargetConfig = { name: 'conformance', stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {} } }

t.test('conformance, both requirement sets: what passes directly passes through the gateway on every path', async t => {
  const suite = await resolveSuite()
  t.comment(`conformance suite ${suite.version} (node_modules), run by ${suite.node}`)
  const reruns = new Reruns(line => t.comment(line))
  // One fixture process per path, so that concurrent runs never share a server's state.
  const [direct, httpUpstream, ruleUpstream] = await Promise.all([0, 1, 2].map(() => startDirect(t, [FIXTURE, 'http'])))
  const urls: Record<Path, string> = {
    direct: direct!,
    http: await startGateway(t, [{ name: 'conformance', mcp: { url: httpUpstream!, headers: {} } }]),
    // On the paths where the gateway writes the session's streams itself, polling is on (SEP-1699):
    // server-sse-polling's test_reconnection (100 ms) is then closed mid-call by the gateway and resumed.
    stdio: await startGateway(t, [fixtureStdio], {}, POLLING),
    // A rule on mcp.* holds for every real item; its presence takes the HTTP target off the proxy path.
    rule: await startGateway(
      t,
      [{ name: 'conformance', mcp: { url: ruleUpstream!, headers: {} } }],
      { authorization: { rules: ['mcp.tool.name != "no_such_tool"'] } },
      POLLING
    ),
  }

  // server-everything (as issue 3 asked), 2025-11-25 over stdio: it lacks most tools the suite names,
  // and a short per-scenario timeout bounds the waits for them.
  // Its children are shared per subject (stdio.share), so that an initialize is answered by a child
  // already started: on a loaded host a fresh one takes longer than the suite waits for it.
  const shared = everythingTarget()
  const everything = {
    direct: await startDirect(t, [EVERYTHING, 'streamableHttp']),
    stdio: await startGateway(t, [{ ...shared, stdio: { ...shared.stdio!, share: 'subject', processesPerSubject: 2 } }]),
  }
  const everythingArgs = ['--requirements', '2025-11-25', '--timeout', '10000']

  const runs = REVISIONS.flatMap(revision => PATHS.map(path => ({ revision, path })))
  const started = Date.now()
  const everythingRuns = (['direct', 'stdio'] as const).map(path => async () => {
    const { results, output } = await runSuite(suite, everything[path], everythingArgs)
    return { revision: 'everything' as Revision | 'everything', path: path as Path, results, output }
  })
  const results = await pool(
    [
      ...everythingRuns,
      ...runs.map(({ revision, path }) => async () => {
        const at = Date.now()
        const { results, output } = await runSuite(suite, urls[path], ['--requirements', revision])
        t.comment(`${revision} ${path}: ${Date.now() - at} ms`)
        return { revision, path, results, output }
      }),
    ],
    3
  )
  t.comment(`${runs.length + everythingRuns.length} suite runs: ${Date.now() - started} ms`)
  const get = (revision: Revision | 'everything', path: Path): { results: Results; output: string } =>
    results.find(r => r.revision === revision && r.path === path)!

  {
    const direct = get('everything', 'direct')
    const through = get('everything', 'stdio')
    for (const s of ['server-initialize', 'tools-list', 'tools-call-simple-text']) {
      t.ok(passed(direct.results.get(s)), `server-everything: ${s} passes directly (the baseline is meaningful)`, {
        checks: direct.results.get(s),
        output: direct.output.slice(-2000),
      })
    }
    for (let round = 0; round < Reruns.PER_SCENARIO; round++) {
      for (const s of regressions(direct.results, through.results).filter(s => KNOWN_GAPS['2025-11-25']?.[s] === undefined)) {
        if (!reruns.take('server-everything stdio', s)) continue
        const { results: r } = await runSuite(suite, everything.stdio, [...everythingArgs, '--scenario', s])
        for (const [k, v] of r) through.results.set(k, v)
      }
    }
    t.comment(
      '\nserver-everything, 2025-11-25\n' +
        [...direct.results.keys()].map(s => `${s}: direct ${mark(direct.results.get(s))}, stdio ${mark(through.results.get(s))}`).join('\n')
    )
    for (const [scenario, checks] of direct.results) {
      const gap = KNOWN_GAPS['2025-11-25']?.[scenario]
      if (gap?.paths.includes('stdio') === true) continue
      if (passed(checks))
        t.ok(passed(through.results.get(scenario)), `server-everything: ${scenario} passes directly and through the gateway`, {
          checks: through.results.get(scenario),
        })
      const ok = successes(through.results.get(scenario))
      for (const id of successes(checks))
        t.ok(ok.has(id), `server-everything: ${scenario}/${id} passes directly and through the gateway`, { checks: through.results.get(scenario) })
    }
  }

  for (const revision of REVISIONS) {
    const base = get(revision, 'direct')
    const scored = suite.requirements(revision)
    t.ok(base.results.size > 0, `${revision}: the suite ran against the fixture directly`, { output: base.output.slice(-2000) })
    // The suite's own request timeouts are short; on a loaded host a scenario can miss one. Each
    // failure is run again (up to twice), so that only a real failure fails the build.
    const again = async (path: Path, results: Results, scenarios: string[]): Promise<void> => {
      for (let round = 0; round < Reruns.PER_SCENARIO && scenarios.length > 0; round++) {
        for (const s of scenarios) {
          if (!reruns.take(`${revision} ${path}`, s)) continue
          const { results: r } = await runSuite(suite, urls[path], ['--requirements', revision, '--scenario', s])
          for (const [k, v] of r) results.set(k, v)
        }
        scenarios = scenarios.filter(s => !passed(results.get(s)) || lost(base.results.get(s), results.get(s)))
      }
    }
    await again(
      'direct',
      base.results,
      [...scored].filter(s => !passed(base.results.get(s)))
    )
    for (const s of scored)
      t.ok(passed(base.results.get(s)), `${revision}: ${s} (scored) passes directly, so the parity rule covers it`, { checks: base.results.get(s) })

    // A scenario that regressed is run once more through the gateway, so that a timing hiccup of the
    // suite or the host cannot fail the build; a real regression fails twice.
    for (const path of PATHS.slice(1)) {
      const through = get(revision, path).results
      const gaps = KNOWN_GAPS[revision] ?? {}
      const regressed = regressions(base.results, through).filter(s => !(gaps[s]?.paths.includes(path) ?? false))
      if (regressed.length > 0) {
        t.comment(`${revision} ${path}: re-running ${regressed.join(', ')} (failed only through the gateway)`)
        await again(path, through, regressed)
      }
    }

    const lines = [`| ${revision} scenario | scored | ${PATHS.join(' | ')} |`, `|---|---|${PATHS.map(() => '---').join('|')}|`]
    for (const s of base.results.keys())
      lines.push(`| ${s} | ${scored.has(s) ? 'yes' : 'no'} | ${PATHS.map(p => mark(get(revision, p).results.get(s))).join(' | ')} |`)
    const total = (path: Path, only: boolean): string => {
      const names = [...base.results.keys()].filter(s => scored.has(s) === only)
      return `${names.filter(s => passed(get(revision, path).results.get(s))).length}/${names.length}`
    }
    lines.push('', `${revision} scored: ${PATHS.map(p => `${p} ${total(p, true)}`).join(', ')}`)
    lines.push(`${revision} not scored: ${PATHS.map(p => `${p} ${total(p, false)}`).join(', ')}`)
    t.comment('\n' + lines.join('\n'))

    for (const path of PATHS.slice(1)) {
      const through = get(revision, path)
      t.same([...through.results.keys()].sort(), [...base.results.keys()].sort(), `${revision} ${path}: the same scenarios ran`, {
        output: through.output.slice(-2000),
      })
      for (const [scenario, checks] of base.results) {
        const gap = KNOWN_GAPS[revision]?.[scenario]
        if (gap?.paths.includes(path) === true) {
          t.ok(
            lost(checks, through.results.get(scenario)),
            `${revision} ${path}: ${scenario} is a known gap (${gap.why}); remove it from KNOWN_GAPS once it passes`
          )
          continue
        }
        if (passed(checks))
          t.ok(passed(through.results.get(scenario)), `${revision} ${path}: ${scenario} passes directly and through the gateway`, {
            checks: through.results.get(scenario),
          })
        const ok = successes(through.results.get(scenario))
        for (const id of successes(checks))
          t.ok(ok.has(id), `${revision} ${path}: ${scenario}/${id} passes directly and through the gateway`, { checks: through.results.get(scenario) })
      }
    }
  }
  // A host so loaded that many scenarios need a second try is a failure of its own, not a green run.
  t.ok(reruns.withinCap, `conformance re-runs: ${reruns.total}, at most ${Reruns.TOTAL} in all and ${Reruns.PER_SCENARIO} per scenario`)
})
