/**
 * Three gateway replicas (real CLI processes) behind nginx round-robin with
 * no affinity, Redis beside them, the dev IdP in front (one client of each
 * SDK runs the full OAuth flow through the balancer, the others hold minted
 * tokens). SDK 1.x clients
 * (sessions, GET stream, tool calls) and SDK 2.x clients (2026-07-28) all
 * succeed while their requests spread over the replicas; the per-subject
 * session cap holds across replicas; one replica killed mid-run: the clients
 * whose sessions it held get 404 and initialize again, every other client
 * goes on without an error.
 */
import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { connect } from 'node:net'
import { mkdtemp, writeFile, rm } from 'node:fs/promises'
import { existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Client as Client1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as Transport1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { UnauthorizedError as Unauthorized1, type OAuthClientProvider as Provider1 } from '@modelcontextprotocol/sdk/client/auth.js'
import { Client as Client2, StreamableHTTPClientTransport as Transport2, UnauthorizedError as Unauthorized2, type OAuthClientProvider as Provider2 } from '@modelcontextprotocol/client'
import { startDevIdp } from '../bin/dev-idp.ts'
import { CLI, ROOT, freePort } from './helpers/cli.ts'
import { FAULTY } from './helpers/gateway-harness.ts'
import { startRedis } from './helpers/redis.ts'
import { HeadlessProvider } from './helpers/oauth-client.ts'

const SECRET = 'multi-replica-cluster-secret-0123456789'
const MODERN = '2026-07-28'
const CAP = 3

function accepts (port: number): Promise<boolean> {
  return new Promise(resolve => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => { s.destroy(); resolve(true) })
    s.once('error', () => resolve(false))
  })
}

interface Replica { child: ChildProcess; port: number; adminPort: number; probePort: number; output: () => string }

async function startReplica (t: Test, dir: string, i: number, publicUrl: string, idp: { issuer: string; clientId: string }, redisUrl: string): Promise<Replica> {
  const [port, adminPort, probePort] = await Promise.all([freePort(), freePort(), freePort()])
  const file = join(dir, `replica-${i}.yaml`)
  await writeFile(file, [
    'mcp:',
    '  host: 127.0.0.1',
    `  port: ${port}`,
    '  targets:',
    `    - { name: faulty, stdio: { cmd: "${process.execPath}", args: ["${FAULTY}"] } }`,
    `  session: { maxSessionsPerSubject: ${CAP} }`,
    '  policies:',
    '    mcpAuthentication:',
    '      mode: strict',
    `      issuer: "${idp.issuer}"`,
    `      audiences: ["${idp.clientId}"]`,
    '      provider: { oss_idp: {} }',
    `      clientId: "${idp.clientId}"`,
    `      resourceMetadata: { resource: "${publicUrl}", scopesSupported: [openid, profile] }`,
    `admin: { host: 127.0.0.1, port: ${adminPort} }`,
    `probes: { host: 127.0.0.1, port: ${probePort} }`,
    'cluster:',
    `  secret: ${SECRET}`,
    `  advertiseUrl: "http://127.0.0.1:${port}"`,
    `  redis: { url: "${redisUrl}", keyPrefix: "mr:" }`,
    'logging: { level: debug }', '',
  ].join('\n'))
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, '-f', file], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout!.on('data', d => { out += d })
  child.stderr!.on('data', d => { out += d })
  const exited = new Promise<void>(resolve => child.once('exit', () => resolve()))
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    await exited
  })
  return { child, port, adminPort, probePort, output: () => out }
}

async function untilReady (r: Replica): Promise<void> {
  // Guard only: a tsx child starts in seconds; the probes answer from the first accepted connection.
  for (let i = 0; i < 600; i++) {
    if (r.child.exitCode !== null) throw new Error(`replica exited ${r.child.exitCode}:\n${r.output()}`)
    if (await accepts(r.probePort)) {
      const res = await fetch(`http://127.0.0.1:${r.probePort}/readyz`)
      await res.text()
      if (res.status === 200) return
    }
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  throw new Error(`replica never ready:\n${r.output()}`)
}

async function startNginx (t: Test, dir: string, port: number, upstreams: number[]): Promise<void> {
  const conf = join(dir, 'nginx.conf')
  await writeFile(conf, `
daemon off;
master_process off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 512; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream gateways {
${upstreams.map(p => `    server 127.0.0.1:${p};`).join('\n')}
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://gateways;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 120s;
    }
  }
}
`)
  // Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
  const nginx = existsSync('/usr/sbin/nginx') ? '/usr/sbin/nginx' : 'nginx'
  const child = spawn(nginx, ['-p', dir, '-c', conf, '-e', join(dir, 'error.log')], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stderr!.on('data', d => { out += d })
  const exited = new Promise<void>(resolve => child.once('exit', () => resolve()))
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    await exited
  })
  for (let i = 0; i < 500 && !(await accepts(port)); i++) {
    if (child.exitCode !== null) throw new Error(`nginx exited: ${out}`)
    await new Promise(resolve => setTimeout(resolve, 10))
  }
}

