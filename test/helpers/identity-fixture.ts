/**
 * The identity fixtures of issue 25 as tests start them: test/fixtures/identity-server.mjs (an HTTP
 * MCP server that verifies its own bearer and says whom it saw) spawned on a free port, and
 * test/fixtures/env-server.mjs (a stdio server that reports its environment) as a target.
 */
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
export const IDENTITY_SERVER = join(ROOT, 'test/fixtures/identity-server.mjs')
export const ENV_SERVER = join(ROOT, 'test/fixtures/env-server.mjs')

/** What whoami answers (claims the server verified, its x-* request headers, the hash of the bearer it got). */
export interface Whoami {
  sub?: string
  oid?: string
  aud?: string | string[]
  iss?: string
  scope?: string
  scp?: string
  act?: { sub: string }
  azp?: string
  appid?: string
  client_id?: string
  tid?: string
  headers: Record<string, string>
  bearerSha256: string | null
}

export interface IdentityServer {
  /** `http://127.0.0.1:<port>/mcp` */
  url: string
  /** SHA-256 (hex) of every distinct bearer the server ever received, accepted or not. */
  seen(): Promise<string[]>
  /** Requests to /mcp so far, refused ones included. */
  requests(): Promise<number>
  /** The server's stderr so far. */
  stderr(): string
}

/** Hex SHA-256, as the fixture reports bearers. */
export const sha256 = (value: string): string => createHash('sha256').update(value).digest('hex')

/**
 * Spawns the identity server with `args` (`['--jwks', url, '--issuer', iss, '--audience', aud]`,
 * `['--static-bearer', v]` or `['--no-auth']`); killed in teardown.
 */
export async function identityServer(t: Test, args: readonly string[]): Promise<IdentityServer> {
  const child = spawn(process.execPath, [IDENTITY_SERVER, ...args], {
    env: { ...process.env, PORT: '0', NODE_OPTIONS: '' },
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  t.teardown(() => {
    child.kill('SIGKILL')
  })
  let err = ''
  const port = await new Promise<string>((resolve, reject) => {
    child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      err += d
      const m = /listening on port (\d+)/.exec(err)
      if (m !== null) resolve(m[1]!)
    })
    child.once('exit', code => reject(new Error(`identity server exited (${code}): ${err}`)))
  })
  const origin = `http://127.0.0.1:${port}`
  const seenDoc = async () => (await (await fetch(`${origin}/seen`)).json()) as { bearers: string[]; requests: number }
  return {
    url: `${origin}/mcp`,
    seen: async () => (await seenDoc()).bearers,
    requests: async () => (await seenDoc()).requests,
    stderr: () => err,
  }
}

/** The identity server's JWT mode for an IdP: its JWKS, its issuer, and `audience` as the server's own. */
export function jwtArgs(idp: { jwksUrl: string; issuer: string }, audience: string, requireScope?: string): string[] {
  return ['--jwks', idp.jwksUrl, '--issuer', idp.issuer, '--audience', audience, ...(requireScope === undefined ? [] : ['--require-scope', requireScope])]
}

/** The env server as a stdio target config (`mcp.targets[]` shape), reporting `names`. */
export function envServerTarget(name: string, names: readonly string[]): { name: string; stdio: { cmd: string; args: string[] } } {
  return { name, stdio: { cmd: process.execPath, args: [ENV_SERVER, ...names] } }
}
