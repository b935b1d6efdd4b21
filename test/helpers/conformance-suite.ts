/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`) as the tests run it:
 * the copy `npm ci` installed from package-lock.json (pinned exactly in package.json, no range),
 * never a floating `npx -y` download at test time (issue 22 item 17: hermetic CI).
 *
 * The suite runs on Node 22: the exact version .ci/run installs (MCPP_NODE22), else the test
 * runner's own node when it is 22 or later (test/helpers/node-versions.ts); nothing is downloaded.
 */
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { parse as parseYaml } from 'yaml'
import { ROOT } from './gateway-harness.ts'
import { nodeBinary } from './node-versions.ts'

export const SUITE_NAME = '@modelcontextprotocol/conformance'
const SUITE_DIR = join(ROOT, 'node_modules', ...SUITE_NAME.split('/'))

export interface Suite {
  /** The node binary that runs the suite. */
  node: string
  /** The suite's CLI script in node_modules. */
  bin: string
  /** The version installed (equal to the pin). */
  version: string
  /** The server scenarios a frozen requirement set names (<package>/requirements/<revision>.yaml). */
  requirements: (revision: string) => Set<string>
}

/** The version package.json pins, refused unless exact: a range would let CI drift to a newer suite. */
export function pinnedVersion(): string {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }
  const spec = pkg.devDependencies[SUITE_NAME]
  if (spec === undefined || !/^\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?$/.test(spec)) {
    throw new Error(`package.json devDependencies.${SUITE_NAME} must be an exact version, not ${JSON.stringify(spec)}`)
  }
  return spec
}

/** Resolves the installed suite and the node that runs it; throws with the reason when either is missing or off the pin. */
export async function resolveSuite(): Promise<Suite> {
  const pinned = pinnedVersion()
  const manifest = join(SUITE_DIR, 'package.json')
  if (!existsSync(manifest)) throw new Error(`${SUITE_NAME} is not installed in node_modules: run npm ci`)
  const installed = JSON.parse(readFileSync(manifest, 'utf8')) as { version: string; bin: Record<string, string> }
  if (installed.version !== pinned) throw new Error(`${SUITE_NAME} ${installed.version} is installed, package.json pins ${pinned}: run npm ci`)
  const bin = join(SUITE_DIR, installed.bin.conformance!)
  const requirements = (revision: string): Set<string> => {
    const doc = parseYaml(readFileSync(join(SUITE_DIR, 'requirements', `${revision}.yaml`), 'utf8')) as { server: string[] }
    return new Set(doc.server)
  }
  return { node: nodeBinary(22), bin, version: installed.version, requirements }
}

/**
 * Re-runs of suite scenarios, counted and capped (issue 22 item 17: a retried scenario is never
 * silently green). Each re-run prints a TAP comment `conformance re-run: <label> <scenario>
 * (re-run N of at most PER_SCENARIO)`, which .ci/run counts and prints before its closing line;
 * `withinCap` is asserted at the end of each test that re-runs.
 */
export class Reruns {
  static readonly PER_SCENARIO = 2
  static readonly TOTAL = 12
  readonly #counts = new Map<string, number>()
  #total = 0
  readonly #comment: (line: string) => void

  constructor(comment: (line: string) => void) {
    this.#comment = comment
  }

  /** Whether `scenario` under `label` may run again; if so, counts and prints the re-run. */
  take(label: string, scenario: string): boolean {
    const key = `${label} ${scenario}`
    const n = (this.#counts.get(key) ?? 0) + 1
    if (n > Reruns.PER_SCENARIO) return false
    this.#counts.set(key, n)
    this.#total++
    this.#comment(`conformance re-run: ${key} (re-run ${n} of at most ${Reruns.PER_SCENARIO})`)
    return true
  }

  get total(): number {
    return this.#total
  }
  get withinCap(): boolean {
    return this.#total <= Reruns.TOTAL
  }
}
