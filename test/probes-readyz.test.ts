/**
 * Issue 22 item 12 (/readyz), through the real CLI: the probe listener needs
 * no token and sits on the pod network, so its /readyz says ready or not and
 * why as reason codes only; the details (the stdio command that is missing,
 * the identity provider's address) stay on the admin listener. Before: the
 * probe listener's /readyz named the command path and the IdP host.
 */
import t from 'tap'
import { configFile, eventually, freePort, spawnCli, waitForPort } from './helpers/cli.ts'

// Real CLI processes (and IdP logins): seconds each on a loaded machine, past the 120 s default.
t.setTimeout(300_000)

const MISSING = '/nonexistent/secret-tools/bin/mcp-server-payroll'

t.test('probe listener /readyz: reason codes only; the admin listener keeps the details', async t => {
  const [port, admin, probes, deadIdp] = await Promise.all([freePort(), freePort(), freePort(), freePort()])
  const idpHost = `127.0.0.1:${deadIdp}`
  const file = await configFile(
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  policies:',
      '    mcpAuthentication:',
      '      mode: strict',
      `      issuer: http://${idpHost}/application/o/payroll/`,
      '      audiences: [c1]',
      `      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp" }`,
      '      keySet: { timeoutMs: 500 }',
      '  readiness: { targets: all }',
      '  targets:',
      `    - { name: payroll, stdio: { cmd: ${JSON.stringify(MISSING)} } }`,
      `admin: { host: 127.0.0.1, port: ${admin} }`,
      `probes: { host: 127.0.0.1, port: ${probes}, shutdownDelayMs: 0 }`,
    ].join('\n'),
    'mcpp-readyz-'
  )
  const cli = spawnCli(['-f', file])
  t.teardown(async () => {
    if (cli.child.exitCode !== null || cli.child.signalCode !== null) return
    cli.child.kill('SIGTERM')
    const gone = await Promise.race([cli.exited.then(() => true), new Promise<false>(resolve => setTimeout(() => resolve(false), 20_000).unref())])
    if (!gone) cli.child.kill('SIGKILL')
  })
  await waitForPort(probes, cli.exited)

  const read = async (url: string): Promise<{ status: number; text: string }> => {
    const res = await fetch(url)
    return { status: res.status, text: await res.text() }
  }
  // Started, the key set fetch failed once and the target was checked: both reasons are there.
  const both = (text: string): boolean => text.includes('target_unavailable') && text.includes('idp_')
  const probe = await eventually(
    () => read(`http://127.0.0.1:${probes}/readyz`),
    r => both(r.text),
    200,
    100
  )
  t.equal(probe.status, 503)
  const body = JSON.parse(probe.text) as { status: string; reasons: string[] }
  t.same(body, { status: 'not ready', reasons: body.reasons }, 'status and reasons, nothing else')
  t.same([...body.reasons].sort(), ['idp_keys_unavailable', 'target_unavailable'], 'reason codes only')
  t.notMatch(probe.text, /nonexistent|payroll|secret-tools/, 'no command path, no target name')
  t.notMatch(probe.text, new RegExp(`127\\.0\\.0\\.1|${deadIdp}`), 'no IdP address')

  const detailed = await eventually(
    () => read(`http://127.0.0.1:${admin}/readyz`),
    r => r.text.includes('signing keys'),
    200,
    100
  )
  t.equal(detailed.status, 503)
  t.match(detailed.text, /target payroll: /, 'the admin listener names the target')
  t.match(detailed.text, /signing keys not loaded/, 'and why the keys are missing')
})
