import t from 'tap'
import { readFile } from 'node:fs/promises'
import { ERROR_CODES, ProxyError, createError } from '../core/errors.ts'
import { builtins } from '../plugins/index.ts'

/** Core's codes and the ones the built-in plugins declare (`PluginModule.errors`). */
const declared = Object.values(builtins.modules).flatMap(m => m.errors ?? [])
const allCodes = [...Object.keys(ERROR_CODES), ...declared.map(e => e.code)]

t.test('every error code is documented in the error table of docs/errors.md (linked from the README)', async t => {
  const readme = await readFile(new URL('../docs/errors.md', import.meta.url), 'utf8')
  t.ok(allCodes.length >= 24)
  t.equal(new Set(allCodes).size, allCodes.length, 'no code is declared twice')
  for (const code of allCodes) t.match(readme, new RegExp('\\| `' + code + '` \\|'), `${code} is in the docs/errors.md table`)
  for (const e of declared) {
    const row = new RegExp('\\| `' + e.code + '` \\| ([^|]+) \\|').exec(readme)
    t.match(row?.[1], String(e.statusCode), `${e.code}: docs/errors.md gives its declared status ${e.statusCode}`)
  }
  const documented = [...readme.matchAll(/\| `(MCPP_ERR_[A-Z_]+)` \|/g)].map(m => m[1])
  t.same(
    documented.filter(c => !allCodes.includes(c!)),
    [],
    'docs/errors.md documents no code that does not exist'
  )
})

t.test('createError binds a code to its status in one place', async t => {
  const Teapot = createError('MCPP_ERR_TEAPOT', 418, 'I am a teapot', { oauthError: 'teapot', headers: { 'x-a': '1' } })
  t.equal(Teapot.code, 'MCPP_ERR_TEAPOT')
  t.equal(Teapot.statusCode, 418)
  const e = Teapot(undefined, { headers: { 'x-b': '2' } })
  t.ok(ProxyError.is(e))
  t.match(e, { code: 'MCPP_ERR_TEAPOT', statusCode: 418, message: 'I am a teapot', oauthError: 'teapot', expose: true })
  t.same(e.headers, { 'x-a': '1', 'x-b': '2' }, 'headers of the call are added to the declared ones')
  t.equal(Teapot('short and stout').message, 'short and stout')
  t.throws(() => createError('lower_case', 400, 'x'), TypeError)
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
