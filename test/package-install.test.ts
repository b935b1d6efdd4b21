/**
 * The published package and the container image's runtime layout, without a
 * Docker engine: `npm pack` -> deploy/install.sh (the script the Dockerfile
 * runs) into a clean folder with production dependencies only -> the
 * installed CLI run as `nobody` in a private mount namespace where the root
 * filesystem is read-only and HOME and TMPDIR are the only writable places
 * (a `--read-only` container with a tmpfs) -> --version, --check on every
 * shipped example; then the Dockerfile's own ENTRYPOINT and CMD (tini as PID 1
 * of a PID namespace) serving one real MCP exchange with a stdio target, its
 * HEALTHCHECK, and a clean stop when PID 1 gets SIGTERM (what `docker stop`
 * sends).
 *
 * Needs root (unshare, mount, setpriv) and tini, as CI has (.ci/run).
 */
import t from 'tap'
import { spawn, execFile, type ChildProcess } from 'node:child_process'
import { mkdtemp, mkdir, readdir, readFile, rm, writeFile, access, chmod, copyFile } from 'node:fs/promises'
import { promisify } from 'node:util'
import { tmpdir } from 'node:os'
import { join, relative } from 'node:path'
import { connect } from 'node:net'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ROOT, freePort, eventually } from './helpers/cli.ts'
import { EVERYTHING } from './helpers/gateway-harness.ts'

// npm pack builds dist/ with tsc (prepare, after prepack empties dist/): most of this file's run time, and
// slower still while the rest of the suite shares the two cores.
t.setTimeout(300_000)

const run = promisify(execFile)
const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as {
  version: string
  dependencies: Record<string, string>
  devDependencies: Record<string, string>
}

// Values for every ${NAME} the shipped examples reference; a new example with
// a new variable fails below until it is listed here.
const EXAMPLE_ENV: Record<string, string> = {
  AUTHENTIK_CLIENT_ID: 'client-1',
  TENANT_ID: 'tenant-1',
  CLIENT_ID: 'client-1',
  CLIENT_SECRET: 'secret-1',
  UPSTREAM_API_KEY: 'key-1',
  KEYCLOAK_CLIENT_ID: 'client-1',
  EXCHANGE_SECRET: 'secret-2',
  LEGACY_API_KEY: 'key-2',
  SEARCH_API_KEY: 'key-3',
  CRM_API_APP_ID: '00000000-0000-4000-8000-000000000001',
}

const work = await mkdtemp(join(tmpdir(), 'mcpp-pkg-'))
const app = join(work, 'app')
const home = join(work, 'home')
const scratch = join(work, 'tmp')
const etc = join(work, 'etc')
const bin = join(work, 'bin')
t.teardown(() => rm(work, { recursive: true, force: true }))

// Offline (issue 22 item 17: hermetic CI): the project's own `npm ci` (.ci/run's first step) has put
// every locked package in npm's cache, so the install reads the cache only: a package missing there
// fails the install instead of silently coming from the registry.
const npmEnv = { ...process.env, NPM_CONFIG_OFFLINE: 'true', NPM_CONFIG_UPDATE_NOTIFIER: 'false' }

interface Sandboxed {
  child: ChildProcess
  done: Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }>
}

/**
 * Runs `argv` as nobody:nogroup in its own mount namespace: `/` remounted
 * read-only (the install tree with it), fresh tmpfs on HOME and TMPDIR. Only
 * PATH, HOME, TMPDIR and `env` reach it (`env -i`: tap's NODE_OPTIONS, which
 * would make every node write its process info into the repository, stays out).
 * With `pid1`, also in a PID namespace of its own where `argv` runs as PID 1,
 * as a container's entrypoint does.
 */
function sandboxed(argv: string[], env: Record<string, string> = {}, pid1 = false): Sandboxed {
  const script =
    (pid1 ? 'mount -t proc proc /proc && ' : '') +
    'mount -o remount,bind,ro / && ' +
    'mount -t tmpfs -o mode=0700,uid=65534,gid=65534,size=64m tmpfs "$HOME" && ' +
    'mount -t tmpfs -o mode=1777,size=64m tmpfs "$TMPDIR" && ' +
    'exec "$@"'
  const vars = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home, TMPDIR: scratch, ...env }
  const child = spawn(
    'unshare',
    [
      '--mount',
      '--propagation',
      'private',
      ...(pid1 ? ['--pid', '--fork'] : []),
      '--',
      'sh',
      '-c',
      script,
      'sandbox',
      'env',
      '-i',
      ...Object.entries(vars).map(([k, v]) => `${k}=${v}`),
      'setpriv',
      '--reuid=nobody',
      '--regid=nogroup',
      '--clear-groups',
      '--no-new-privs',
      '--',
      ...argv,
    ],
    {
      env: { PATH: vars.PATH, HOME: home, TMPDIR: scratch },
      stdio: ['ignore', 'pipe', 'pipe'],
    }
  )
  let out = ''
  child.stdout!.on('data', d => {
    out += d
  })
  child.stderr!.on('data', d => {
    out += d
  })
  const done = new Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }>(resolve => {
    child.on('exit', (code, signal) => resolve({ code, signal, out }))
  })
  return { child, done }
}

