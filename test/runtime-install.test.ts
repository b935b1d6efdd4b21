/**
 * Supported runtimes and the command in a clone (issue 24 items 1 and 2):
 * Node 22 and 24 only, the exact versions .ci/run installs accepted by every
 * locked package, `npm ci` leaving a built gateway (`prepare`), and no other
 * package's `mcp-proxy` in the root tree, where `npx mcp-proxy` would find it.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { readFileSync, existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { ROOT } from './helpers/cli.ts'
import { nodeBinary, type NodeLine } from './helpers/node-versions.ts'

interface LockEntry {
  version?: string
  bin?: Record<string, string>
  engines?: { node?: string } | string[]
  dev?: boolean
  optional?: boolean
}
interface Manifest {
  version: string
  engines: { node: string }
  scripts: Record<string, string>
  bin: Record<string, string>
  dependencies: Record<string, string>
  devDependencies: Record<string, string>
}

const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as Manifest
const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, LockEntry> }
const semver = createRequire(import.meta.url)('semver') as { satisfies(v: string, range: string): boolean }

/** The exact Node versions .ci/run installs (NODE24_VERSION=…, NODE22_VERSION=…). */
function ciNodeVersions(): Record<NodeLine, string> {
  const run = readFileSync(join(ROOT, '.ci/run'), 'utf8')
  const pick = (line: NodeLine): string => {
    const m = new RegExp(`^NODE${line}_VERSION=(\\d+\\.\\d+\\.\\d+)$`, 'm').exec(run)
    if (m === null) throw new Error(`.ci/run pins no exact NODE${line}_VERSION`)
    return m[1]!
  }
  return { 22: pick(22), 24: pick(24) }
}

t.test('the supported lines are Node 22 and 24, everywhere they are named', async t => {
  const pinned = ciNodeVersions()
  t.match(pinned[22], /^22\./)
  t.match(pinned[24], /^24\./)
  t.equal(pkg.engines.node, '>=22', 'engines')
  t.notOk(semver.satisfies('20.19.0', pkg.engines.node), 'Node 20 (end of life 2026-04-30) is refused')
  t.match(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'), /^ARG NODE_IMAGE=node:24-/m, 'the image is built on Node 24')
  t.match(pkg.devDependencies['@types/node'], /^\^22\./, 'types of the oldest supported line: no API newer than Node 22 type-checks')
  // npm prints EBADENGINE for each locked package whose engines.node the running Node misses.
  for (const [line, version] of Object.entries(pinned)) {
    const refusing = Object.entries(lock.packages)
      .filter(
        ([, e]) =>
          typeof e.engines === 'object' && !Array.isArray(e.engines) && typeof e.engines.node === 'string' && !semver.satisfies(version, e.engines.node)
      )
      .map(([path, e]) => `${path}@${e.version} wants node ${(e.engines as { node: string }).node}`)
    t.same(refusing, [], `no EBADENGINE on Node ${version} (line ${line})`)
  }
})

t.test('npx mcp-proxy in a clone finds this gateway: no dependency ships a bin of that name', async t => {
  t.same(pkg.bin, { 'mcp-proxy': 'dist/bin/mcp-proxy.js', 'mcp-idp-gateway': 'dist/bin/mcp-proxy.js' })
  const shadowing = Object.entries(lock.packages)
    .filter(([path, e]) => path !== '' && e.bin !== undefined && Object.keys(e.bin).some(b => b in pkg.bin))
    .map(([path]) => path)
  t.same(shadowing, [], 'no package in the root tree links node_modules/.bin/mcp-proxy or mcp-idp-gateway')
  const bench = JSON.parse(readFileSync(join(ROOT, 'bench/package.json'), 'utf8')) as { private: boolean; dependencies: Record<string, string> }
  t.equal(bench.private, true)
  t.ok('mcp-proxy' in bench.dependencies && 'supergateway' in bench.dependencies, 'the benchmark peers live in bench/package.json')
  t.ok(existsSync(join(ROOT, 'bench/package-lock.json')), 'with their own lockfile (bench/lib/peers.ts runs npm ci there)')
})

t.test('the gateway runs on both supported lines; npm ci builds it (prepare)', async t => {
  // dist/ itself is checked by .ci/run right after npm ci: here, package-install.test.ts
  // may be re-packing it (prepack empties dist/) while this file runs.
  t.match(pkg.scripts.prepare, /\bbuild\b/, 'prepare builds dist/')
  for (const line of [22, 24] as const) {
    const node = nodeBinary(line)
    const cli = ['--import', 'tsx', join(ROOT, 'bin/mcp-proxy.ts')]
    const r = await run(node, [...cli, '-f', join(ROOT, 'examples/http-target.yaml'), '--check'])
    t.equal(r.code, 0, `--check passes with ${node}: ${r.output.slice(-500)}`)
    const v = await run(node, [...cli, '--version'])
    t.equal(v.output.trim(), pkg.version, `--version prints this package's version on line ${line}`)
  }
})

function run(cmd: string, args: string[]): Promise<{ code: number | null; output: string }> {
  const child = spawn(cmd, args, {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, UPSTREAM_API_KEY: 'example-key' },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    output += d
  })
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    output += d
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
  return new Promise(resolve =>
    child.once('close', code => {
      clearTimeout(timer)
      resolve({ code, output })
    })
  )
}
