/**
 * The conformance fixture (test/fixtures/conformance-server.mjs, both eras, HTTP and stdio) as a
 * target, and one raw 2026-07-28 POST with the revision's headers: what the native-forwarding
 * tests (mcp-modern-native, mcp-modern-tasks) talk to the gateway with.
 */
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import type { TargetConfig } from '../../core/config.ts'
import { ROOT } from './gateway-harness.ts'

export const MODERN = '2026-07-28'
export const META = {
  'io.modelcontextprotocol/protocolVersion': MODERN,
  'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' },
}
export const FIXTURE = join(ROOT, 'test/fixtures/conformance-server.mjs')

/** The fixture over HTTP on a free port; its URL once it listens. */
export async function fixtureHttp(t: Test): Promise<string> {
  const child = spawn(process.execPath, [FIXTURE, 'http'], { env: { ...process.env, PORT: '0', NODE_OPTIONS: '' }, stdio: ['ignore', 'ignore', 'pipe'] })
  t.teardown(() => {
    child.kill('SIGKILL')
  })
  const port = await new Promise<string>((resolve, reject) => {
    let err = ''
    child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      err += d
      const m = /listening on port (\d+)/.exec(err)
      if (m !== null) resolve(m[1]!)
    })
    child.once('exit', () => reject(new Error('fixture exited: ' + err)))
  })
  return `http://127.0.0.1:${port}/mcp`
}

export const fixtureStdio = (): TargetConfig => ({ name: 'fixture', stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {} } })

export interface Answer {
  status: number
  json: any
  frames: any[]
}

/** One 2026-07-28 POST with the revision's headers (`fetcher`: freshFetch spreads them over workers); SSE answers are read frame by frame. */
export async function call(
  url: string,
  method: string,
  params: Record<string, unknown>,
  caps: Record<string, unknown> = {},
  extra: Record<string, string> = {},
  fetcher: typeof fetch = fetch
): Promise<Answer> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-protocol-version': MODERN,
    'mcp-method': method,
    ...extra,
  }
  const name = params.name ?? params.uri ?? params.taskId
  if (typeof name === 'string' && extra['mcp-name'] === undefined) headers['mcp-name'] = name
  const body = {
    jsonrpc: '2.0',
    id: 7,
    method,
    params: { ...params, _meta: { ...META, 'io.modelcontextprotocol/clientCapabilities': caps, ...((params._meta as object) ?? {}) } },
  }
  const res = await fetcher(url, { method: 'POST', headers, body: JSON.stringify(body) })
  const text = await res.text()
  const frames = (res.headers.get('content-type') ?? '').startsWith('application/json')
    ? [JSON.parse(text)]
    : text
        .split('\n')
        .filter(l => l.startsWith('data: '))
        .map(l => JSON.parse(l.slice(6)))
  return { status: res.status, json: frames.at(-1), frames }
}
