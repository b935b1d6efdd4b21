/**
 * Diagnostics an operator meets on the first day (issue 24 item 6), from the
 * outside: the real CLI in front of the development OpenID provider (an
 * Authentik-like oss_idp, whose issuer ends with a slash) configured with the
 * issuer written without its trailing slash, the classic mistake.
 */
import t from 'tap'
import { startDevIdp } from '../bin/dev-idp.ts'
import { spawnCli, waitForPort, freePort, configFile } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/gateway-harness.ts'

/** Resolves once `output()` matches `re`; rejects when the process exits first or after `ms`. */
function logged(run: ReturnType<typeof spawnCli>, re: RegExp, ms = 60_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`no log line matching ${re} within ${ms} ms:\n${run.output().slice(-3000)}`))
    }, ms)
    const check = (): void => {
      const m = re.exec(run.output())
      if (m !== null) {
        clearTimeout(timer)
        resolve(m[0])
      }
    }
    // The CLI's output arrives in chunks on its pipes: re-check on each one.
    run.child.stdout!.on('data', check)
    run.child.stderr!.on('data', check)
    void run.exited.then(() => {
      clearTimeout(timer)
      check()
      reject(new Error(`CLI exited:\n${run.output().slice(-3000)}`))
    })
    check()
  })
}

t.test(
  "an oss_idp issuer without its trailing slash: a start-up warning naming both issuers, and each 401 logs the token's issuer against the expected one",
  async t => {
    const idp = await startDevIdp()
    t.teardown(() => idp.close())
    t.match(idp.issuer, /\/$/, 'the development IdP issues with a trailing slash, like Authentik')
    const configured = idp.issuer.replace(/\/$/, '')
    const port = await freePort()
    const file = await configFile(
      [
        'mcp:',
        `  port: ${port}`,
        '  host: 127.0.0.1',
        '  policies:',
        '    mcpAuthentication:',
        '      mode: strict',
        `      issuer: ${configured}`,
        `      audiences: [${idp.clientId}]`,
        `      clientId: ${idp.clientId}`,
        '      provider: { oss_idp: {} }',
        `      resourceMetadata: { resource: "http://127.0.0.1:${port}/mcp" }`,
        '  targets:',
        '    - name: everything',
        `      stdio: { cmd: ${JSON.stringify(process.execPath)}, args: [${JSON.stringify(EVERYTHING)}, stdio] }`,
        'admin: { enabled: false }',
        'logging: { level: info, format: json }',
        '',
      ].join('\n')
    )
    const run = spawnCli(['-f', file])
    t.teardown(async () => {
      if (run.child.exitCode === null) {
        run.child.kill('SIGTERM')
        await run.exited
      }
    })
    await waitForPort(port, run.exited)

    const warning = await logged(run, /"level":"warn"[^\n]*discovery document names issuer[^\n]*/)
    t.match(warning, `"configured":${JSON.stringify(configured)}`)
    t.match(warning, `"discovered":${JSON.stringify(idp.issuer)}`)
    t.match(warning, '"path":"mcp.policies.mcpAuthentication.issuer"')

    const token = await idp.mintToken({ sub: 'alice' })
    const res = await fetch(`http://127.0.0.1:${port}/mcp`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    t.equal(res.status, 401)
    const body = await res.text()
    t.notMatch(body, idp.issuer, 'the response does not echo issuers (the log line does)')
    const line = await logged(run, /"msg":"request"[^\n]*"status":401[^\n]*|"status":401[^\n]*"msg":"request"[^\n]*/)
    t.match(line, `token issuer not accepted (token iss \\"${idp.issuer}\\", expected \\"${configured}\\")`)
    t.notMatch(run.output(), token, 'the token itself is never logged')
  }
)
