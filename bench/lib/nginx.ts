/**
 * Debian nginx as a reverse proxy for the HTTP-target workload: generated
 * config in a temp dir, 127.0.0.1 only, one worker, no daemon, upstream
 * keep-alive and no buffering (so SSE answers stream through as they come).
 */
import { execFile } from 'node:child_process'
import { mkdtemp, writeFile, chmod, readFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { freePort, startService, type Service } from './procs.ts'

const run = promisify(execFile)

async function which(cmd: string): Promise<string | undefined> {
  for (const dir of ['/usr/sbin', '/usr/bin', '/usr/local/sbin', '/usr/local/bin']) {
    try {
      await run('test', ['-x', join(dir, cmd)])
      return join(dir, cmd)
    } catch {
      /* next */
    }
  }
  return undefined
}

/** The nginx binary, installing Debian's package when we are root and it is missing; undefined with a reason otherwise. */
export async function findNginx(log: (s: string) => void): Promise<string | undefined> {
  const found = await which('nginx')
  if (found !== undefined) return found
  if (process.getuid?.() !== 0 || process.env.BENCH_NO_INSTALL === '1') {
    log('nginx is not installed (apt-get install nginx); the nginx row of workload d is skipped')
    return undefined
  }
  log('installing Debian nginx for workload d (apt-get install -y nginx) ...')
  try {
    await run('apt-get', ['install', '-y', '--no-install-recommends', 'nginx'], {
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
      timeout: 120_000,
    })
  } catch (err) {
    log(`could not install nginx (${(err as Error).message.split('\n')[0]}); the nginx row of workload d is skipped`)
    return undefined
  }
  return which('nginx')
}

export async function startNginx(bin: string, upstreamPort: number): Promise<{ url: string; service: Service; workerPid: number }> {
  const dir = await mkdtemp(join(tmpdir(), 'mcp-proxy-bench-nginx-'))
  // Workers run as nobody when the master is root: let them write their temp dirs.
  await chmod(dir, 0o777)
  const port = await freePort()
  const conf = `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream mcp_upstream {
    server 127.0.0.1:${upstreamPort};
    keepalive 64;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://mcp_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
`
  const file = join(dir, 'nginx.conf')
  await writeFile(file, conf)
  const service = await startService('nginx', bin, ['-c', file, '-p', dir, '-e', join(dir, 'error.log')], { port, tempDir: dir })
  // The one worker does the proxying; its pid is what RSS and CPU are read from.
  const children = await readFile(`/proc/${service.pid}/task/${service.pid}/children`, 'utf8').catch(() => '')
  const worker = Number(children.trim().split(/\s+/)[0])
  return { url: `http://127.0.0.1:${port}/mcp`, service, workerPid: Number.isInteger(worker) && worker > 0 ? worker : service.pid }
}
