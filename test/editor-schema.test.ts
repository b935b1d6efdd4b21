/**
 * The schema for editors (issue 18 item 4): schemas/editor.schema.json is
 * current, every schema is ajv strict-mode clean and documents every
 * property, the examples carry the modeline, and the real yaml-language-server
 * (over LSP on stdio) flags a broken config and completes `mcp.` keys.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { readFile, readdir } from 'node:fs/promises'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { createRequire } from 'node:module'
import { Ajv } from 'ajv'
import addFormatsModule from 'ajv-formats'
import { HEADER_VALUE, packagePath, parseConfigText, validateConfig } from '../core/config.ts'
import { builtins } from '../plugins/index.ts'
import { renderEditorSchema } from '../plugins/editor-schema.ts'

const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv
type Schema = Record<string, unknown>

const CORE = 'schemas/config.schema.json'
const EDITOR = 'schemas/editor.schema.json'
const PLUGINS = ['authorization', 'cors', 'mcp-authentication', 'oauth-facade', 'provider-bridge', 'registration'].map(p => `plugins/${p}/schema.json`)
const readJson = async (rel: string): Promise<Schema> => JSON.parse(await readFile(packagePath(rel), 'utf8')) as Schema

t.test('the committed editor schema is the generated one (npm run -s schema:editor)', async t => {
  t.equal(await readFile(packagePath(EDITOR), 'utf8'), await renderEditorSchema())
})

t.test('every schema compiles in ajv strict mode; the root has no unresolvable $id; plugin schemas have one', async t => {
  for (const rel of [CORE, EDITOR, ...PLUGINS]) {
    const ajv = new Ajv({ strict: true, allErrors: true })
    addFormats(ajv)
    ajv.addFormat('header-value', HEADER_VALUE)
    ajv.addKeyword({ keyword: 'errorMessage', schemaType: 'string' })
    const schema = await readJson(rel)
    t.doesNotThrow(() => ajv.compile(schema), rel)
    if (rel.startsWith('plugins/')) t.equal(schema.$id, rel, `${rel} has an $id`)
    else t.notOk(schema.$id, `${rel}: no $id (an editor resolves it where it found it)`)
  }
})

t.test('every property has a description, and a default unless it is required or says what unset means', async t => {
  const missing: string[] = []
  const walk = (rel: string, s: Schema, at: string): void => {
    const props = (s.properties ?? {}) as Record<string, Schema | boolean>
    const required = (s.required ?? []) as string[]
    for (const [k, v] of Object.entries(props)) {
      if (typeof v !== 'object') continue
      const p = `${at}.${k}`
      const description = typeof v.description === 'string' ? v.description : ''
      if (description === '') missing.push(`${rel} ${p}: no description`)
      else if (v.default === undefined && !required.includes(k) && !/Unset|Default|Required|Exactly one of|Without it/.test(description))
        missing.push(`${rel} ${p}: no default`)
      walk(rel, v, p)
      if (typeof v.items === 'object') walk(rel, v.items as Schema, `${p}[]`)
    }
  }
  for (const rel of [CORE, ...PLUGINS]) walk(rel, await readJson(rel), '')
  t.same(missing, [])
})

t.test('every example and every README and docs/*.md YAML block starts with the modeline; the examples are valid configs', async t => {
  const files = (await readdir(packagePath('examples')))
    .filter(f => f.endsWith('.yaml'))
    .map(f => `examples/${f}`)
    .concat('examples/demo/config.yaml', 'examples/demo/facade.yaml')
  for (const rel of files) {
    const text = await readFile(packagePath(rel), 'utf8')
    const depth = rel.split('/').length - 1
    t.equal(text.split('\n')[0], `# yaml-language-server: $schema=${'../'.repeat(depth)}schemas/editor.schema.json`, rel)
    const env = new Proxy({}, { get: (_t, k) => (typeof k === 'string' && /ISSUER/.test(k) ? 'https://idp.example/app/' : 'x') })
    await t.resolves(validateConfig(parseConfigText(text, env as NodeJS.ProcessEnv).data, builtins), rel)
  }
  const docs = (await readdir(packagePath('docs'))).filter(f => f.endsWith('.md')).map(f => `docs/${f}`)
  const readme = (await Promise.all(['README.md', ...docs].map(f => readFile(packagePath(f), 'utf8')))).join('\n')
  const blocks = [...readme.matchAll(/```yaml\n([\s\S]*?)```/g)].map(m => m[1]!).filter(b => /^mcp:/m.test(b))
  t.ok(blocks.length > 0)
  for (const b of blocks) t.match(b, /^# yaml-language-server: \$schema=/, b.slice(0, 80))
})

/** A minimal LSP client over stdio (Content-Length framing, JSON-RPC 2.0). */
function startLanguageServer(): {
  request: (method: string, params: unknown) => Promise<unknown>
  notify: (method: string, params: unknown) => void
  diagnostics: (uri: string, ok: (d: Diagnostic[]) => boolean) => Promise<Diagnostic[]>
  close: () => void
} {
  // The package's server module itself: its extensionless bin/ script is loaded as
  // CommonJS-detected ESM, which tap's process tracking (it wraps spawn) turns into a require cycle.
  const server = join(createRequire(import.meta.url).resolve('yaml-language-server/package.json'), '..', 'out', 'src', 'server.js')
  const child = spawn(process.execPath, [server, '--stdio'], {
    env: { ...process.env, YAML_LANGUAGE_SERVER_VERSION: 'test' },
    stdio: ['pipe', 'pipe', 'ignore'],
  })
  let nextId = 1
  const pending = new Map<number, (v: unknown) => void>()
  const published = new Map<string, Diagnostic[]>()
  const waiters: Array<() => void> = []
  const send = (msg: unknown): void => {
    const body = Buffer.from(JSON.stringify({ jsonrpc: '2.0', ...(msg as object) }))
    child.stdin.write(`Content-Length: ${body.length}\r\n\r\n`)
    child.stdin.write(body)
  }
  let buf = Buffer.alloc(0)
  child.stdout.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d])
    for (;;) {
      const end = buf.indexOf('\r\n\r\n')
      if (end < 0) return
      const len = Number(/Content-Length: (\d+)/i.exec(buf.subarray(0, end).toString())?.[1])
      if (buf.length < end + 4 + len) return
      const msg = JSON.parse(buf.subarray(end + 4, end + 4 + len).toString()) as {
        id?: number
        method?: string
        params?: { uri: string; diagnostics: Diagnostic[]; items?: unknown[] }
        result?: unknown
      }
      buf = buf.subarray(end + 4 + len)
      if (msg.method !== undefined && msg.id !== undefined) {
        // Server requests: workspace/configuration wants one settings object per item.
        const items = (msg.params as { items?: unknown[] } | undefined)?.items
        send({ id: msg.id, result: msg.method === 'workspace/configuration' ? (items ?? []).map(() => SETTINGS.yaml) : null })
      } else if (msg.method === 'textDocument/publishDiagnostics') {
        published.set(msg.params!.uri, msg.params!.diagnostics)
        for (const w of waiters.splice(0)) w()
      } else if (msg.id !== undefined) {
        pending.get(msg.id)?.(msg.result)
        pending.delete(msg.id)
      }
    }
  })
  return {
    request: (method, params) =>
      new Promise(resolve => {
        const id = nextId++
        pending.set(id, resolve)
        send({ id, method, params })
      }),
    notify: (method, params) => send({ method, params }),
    diagnostics: async (uri, ok) => {
      // A failure guard only: the server publishes within a second or two.
      const giveUp = Date.now() + 20000
      for (;;) {
        const d = published.get(uri)
        if (d !== undefined && ok(d)) return d
        if (Date.now() > giveUp) throw new Error(`no matching diagnostics for ${uri}; last: ${JSON.stringify(d)}`)
        await new Promise<void>(resolve => {
          waiters.push(resolve)
          setTimeout(resolve, 1000).unref()
        })
      }
    },
    close: () => {
      child.kill()
    },
  }
}

