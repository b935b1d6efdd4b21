/**
 * Native 2026-07-28 forwarding (issue 15 item 1): an upstream that speaks the
 * revision gets its requests as they are (per-request `_meta`, input requests
 * with their keys, `inputResponses` and `requestState` untouched), over HTTP
 * (found by `server/discover`) and over stdio (a dual-era child probed with
 * `server/discover` first), with names mapped by the one router. The fixture
 * is test/fixtures/conformance-server.mjs (the official SDK 2.x); a raw
 * recording HTTP upstream shows what goes on the wire.
 */
import t, { type Test } from 'tap'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { TargetConfig } from '../core/config.ts'
import { everythingTarget, until } from './helpers/gateway-harness.ts'
import { META, MODERN, call, fixtureHttp, fixtureStdio } from './helpers/conformance-fixture.ts'
import { fullGateway } from './helpers/full-gateway.ts'

/** The keyed multi round-trip scenarios of the suite, through one gateway URL. */
async function roundTrips(t: Test, url: string, prefix: string): Promise<void> {
  const tool = (n: string): string => prefix + n
  const first = await call(url, 'tools/call', { name: tool('test_input_required_result_elicitation'), arguments: {} }, { elicitation: {} })
  t.equal(first.json.result?.resultType, 'input_required', 'input required', { got: first.json })
  t.same(Object.keys(first.json.result?.inputRequests ?? {}), ['user_name'], "the upstream's key kept")
  const second = await call(
    url,
    'tools/call',
    {
      name: tool('test_input_required_result_elicitation'),
      arguments: {},
      inputResponses: { user_name: { action: 'accept', content: { name: 'Ada' } } },
      ...(first.json.result?.requestState === undefined ? {} : { requestState: first.json.result.requestState }),
    },
    { elicitation: {} }
  )
  t.match(second.json.result?.content?.[0]?.text, 'Hello, Ada!', 'the retry answered by the upstream', { got: second.json })

  const caps = await call(url, 'tools/call', { name: tool('test_input_required_result_capabilities'), arguments: {} }, { roots: {} })
  t.same(Object.keys(caps.json.result?.inputRequests ?? {}), ['client_roots'], 'the per-request capabilities reach the tool', { got: caps.json })

  const multi = await call(
    url,
    'tools/call',
    { name: tool('test_input_required_result_multiple_inputs'), arguments: {} },
    { elicitation: {}, sampling: {}, roots: {} }
  )
  t.same(Object.keys(multi.json.result?.inputRequests ?? {}).sort(), ['client_roots', 'greeting', 'user_name'], 'several input requests in one round')
  t.type(multi.json.result?.requestState, 'string', "the upstream's requestState")
  const done = await call(
    url,
    'tools/call',
    {
      name: tool('test_input_required_result_multiple_inputs'),
      arguments: {},
      requestState: multi.json.result.requestState,
      inputResponses: {
        user_name: { action: 'accept', content: { name: 'Ada' } },
        greeting: { role: 'assistant', content: { type: 'text', text: 'Hi' }, model: 'm', stopReason: 'endTurn' },
        client_roots: { roots: [{ uri: 'file:///a' }] },
      },
    },
    { elicitation: {}, sampling: {}, roots: {} }
  )
  t.equal(done.json.result?.content?.[0]?.text, 'Hi Ada, 1 root(s) visible', 'the upstream verified its own requestState', { got: done.json })

  const extra = await call(url, 'tools/call', { name: tool('test_simple_text'), arguments: {}, inputResponses: { stray: { action: 'decline' } } })
  t.equal(
    extra.json.result?.content?.[0]?.text,
    'This is a simple text response for testing.',
    'extra inputResponses on a first call are passed on and ignored',
    { got: extra.json }
  )
  const forged = await call(url, 'tools/call', { name: tool('test_simple_text'), arguments: {}, requestState: 'not-ours' })
  t.match(forged.json.error, { code: -32602, message: 'Invalid or expired requestState' }, "requestState is the upstream's to judge: its own answer", {
    got: forged.json,
  })
}

t.test('HTTP target speaking 2026-07-28: forwarded natively (keys, capabilities, requestState)', async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'fixture', mcp: { url: upstream } }] })
  await roundTrips(t, url, '')
})

t.test('stdio target speaking 2026-07-28: probed with server/discover, forwarded natively', async t => {
  const { url } = await fullGateway(t, { targets: [fixtureStdio()] })
  await roundTrips(t, url, '')
})

