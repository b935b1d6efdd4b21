/**
 * The bench's peers (supergateway and punkpeye's mcp-proxy) live in bench/'s
 * own package.json and lockfile, out of the gateway's dependency tree: in the
 * root tree, punkpeye's package put its `mcp-proxy` bin where `npx mcp-proxy`
 * finds it, shadowing this project's command. Installed here on first use,
 * exactly as locked.
 */
import { existsSync } from 'node:fs'
import { execFile } from 'node:child_process'
import { join } from 'node:path'

/** Entry scripts of the peers, run with `node` by path (punkpeye's shares our command's name). */
export function peerBins(benchDir: string): { supergateway: string; punkpeye: string } {
  const modules = join(benchDir, 'node_modules')
  return {
    supergateway: join(modules, 'supergateway/dist/index.js'),
    punkpeye: join(modules, 'mcp-proxy/dist/bin/mcp-proxy.mjs'),
  }
}

/** `npm ci` in bench/ when a peer is missing; resolves once both entry scripts exist. */
export async function ensurePeers(benchDir: string, say: (line: string) => void): Promise<void> {
  const bins = peerBins(benchDir)
  if (existsSync(bins.supergateway) && existsSync(bins.punkpeye)) return
  say('installing the bench peers into bench/node_modules (npm ci, first run only)')
  await new Promise<void>((resolve, reject) => {
    execFile('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: benchDir, timeout: 300_000 }, (err, _out, stderr) => {
      if (err === null) resolve()
      else reject(new Error(`npm ci in ${benchDir} failed: ${stderr.slice(-2000)}`))
    })
  })
  for (const [name, path] of Object.entries(bins)) {
    if (!existsSync(path)) throw new Error(`bench peer ${name} not found at ${path} after npm ci`)
  }
}
