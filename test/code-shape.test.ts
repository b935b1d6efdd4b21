/**
 * The guard rails of the code's shape that are not import rules (those are
 * .dependency-cruiser.cjs, pinned by test/dependency-rules.test.ts); see
 * docs/architecture.md, "Rules CI enforces".
 *
 * - MCP protocol literals (`io.modelcontextprotocol/...` strings, the -32000..-32099
 *   error codes) are written in code only in core/mcp/protocol.ts, the vocabulary
 *   file. Found with the TypeScript parser, so comments that cite a code do not count.
 * - Size: no function in core/, plugins/ and bin/ over 120 lines (from its first
 *   line to its closing brace) and no file over 600 lines, except the files in
 *   biome.jsonc's override lists, which may only shrink.
 */
import { readdir, readFile } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import ts from 'typescript'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')
const SHIPPED = ['core', 'plugins', 'bin']

/** The one file where protocol literals are written. */
const VOCABULARY = 'core/mcp/protocol.ts'
const META_PREFIX = 'io.modelcontextprotocol/'
/**
 * core/errors.ts's `RPC` table is the engine's JSON-RPC code table (what
 * `ProxyError.rpcCode` answers on /mcp). Its implementation-defined server
 * codes stay there, these four names and no other; the three MCP-defined
 * ones among them (connection closed, request timeout, resource not found)
 * belong in core/mcp/protocol.ts, so this list may only shrink.
 */
const ENGINE_RPC = { file: 'core/errors.ts', table: 'RPC', names: ['SERVER_ERROR', 'CONNECTION_CLOSED', 'REQUEST_TIMEOUT', 'RESOURCE_NOT_FOUND'] }

const MAX_FUNCTION_LINES = 120
const MAX_FILE_LINES = 600
/**
 * Files allowed over the limits, frozen: biome.jsonc may exempt these and no
 * other. Issue 23 emptied both lists; they stay here so that an exemption can
 * only ever be added by changing this test in review.
 */
const FUNCTION_BASELINE: string[] = []
const FILE_BASELINE: string[] = []

function parse(file: string, text: string): ts.SourceFile {
  const kind = /\.[cm]?js$/.test(file) ? ts.ScriptKind.JS : ts.ScriptKind.TS
  return ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, kind)
}

function lineOf(sf: ts.SourceFile, pos: number): number {
  return sf.getLineAndCharacterOfPosition(pos).line + 1
}

/** True inside `export const RPC = { NAME: ... }` of core/errors.ts, for the frozen names. */
function inEngineRpcTable(file: string, node: ts.Node): boolean {
  if (file !== ENGINE_RPC.file) return false
  for (let n: ts.Node | undefined = node; n !== undefined; n = n.parent) {
    if (!ts.isPropertyAssignment(n)) continue
    const table = n.parent.parent
    return (
      ts.isObjectLiteralExpression(n.parent) &&
      (ts.isVariableDeclaration(table) || ts.isAsExpression(table)) &&
      tableName(table) === ENGINE_RPC.table &&
      ts.isIdentifier(n.name) &&
      ENGINE_RPC.names.includes(n.name.text) &&
      n.initializer === node.parent
    )
  }
  return false
}

function tableName(n: ts.Node): string | undefined {
  let d: ts.Node = n
  while (!ts.isVariableDeclaration(d) && d.parent !== undefined) d = d.parent
  return ts.isVariableDeclaration(d) && ts.isIdentifier(d.name) ? d.name.text : undefined
}

/** `file:line: literal` for every protocol literal written in code (comments aside). */
function protocolLiterals(file: string, text: string): string[] {
  if (file === VOCABULARY) return []
  const sf = parse(file, text)
  const found: string[] = []
  const visit = (node: ts.Node): void => {
    if (ts.isStringLiteralLike(node) || ts.isTemplateLiteralToken(node) || ts.isRegularExpressionLiteral(node)) {
      const value = ts.isRegularExpressionLiteral(node) ? node.text.replaceAll('\\', '') : node.text
      if (value.includes(META_PREFIX)) found.push(`${file}:${lineOf(sf, node.getStart(sf))}: ${node.getText(sf)}`)
    } else if (ts.isPrefixUnaryExpression(node) && node.operator === ts.SyntaxKind.MinusToken && ts.isNumericLiteral(node.operand)) {
      const code = -Number(node.operand.text)
      if (code <= -32000 && code >= -32099 && !inEngineRpcTable(file, node.operand)) {
        found.push(`${file}:${lineOf(sf, node.getStart(sf))}: ${node.getText(sf)}`)
      }
    }
    ts.forEachChild(node, visit)
  }
  visit(sf)
  return found
}

