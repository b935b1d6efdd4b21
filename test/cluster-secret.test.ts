/**
 * cluster.secret seals every session id across replicas: a placeholder copied
 * from a manifest or the docs (it passes the 32-character minimum) would be a
 * key every reader of that file holds. The real CLI refuses such values at
 * start-up, naming the path and never echoing the value (the loader's check for
 * each value, the real CLI for one); a generated secret passes.
 */
import t from 'tap'
import { randomBytes } from 'node:crypto'
import { runCli, configFile } from './helpers/cli.ts'
import { validateConfig } from '../core/config.ts'
import type { ProxyError } from '../core/errors.ts'

const config = (): Promise<string> =>
  configFile(
    [
      'mcp:',
      '  port: 0',
      '  targets:',
      '    - name: a',
      '      stdio: { cmd: node }',
      'cluster:',
      '  secret: "${CLUSTER_SECRET}"',
      '  advertiseUrl: "http://10.0.0.7:3000"',
      '',
    ].join('\n')
  )

/** The same config as data, for the loader's own check without a process per value. */
const data = (secret: string): unknown => ({
  mcp: { port: 0, targets: [{ name: 'a', stdio: { cmd: 'node' } }] },
  cluster: { secret, advertiseUrl: 'http://10.0.0.7:3000' },
})

const refused = [
  // The placeholder the Kubernetes manifest shipped before (45 characters).
  'replace-me-with-at-least-32-random-characters',
  'change-me-change-me-change-me-change-me',
  'your-cluster-secret-of-32-characters-or-more',
  'x'.repeat(48),
  '01010101010101010101010101010101',
]

t.test('refused by the real CLI: the placeholder the manifest shipped, named by its path, never echoed', async t => {
  const secret = refused[0]!
  const r = await runCli(['-f', await config(), '--check'], { CLUSTER_SECRET: secret })
  t.equal(r.code, 1, 'exit 1: invalid configuration')
  t.match(r.stderr, /cluster\.secret: looks like a placeholder/)
  t.match(r.stderr, /openssl rand -base64 48/, 'says how to make one')
  t.notOk(r.stderr.includes(secret) || r.stdout.includes(secret), 'the value is not echoed')
})

for (const secret of refused) {
  t.test(`refused: a ${secret.length}-character placeholder or low-variety value`, async t => {
    const err = (await t.rejects(validateConfig(data(secret)))) as unknown as ProxyError
    t.match(err.message, /cluster\.secret: (looks like a placeholder|has fewer than 10 distinct characters)/)
    t.notOk(err.message.includes(secret), 'the value is not in the message')
  })
}

t.test('accepted: a generated secret', async t => {
  const secret = randomBytes(48).toString('base64')
  const r = await runCli(['-f', await config(), '--check'], { CLUSTER_SECRET: secret })
  t.equal(r.code, 0, r.stderr)
  t.notOk(r.stdout.includes(secret), 'not printed by --check')
})
