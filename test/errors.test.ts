import t from 'tap'
import { readFile } from 'node:fs/promises'
import { ERROR_CODES, ProxyError } from '../core/errors.ts'

t.test('every error code is documented in the README error table', async t => {
  const readme = await readFile(new URL('../README.md', import.meta.url), 'utf8')
  const codes = Object.keys(ERROR_CODES)
  t.ok(codes.length >= 20)
  for (const code of codes) t.match(readme, new RegExp('\\| `' + code + '` \\|'), `${code} is in the README table`)
  const documented = [...readme.matchAll(/\| `(MCPP_ERR_[A-Z_]+)` \|/g)].map(m => m[1])
  t.same(documented.filter(c => !(c! in ERROR_CODES)), [], 'the README documents no code that does not exist')
})

t.test('ProxyError is recognised across package copies by its brand', async t => {
  const e = new ProxyError('MCPP_ERR_FORBIDDEN', 403, 'nope')
  t.ok(ProxyError.is(e))
  t.equal(e.expose, true)
  t.equal(new ProxyError('MCPP_ERR_INTERNAL', 500, 'x').expose, false)
  const foreign = { [Symbol.for('mcp-proxy.ProxyError')]: true, code: 'MCPP_ERR_FORBIDDEN' }
  t.ok(ProxyError.is(foreign), 'an error from another copy of the package carries the same Symbol.for brand')
  t.notOk(ProxyError.is(new Error('plain')))
  t.notOk(ProxyError.is(null))
})