async function sandboxedRun(argv: string[], env: Record<string, string> = {}, guardMs = 30000): Promise<{ code: number | null; out: string }> {
  const s = sandboxed(argv, env)
  const guard = setTimeout(() => s.child.kill('SIGKILL'), guardMs)
  const r = await s.done
  clearTimeout(guard)
  return r
}

const cli = join(app, 'dist/bin/mcp-proxy.js')
let tarball = ''

// What the image runs, with its paths mapped into this test's folders.
const dockerfile = await readFile(join(ROOT, 'Dockerfile'), 'utf8')
function execForm(instruction: string): string[] {
  const line = dockerfile.split('\n').find(l => l.startsWith(`${instruction} `)) ?? ''
  const argv = JSON.parse(line.slice(line.indexOf('['))) as string[]
  return argv.map(a => a.replace(/^\/opt\/mcp-proxy\//, `${app}/`).replace(/^\/etc\/mcp-proxy\//, `${etc}/`))
}

t.before(async () => {
  // mkdtemp makes the folder 0700; nobody must be able to reach the install inside it.
  await chmod(work, 0o755)
  await Promise.all([app, home, scratch, etc, bin].map(d => mkdir(d, { recursive: true })))
  await copyFile(join(ROOT, 'deploy/healthcheck.mjs'), join(bin, 'mcp-proxy-healthcheck'))
  await chmod(join(bin, 'mcp-proxy-healthcheck'), 0o755)
  await run('npm', ['pack', '--pack-destination', work], { cwd: ROOT, env: npmEnv, maxBuffer: 16 * 1024 * 1024 })
  const tgz = (await readdir(work)).filter(f => f.endsWith('.tgz'))
  if (tgz.length !== 1) throw new Error(`npm pack made ${tgz.length} tarballs`)
  tarball = join(work, tgz[0]!)
  await run('sh', [join(ROOT, 'deploy/install.sh'), tarball, app, join(ROOT, 'package-lock.json')], { env: npmEnv, maxBuffer: 16 * 1024 * 1024 })
})

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true })
  return entries.filter(e => e.isFile()).map(e => relative(dir, join(e.parentPath, e.name)))
}

