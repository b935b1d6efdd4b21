/**
 * Resource rules against URIs spelled differently (issue 22, item 2). The
 * upstream (server-everything, official SDK) reads `params.uri` with
 * `new URL()` and serves what its serialization names, so a rule must see
 * that serialization, and the gateway must send it: `..`, `./`, `%2e%2e`, an
 * upper-case scheme, a tab or spaces around the URI do not get past an allow
 * rule (`startsWith(mcp.resource.uri, "demo://resource/dynamic/")`) or a deny
 * rule (`!= "demo://resource/dynamic/text/2"`). A URI that does not parse, or
 * that holds an encoded separator an upstream might decode into a path, is
 * -32602. Session era and 2026-07-28, one target and several (marked
 * `mcp-proxy://<target>/` URIs), resources/read and resources/subscribe.
 */
import t, { type Test } from 'tap'
import { everythingTarget } from './helpers/gateway-harness.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { listenAck, modernCall, openSession, type Message, type RawSession } from './helpers/raw-mcp.ts'

const RULES = [
  'mcp.method != "resources/read" || startsWith(mcp.resource.uri, "demo://resource/dynamic/")',
  'mcp.resource.uri != "demo://resource/dynamic/text/2"',
]
const STATIC = 'demo://resource/static/document/architecture.md'
const DENIED = 'demo://resource/dynamic/text/2'

/** Spellings of STATIC that start with the allowed prefix as the client wrote them. */
const PAST_ALLOW = [
  'demo://resource/dynamic/../static/document/architecture.md',
  'demo://resource/dynamic/%2e%2e/static/document/architecture.md',
  'demo://resource/dynamic/%2E./static/document/architecture.md',
  'demo://resource/dynamic/text/../../static/document/architecture.md',
]
/** Spellings of DENIED that differ from the denied string. */
const PAST_DENY = [
  'demo://resource/dynamic/text/./2',
  'DEMO://resource/dynamic/text/2',
  'Demo://resource/dynamic/text/x/../2',
  'demo://resource/dynamic/text/%2e/2',
]
/** Only through a session (fetch trims header values, and 2026-07-28 mirrors the URI in Mcp-Name). */
const WHITESPACE = [' demo://resource/dynamic/text/2', 'demo://resource/dynamic/text/\t2']

let one: FullGateway
let two: FullGateway
t.before(async () => {
  one = await fullGateway(t, { targets: [everythingTarget('everything')], policies: { authorization: { rules: RULES } } })
  two = await fullGateway(t, { targets: [everythingTarget('a'), everythingTarget('b')], policies: { authorization: { rules: RULES } } })
})

function refusedLike(t: Test, got: Message, plain: Message, what: string): void {
  t.equal(got.result, undefined, `${what}: no contents`)
  t.type(plain.error?.code, 'number', 'the plainly spelled URI is refused')
  t.equal(got.error?.code, plain.error?.code, `${what}: refused as the plain spelling is`)
}

async function read(s: RawSession, uri: string): Promise<Message> {
  return (await s.call('resources/read', { uri })).answer
}

t.test('session, one target: other spellings pass neither an allow nor a deny rule; allowed ones are sent normalized', async t => {
  const s = await openSession(one.url)
  t.teardown(() => s.close())
  const ok = await read(s, 'demo://resource/dynamic/text/./1')
  t.equal(ok.result?.contents?.[0]?.uri, 'demo://resource/dynamic/text/1', 'an allowed resource in another spelling is read, under its normalized URI')
  const plainStatic = await read(s, STATIC)
  for (const uri of PAST_ALLOW) refusedLike(t, await read(s, uri), plainStatic, uri)
  const plainDenied = await read(s, DENIED)
  for (const uri of [...PAST_DENY, ...WHITESPACE]) refusedLike(t, await read(s, uri), plainDenied, JSON.stringify(uri))
})

