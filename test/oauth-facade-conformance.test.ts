/**
 * The official conformance suite's authorization-server checks against the
 * facade (`conformance authorization --url {base_url}/mcp`, the copy in node_modules pinned exactly; the
 * `authorization` command exists from the 0.2 line): the metadata endpoint
 * scenario, and the authorization-code grant, whose login the suite leaves to
 * a browser: the test follows the printed URL (IdP login, consent) to the
 * suite's own callback.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from './helpers/cli.ts'
import { ROOT } from './helpers/gateway-harness.ts'
import { ossSetup, Agent, FACADE_KEY } from './helpers/facade.ts'
import { resolveSuite } from './helpers/conformance-suite.ts'

function env(): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, NO_COLOR: '1', npm_config_update_notifier: 'false' }
}

t.test('conformance authorization: metadata endpoint and authorization code grant pass against the facade', async t => {
  const suite = await resolveSuite()
  const { g } = await ossSetup(t, {
    keys: [FACADE_KEY],
    clients: [{ clientId: 'conformance-client', clientName: 'MCP conformance suite', redirectUris: ['http://127.0.0.1/callback'] }],
  })
  const port = await freePort()
  const outDir = await mkdtemp(join(tmpdir(), 'facade-conformance-'))
  t.teardown(() => rm(outDir, { recursive: true, force: true }))
  const child = spawn(
    suite.node,
    [suite.bin, 'authorization', '--url', `${g.base}/mcp`, '--client-id', 'conformance-client', '-p', String(port), '-o', outDir],
    {
      cwd: ROOT,
      env: env(),
      stdio: ['ignore', 'pipe', 'pipe'],
    }
  )
  const guard = setTimeout(() => child.kill('SIGKILL'), 120_000)
  t.teardown(() => {
    clearTimeout(guard)
    if (child.exitCode === null) child.kill('SIGKILL')
  })
  let output = ''
  let browsed: Promise<void> | undefined
  const agent = new Agent()
  const onData = (d: string): void => {
    output += d
    const m = new RegExp(`^(${g.base.replace(/[.]/g, '\\.')}/oauth/authorize\\?\\S+)$`, 'm').exec(output)
    if (m !== null && browsed === undefined) {
      // The "browser": IdP login, consent, then the suite's callback.
      browsed = agent.follow(m[1]!, `http://127.0.0.1:${port}/callback`).then(async cb => {
        await fetch(cb)
      })
    }
  }
  child.stdout.setEncoding('utf8').on('data', onData)
  child.stderr.setEncoding('utf8').on('data', onData)
  const code = await new Promise<number | null>(resolve => child.once('close', resolve))
  t.ok(browsed !== undefined, 'the suite printed the authorization URL')
  await browsed
  t.equal(agent.consentPages, 1, 'consent was asked')
  const results = new Map<string, Array<{ id: string; status: string; errorMessage?: string }>>()
  for (const dir of await readdir(outDir, { recursive: true })) {
    if (!String(dir).endsWith('checks.json')) continue
    const checks = JSON.parse(await readFile(join(outDir, String(dir)), 'utf8')) as Array<{ id: string; status: string; errorMessage?: string }>
    for (const c of checks) results.set(c.id, [...(results.get(c.id) ?? []), c])
  }
  for (const id of ['authorization-server-metadata', 'authorization-code-grant']) {
    const checks = [...results.entries()].filter(([k]) => k.startsWith(id)).flatMap(([, v]) => v)
    t.ok(checks.length > 0, `${id}: checks ran`)
    t.same(
      checks.filter(c => c.status === 'FAILURE'),
      [],
      `${id}: no failure`
    )
  }
  if (code !== 0) t.comment(output.slice(-3000))
  t.equal(code, 0, 'the suite exits 0')
})