t.test('the tarball ships the licence, the examples, and no dev-only script', async t => {
  const listed = (await run('tar', ['-tzf', tarball])).stdout
    .split('\n')
    .filter(Boolean)
    .map(p => p.replace(/^package\//, ''))
  t.ok(listed.includes('LICENSE'), 'LICENSE is shipped')
  const license = await readFile(join(app, 'LICENSE'), 'utf8').catch(() => '')
  t.match(license, /Apache License\s+Version 2\.0, January 2004/)
  t.match(license, /TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION/)
  t.match(license, /END OF TERMS AND CONDITIONS/)
  for (const f of [
    'examples/oss-idp.yaml',
    'examples/cloud-idp.yaml',
    'examples/multi-target.yaml',
    'examples/http-target.yaml',
    'examples/plugins/rate-limit.js',
  ]) {
    t.ok(listed.includes(f), `${f} is shipped`)
  }
  t.same(
    listed.filter(f => /^dist\/bin\/(demo|dev-idp)[.-]/.test(f) || f.startsWith('examples/demo/')),
    [],
    'the demo and the development IdP stay in the repository'
  )
  t.same(
    listed.filter(f => /^(test|bench|deploy|\.ci)\//.test(f)),
    [],
    'no tests, benchmarks or CI files'
  )
  const installed = JSON.parse(await readFile(join(app, 'package.json'), 'utf8')) as { scripts?: Record<string, string>; bin: Record<string, string> }
  // npm warns consumers about (and may refuse) packages with these scripts.
  // `prepare` builds dist/ so that `npm ci` in a clone leaves a runnable gateway.
  // npm lists it among a tarball's install scripts (allowScripts): in an installed
  // package, which ships no tsconfig.build.json, it does nothing and succeeds.
  t.same(
    Object.keys(installed.scripts ?? {}).filter(s => ['preinstall', 'install', 'postinstall'].includes(s)),
    [],
    'no install-time script'
  )
  if (installed.scripts?.prepare !== undefined) {
    const before = await readFile(join(app, 'dist/bin/mcp-proxy.js'), 'utf8')
    await run('sh', ['-c', installed.scripts.prepare], { cwd: app, env: npmEnv })
    t.equal(await readFile(join(app, 'dist/bin/mcp-proxy.js'), 'utf8'), before, 'prepare is a no-op in an installed package')
  }
  t.same(installed.bin, { 'mcp-proxy': 'dist/bin/mcp-proxy.js', 'mcp-idp-gateway': 'dist/bin/mcp-proxy.js' })
})

t.test('deploy/install.sh refuses bad arguments with a clear message', async t => {
  const install = (...args: string[]): Promise<{ code: number; stderr: string }> =>
    run('sh', [join(ROOT, 'deploy/install.sh'), ...args], { env: npmEnv }).then(
      () => ({ code: 0, stderr: '' }),
      (e: { code: number; stderr: string }) => ({ code: e.code, stderr: e.stderr })
    )
  t.match(await install(), { code: 2, stderr: /usage: .*install\.sh <package\.tgz> <dir> \[package-lock\.json\]/ })
  t.match(await install(join(work, 'missing.tgz'), join(work, 'x')), { code: 2, stderr: /tarball not found: .*missing\.tgz/ })
  t.match(await install(tarball, join(work, 'y'), join(work, 'missing-lock.json')), { code: 2, stderr: /lockfile not found/ })
  t.match(await install(tarball, app), { code: 2, stderr: /is not empty/ }, 'never installs over an existing tree')
})

t.test('every shipped source map carries the source it maps to', async t => {
  const maps = (await filesUnder(join(app, 'dist'))).filter(f => f.endsWith('.map'))
  t.ok(maps.length > 10, `${maps.length} source maps`)
  const bad: string[] = []
  for (const f of maps) {
    const map = JSON.parse(await readFile(join(app, 'dist', f), 'utf8')) as { sources: string[]; sourcesContent?: (string | null)[] }
    const ok = map.sourcesContent?.length === map.sources.length && map.sourcesContent.every(s => typeof s === 'string' && s.length > 0)
    if (!ok) bad.push(f)
  }
  t.same(bad, [], 'no map without sourcesContent')
})

t.test('the install holds production dependencies only', async t => {
  const present = async (name: string): Promise<boolean> =>
    access(join(app, 'node_modules', name, 'package.json')).then(
      () => true,
      () => false
    )
  for (const dep of Object.keys(pkg.dependencies)) t.ok(await present(dep), `${dep} installed`)
  const dev: string[] = []
  for (const dep of Object.keys(pkg.devDependencies)) if (await present(dep)) dev.push(dep)
  t.same(dev, [], 'no devDependency installed')
})

t.test('in a read-only tree as nobody: --version and a write attempt', async t => {
  const version = await sandboxedRun([process.execPath, cli, '--version'])
  t.equal(version.code, 0, version.out)
  t.equal(version.out.trim(), pkg.version)
  const write = await sandboxedRun(['sh', '-c', `touch "${app}/probe" || exit 7; exit 0`])
  t.equal(write.code, 7, 'the install tree is not writable')
  const writable = await sandboxedRun(['sh', '-c', 'touch "$HOME/probe" "$TMPDIR/probe"'])
  t.equal(writable.code, 0, `HOME and TMPDIR are writable: ${writable.out}`)
})

t.test('--check passes on every shipped example', async t => {
  const examples = (await filesUnder(join(app, 'examples'))).filter(f => f.endsWith('.yaml'))
  t.ok(examples.length >= 4, examples.join(', '))
  for (const f of examples) {
    const file = join(app, 'examples', f)
    const text = await readFile(file, 'utf8')
    // Installed, the package has no clone around it: nothing may point into one or download at run time.
    t.notMatch(text, /\bnpx\b|node_modules\/|["\s[,]-y\b|--yes\b/, `${f}: no npx, no -y download, no node_modules/ path`)
    const referenced = [...text.matchAll(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g)].map(m => m[1]!)
    t.same(
      referenced.filter(name => EXAMPLE_ENV[name] === undefined),
      [],
      `${f}: every variable it references has a test value`
    )
    const r = await sandboxedRun([process.execPath, cli, '-f', file, '--check'], EXAMPLE_ENV)
    t.equal(r.code, 0, `${f}: ${r.out}`)
    t.match(r.out, /^config OK: /m, f)
  }
})

const accepts = (port: number): Promise<boolean> =>
  new Promise(resolve => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.once('error', () => resolve(false))
  })

t.test('the image entrypoint (tini as PID 1) serves a real MCP call to a stdio target, answers the HEALTHCHECK, and stops on SIGTERM', async t => {
  const [port, adminPort] = [await freePort(), await freePort()]
  const config = join(etc, 'config.yaml')
  // server-everything is a devDependency: the test reaches it in the repository by path.
  await writeFile(
    config,
    [
      'mcp:',
      '  host: 127.0.0.1',
      `  port: ${port}`,
      '  targets:',
      '    - name: everything',
      '      stdio:',
      `        cmd: ${JSON.stringify(process.execPath)}`,
      `        args: [${JSON.stringify(EVERYTHING)}, stdio]`,
      'admin:',
      '  host: 127.0.0.1',
      `  port: ${adminPort}`,
      '',
    ].join('\n')
  )
  // ENTRYPOINT + CMD: tini -- node <app>/dist/bin/mcp-proxy.js -f <etc>/config.yaml
  const gw = sandboxed([...execForm('ENTRYPOINT'), ...execForm('CMD')], {}, true)
  let exited = false
  void gw.done.then(() => {
    exited = true
  })
  t.teardown(() => {
    if (!exited) gw.child.kill('SIGKILL')
  })
  // The namespace's PID 1 (tini) is unshare's child; `docker stop` signals it from outside.
  const init = await eventually(
    async () => {
      try {
        return Number((await run('ps', ['-o', 'pid=', '--ppid', String(gw.child.pid)])).stdout.trim())
      } catch {
        return 0
      }
    },
    pid => pid > 0 || exited,
    100,
    50
  )

  const up = await eventually(
    () => (exited ? false : accepts(port)),
    ok => ok || exited,
    300,
    50
  )
  t.ok(up, 'the MCP port accepts')
  if (!up) return t.fail((await gw.done).out)

  const client = new Client({ name: 'package-install-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`)))
  t.ok(client.getServerCapabilities()?.tools, 'the gateway offers tools')
  const echo = await client.callTool({ name: 'echo', arguments: { message: 'from a read-only install' } })
  t.same(echo.content, [{ type: 'text', text: 'Echo: from a read-only install' }])
  await client.close()

  // The image's HEALTHCHECK and the Kubernetes exec probes run this script,
  // installed as the Dockerfile does: without its extension, found on PATH.
  const probeEnv = { PATH: `${bin}:${process.env.PATH ?? '/usr/bin:/bin'}`, MCP_PROXY_ADMIN_URL: `http://127.0.0.1:${adminPort}` }
  const healthcheck = execForm('HEALTHCHECK')
  t.same(healthcheck, ['mcp-proxy-healthcheck', '/healthz'])
  for (const argv of [healthcheck, ['mcp-proxy-healthcheck', '/readyz']]) {
    const probe = await sandboxedRun(argv, probeEnv)
    t.equal(probe.code, 0, `${argv.join(' ')}: ${probe.out}`)
  }
  const down = await sandboxedRun(healthcheck, { ...probeEnv, MCP_PROXY_ADMIN_URL: `http://127.0.0.1:${await freePort()}` })
  t.equal(down.code, 1, 'the probe fails when nothing answers')
  t.match(down.out, /^\/healthz: /m, 'and says why')

  t.ok(init > 0, 'found the namespace init')
  process.kill(init, 'SIGTERM')
  const end = await gw.done
  t.equal(end.code, 0, `clean exit on SIGTERM through tini:\n${end.out}`)
  t.match(end.out, /"signal":"SIGTERM"[^\n]*shutting down/, 'the gateway itself got the signal')
  t.notMatch(end.out, /not running as PID 1/, 'tini ran as PID 1')
  t.notMatch(end.out, /EROFS|EACCES|read-only file system/i, 'nothing tried to write outside HOME and TMPDIR')
})

t.test('the Dockerfile installs through the same script and runs the same probe', async t => {
  t.match(dockerfile, /^COPY deploy\/install\.sh \/usr\/local\/bin\/mcp-proxy-install$/m)
  t.match(dockerfile, /^RUN sh \/usr\/local\/bin\/mcp-proxy-install \/pkg\/package\.tgz \/opt\/mcp-proxy \/pkg\/package-lock\.json$/m)
  t.match(dockerfile, /^COPY --chmod=0755 deploy\/healthcheck\.mjs \/usr\/local\/bin\/mcp-proxy-healthcheck$/m)
  t.match(dockerfile, /^HEALTHCHECK .*CMD \["mcp-proxy-healthcheck", "\/healthz"\]$/m)
  t.match(dockerfile, /^USER 1000:1000$/m, 'a numeric non-root user (runAsNonRoot can check it)')
  t.match(dockerfile, /^ENTRYPOINT \["\/usr\/bin\/tini", "--", "node", "\/opt\/mcp-proxy\/dist\/bin\/mcp-proxy\.js"\]$/m)
  t.match(dockerfile, /^CMD \["-f", "\/etc\/mcp-proxy\/config\.yaml"\]$/m)
  const ignore = (await readFile(join(ROOT, '.dockerignore'), 'utf8')).split('\n')
  for (const p of ['node_modules', 'dist', '.git']) t.ok(ignore.includes(p), `.dockerignore leaves out ${p}`)
})