t.test('two targets: names mapped by the router, both native', async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'remote', mcp: { url: upstream } }, fixtureStdio()] })
  await roundTrips(t, url, 'remote_')
  await roundTrips(t, url, 'fixture_')
})

t.test(
  'two targets: URIs in tools/call results and prompts/get messages carry their target (Router.markUris); one target: as the upstream wrote them',
  async t => {
    const upstream = await fixtureHttp(t)
    const { url } = await fullGateway(t, { targets: [{ name: 'remote', mcp: { url: upstream } }, fixtureStdio()] })
    for (const target of ['remote', 'fixture']) {
      const tool = await call(url, 'tools/call', { name: `${target}_test_embedded_resource`, arguments: {} })
      t.equal(tool.json.result?.content?.[0]?.resource?.uri, `mcp-proxy://${target}/test://embedded-resource`, `${target}: embedded resource marked`, {
        got: tool.json,
      })
      const prompt = await call(url, 'prompts/get', { name: `${target}_test_prompt_with_embedded_resource`, arguments: { resourceUri: 'test://static-text' } })
      const block = prompt.json.result?.messages?.find((m: any) => m.content?.type === 'resource')?.content
      t.equal(block?.resource?.uri, `mcp-proxy://${target}/test://static-text`, `${target}: prompt message resource marked`, { got: prompt.json })
      const read = await call(url, 'resources/read', { uri: block?.resource?.uri })
      t.equal(read.json.result?.contents?.[0]?.text, 'This is the content of the static text resource.', `${target}: the marked URI reads from its target`, {
        got: read.json,
      })
    }
    const single = await fullGateway(t, { targets: [fixtureStdio()] })
    const one = await call(single.url, 'tools/call', { name: 'test_embedded_resource', arguments: {} })
    t.equal(one.json.result?.content?.[0]?.resource?.uri, 'test://embedded-resource', 'one target: unchanged')
  }
)

t.test("what reaches a native HTTP upstream: the revision's headers and _meta, no client token, static headers", async t => {
  const seen: Array<{ headers: IncomingHttpHeaders; body: any }> = []
  const upstream = createServer((req, res) => {
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        seen.push({ headers: req.headers, body })
        const reply = (result: unknown): void => {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result }))
        }
        if (body.method === 'server/discover')
          reply({
            resultType: 'complete',
            supportedVersions: [MODERN],
            capabilities: { tools: {} },
            _meta: { 'io.modelcontextprotocol/serverInfo': { name: 'raw-upstream', version: '9' } },
          })
        else if (body.method === 'tools/list')
          reply({
            resultType: 'complete',
            tools: [{ name: 'where', inputSchema: { type: 'object', properties: { region: { type: 'string', 'x-mcp-header': 'Region' } } } }],
          })
        else reply({ resultType: 'complete', content: [{ type: 'text', text: 'ok' }] })
      })
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        upstream.closeAllConnections()
        upstream.close(() => resolve())
      })
  )
  const port = (upstream.address() as AddressInfo).port
  const { url } = await fullGateway(t, { targets: [{ name: 'raw', mcp: { url: `http://127.0.0.1:${port}/mcp`, headers: { 'x-gateway-key': 'k1' } } }] })
  const r = await call(
    url,
    'tools/call',
    { name: 'where', arguments: { region: 'eu' }, _meta: { progressToken: 'p1' } },
    { sampling: {} },
    { authorization: 'Bearer client-token', 'mcp-param-region': 'eu' }
  )
  t.equal(r.status, 200)
  t.equal(r.json.result?.content?.[0]?.text, 'ok', 'answered', { got: r.json })
  t.equal(r.json.result?._meta?.['io.modelcontextprotocol/serverInfo']?.name, 'raw-upstream', "one target: the upstream's serverInfo")
  const callSeen = seen.find(s => s.body.method === 'tools/call')
  t.ok(callSeen, 'the call reached the upstream')
  t.ok(
    seen.some(s => s.body.method === 'server/discover'),
    'probed with server/discover'
  )
  t.notOk(
    seen.some(s => s.body.method === 'initialize'),
    'never initialized: the upstream speaks the revision'
  )
  const h = callSeen!.headers
  t.equal(h['mcp-protocol-version'], MODERN)
  t.equal(h['mcp-method'], 'tools/call')
  t.equal(h['mcp-name'], 'where')
  t.equal(h['mcp-param-region'], 'eu', 'Mcp-Param-* mirrored where the tool declares it')
  t.equal(h['x-gateway-key'], 'k1', "the target's static headers")
  t.equal(h.authorization, undefined, "the client's token never goes upstream")
  t.equal(h['mcp-session-id'], undefined, 'no session')
  const meta = callSeen!.body.params._meta
  t.same(meta['io.modelcontextprotocol/clientCapabilities'], { sampling: {} }, "the client's per-request capabilities")
  t.same(meta['io.modelcontextprotocol/clientInfo'], { name: 'raw', version: '1' }, "the client's info")
  t.equal(meta['io.modelcontextprotocol/protocolVersion'], MODERN)
  t.equal(meta.progressToken, 'p1', "a per-request HTTP stream: the client's own token")
})

