/**
 * Child processes under test: spawn on 127.0.0.1, wait until they listen,
 * read their own RSS (children excluded), stop them with escalation.
 * Everything the bench starts is registered here so one call ends it all.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readdir, readFile, rm } from 'node:fs/promises'
import { createServer, connect } from 'node:net'

export interface Service {
  readonly name: string
  readonly pid: number
  readonly child: ChildProcess
  /** Last lines of stderr/stdout, for error messages. */
  tail(): string
  stop(): Promise<void>
}

const running = new Set<Service>()

/** A free TCP port on 127.0.0.1 (the listener is closed again; fine on loopback for a bench). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as import('node:net').AddressInfo).port
      s.close(() => resolve(port))
    })
  })
}

function canConnect(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const sock = connect({ port, host: '127.0.0.1' })
    sock.once('connect', () => {
      sock.destroy()
      resolve(true)
    })
    sock.once('error', () => resolve(false))
  })
}

export const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

export interface SpawnOptions {
  readonly env?: Record<string, string>
  readonly cwd?: string
  /** Resolve once 127.0.0.1:<port> accepts connections. */
  readonly port?: number
  /** Or once a line of output matches. */
  readonly readyLine?: RegExp
  readonly timeoutMs?: number
  /** A temp dir (config, logs) removed when the service stops. */
  readonly tempDir?: string
}

/** Spawns a service in its own process group and waits until it is ready. */
export async function startService(name: string, cmd: string, args: readonly string[], opts: SpawnOptions = {}): Promise<Service> {
  const child = spawn(cmd, args, {
    cwd: opts.cwd,
    env: { ...process.env, ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  })
  let out = ''
  let lineSeen = false
  const onData = (d: Buffer): void => {
    out = (out + d.toString('utf8')).slice(-4000)
    if (opts.readyLine?.test(out)) lineSeen = true
  }
  child.stdout!.on('data', onData)
  child.stderr!.on('data', onData)
  let exited: number | string | null | undefined
  const exitedP = new Promise<void>(resolve =>
    child.once('exit', (code, sig) => {
      exited = code ?? sig
      resolve()
    })
  )
  const service: Service = {
    name,
    pid: child.pid!,
    child,
    tail: () => out.split('\n').slice(-15).join('\n'),
    async stop() {
      running.delete(service)
      if (exited !== undefined) {
        if (opts.tempDir !== undefined) await rm(opts.tempDir, { recursive: true, force: true })
        return
      }
      try {
        process.kill(-child.pid!, 'SIGTERM')
      } catch {
        /* gone */
      }
      const t = setTimeout(() => {
        try {
          process.kill(-child.pid!, 'SIGKILL')
        } catch {
          /* gone */
        }
      }, 3000)
      await exitedP
      clearTimeout(t)
      // Grandchildren (stdio servers) of a peer that did not reap them.
      try {
        process.kill(-child.pid!, 'SIGKILL')
      } catch {
        /* gone */
      }
      if (opts.tempDir !== undefined) await rm(opts.tempDir, { recursive: true, force: true })
    },
  }
  running.add(service)
  const deadline = Date.now() + (opts.timeoutMs ?? 20_000)
  for (;;) {
    if (exited !== undefined) throw new Error(`${name} exited (${String(exited)}) before it was ready:\n${service.tail()}`)
    if (opts.port !== undefined ? await canConnect(opts.port) : lineSeen) break
    if (Date.now() > deadline) {
      await service.stop()
      throw new Error(`${name} not ready after ${opts.timeoutMs ?? 20_000} ms:\n${service.tail()}`)
    }
    await sleep(50)
  }
  return service
}

export async function stopAll(): Promise<void> {
  await Promise.allSettled([...running].map(s => s.stop()))
}

/** Resident set size of one process in bytes (VmRSS: its own pages only, never its children's). */
export async function rssOf(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8')
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status)
  if (m === null) throw new Error(`no VmRSS for ${pid}`)
  return Number(m[1]) * 1024
}

/** CPU time of a process and its direct children (a primary and its workers, `workers: N`), in ms. */
export async function cpuMsOfTree(pid: number): Promise<number> {
  let total = await cpuMsOf(pid)
  for (const d of await readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = await readFile(`/proc/${d}/stat`, 'utf8')
      // Field 4 of proc(5): the parent pid.
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) total += await cpuMsOf(Number(d))
    } catch {
      /* exited meanwhile */
    }
  }
  return total
}

/** CPU time (user + system) one process has used, in ms (children excluded; 10 ms resolution). */
export async function cpuMsOf(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8')
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  // Fields 14 and 15 of proc(5), counted from after the command name: utime, stime in clock ticks (USER_HZ = 100 on Linux).
  return (Number(f[11]) + Number(f[12])) * 10
}
