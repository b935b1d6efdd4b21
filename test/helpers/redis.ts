/**
 * A real redis-server (the Debian package) for one test: a free port on
 * 127.0.0.1, a temp dir, no persistence; killed and removed in teardown.
 */
import type { Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { connect } from 'node:net'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from './cli.ts'

export interface RedisServer {
  readonly url: string
  readonly port: number
  /** The running server process (a new one after restart()). */
  readonly child: ChildProcess
  /** Kills the server (SIGKILL) and resolves once it has exited. */
  kill(): Promise<void>
  /** Starts a fresh, empty server on the same port (after kill()); resolves once it accepts connections. */
  restart(): Promise<void>
}

function accepts(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.once('error', () => resolve(false))
  })
}

/**
 * `alsoBind`: another local address to listen on too (replicas in network namespaces reach it there); protected
 * mode, which only lets loopback clients in while no password is set, is off then: the address is a test bridge's.
 */
export async function startRedis(t: Test, alsoBind?: string): Promise<RedisServer> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-redis-'))
  const port = await freePort()
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    ...(alsoBind !== undefined ? [alsoBind] : []),
    '--save',
    '',
    '--appendonly',
    'no',
    '--dir',
    dir,
    '--protected-mode',
    alsoBind !== undefined ? 'no' : 'yes',
  ]
  let child: ChildProcess
  let exited: Promise<void>
  const kill = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    await exited
  }
  const run = async (): Promise<void> => {
    child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout!.on('data', d => {
      out += d
    })
    child.stderr!.on('data', d => {
      out += d
    })
    exited = new Promise<void>(resolve => child.once('exit', () => resolve()))
    // Bounded: redis-server is up in milliseconds.
    for (let i = 0; i < 500 && !(await accepts(port)); i++) {
      if (child.exitCode !== null) throw new Error(`redis-server exited: ${out}`)
      await new Promise(resolve => setTimeout(resolve, 10))
    }
    if (!(await accepts(port))) throw new Error(`redis-server did not accept connections on ${port}: ${out}`)
  }
  t.teardown(async () => {
    await kill()
    await rm(dir, { recursive: true, force: true })
  })
  await run()
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    get child() {
      return child
    },
    kill,
    restart: run,
  }
}