/**
 * subscriptions/listen forwarded natively: the acknowledgement first, then the list change a
 * concurrent tools/call triggers, re-tagged with the client's subscription id.
 */
async function listenSeesChange(t: Test, url: string, prefix: string): Promise<void> {
  const ac = new AbortController()
  t.teardown(() => ac.abort())
  const res = await fetch(url, {
    method: 'POST',
    signal: ac.signal,
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN,
      'mcp-method': 'subscriptions/listen',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 'sub-1',
      method: 'subscriptions/listen',
      params: { _meta: { ...META, 'io.modelcontextprotocol/clientCapabilities': {} }, notifications: { toolsListChanged: true } },
    }),
  })
  t.equal(res.status, 200)
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  // A failure guard only: a missing event fails the test instead of hanging it.
  const next = (): Promise<any> => Promise.race([read(), new Promise(resolve => setTimeout(resolve, 10_000).unref())])
  const read = async (): Promise<any> => {
    for (;;) {
      const at = buf.indexOf('\n\n')
      if (at >= 0) {
        const event = buf.slice(0, at)
        buf = buf.slice(at + 2)
        const data = event
          .split('\n')
          .filter(l => l.startsWith('data: '))
          .map(l => l.slice(6))
          .join('\n')
        if (data !== '') return JSON.parse(data)
        continue
      }
      const { value, done } = await reader.read()
      if (done) return undefined
      buf += decoder.decode(value, { stream: true })
    }
  }
  const ack = await next()
  t.equal(ack?.method, 'notifications/subscriptions/acknowledged', 'acknowledged first')
  t.same(ack?.params?.notifications, { toolsListChanged: true }, 'as the upstream agreed')
  t.equal(ack?.params?._meta?.['io.modelcontextprotocol/subscriptionId'], 'sub-1')
  const trigger = await call(url, 'tools/call', { name: prefix + 'test_trigger_tool_change', arguments: {} })
  t.match(trigger.json.result?.content?.[0]?.text, 'published', { got: trigger.json })
  const change = await next()
  t.equal(change?.method, 'notifications/tools/list_changed', 'the change made by another request reaches the stream')
  t.equal(change?.params?._meta?.['io.modelcontextprotocol/subscriptionId'], 'sub-1', "tagged with the client's subscription id")
  ac.abort()
}

t.test('subscriptions/listen forwarded natively (HTTP and stdio)', async t => {
  const upstream = await fixtureHttp(t)
  const http = await fullGateway(t, { targets: [{ name: 'fixture', mcp: { url: upstream } }] })
  await listenSeesChange(t, http.url, '')
  const stdio = await fullGateway(t, { targets: [fixtureStdio()] })
  await listenSeesChange(t, stdio.url, '')
})

