#!/usr/bin/env node
/**
 * `npm run demo`: a development OpenID provider on 127.0.0.1 plus the
 * gateway on examples/demo/config.yaml in front of server-everything.
 * Development only: the IdP logs every authorize request in as a demo user.
 */
import { fileURLToPath } from 'node:url'
import { dirname, resolve } from 'node:path'
import { startDevIdp } from './dev-idp.ts'
import { loadConfig } from '../core/config.ts'
import { startGateway, type RunningGateway } from '../core/gateway.ts'
import { ProxyError } from '../core/errors.ts'
import { builtins } from '../plugins/index.ts'

const here = dirname(fileURLToPath(import.meta.url))
const root = here.endsWith('/dist/bin') || here.endsWith('\\dist\\bin') ? resolve(here, '../..') : resolve(here, '..')
// `--facade`: the OAuth facade (issue 17): the IdP knows only the gateway's callback.
const facade = process.argv.includes('--facade')
const configFile = resolve(root, facade ? 'examples/demo/facade.yaml' : 'examples/demo/config.yaml')
const idpPort = Number(process.env.DEMO_IDP_PORT ?? 9400)

async function main(): Promise<void> {
  const idp = await startDevIdp(
    facade
      ? { port: idpPort, clientId: 'mcp-gateway-dev', allowLoopbackRedirects: false, redirectUris: ['http://localhost:3000/oauth/callback'] }
      : { port: idpPort, clientId: 'mcp-gateway-dev' }
  )
  process.env.DEMO_IDP_ISSUER = idp.issuer
  let gateway: RunningGateway
  try {
    gateway = await startGateway(await loadConfig(configFile, process.env, builtins), { registry: builtins })
  } catch (err) {
    await idp.close()
    process.stderr.write(`mcp-proxy demo: ${ProxyError.is(err) ? err.message : String(err)}\n`)
    process.exit(1)
  }
  const mcp = gateway.mcpUrl
  process.stdout.write(`
  mcp-proxy demo is running (development only)

  MCP endpoint      ${mcp}
  Management UI     ${gateway.adminUrl ?? '(disabled)'}/ui
  Dev OpenID issuer ${idp.issuer}   (127.0.0.1 only; logs every authorize request in as "alice")
  Config            examples/demo/${facade ? 'facade.yaml (OAuth facade: the IdP knows only http://localhost:3000/oauth/callback)' : 'config.yaml'}

  Get a token by hand (a client-credentials request with a service account, as in docs/identity-providers.md "Setting up the identity provider"):

    TOKEN=$(curl -s -X POST ${idp.tokenEndpoint} \\
      -d grant_type=client_credentials -d client_id=mcp-gateway-dev \\
      -d username=mcp-service -d password=mcp-service-dev-password \\
      -d 'scope=openid profile' | node -pe 'JSON.parse(require("fs").readFileSync(0)).access_token')

    curl -s ${mcp} -H "authorization: Bearer $TOKEN" \\
      -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \\
      -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}' -i

  Without a token you get 401 with WWW-Authenticate pointing at
  http://localhost:3000/.well-known/oauth-protected-resource/mcp

  MCP Inspector 2.x (Node 22.19+): it discovers the metadata, registers, and logs in
  through the dev provider without a password prompt:

    npx -y @modelcontextprotocol/inspector@2

  then, in Inspector 2.12: Add Servers -> Add manually, transport streamable-http,
  URL ${mcp}, save, and switch the server's toggle on.
${
  facade
    ? `
  In facade mode the gateway then shows its consent page before the Inspector gets a code.`
    : ''
}

  Ctrl-C stops everything.
`)
  let stopping = false
  const stop = (): void => {
    if (stopping) process.exit(1)
    stopping = true
    void gateway
      .close()
      .then(() => idp.close())
      .then(() => process.exit(0))
  }
  process.on('SIGINT', stop)
  process.on('SIGTERM', stop)
}

void main()
