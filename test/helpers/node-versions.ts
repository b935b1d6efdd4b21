/**
 * The Node binaries of the supported lines (package.json "engines": >=22).
 * `.ci/run` installs each at an exact version from the npm registry and passes
 * its path as MCPP_NODE22 / MCPP_NODE24; tests that must run something on a
 * given line (the conformance suite on 22, the CLI on both) take it from here,
 * never from a download at test time. Unset (a developer's machine), the Node
 * running the tests stands in when it is a supported line itself.
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

export type NodeLine = 22 | 24

const MIN_MAJOR = 22

/** The running Node's major version. */
export function currentMajor(): number {
  return Number(process.versions.node.split('.')[0])
}

/**
 * Path of a node binary for `line`: $MCPP_NODE<line> when set, else this
 * process's node when it is Node 22 or later. Throws a message that says
 * what to set otherwise, so a test fails with the reason instead of a spawn error.
 */
export function nodeBinary(line: NodeLine): string {
  const name = `MCPP_NODE${line}`
  const fromEnv = process.env[name]
  if (fromEnv !== undefined && fromEnv !== '') return fromEnv
  if (currentMajor() >= MIN_MAJOR) return process.execPath
  throw new Error(
    `${name} is not set and this Node (${process.version}) is older than ${MIN_MAJOR}: set ${name} to a Node ${line} binary (.ci/run installs one) or run the tests on Node ${MIN_MAJOR} or later`
  )
}

/** The bin script `bin` of the installed package `pkg` (under node_modules of `root`). */
export function packageBin(root: string, pkg: string, bin: string): string {
  const dir = join(root, 'node_modules', pkg)
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { bin?: string | Record<string, string> }
  const rel = typeof manifest.bin === 'string' ? manifest.bin : manifest.bin?.[bin]
  if (rel === undefined) throw new Error(`${pkg} has no bin named ${bin}`)
  return join(dir, rel)
}