function textOf (result: unknown): string {
  return ((result as { content: Array<{ text?: string }> }).content).map(c => c.text ?? '').join('')
}

async function requestsServed (r: Replica): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${r.probePort}/metrics`)
  const body = await res.text()
  let n = 0
  for (const line of body.split('\n')) if (line.startsWith('mcp_proxy_requests_total{')) n += Number(line.slice(line.lastIndexOf(' ') + 1))
  return n
}

async function sessionHandles (r: Replica): Promise<string[]> {
  const res = await fetch(`http://127.0.0.1:${r.adminPort}/api/sessions`)
  return (await res.json() as Array<{ id: string }>).map(s => s.id)
}

t.test('three replicas behind nginx round-robin, Redis, the dev IdP: SDK 1.x and 2.x clients, a cap across replicas, a replica killed', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-replicas-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const redis = await startRedis(t)
  const idp = await startDevIdp()
  t.teardown(() => idp.close())
  const nginxPort = await freePort()
  const publicUrl = `http://127.0.0.1:${nginxPort}/mcp`
  const replicas = await Promise.all([0, 1, 2].map(i => startReplica(t, dir, i, publicUrl, idp, redis.url)))
  await Promise.all(replicas.map(untilReady))
  // nginx takes the port picked above: the gateways' resource URL names it.
  await startNginx(t, dir, nginxPort, replicas.map(r => r.port))
  const url = new URL(publicUrl)
  const token = (sub: string): Promise<string> => idp.mintToken({ sub, groups: ['mcp-users'] })

  // The per-subject cap holds across replicas: 5 initializes spread round-robin, 3 slots.
  const capped = await token('capped-user')
  const statuses: number[] = []
  const cappedSessions: string[] = []
  for (let i = 0; i < 5; i++) {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${capped}` },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'cap', version: '1' } } }),
    })
    await res.text()
    statuses.push(res.status)
    if (res.status === 200) cappedSessions.push(res.headers.get('mcp-session-id')!)
  }
  t.same(statuses, [200, 200, 200, 429, 429], `${CAP} sessions for one subject across three replicas, then 429`)
  const owners = await Promise.all(replicas.map(sessionHandles))
  t.ok(owners.filter(h => h.length > 0).length >= 2, 'the capped sessions live on different replicas')

  // SDK 1.x clients: sessions with their GET stream, tool calls through any replica.
  const legacy: Array<{ client: Client1; transport: Transport1; sub: string; provider?: HeadlessProvider }> = []
  for (const sub of ['u1', 'u2', 'u3', 'u4']) {
    const transport = new Transport1(url, { requestInit: { headers: { authorization: `Bearer ${await token(sub)}` } } })
    const client = new Client1({ name: `sdk1-${sub}`, version: '1.0.0' })
    t.teardown(() => client.close().catch(() => {}))
    await client.connect(transport)
    legacy.push({ client, transport, sub })
    // A connect is three requests (initialize, initialized, GET): one more so the next
    // initialize lands on another replica and the sessions spread.
    await (await fetch(new URL('/.well-known/oauth-protected-resource/mcp', url))).text()
  }
  // The full OAuth flow through the balancer: metadata, registration, authorization code + PKCE at the dev IdP.
  {
    const provider = new HeadlessProvider()
    const first = await new Client1({ name: 'sdk1-oauth', version: '1.0.0' }).connect(new Transport1(url, { authProvider: provider as unknown as Provider1 })).then(() => undefined, (e: unknown) => e)
    t.ok(first instanceof Unauthorized1, 'sdk1: the first connect asks for authorization')
    const transport = new Transport1(url, { authProvider: provider as unknown as Provider1 })
    await transport.finishAuth(provider.code())
    const client = new Client1({ name: 'sdk1-oauth', version: '1.0.0' })
    t.teardown(() => client.close().catch(() => {}))
    await client.connect(transport)
    legacy.push({ client, transport, sub: 'alice (OAuth)', provider })
    await (await fetch(new URL('/.well-known/oauth-protected-resource/mcp', url))).text()
  }
  const modern: Client2[] = []
  {
    const provider = new HeadlessProvider()
    const first = await new Client2({ name: 'sdk2-oauth', version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } }).connect(new Transport2(url, { authProvider: provider as unknown as Provider2 })).then(() => undefined, (e: unknown) => e)
    t.ok(first instanceof Unauthorized2, 'sdk2: the first connect asks for authorization')
    const transport = new Transport2(url, { authProvider: provider as unknown as Provider2 })
    await transport.finishAuth(provider.callback!.searchParams)
    const client = new Client2({ name: 'sdk2-oauth', version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
    t.teardown(() => client.close().catch(() => {}))
    await client.connect(transport)
    modern.push(client)
  }
  for (const sub of ['m1', 'm2']) {
    const client = new Client2({ name: `sdk2-${sub}`, version: '2.0.0' }, { versionNegotiation: { mode: { pin: MODERN } } })
    t.teardown(() => client.close().catch(() => {}))
    await client.connect(new Transport2(url, { requestInit: { headers: { authorization: `Bearer ${await token(sub)}` } } }))
    modern.push(client)
  }
  const round = async (tag: string): Promise<void> => {
    await Promise.all([
      ...legacy.map(async ({ client, sub }) => {
        const { tools } = await client.listTools()
        t.ok(tools.some(x => x.name === 'echo'), `${tag}: ${sub} lists tools`)
        for (let i = 0; i < 3; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `${sub}-${i}` } })), `${sub}-${i}`)
      }),
      ...modern.map(async (client, n) => {
        const { tools } = await client.listTools()
        t.ok(tools.some(x => x.name === 'echo'), `${tag}: sdk2 client ${n} lists tools`)
        t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `m${n}` } })), `m${n}`)
      }),
    ])
  }
  await round('before')
  const served = await Promise.all(replicas.map(requestsServed))
  t.ok(served.every(n => n > 5), `every replica served requests (${served.join(', ')})`)
  t.ok(replicas.some(r => r.output().includes('forwarded to the session owner')), 'requests reached sessions on other replicas')
  for (const { transport, sub } of legacy) t.ok(transport.sessionId, `${sub} has a session`)

  // Kill the replica that holds u1's session (a crash: SIGKILL, no drain).
  const handles = await Promise.all(replicas.map(sessionHandles))
  const victim = handles.findIndex(h => h.includes(legacy[0]!.transport.sessionId!.slice(0, 8)))
  t.ok(victim >= 0, 'u1\'s session has an owner')
  t.ok(handles.filter((h, i) => i !== victim && legacy.some(l => h.includes(l.transport.sessionId!.slice(0, 8)))).length > 0, 'other replicas hold sessions too')
  const lost = new Set(legacy.filter(l => handles[victim]!.includes(l.transport.sessionId!.slice(0, 8))).map(l => l.sub))
  const dead = replicas[victim]!
  const died = new Promise(resolve => dead.child.once('exit', resolve))
  dead.child.kill('SIGKILL')
  await died

  const failed = new Set<string>()
  await Promise.all(legacy.map(async (l, i) => {
    try {
      t.equal(textOf(await l.client.callTool({ name: 'echo', arguments: { message: `after-${l.sub}` } })), `after-${l.sub}`)
    } catch (err) {
      failed.add(l.sub)
      t.equal((err as { code?: number }).code, 404, `${l.sub}: its session is gone (404)`)
      // As the spec asks of a client that gets 404: a new session.
      await l.client.close().catch(() => {})
      const transport = l.provider !== undefined
        ? new Transport1(url, { authProvider: l.provider as unknown as Provider1 })
        : new Transport1(url, { requestInit: { headers: { authorization: `Bearer ${await token(l.sub)}` } } })
      const client = new Client1({ name: `sdk1-${l.sub}-again`, version: '1.0.0' })
      t.teardown(() => client.close().catch(() => {}))
      await client.connect(transport)
      legacy[i] = { ...l, client, transport }
      t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `again-${l.sub}` } })), `again-${l.sub}`, `${l.sub} re-initialized`)
    }
  }))
  t.same([...failed].sort(), [...lost].sort(), 'exactly the clients whose sessions the killed replica held saw 404')
  await round('after')
})
