/**
 * core/mcp/subject-key.ts: what sessions, per-subject caps and pooled upstreams are keyed by.
 */
import t from 'tap'
import type { RequestContext } from '../core/context.ts'
import { subjectKeyOf } from '../core/mcp/routing/subject-key.ts'

function ctx(subject: string | undefined, clientAddress: string | undefined): RequestContext {
  return { auth: subject === undefined ? undefined : { subject, claims: {} }, clientAddress: clientAddress ?? '' } as unknown as RequestContext
}

t.test('the subject when authenticated, else the client address, never one from the other', async t => {
  t.equal(subjectKeyOf(ctx('alice', '10.0.0.1')), 'alice')
  t.equal(subjectKeyOf(ctx(undefined, '10.0.0.1')), subjectKeyOf(ctx(undefined, '10.0.0.1')), 'one address, one key')
  t.not(subjectKeyOf(ctx(undefined, '10.0.0.1')), subjectKeyOf(ctx(undefined, '10.0.0.2')), 'anonymous callers at two addresses are apart')
  const anon = subjectKeyOf(ctx(undefined, '10.0.0.1'))
  t.match(anon, /^\u0000/, 'a NUL prefix no IdP subject has')
  t.not(subjectKeyOf(ctx(anon.slice(1), '10.0.0.1')), anon, 'a subject spelled like the anonymous key is still another key')
  t.type(subjectKeyOf(ctx(undefined, undefined)), 'string', 'a socket without an address still gets a key')
})