interface Diagnostic {
  range: { start: { line: number } }
  message: string
}
const SETTINGS = { yaml: { validate: true, completion: true, hover: true, schemaStore: { enable: false }, schemas: {} } }

t.test('yaml-language-server validates and completes with the modeline', async t => {
  const lsp = startLanguageServer()
  t.teardown(lsp.close)
  const root = pathToFileURL(packagePath('.')).href
  await lsp.request('initialize', {
    processId: process.pid,
    rootUri: root,
    capabilities: { workspace: { configuration: true }, textDocument: { completion: { completionItem: { snippetSupport: false } }, publishDiagnostics: {} } },
  })
  lsp.notify('initialized', {})
  lsp.notify('workspace/didChangeConfiguration', { settings: SETTINGS })
  const open = (uri: string, text: string): void => lsp.notify('textDocument/didOpen', { textDocument: { uri, languageId: 'yaml', version: 1, text } })

  // A broken config beside the examples (the document needs no file; the modeline resolves against its URI).
  const broken = pathToFileURL(packagePath('examples/broken.yaml')).href
  const brokenText = [
    '# yaml-language-server: $schema=../schemas/editor.schema.json',
    'mcp:',
    '  port: abc',
    '  targets:',
    '    - name: a',
    '      stdio: { cmd: node }',
    '  bogusKey: 1',
    '  policies:',
    '    mcpAuthentication:',
    '      mode: sometimes',
    '',
  ].join('\n')
  open(broken, brokenText)
  const lines = (d: Diagnostic[]): number[] => d.map(x => x.range.start.line)
  const found = await lsp.diagnostics(broken, d => lines(d).includes(2))
  t.ok(lines(found).includes(2), `port: abc flagged: ${JSON.stringify(found.map(d => d.message))}`)
  t.ok(lines(found).includes(6), 'an unknown key is flagged')
  t.ok(lines(found).includes(9), 'a bad value in a plugin block is flagged')

  // The example with ${…} values in format-checked fields (issuer, audiences) passes.
  const example = pathToFileURL(packagePath('examples/cloud-idp.yaml')).href
  open(example, await readFile(packagePath('examples/cloud-idp.yaml'), 'utf8'))
  t.same(await lsp.diagnostics(example, () => true), [], 'cloud-idp.yaml has no diagnostics')
  const refs = pathToFileURL(packagePath('examples/refs.yaml')).href
  open(
    refs,
    '# yaml-language-server: $schema=../schemas/editor.schema.json\nmcp:\n  port: ${PORT}\n  baseUrl: ${BASE_URL}\n  targets:\n    - name: a\n      mcp: { url: "${UPSTREAM}" }\n'
  )
  t.same(await lsp.diagnostics(refs, () => true), [], '${…} where an integer or a URI is expected passes')

  // Completion of mcp. keys, and of the built-in policy blocks.
  const completing = pathToFileURL(packagePath('examples/completing.yaml')).href
  open(completing, '# yaml-language-server: $schema=../schemas/editor.schema.json\nmcp:\n  \n  policies:\n    \n')
  const labels = async (line: number, character: number): Promise<string[]> => {
    const r = (await lsp.request('textDocument/completion', { textDocument: { uri: completing }, position: { line, character } })) as
      | { items: Array<{ label: string }> }
      | Array<{ label: string }>
    return (Array.isArray(r) ? r : r.items).map(i => i.label)
  }
  const mcpKeys = await labels(2, 2)
  for (const k of ['port', 'host', 'targets', 'limits', 'session']) t.ok(mcpKeys.includes(k), `completes mcp.${k}: ${mcpKeys.join(', ')}`)
  const policyKeys = await labels(4, 4)
  for (const k of ['cors', 'mcpAuthentication', 'authorization']) t.ok(policyKeys.includes(k), `completes mcp.policies.${k}: ${policyKeys.join(', ')}`)
  await lsp.request('shutdown', null)
  lsp.notify('exit', null)
})