/** Every function's length, first line (modifiers included, its doc comment not) to its closing brace. */
function functionLengths(file: string, text: string): Array<{ line: number; lines: number }> {
  const sf = parse(file, text)
  const out: Array<{ line: number; lines: number }> = []
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
      const line = lineOf(sf, node.getStart(sf))
      out.push({ line, lines: lineOf(sf, node.end) - line + 1 })
    }
    ts.forEachChild(node, visit)
  }
  visit(sf)
  return out
}

function fileLines(text: string): number {
  return text.split('\n').length - (text.endsWith('\n') ? 1 : 0)
}

async function shippedFiles(): Promise<Map<string, string>> {
  const files = new Map<string, string>()
  for (const top of SHIPPED) {
    for (const entry of await readdir(join(ROOT, top), { recursive: true, withFileTypes: true })) {
      if (!entry.isFile() || !/\.(ts|[cm]?js)$/.test(entry.name) || entry.name.endsWith('.d.ts')) continue
      const rel = join(entry.parentPath, entry.name).slice(ROOT.length + 1)
      files.set(rel, await readFile(join(ROOT, rel), 'utf8'))
    }
  }
  return files
}

const files = await shippedFiles()

t.test('protocol literals: written in code only in core/mcp/protocol.ts', async t => {
  t.ok(files.size >= 90, `${files.size} files under ${SHIPPED.join(', ')}`)
  t.ok(files.has(VOCABULARY) && files.has(ENGINE_RPC.file), 'the vocabulary file and the engine code table are where this test looks')
  const found = [...files].flatMap(([file, text]) => protocolLiterals(file, text))
  t.same(found, [], 'no `io.modelcontextprotocol/` string nor -320xx code outside core/mcp/protocol.ts')
  // The vocabulary file does hold them (the walk does see literals there).
  t.ok(protocolLiterals('core/mcp/elsewhere.ts', files.get(VOCABULARY)!).length >= 8, "the same walk finds the vocabulary file's own literals")
})

t.test('protocol literals: the walk finds literals in code and not in comments', async t => {
  const source = [
    '// io.modelcontextprotocol/protocolVersion in a comment, and -32001',
    '/** -32020: header mismatch (io.modelcontextprotocol/x) */',
    "const key = 'io.modelcontextprotocol/logLevel'",
    'const tpl = `io.modelcontextprotocol/${name}`',
    'const re = /^io\\.modelcontextprotocol\\//',
    'type K = "io.modelcontextprotocol/tasks"',
    'const code = -32021',
    'const hex = -0x7D01',
    'const grouped = -32_099',
    'function f (c = -32000) { return c }',
    'const fine = [-32700, -32600, -32602, -31999, -32100, 32001, "io.modelcontext"]',
  ].join('\n')
  t.same(
    protocolLiterals('core/mcp/modern/handler.ts', source).map(f => f.replace(/^[^:]+:/, '')),
    [
      "3: 'io.modelcontextprotocol/logLevel'",
      '4: `io.modelcontextprotocol/${',
      '5: /^io\\.modelcontextprotocol\\//',
      '6: "io.modelcontextprotocol/tasks"',
      '7: -32021',
      '8: -0x7D01',
      '9: -32_099',
      '10: -32000',
    ]
  )
  t.same(protocolLiterals(VOCABULARY, source), [], 'the vocabulary file may write them')
  const errors = [
    'export const RPC = {',
    '  PARSE_ERROR: -32700,',
    '  SERVER_ERROR: -32000,',
    '  RESOURCE_NOT_FOUND: -32002,',
    '  URL_ELICITATION_REQUIRED: -32042,',
    '} as const',
    'export const OTHER = { SERVER_ERROR: -32000 }',
    'const loose = -32001',
  ].join('\n')
  t.same(
    protocolLiterals('core/errors.ts', errors).map(f => f.replace(/^[^:]+:/, '')),
    ['5: -32042', '7: -32000', '8: -32001'],
    "in core/errors.ts only the RPC table's frozen names may hold a -320xx code"
  )
  t.same(protocolLiterals('core/other.ts', errors).length, 5, 'the RPC table is allowed in core/errors.ts only')
})

/** biome.jsonc, comments and trailing commas allowed (TypeScript reads JSONC). */
async function biomeConfig(): Promise<{ overrides?: Array<{ includes?: string[]; linter?: { rules?: Record<string, Record<string, unknown>> } }> }> {
  const { config, error } = ts.parseConfigFileTextToJson('biome.jsonc', await readFile(join(ROOT, 'biome.jsonc'), 'utf8'))
  if (error !== undefined) throw new Error(ts.flattenDiagnosticMessageText(error.messageText, '\n'))
  return config
}