t.test("protocol: session: the same fixture translated onto a session-era upstream (keys the gateway's, one round answered as a whole)", async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'fixture', protocol: 'session', mcp: { url: upstream } }] })
  const first = await call(
    url,
    'tools/call',
    { name: 'test_input_required_result_elicitation', arguments: {}, _meta: { progressToken: 'p7' } },
    { elicitation: {} }
  )
  t.equal(first.json.result?.resultType, 'input_required', { got: first.json })
  const [key, request] = Object.entries(first.json.result?.inputRequests ?? {})[0] as [string, any]
  t.equal(request?.method, 'elicitation/create', "the upstream's elicitation, bridged")
  t.equal(request?.params?._meta?.progressToken, undefined, 'no upstream progress token in the input request')
  t.equal(first.json.result?._meta?.['io.modelcontextprotocol/serverInfo']?.name, 'conformance-fixture', 'the serverInfo every result carries')
  const second = await call(
    url,
    'tools/call',
    {
      name: 'test_input_required_result_elicitation',
      arguments: {},
      requestState: first.json.result.requestState,
      inputResponses: { [key]: { action: 'accept', content: { name: 'Ada' } } },
    },
    { elicitation: {} }
  )
  t.equal(second.json.result?.content?.[0]?.text, 'Hello, Ada!', { got: second.json })
  const multi = await call(
    url,
    'tools/call',
    { name: 'test_input_required_result_multiple_inputs', arguments: {} },
    { elicitation: {}, sampling: {}, roots: {} }
  )
  t.ok(Object.keys(multi.json.result?.inputRequests ?? {}).length >= 2, "the round's input requests together", { got: multi.json })
})

t.test('capability-gated tools: a session-era upstream is pooled per declared capability set', async t => {
  const { url } = await fullGateway(t, { targets: [everythingTarget()] })
  const names = async (caps: Record<string, unknown>): Promise<string[]> => {
    const r = await call(url, 'tools/list', {}, caps)
    return ((r.json.result?.tools ?? []) as Array<{ name: string }>).map(x => x.name)
  }
  const bare = await names({})
  t.ok(bare.includes('echo'), 'listed', { got: bare })
  t.notOk(bare.includes('trigger-sampling-request'), 'a client without sampling never sees the tool gated on it')
  t.notOk(bare.includes('trigger-elicitation-request'), 'nor the one gated on elicitation')
  const sampling = await names({ sampling: {} })
  t.ok(sampling.includes('trigger-sampling-request'), 'a client declaring sampling sees it', { got: sampling })
  t.notOk(sampling.includes('trigger-elicitation-request'), 'but not the elicitation one')
  const denied = await call(url, 'tools/call', { name: 'trigger-sampling-request', arguments: { prompt: 'x' } }, {})
  t.ok(denied.json.error !== undefined || denied.json.result?.isError === true, 'nor gets it', { got: denied.json })
})

t.test("2026-07-28 streams are not resumable: no event ids, Last-Event-ID ignored, progress relayed with the client's token", async t => {
  const upstream = await fixtureHttp(t)
  for (const target of [{ name: 'fixture', mcp: { url: upstream } }, fixtureStdio()] as TargetConfig[]) {
    const { url } = await fullGateway(t, { targets: [target] })
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': MODERN,
        'mcp-method': 'tools/call',
        'mcp-name': 'test_tool_with_progress',
        'last-event-id': 'p1.3',
      },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 3,
        method: 'tools/call',
        params: { name: 'test_tool_with_progress', arguments: {}, _meta: { ...META, 'io.modelcontextprotocol/clientCapabilities': {}, progressToken: 'mine' } },
      }),
    })
    t.equal(res.status, 200)
    const text = await res.text()
    t.notMatch(text, /^id:/m, `${target.name}: no event ids (MCP 2026-07-28 streamable HTTP)`)
    const frames = text
      .split('\n')
      .filter(l => l.startsWith('data: '))
      .map(l => JSON.parse(l.slice(6)))
    const progress = frames.filter(f => f.method === 'notifications/progress')
    t.ok(
      progress.length > 0 && progress.every(p => p.params.progressToken === 'mine'),
      `${target.stdio === undefined ? 'http' : 'stdio'}: progress with the client's token`,
      { frames }
    )
    t.equal(frames.at(-1)?.id, 3, 'the answer last')
  }
})