t.test('session, one target: unparsable and ambiguous URIs are -32602', async t => {
  const s = await openSession(one.url)
  t.teardown(() => s.close())
  for (const uri of [
    'demo://res ource/dynamic/text/1',
    'dynamic/text/1',
    'demo://resource/dynamic/text/1%2f..%2f..%2fstatic',
    'demo://resource/dynamic/text\\..\\..\\static',
  ]) {
    const got = await read(s, uri)
    t.equal(got.error?.code, -32602, `${uri}: invalid params`)
    t.match(got.error?.message, /^Invalid resource URI: /, `${uri}: says why`)
  }
})

t.test('session: a subscription in another spelling of a denied URI never reaches the upstream under it', async t => {
  const s = await openSession(one.url)
  t.teardown(() => s.close())
  const open = await s.call('resources/subscribe', { uri: 'DEMO://resource/dynamic/text/1' })
  t.match(JSON.stringify(open.notes), 'demo://resource/dynamic/text/1', 'control: the upstream logs the (normalized) URI it was sent')
  for (const uri of ['DEMO://resource/dynamic/text/2', 'demo://resource/dynamic/text/./2']) {
    const sub = await s.call('resources/subscribe', { uri })
    t.notMatch(JSON.stringify(sub.notes), /dynamic\/text\/(\.\/)?2/i, `${uri}: the upstream never saw the denied resource`)
  }
})

t.test('session, several targets: marked URIs are normalized after the target', async t => {
  const s = await openSession(two.url)
  t.teardown(() => s.close())
  const ok = await read(s, 'mcp-proxy://b/demo://resource/dynamic/text/./1')
  t.equal(ok.result?.contents?.[0]?.uri, 'mcp-proxy://b/demo://resource/dynamic/text/1', 'allowed, marked with its target')
  const plainStatic = await read(s, `mcp-proxy://a/${STATIC}`)
  for (const uri of PAST_ALLOW) refusedLike(t, await read(s, `mcp-proxy://a/${uri}`), plainStatic, uri)
  const plainDenied = await read(s, `mcp-proxy://b/${DENIED}`)
  for (const uri of PAST_DENY) refusedLike(t, await read(s, `mcp-proxy://b/${uri}`), plainDenied, uri)
})

t.test('2026-07-28, one and several targets', async t => {
  const ok = await modernCall(one.url, 'resources/read', { uri: 'DEMO://resource/dynamic/text/1' })
  t.equal(ok.answer.result?.contents?.[0]?.uri, 'demo://resource/dynamic/text/1', 'allowed, sent normalized')
  const plainStatic = (await modernCall(one.url, 'resources/read', { uri: STATIC })).answer
  for (const uri of PAST_ALLOW) refusedLike(t, (await modernCall(one.url, 'resources/read', { uri })).answer, plainStatic, uri)
  const plainDenied = (await modernCall(one.url, 'resources/read', { uri: DENIED })).answer
  for (const uri of PAST_DENY) refusedLike(t, (await modernCall(one.url, 'resources/read', { uri })).answer, plainDenied, uri)
  const bad = await modernCall(one.url, 'resources/read', { uri: 'demo://res ource/x' })
  t.equal(bad.answer.error?.code, -32602, 'unparsable: invalid params')
  const plainMarked = (await modernCall(two.url, 'resources/read', { uri: `mcp-proxy://b/${DENIED}` })).answer
  for (const uri of PAST_DENY)
    refusedLike(t, (await modernCall(two.url, 'resources/read', { uri: `mcp-proxy://b/${uri}` })).answer, plainMarked, `marked ${uri}`)
})

t.test('2026-07-28 subscriptions/listen: another spelling of a denied URI is not subscribed', async t => {
  const allowed = 'demo://resource/dynamic/text/./1'
  const ack = await listenAck(one.url, {
    resourceSubscriptions: [allowed, 'demo://resource/dynamic/text/./2', 'demo://resource/dynamic/%2e%2e/static/document/architecture.md'],
  })
  t.equal(ack.method, 'notifications/subscriptions/acknowledged')
  t.same(ack.params?.notifications?.resourceSubscriptions, [allowed], 'only the allowed resource, named as the client named it')
})
