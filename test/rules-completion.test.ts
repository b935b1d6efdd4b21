/**
 * Per-operation rules on completions and subscriptions (issue 22, item 5):
 * `completion/complete` for a denied prompt (`ref/prompt`), a denied resource
 * template (`ref/resource`) or a prompt or template of a denied target is
 * refused exactly as for one that does not exist (the upstream's own answer
 * for an unknown reference, with the caller's name put back), in a session,
 * in a JSON-RPC batch (2025-03-26) and in 2026-07-28; `resources/subscribe`
 * to a denied resource or target never reaches the upstream under its name.
 * Real gateway, server-everything (its `completable-prompt`, `resource-prompt`
 * and `demo://resource/dynamic/{text,blob}/{resourceId}` templates), no
 * authentication (rules that read only `mcp.*`).
 */
import t, { type Test } from 'tap'
import { everythingTarget } from './helpers/gateway-harness.ts'
import { fullGateway, type FullGateway } from './helpers/full-gateway.ts'
import { modernCall, openSession, type Message } from './helpers/raw-mcp.ts'

const BLOB = 'demo://resource/dynamic/blob/{resourceId}'
const TEXT = 'demo://resource/dynamic/text/{resourceId}'
const SECRET_DOC = 'demo://resource/static/document/architecture.md'
const OPEN_DOC = 'demo://resource/static/document/features.md'
const RULES = [
  'mcp.prompt.name != "completable-prompt"',
  `mcp.resource.uri != "${BLOB}"`,
  `mcp.resource.uri != "${SECRET_DOC}"`,
  'mcp.prompt.target != "b"',
  'mcp.resource.target != "b"',
]

const promptRef = (name: string): Record<string, unknown> => ({ ref: { type: 'ref/prompt', name }, argument: { name: 'resourceType', value: '' } })
const departmentRef = (name: string): Record<string, unknown> => ({ ref: { type: 'ref/prompt', name }, argument: { name: 'department', value: 'E' } })
const templateRef = (uri: string): Record<string, unknown> => ({ ref: { type: 'ref/resource', uri }, argument: { name: 'resourceId', value: '1' } })

/** A refusal reads as the answer for an unknown reference: same code, same message with the name swapped. */
function sameAsUnknown(t: Test, denied: Message, deniedName: string, unknown: Message, unknownName: string, what: string): void {
  t.equal(denied.result, undefined, `${what}: no completions`)
  t.type(unknown.error?.code, 'number', `${what}: the upstream refuses an unknown reference`)
  t.equal(denied.error?.code, unknown.error?.code, `${what}: same code as an unknown reference`)
  t.equal(
    String(denied.error?.message).split(deniedName).join('<ref>'),
    String(unknown.error?.message).split(unknownName).join('<ref>'),
    `${what}: same message, the caller's name`
  )
  t.notMatch(JSON.stringify(denied), /mcp-proxy-denied/, `${what}: no stand-in leaks`)
}

const values = (m: Message): unknown => m.result?.completion?.values

let one: FullGateway
let two: FullGateway
t.before(async () => {
  one = await fullGateway(t, { targets: [everythingTarget('everything')], policies: { authorization: { rules: RULES } } })
  two = await fullGateway(t, { targets: [everythingTarget('a'), everythingTarget('b')], policies: { authorization: { rules: RULES } } })
})

t.test('session, one target: denied prompt and template completions are refused as unknown ones', async t => {
  const s = await openSession(one.url)
  t.teardown(() => s.close())
  t.same(values((await s.call('completion/complete', promptRef('resource-prompt'))).answer), ['Text', 'Blob'], 'control: an allowed prompt completes')
  t.same(values((await s.call('completion/complete', templateRef(TEXT))).answer), ['1'], 'control: an allowed template completes')
  const deniedPrompt = (await s.call('completion/complete', departmentRef('completable-prompt'))).answer
  const unknownPrompt = (await s.call('completion/complete', departmentRef('no-such-prompt'))).answer
  sameAsUnknown(t, deniedPrompt, 'completable-prompt', unknownPrompt, 'no-such-prompt', 'denied prompt')
  const deniedTemplate = (await s.call('completion/complete', templateRef(BLOB))).answer
  const unknownTemplate = (await s.call('completion/complete', templateRef('demo://resource/dynamic/none/{resourceId}'))).answer
  sameAsUnknown(t, deniedTemplate, BLOB, unknownTemplate, 'demo://resource/dynamic/none/{resourceId}', 'denied template')
  // Templates are compared as written (servers match a ref by its exact template string), so
  // another spelling of a denied template is simply unknown upstream: a guard, not normalization.
  const respelled = (await s.call('completion/complete', templateRef('DEMO://resource/dynamic/blob/{resourceId}'))).answer
  t.equal(respelled.result, undefined, 'another spelling of a denied template completes nothing')
})