/** The files of the override(s) that turn `group/rule` off. */
function exempted(config: Awaited<ReturnType<typeof biomeConfig>>, group: string, rule: string): string[] {
  return (config.overrides ?? []).filter(o => o.linter?.rules?.[group]?.[rule] === 'off').flatMap(o => o.includes ?? [])
}

function overLimits(all: Map<string, string>): { functions: Map<string, string>; files: Map<string, number> } {
  const functions = new Map<string, string>()
  const long = new Map<string, number>()
  for (const [file, text] of all) {
    const over = functionLengths(file, text).filter(f => f.lines > MAX_FUNCTION_LINES)
    if (over.length > 0) functions.set(file, over.map(f => `line ${f.line}: ${f.lines} lines`).join(', '))
    const n = fileLines(text)
    if (n > MAX_FILE_LINES) long.set(file, n)
  }
  return { functions, files: long }
}

t.test("size: the measure counts a function from its first line to its closing brace, and a file's lines", async t => {
  const body = (n: number) => Array.from({ length: n }, (_, i) => (i % 10 === 3 ? '' : i % 10 === 6 ? '  // a comment' : `  call(${i})`))
  const fn = (head: string, inner: number, tail = '}') => [head, ...body(inner), tail].join('\n')
  const lengths = (src: string) => functionLengths('x.ts', src).map(f => f.lines)
  t.same(lengths(fn('export async function f (a: number): Promise<void> {', 118)), [120], 'blank and comment lines count')
  t.same(lengths(fn('const g = async (a: number) => {', 119)), [121])
  t.same(lengths(fn('class C {\n  method () {', 3, '  }\n}')), [5])
  t.same(lengths(fn('function outer () {\n  const inner = () => {', 2, '  }\n}')), [6, 4], 'a nested function counts in both')
  t.same(lengths('/**\n * doc\n */\nfunction h () {\n  return 1\n}\n'), [3], 'the doc comment is not the function')
  t.equal(fileLines('a\nb\n'), 2)
  t.equal(fileLines('a\nb'), 2)
})

t.test('size: Biome holds the limits on core/, plugins/ and bin/ at error', async t => {
  const config = await biomeConfig()
  const limits = (config.overrides ?? []).find(
    o => o.linter?.rules?.complexity?.noExcessiveLinesPerFunction !== 'off' && o.linter?.rules?.complexity?.noExcessiveLinesPerFunction !== undefined
  )
  t.same(limits?.includes, ['core/**', 'plugins/**', 'bin/**'])
  // Biome counts the lines between the braces (less the lines that start with `}`): 118 of them is a
  // function of 120 lines at most by this test's count, which is the one that decides.
  t.same(limits?.linter?.rules?.complexity, { noExcessiveLinesPerFunction: { level: 'error', options: { maxLines: MAX_FUNCTION_LINES - 2 } } })
  t.same(limits?.linter?.rules?.style, { noExcessiveLinesPerFile: { level: 'error', options: { maxLines: MAX_FILE_LINES } } })
})

t.test('size: the override lists of biome.jsonc only shrink, and hold exactly the files over a limit', async t => {
  const config = await biomeConfig()
  const lists = {
    function: { listed: exempted(config, 'complexity', 'noExcessiveLinesPerFunction'), baseline: FUNCTION_BASELINE },
    file: { listed: exempted(config, 'style', 'noExcessiveLinesPerFile'), baseline: FILE_BASELINE },
  }
  const over = overLimits(files)
  const violating = { function: over.functions, file: over.files }
  for (const kind of ['function', 'file'] as const) {
    const { listed, baseline } = lists[kind]
    const limit = kind === 'function' ? `a function over ${MAX_FUNCTION_LINES} lines` : `over ${MAX_FILE_LINES} lines`
    for (const file of listed) {
      t.ok(baseline.includes(file), `${file} may not join the ${kind}-length list: split it instead (the list only shrinks)`)
      t.ok(
        violating[kind].has(file),
        `${file} is no longer ${limit}: take it off biome.jsonc's ${kind}-length list and off ${kind === 'function' ? 'FUNCTION' : 'FILE'}_BASELINE here`
      )
    }
    for (const [file, what] of violating[kind]) {
      t.ok(listed.includes(file), `${file} is ${limit} (${what}) and not in biome.jsonc's ${kind}-length list`)
    }
    // The frozen copy shrinks too, so a fixed file cannot come back later.
    for (const file of baseline) {
      t.ok(violating[kind].has(file), `${file} is no longer ${limit}: take it off ${kind === 'function' ? 'FUNCTION' : 'FILE'}_BASELINE here`)
    }
  }
})