t.test('the probe: a target down is asked again by the next request; protocol: session never asks; 2026-07-28 configured needs no probe', async t => {
  const seen: string[] = []
  const upstream = createServer((req, res) => {
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        seen.push(body.method)
        const reply = (result: unknown): void => {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result }))
        }
        if (body.method === 'server/discover') reply({ resultType: 'complete', supportedVersions: [MODERN], capabilities: { tools: {} } })
        else if (body.method === 'tools/list') reply({ resultType: 'complete', tools: [{ name: 'late', inputSchema: { type: 'object' } }] })
        else
          res
            .writeHead(400, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', id: body.id ?? null, error: { code: -32600, message: 'session era not served here' } }))
      })
  })
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        upstream.closeAllConnections()
        upstream.close(() => resolve())
      })
  )
  // A port that nothing listens on yet.
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  const port = (upstream.address() as AddressInfo).port
  await new Promise<void>(resolve => upstream.close(() => resolve()))
  const { url, logText } = await fullGateway(t, { targets: [{ name: 'late', mcp: { url: `http://127.0.0.1:${port}/mcp` } }] })
  const down = await call(url, 'tools/list', {})
  t.ok(down.json.error !== undefined, 'the target down: this request fails', { got: down.json })
  t.notMatch(logText(), /"era":"session"/, 'a failed probe decides nothing')
  await new Promise<void>(resolve => upstream.listen(port, '127.0.0.1', resolve))
  const up = await call(url, 'tools/list', {})
  t.same(
    up.json.result?.tools?.map((x: { name: string }) => x.name),
    ['late'],
    'asked again: native',
    { got: up.json }
  )
  t.equal(seen.filter(m => m === 'server/discover').length, 1, 'probed once it answered')

  seen.length = 0
  const configured = await fullGateway(t, { targets: [{ name: 'late', protocol: '2026-07-28', mcp: { url: `http://127.0.0.1:${port}/mcp` } }] })
  const direct = await call(configured.url, 'tools/list', {})
  t.same(
    direct.json.result?.tools?.map((x: { name: string }) => x.name),
    ['late']
  )
  const session = await fullGateway(t, { targets: [{ name: 'late', protocol: 'session', mcp: { url: `http://127.0.0.1:${port}/mcp` } }] })
  const translated = await call(session.url, 'tools/list', {})
  t.ok(translated.json.error !== undefined, 'protocol: session: translated (this upstream refuses initialize)', { got: translated.json })
  t.ok(seen.includes('initialize'), 'initialized as a session-era upstream')
  t.equal(
    seen.filter(m => m === 'server/discover').length,
    1,
    "only the configured-native gateway's pooled upstream asked (its start handshake); protocol: session never"
  )
})

t.test("native HTTP: the client closing its response ends the upstream request (the revision's cancellation); an upstream 5xx is a clear error", async t => {
  let closed!: () => void
  const upstreamClosed = new Promise<void>(resolve => {
    closed = resolve
  })
  let arrived!: () => void
  const callArrived = new Promise<void>(resolve => {
    arrived = resolve
  })
  const upstream = createServer((req, res) => {
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        if (body.method === 'server/discover') {
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { resultType: 'complete', supportedVersions: [MODERN], capabilities: { tools: {} } } }))
          return
        }
        if (body.method === 'tools/list') {
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { resultType: 'complete', tools: [] } }))
          return
        }
        if (body.params?.name === 'broken') {
          res.writeHead(502).end('bad gateway')
          return
        }
        // tools/call hang: an SSE stream that never answers, until the gateway lets go of it.
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(': open\n\n')
        res.on('close', () => closed())
        arrived()
      })
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        upstream.closeAllConnections()
        upstream.close(() => resolve())
      })
  )
  const port = (upstream.address() as AddressInfo).port
  const { url } = await fullGateway(t, { targets: [{ name: 'raw', mcp: { url: `http://127.0.0.1:${port}/mcp` } }] })
  const broken = await call(url, 'tools/call', { name: 'broken', arguments: {} })
  t.match(broken.json.error, { message: /target raw: upstream answered HTTP 502/ }, 'a clear error naming the target', { got: broken.json })
  const ac = new AbortController()
  const pending = fetch(url, {
    method: 'POST',
    signal: ac.signal,
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN,
      'mcp-method': 'tools/call',
      'mcp-name': 'hang',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 9,
      method: 'tools/call',
      params: { name: 'hang', arguments: {}, _meta: { ...META, 'io.modelcontextprotocol/clientCapabilities': {} } },
    }),
  }).catch(() => undefined)
  // Failure guards only: a missing event fails the test instead of hanging it.
  const guard = (): Promise<string> => new Promise(resolve => setTimeout(() => resolve('timed out'), 10_000).unref())
  t.equal(await Promise.race([callArrived.then(() => 'arrived'), guard()]), 'arrived', 'the call reached the upstream')
  ac.abort()
  await pending
  t.equal(await Promise.race([upstreamClosed.then(() => 'closed'), guard()]), 'closed', 'the upstream request stream was closed after the client went away')
})