t.test('session, one target: subscribing to a denied resource never names it upstream', async t => {
  const s = await openSession(one.url)
  t.teardown(() => s.close())
  // server-everything logs every subscription it receives, with the URI, to the client.
  const open = await s.call('resources/subscribe', { uri: OPEN_DOC })
  t.same(open.answer.result, {}, 'control: an allowed subscription')
  t.match(JSON.stringify(open.notes), OPEN_DOC, 'control: the upstream saw the allowed URI (its log notification)')
  const unknown = await s.call('resources/subscribe', { uri: 'demo://resource/static/document/nope.md' })
  const denied = await s.call('resources/subscribe', { uri: SECRET_DOC })
  t.same(denied.answer.result, unknown.answer.result, 'answered as a subscription to an unknown URI')
  t.same(denied.answer.error, unknown.answer.error)
  t.notMatch(JSON.stringify(denied.notes), SECRET_DOC, 'the upstream never received the denied URI')
  const un = await s.call('resources/unsubscribe', { uri: SECRET_DOC })
  t.notMatch(JSON.stringify(un.notes), SECRET_DOC, 'nor on unsubscribe')
})

t.test('batch (2025-03-26): a denied completion in a batch is refused, its neighbour answered', async t => {
  const s = await openSession(one.url, '2025-03-26')
  t.teardown(() => s.close())
  const answers = await s.batch([
    { method: 'completion/complete', params: departmentRef('completable-prompt') },
    { method: 'completion/complete', params: promptRef('resource-prompt') },
    { method: 'completion/complete', params: templateRef(BLOB) },
  ])
  t.equal(answers.get(0)?.result, undefined, 'denied prompt: no completions')
  t.type(answers.get(0)?.error?.code, 'number')
  t.same(values(answers.get(1)!), ['Text', 'Blob'], 'allowed prompt completes')
  t.equal(answers.get(2)?.result, undefined, 'denied template: no completions')
})

t.test('session, two targets: completions and subscriptions of a denied target are refused', async t => {
  const s = await openSession(two.url)
  t.teardown(() => s.close())
  t.same(values((await s.call('completion/complete', promptRef('a_resource-prompt'))).answer), ['Text', 'Blob'], 'control: target a completes')
  t.same(values((await s.call('completion/complete', templateRef(`mcp-proxy://a/${TEXT}`))).answer), ['1'], 'control: a template of a')
  const deniedTarget = (await s.call('completion/complete', promptRef('b_resource-prompt'))).answer
  const unknownB = (await s.call('completion/complete', promptRef('b_no-such-prompt'))).answer
  sameAsUnknown(t, deniedTarget, 'resource-prompt', unknownB, 'no-such-prompt', 'prompt of a denied target')
  const deniedName = (await s.call('completion/complete', departmentRef('a_completable-prompt'))).answer
  const unknownA = (await s.call('completion/complete', departmentRef('a_no-such-prompt'))).answer
  sameAsUnknown(t, deniedName, 'completable-prompt', unknownA, 'no-such-prompt', 'denied prompt of target a')
  const deniedTemplate = (await s.call('completion/complete', templateRef(`mcp-proxy://b/${TEXT}`))).answer
  const unknownTemplate = (await s.call('completion/complete', templateRef('mcp-proxy://b/demo://resource/dynamic/none/{resourceId}'))).answer
  sameAsUnknown(t, deniedTemplate, TEXT, unknownTemplate, 'demo://resource/dynamic/none/{resourceId}', 'template of a denied target')
  const sub = await s.call('resources/subscribe', { uri: `mcp-proxy://b/${OPEN_DOC}` })
  t.notMatch(JSON.stringify(sub.notes), OPEN_DOC, 'the denied target never received the subscription')
  const subA = await s.call('resources/subscribe', { uri: `mcp-proxy://a/${OPEN_DOC}` })
  t.match(JSON.stringify(subA.notes), OPEN_DOC, 'control: target a did')
})

t.test('2026-07-28: denied prompt, template and target completions are refused as unknown ones', async t => {
  t.same(values((await modernCall(one.url, 'completion/complete', promptRef('resource-prompt'))).answer), ['Text', 'Blob'], 'control')
  const denied = (await modernCall(one.url, 'completion/complete', departmentRef('completable-prompt'))).answer
  const unknown = (await modernCall(one.url, 'completion/complete', departmentRef('no-such-prompt'))).answer
  sameAsUnknown(t, denied, 'completable-prompt', unknown, 'no-such-prompt', 'denied prompt')
  const deniedTemplate = (await modernCall(one.url, 'completion/complete', templateRef(BLOB))).answer
  const unknownTemplate = (await modernCall(one.url, 'completion/complete', templateRef('demo://resource/dynamic/none/{resourceId}'))).answer
  sameAsUnknown(t, deniedTemplate, BLOB, unknownTemplate, 'demo://resource/dynamic/none/{resourceId}', 'denied template')
  const deniedTarget = (await modernCall(two.url, 'completion/complete', promptRef('b_resource-prompt'))).answer
  const unknownB = (await modernCall(two.url, 'completion/complete', promptRef('b_no-such-prompt'))).answer
  sameAsUnknown(t, deniedTarget, 'resource-prompt', unknownB, 'no-such-prompt', 'prompt of a denied target')
})
