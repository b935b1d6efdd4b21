/**
 * Capability-gated tools in the session era: an upstream learns exactly the
 * capabilities the client declared (never sampling, elicitation or roots on
 * behalf of a client that did not), so a server that gates tools on them
 * shows each client what it may use. server-everything registers
 * trigger-elicitation-request, trigger-sampling-request and get-roots-list
 * only for clients that declared elicitation, sampling and roots. Per-session
 * children get the client's initialize; children shared per subject
 * (stdio.share) are pooled per capability set. Real children, SDK clients,
 * real tokens (the dev IdP; mcpAuthentication), all of one subject.
 */
import t, { type Test } from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import type { TargetConfig } from '../core/config.ts'
import { startGateway, everythingTarget, type GatewayHarness } from './helpers/gateway-harness.ts'
import { realAuth, type RealAuth } from './helpers/real-auth.ts'

const GATED = ['get-roots-list', 'trigger-elicitation-request', 'trigger-sampling-request']

/** An SDK client of alice's (a real token from the dev IdP) declaring `capabilities`. */
async function connect(t: Test, gw: GatewayHarness, auth: RealAuth, capabilities: Record<string, unknown>): Promise<Client> {
  const client = new Client({ name: 'caps', version: '1.0.0' }, { capabilities })
  await client.connect(new StreamableHTTPClientTransport(new URL(gw.url), { requestInit: { headers: await auth.as('alice') } }))
  t.teardown(() => client.close())
  return client
}

async function gated(client: Client): Promise<string[]> {
  const { tools } = await client.listTools()
  return tools
    .map(x => x.name)
    .filter(n => GATED.includes(n))
    .sort()
}

const paths: Record<string, TargetConfig> = {
  'a child per session': everythingTarget(),
  'a child shared per subject': { ...everythingTarget(), stdio: { ...everythingTarget().stdio!, share: 'subject', processesPerSubject: 1 } },
}

for (const [path, target] of Object.entries(paths)) {
  t.test(`${path}: gated tools follow each client's own declared capabilities`, async t => {
    const auth = await realAuth(t, ['alice'])
    const gw = await startGateway(t, { targets: [target], plugins: [auth.plugin] })
    const plain = await connect(t, gw, auth, {})
    const eliciting = await connect(t, gw, auth, { elicitation: {} })
    eliciting.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'decline' }))
    const plainAgain = await connect(t, gw, auth, {})

    t.same(await gated(plain), [], 'a client that declared nothing sees no gated tool')
    t.same(await gated(eliciting), ['trigger-elicitation-request'], 'a client that declared elicitation sees the elicitation tool, and no other gated one')
    t.same(await gated(plainAgain), [], 'a later client without capabilities still sees none')
    const r = await eliciting.callTool({ name: 'trigger-elicitation-request', arguments: {} })
    t.match(JSON.stringify(r.content), /decline/i, 'the elicitation round trip reached the client that declared it')
  })
}
