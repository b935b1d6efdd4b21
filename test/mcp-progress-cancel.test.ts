/**
 * What a client sees after its request is over, and what the server sees when
 * the client cancels (MCP 2025-11-25 utilities: progress, cancellation), on
 * every path of the session era: a child per session, a child shared per
 * subject (stdio.share), an HTTP target. Real SDK clients, the gateway on a
 * real socket, test/fixtures/late-server.mjs as the racing server (progress
 * after its answer, and after a cancellation).
 *
 * - Progress for a request that was answered or cancelled is dropped: the SDK
 *   client reports "unknown token" for it otherwise.
 * - `notifications/cancelled` reaches the server with the client's reason,
 *   under the server's own id for the request.
 */
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import type { TargetConfig } from '../core/config.ts'
import { ROOT, startGateway, until, type GatewayHarness } from './helpers/gateway-harness.ts'

const FIXTURE = join(ROOT, 'test/fixtures/late-server.mjs')

/** The fixture in its HTTP mode, stopped in teardown. */
async function httpFixture(t: Test): Promise<string> {
  const child = spawn(process.execPath, [FIXTURE, 'http'], { env: { PORT: '0' }, stdio: ['ignore', 'ignore', 'pipe'] })
  t.teardown(() => {
    child.kill('SIGKILL')
  })
  const port = await new Promise<string>((resolve, reject) => {
    let err = ''
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d
      const m = /listening on port (\d+)/.exec(err)
      if (m !== null) resolve(m[1]!)
    })
    child.once('exit', () => reject(new Error(`late-server http did not start: ${err}`)))
  })
  return `http://127.0.0.1:${port}/mcp`
}

const paths: Record<string, (t: Test) => Promise<TargetConfig>> = {
  'a child per session': async () => ({ name: 'late', stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {} } }),
  'a child shared per subject': async () => ({
    name: 'late',
    stdio: { cmd: process.execPath, args: [FIXTURE, 'stdio'], env: {}, share: 'subject', processesPerSubject: 1 },
  }),
  'an HTTP target': async t => ({ name: 'late', mcp: { url: await httpFixture(t), headers: {} } }),
}

interface Connected {
  client: Client
  errors: Error[]
  barriers: () => number
}

async function connect(t: Test, gw: GatewayHarness): Promise<Connected> {
  const client = new Client({ name: 'progress-cancel', version: '1.0.0' })
  const errors: Error[] = []
  let barriers = 0
  client.onerror = err => {
    errors.push(err)
  }
  // The fixture's barrier (see late-server.mjs): written right after its late progress.
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    barriers++
  })
  await client.connect(new StreamableHTTPClientTransport(new URL(gw.url)))
  t.teardown(() => client.close())
  return { client, errors, barriers: () => barriers }
}

function textOf(result: unknown): string {
  return (result as { content: Array<{ text?: string }> }).content[0]!.text ?? ''
}

const unknownToken = (errors: Error[]): Error[] => errors.filter(e => /unknown token/i.test(e.message))

/**
 * Waits for the fixture's barrier: it follows the late progress on the same ordered path (the
 * upstream's channel, the session's GET stream), so once the client has it, the late progress
 * either reached the client before it or was dropped by the gateway.
 */
async function settled(t: Test, c: Connected): Promise<void> {
  t.ok(await until(() => c.barriers() > 0, 400, 25), "the fixture's barrier after the late progress reached the client")
}

for (const [path, target] of Object.entries(paths)) {
  // Over HTTP a request's stream is read until its answer only: nothing after the answer arrives.
  if (path !== 'an HTTP target') {
    t.test(`${path}: progress after the answer is dropped`, async t => {
      const gw = await startGateway(t, { targets: [await target(t)] })
      const c = await connect(t, gw)
      const { client, errors } = c
      const seen: number[] = []
      const r = await client.callTool({ name: 'late-progress', arguments: {} }, undefined, {
        onprogress: p => {
          seen.push(p.progress)
        },
      })
      t.equal(textOf(r), 'done')
      t.same(seen, [1], 'the progress before the answer reached the caller')
      // The fixture writes the late progress before it answers this.
      t.equal(textOf(await client.callTool({ name: 'cancellations', arguments: {} })), '[]')
      await settled(t, c)
      t.same(unknownToken(errors), [], 'the client was sent no progress for a request it no longer has')
    })
  }

  t.test(`${path}: a cancellation reaches the server with the client's reason; progress after it is dropped`, async t => {
    const gw = await startGateway(t, { targets: [await target(t)] })
    const c = await connect(t, gw)
    const { client, errors } = c
    const ac = new AbortController()
    const seen: number[] = []
    const call = client.callTool({ name: 'until-cancelled', arguments: {} }, undefined, {
      signal: ac.signal,
      onprogress: p => {
        seen.push(p.progress)
        if (seen.length === 2) ac.abort('user pressed stop')
      },
    })
    await t.rejects(call, /user pressed stop/, 'the caller gave up')
    let received: Array<{ requestId: unknown; reason?: unknown }> = []
    // The fixture writes one more progress as soon as the cancellation arrives, before it answers this.
    t.ok(
      await until(
        async () => {
          received = JSON.parse(textOf(await client.callTool({ name: 'cancellations', arguments: {} }))) as typeof received
          return received.length > 0
        },
        100,
        20
      ),
      'the server got a cancellation'
    )
    t.equal(received.length, 1)
    t.same(received[0]!.reason, 'user pressed stop', "the client's reason, not the gateway's")
    t.type(received[0]!.requestId, 'number', 'under the id the server knows the request by')
    await settled(t, c)
    t.same(unknownToken(errors), [], 'the client was sent no progress for the request it cancelled')
  })
}

for (const [path, target] of Object.entries(paths)) {
  t.test(`${path}: a cancellation without a reason reaches the server without one`, async t => {
    const gw = await startGateway(t, { targets: [await target(t)] })
    const client = new Client({ name: 'progress-cancel', version: '1.0.0' })
    const transport = new StreamableHTTPClientTransport(new URL(gw.url))
    // The id the SDK gives the call: the cancellation names it.
    let callId: unknown
    const send = transport.send.bind(transport)
    transport.send = (m, o) => {
      if ('method' in m && m.method === 'tools/call' && 'id' in m && callId === undefined) callId = m.id
      return send(m, o)
    }
    await client.connect(transport)
    t.teardown(() => client.close())
    const seen: number[] = []
    // Never answered: the gateway drops the call once cancelled, and the client's close ends it.
    client
      .callTool({ name: 'until-cancelled', arguments: {} }, undefined, {
        onprogress: p => {
          seen.push(p.progress)
        },
      })
      .catch(() => {})
    t.ok(await until(() => seen.length > 0), 'the call runs')
    await client.notification({ method: 'notifications/cancelled', params: { requestId: callId as string } })
    let received: Array<{ requestId: unknown; reason?: unknown }> = []
    t.ok(
      await until(
        async () => {
          received = JSON.parse(textOf(await client.callTool({ name: 'cancellations', arguments: {} }))) as typeof received
          return received.length > 0
        },
        100,
        20
      ),
      'the server got a cancellation'
    )
    t.equal(received.length, 1)
    t.same(Object.keys(received[0]!), ['requestId'], 'no reason: the client gave none')
  })
}
