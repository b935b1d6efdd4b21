/**
 * core/mcp/revision.ts: the revisions served and the per-request era decision.
 */
import t from 'tap'
import { readFileSync } from 'node:fs'
import type { RequestContext } from '../core/context.ts'
import { SESSION_REVISIONS, LATEST_SESSION_REVISION, MODERN_REVISION, isSessionRevision, negotiateRevision, allowsBatch, eraOf } from '../core/mcp/protocol.ts'

function ctx(headers: Record<string, string>): RequestContext {
  return { req: { headers } } as unknown as RequestContext
}
const meta = (v: string): Record<string, unknown> => ({ _meta: { 'io.modelcontextprotocol/protocolVersion': v } })

/** docs/protocol.md: the session-based revisions its opening sentence names, and server/discover's supportedVersions. */
const PROTOCOL_DOC = readFileSync(new URL('../docs/protocol.md', import.meta.url), 'utf8')
const DOC_SESSION: string[] = (/session-based revisions ([^(]*)\(/.exec(PROTOCOL_DOC)?.[1] ?? '').match(/\d{4}-\d{2}-\d{2}/g) ?? ([] as string[])
const DOC_SUPPORTED = JSON.parse(/`supportedVersions` = `(\[[^\]]*\])`/.exec(PROTOCOL_DOC)?.[1] ?? '[]') as string[]

t.test('revisions and negotiation', async t => {
  t.same(DOC_SESSION, ['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25'], 'the doc names the four session revisions (the parse works)')
  t.same([...SESSION_REVISIONS].sort(), [...DOC_SESSION].sort(), 'the session revisions are those docs/protocol.md names')
  t.equal(SESSION_REVISIONS[0], [...DOC_SESSION].sort().at(-1), 'newest first')
  t.equal(LATEST_SESSION_REVISION, [...DOC_SESSION].sort().at(-1), 'the latest is the newest the doc names')
  t.same(
    DOC_SUPPORTED.filter(v => !DOC_SESSION.includes(v)),
    [MODERN_REVISION],
    'the one other revision server/discover lists is the stateless one'
  )
  t.equal(MODERN_REVISION, '2026-07-28')
  for (const v of DOC_SESSION) t.ok(isSessionRevision(v), `${v} is a session revision`)
  t.ok(isSessionRevision('2024-11-05'))
  t.notOk(isSessionRevision('2026-07-28'))
  t.notOk(isSessionRevision(20241105))
  t.equal(negotiateRevision('2024-11-05'), '2024-11-05', 'a supported revision is kept')
  t.equal(negotiateRevision('1999-01-01'), '2025-11-25', 'else our latest')
  t.equal(negotiateRevision(undefined), '2025-11-25')
  t.ok(allowsBatch('2025-03-26'))
  t.notOk(allowsBatch('2025-06-18'))
  t.notOk(allowsBatch('2024-11-05'))
})

t.test('eraOf: the table of docs/protocol.md "Revision 2026-07-28"', async t => {
  const cases: Array<[Record<string, string>, unknown, 'legacy' | 'modern', string]> = [
    [{ 'mcp-protocol-version': '2026-07-28' }, undefined, 'modern', 'version header 2026-07-28'],
    [{ 'mcp-protocol-version': '2026-07-28', 'mcp-session-id': 's' }, undefined, 'modern', 'the session id is then ignored'],
    [{}, { jsonrpc: '2.0', id: 1, method: 'initialize', params: meta('2026-07-28') }, 'legacy', 'initialize is always session era'],
    [
      { 'mcp-session-id': 's' },
      { jsonrpc: '2.0', id: 1, method: 'tools/list', params: meta('2026-07-28') },
      'modern',
      '_meta 2026-07-28, even with a session id',
    ],
    [{}, { jsonrpc: '2.0', id: 1, method: 'tools/list', params: meta('2030-01-01') }, 'modern', 'any _meta version without a session id'],
    [
      { 'mcp-session-id': 's' },
      { jsonrpc: '2.0', id: 1, method: 'tools/list', params: meta('2030-01-01') },
      'legacy',
      'another _meta version with a session id',
    ],
    [{}, { jsonrpc: '2.0', id: 1, method: 'server/discover' }, 'modern', 'discover without version and session headers'],
    [{ 'mcp-protocol-version': '2025-06-18' }, { jsonrpc: '2.0', id: 1, method: 'server/discover' }, 'legacy', 'discover with a session-era version header'],
    [{ 'mcp-protocol-version': '2030-01-01' }, undefined, 'modern', 'a version header naming no session-era revision'],
    [{ 'mcp-protocol-version': '2030-01-01', 'mcp-session-id': 's' }, undefined, 'legacy', '... unless there is a session id'],
    [{}, [{ jsonrpc: '2.0', id: 1, method: 'tools/list', params: meta('2026-07-28') }], 'legacy', 'a batch is never read for _meta'],
    [{}, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, 'legacy', 'anything else'],
    [{ 'mcp-protocol-version': '2025-11-25' }, undefined, 'legacy', 'a session-era version header'],
  ]
  for (const [headers, body, era, why] of cases) t.equal(eraOf(ctx(headers), body), era, why)
})
