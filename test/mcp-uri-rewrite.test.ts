/**
 * URIs inside results with several targets (core/mcp/router.ts, naming.ts):
 * resource links and embedded resources in tools/call results, and embedded
 * resources in prompts/get messages, carry the target-qualified URI
 * (`mcp-proxy://<target>/<uri>`) that the gateway's resources/read accepts;
 * with one target nothing is renamed. Two real server-everything children,
 * the official SDK client.
 */
import t, { type Test } from 'tap'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { startGateway, everythingTarget } from './helpers/gateway-harness.ts'

async function connect(t: Test, url: string): Promise<Client> {
  const client = new Client({ name: 'uri-rewrite', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url)))
  t.teardown(() => client.close())
  return client
}

type Block = { type: string; uri?: string; resource?: { uri: string; text?: string } }

t.test("several targets: URIs in tool results and prompt messages are the gateway's, and resources/read takes them", async t => {
  const gw = await startGateway(t, { targets: [everythingTarget('a'), everythingTarget('b')] })
  const client = await connect(t, gw.url)

  const links = (await client.callTool({ name: 'b_get-resource-links', arguments: { count: 2 } })).content as Block[]
  const linked = links.filter(c => c.type === 'resource_link')
  t.equal(linked.length, 2)
  for (const l of linked) {
    t.match(l.uri, /^mcp-proxy:\/\/b\/demo:\/\//, 'a resource link names its target')
    const read = await client.readResource({ uri: l.uri! })
    t.equal(read.contents[0]!.uri, l.uri, 'and reads through the gateway under the same URI')
  }

  const ref = (await client.callTool({ name: 'a_get-resource-reference', arguments: { resourceType: 'Text', resourceId: 2 } })).content as Block[]
  const embedded = ref.find(c => c.type === 'resource')!
  t.match(embedded.resource!.uri, /^mcp-proxy:\/\/a\/demo:\/\//, 'an embedded resource names its target')
  const read = await client.readResource({ uri: embedded.resource!.uri })
  // server-everything stamps each rendering with the time of day ("created at 2:13:27 AM"): a read in the
  // next second differs only there.
  const untimed = (text: string | undefined): string | undefined => text?.replace(/created at \S+( [AP]M)?/, 'created at <time>')
  t.equal(read.contents[0]!.uri, embedded.resource!.uri, 'read under the same URI')
  t.equal(untimed((read.contents[0] as { text?: string }).text), untimed(embedded.resource!.text), 'the same resource')

  const prompt = await client.getPrompt({ name: 'b_resource-prompt', arguments: { resourceType: 'Text', resourceId: '2' } })
  const inPrompt = prompt.messages.map(m => m.content as Block).find(c => c.type === 'resource')!
  t.match(inPrompt.resource!.uri, /^mcp-proxy:\/\/b\/demo:\/\//, 'an embedded resource in a prompt names its target')
})

t.test('one target: URIs stay as the server wrote them', async t => {
  const gw = await startGateway(t, { targets: [everythingTarget()] })
  const client = await connect(t, gw.url)
  const links = (await client.callTool({ name: 'get-resource-links', arguments: { count: 1 } })).content as Block[]
  t.match(links.find(c => c.type === 'resource_link')!.uri, /^demo:\/\//)
  const ref = (await client.callTool({ name: 'get-resource-reference', arguments: { resourceType: 'Text', resourceId: 2 } })).content as Block[]
  t.match(ref.find(c => c.type === 'resource')!.resource!.uri, /^demo:\/\//)
})
