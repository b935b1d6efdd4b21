import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { createServer, connect } from 'node:net'
import { mkdtemp, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { readdirSync, readFileSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { Readable } from 'node:stream'
import { join } from 'node:path'

export const ROOT = fileURLToPath(new URL('../..', import.meta.url))
export const CLI = fileURLToPath(new URL('../../bin/mcp-proxy.ts', import.meta.url))

export interface CliResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
}

/** Runs the real CLI from source (through tsx) as a child process. */
export function runCli(args: string[], env: NodeJS.ProcessEnv = {}, timeoutMs = 30000): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', d => {
      stdout += d
    })
    child.stderr.on('data', d => {
      stderr += d
    })
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`CLI did not exit: ${args.join(' ')}\n${stderr}`))
    }, timeoutMs)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr })
    })
  })
}

/** Starts the CLI and resolves once its start-up log line says it listens. */
export function startCli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ child: ChildProcess; output: () => string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    const onData = (d: Buffer): void => {
      out += d
      if (out.includes('listening on')) resolve({ child, output: () => out })
    }
    child.stdout!.on('data', onData)
    child.stderr!.on('data', onData)
    child.on('exit', code => reject(new Error(`CLI exited with ${code} before listening:\n${out}`)))
  })
}

/**
 * Starts the CLI without waiting for anything: black-box start-up tests talk
 * to the port as soon as it accepts (see `waitForPort`), never after a log line.
 */
export function spawnCli(
  args: string[],
  env: NodeJS.ProcessEnv = {}
): { child: ChildProcess; output: () => string; exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }> } {
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout!.on('data', d => {
    out += d
  })
  child.stderr!.on('data', d => {
    out += d
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>(resolve => child.once('exit', (code, signal) => resolve({ code, signal })))
  return { child, output: () => out, exited }
}

/** Tries to connect in a tight loop until `port` accepts; rejects when `giveUp` settles first. */
export async function waitForPort(port: number, giveUp: Promise<unknown>): Promise<void> {
  let over = false
  void giveUp.then(() => {
    over = true
  })
  for (;;) {
    if (over) throw new Error(`port ${port} never accepted`)
    const ok = await new Promise<boolean>(resolve => {
      const s = connect(port, '127.0.0.1')
      s.once('connect', () => {
        s.destroy()
        resolve(true)
      })
      s.once('error', () => resolve(false))
    })
    if (ok) return
    await new Promise(resolve => setTimeout(resolve, 2))
  }
}

/** A port that was free a moment ago. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as import('node:net').AddressInfo
      s.close(() => resolve(port))
    })
    s.on('error', reject)
  })
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/**
 * Polls `check` up to `tries` times, `everyMs` apart, until `ok` holds; resolves with that value.
 * Throws when it never holds, naming what it waited for (the source of `check` and `ok`) and the
 * last value seen: a bounded wait that fails loudly, never a silent pass.
 */
export async function eventually<T>(check: () => T | Promise<T>, ok: (v: T) => boolean, tries = 100, everyMs = 50): Promise<T> {
  let v = await check()
  for (let i = 0; i < tries && !ok(v); i++) {
    await new Promise(resolve => setTimeout(resolve, everyMs))
    v = await check()
  }
  if (!ok(v)) {
    let last: string
    try {
      last = JSON.stringify(v) ?? String(v)
    } catch {
      last = String(v)
    }
    throw new Error(
      `eventually: waited ${tries} x ${everyMs} ms for (${ok.toString()}) on (${check.toString().slice(0, 300)}); last value: ${last.slice(0, 300)}`
    )
  }
  return v
}

/** Writes `text` as config.yaml in a fresh temp folder and returns its path. */
export async function configFile(text: string, prefix = 'mcpp-cli-'): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix))
  const file = join(dir, 'config.yaml')
  await writeFile(file, text)
  return file
}

/** Whether a TCP connection to 127.0.0.1:`port` is accepted now. */
export const canConnect = (port: number): Promise<boolean> =>
  new Promise(resolve => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.once('error', () => resolve(false))
  })

/** fetch over a new TCP connection each time (no keep-alive pool): the primary hands each to the next worker. */
export function freshFetch(url: string | URL, init: RequestInit = {}): Promise<Response> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = {}
    new Headers(init.headers).forEach((v, k) => {
      headers[k] = v
    })
    const req = httpRequest(url, { method: init.method ?? 'GET', headers, agent: false }, res => {
      const h = new Headers()
      for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(', ') : v)
      const empty = res.statusCode === 204 || res.statusCode === 304
      if (empty) res.resume()
      resolve(new Response(empty ? null : (Readable.toWeb(res) as ReadableStream), { status: res.statusCode, headers: h }))
    })
    init.signal?.addEventListener('abort', () => req.destroy(new Error('aborted')))
    req.once('error', reject)
    req.end(typeof init.body === 'string' ? init.body : undefined)
  })
}

/** The parent of a process (Linux /proc). */
export function parentOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
}

/** The gateway processes the primary forked (tsx may run a helper process of its own beside them). */
export function workersOf(pid: number): number[] {
  return readdirSync('/proc')
    .filter(d => /^\d+$/.test(d))
    .map(Number)
    .filter(p => {
      try {
        return parentOf(p) === pid && readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('mcp-proxy.ts')
      } catch {
        return false
      }
    })
}
