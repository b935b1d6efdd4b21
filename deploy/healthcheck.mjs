#!/usr/bin/env node
// Health probe for the container image (HEALTHCHECK) and Kubernetes exec
// probes: GET <admin listener><path>, exit 0 on 200 and 1 otherwise (both read
// only the exit code). The admin listener binds 127.0.0.1 by default, where
// only a command run inside the container reaches it; an HTTP probe from the
// kubelet would need the listener on the pod IP.
//
//   mcp-proxy-healthcheck [/healthz | /readyz]
//   MCP_PROXY_ADMIN_URL    admin listener origin (default http://127.0.0.1:15000)
//   MCP_PROXY_ADMIN_TOKEN  sent as a bearer token when set (with `admin.token`,
//                          every route but /healthz needs it)
//
// The image installs this file without its extension, which node may load as
// CommonJS; it stays valid both ways (no import, require or top-level await).
const path = process.argv[2] ?? '/healthz'
const origin = process.env.MCP_PROXY_ADMIN_URL ?? 'http://127.0.0.1:15000'
const token = process.env.MCP_PROXY_ADMIN_TOKEN
const headers = token !== undefined && token !== '' ? { authorization: `Bearer ${token}` } : {}

function fail(message) {
  process.stderr.write(`${path}: ${message}\n`)
  process.exit(1)
}

fetch(new URL(path, origin), { headers, signal: AbortSignal.timeout(3000) })
  .then(async res => {
    const body = await res.text()
    if (res.status !== 200) fail(`HTTP ${res.status} ${body.slice(0, 500)}`)
    process.exit(0)
  })
  .catch(err => fail(err instanceof Error ? err.message : String(err)))