t.test('subscriptions/listen over a native and a translated target at once', async t => {
  const upstream = await fixtureHttp(t)
  const { url } = await fullGateway(t, { targets: [{ name: 'fixture', mcp: { url: upstream } }, everythingTarget()] })
  await listenSeesChange(t, url, 'fixture_')
})

t.test(
  'a shared native stdio child: a log notification goes to the one request in flight that asked for logs (a server logs only for those, MCP 2026-07-28 logging)',
  async t => {
    const { url, logText } = await fullGateway(t, { targets: [fixtureStdio()] })
    // The child is started (and probed) first, so that both calls below share it.
    await call(url, 'tools/list', {})
    // In flight until released; the fixture's stderr marker (logged by the gateway) says it runs.
    const held = call(url, 'tools/call', { name: 'test_hold', arguments: { label: 'other' } })
    t.ok(await until(() => logText().includes('fixture: held other')), 'the other call is in flight upstream')
    const logged = await call(url, 'tools/call', { name: 'test_logging_tool', arguments: {}, _meta: { 'io.modelcontextprotocol/logLevel': 'info' } })
    const logs = logged.frames.filter(f => f.method === 'notifications/message')
    t.same(
      logs.map(f => f.params?.data),
      ['test_logging_tool ran'],
      'the log reached its request while another (without logLevel) was in flight',
      { frames: logged.frames }
    )
    t.equal(
      (await call(url, 'tools/call', { name: 'test_release', arguments: {} })).json.result?.content?.[0]?.text,
      'released 1',
      'the other call was still in flight'
    )
    const other = await held
    t.equal(other.frames.filter(f => f.method === 'notifications/message').length, 0, 'and not the other request')
    t.equal(other.json.result?.content?.[0]?.text, 'released other', 'the other call answered')
  }
)

t.test('subscriptions/listen: a native upstream that refuses it is left out of the acknowledgement and logged with its error', async t => {
  const upstream = createServer((req, res) => {
    let raw = ''
    req
      .setEncoding('utf8')
      .on('data', (d: string) => {
        raw += d
      })
      .on('end', () => {
        const body = JSON.parse(raw)
        const send = (msg: Record<string, unknown>): void => {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, ...msg }))
        }
        if (body.method === 'server/discover')
          send({
            result: { resultType: 'complete', supportedVersions: [MODERN], capabilities: { tools: { listChanged: true }, resources: { subscribe: true } } },
          })
        else if (body.method === 'subscriptions/listen') send({ error: { code: -32603, message: 'listen refused by raw' } })
        else send({ result: { resultType: 'complete', tools: [], resources: [] } })
      })
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>(resolve => {
        upstream.closeAllConnections()
        upstream.close(() => resolve())
      })
  )
  const port = (upstream.address() as AddressInfo).port
  const { url, logText } = await fullGateway(t, { targets: [{ name: 'raw', mcp: { url: `http://127.0.0.1:${port}/mcp` } }, fixtureStdio()] })
  const ac = new AbortController()
  t.teardown(() => ac.abort())
  const res = await fetch(url, {
    method: 'POST',
    signal: ac.signal,
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': MODERN,
      'mcp-method': 'subscriptions/listen',
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 'sub-r',
      method: 'subscriptions/listen',
      params: {
        _meta: { ...META, 'io.modelcontextprotocol/clientCapabilities': {} },
        notifications: { toolsListChanged: true, resourceSubscriptions: ['mcp-proxy://raw/test://a', 'mcp-proxy://fixture/test://watched-resource'] },
      },
    }),
  })
  t.equal(res.status, 200)
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  // A failure guard only: a missing acknowledgement fails the test instead of hanging it.
  const guard = setTimeout(() => ac.abort(), 10_000)
  while (!buf.includes('\n\n')) {
    const { value, done } = await reader.read()
    if (done) break
    buf += decoder.decode(value, { stream: true })
  }
  clearTimeout(guard)
  const ack = JSON.parse(
    buf
      .split('\n')
      .find(l => l.startsWith('data: '))!
      .slice(6)
  )
  t.equal(ack.method, 'notifications/subscriptions/acknowledged')
  t.same(
    ack.params.notifications,
    { toolsListChanged: true, resourceSubscriptions: ['mcp-proxy://fixture/test://watched-resource'] },
    'what the fixture agreed; nothing of the refusing target'
  )
  ac.abort()
  t.match(logText(), /"target":"raw".*listen refused by raw|listen refused by raw.*"target":"raw"/, 'the refusal logged with the target and its error')
})
