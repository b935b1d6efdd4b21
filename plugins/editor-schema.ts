/**
 * The schema editors use (schemas/editor.schema.json): core's config schema
 * with every built-in's `mcp.policies` block filled in from the plugin's own
 * schema, so one file validates and completes a whole config. Core validates
 * plugin blocks through the plugins and never reads this file.
 *
 * Editors see the raw file, before `${NAME}` expansion: wherever a type,
 * format, pattern or enum would reject a reference (`port: ${PORT}`,
 * `issuer: ${ISSUER}`), a `${…}` string is accepted too. The root has no
 * `$id`, so an editor resolves the file where it found it.
 *
 * Regenerate after a schema change: `npm run -s schema:editor`
 * (test/editor-schema.test.ts fails while the committed file is stale).
 */
import { readFile, writeFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import type { PluginRegistry } from '../core/plugin.ts'
import { packagePath } from '../core/config.ts'
import { builtins } from './index.ts'

type Schema = Record<string, unknown>

/** A string holding at least one `${…}` reference. */
export const ENV_REFERENCE: Readonly<Schema> = Object.freeze({
  type: 'string',
  pattern: '\\$\\{[^}]+\\}',
  description: 'A ${NAME} reference, expanded from the environment when the gateway loads the file.',
})

const ANNOTATIONS = ['description', 'default', 'title']

/** Whether a value other than a string (or a constrained string) is expected, so a raw `${…}` would be rejected. */
function rejectsReference(s: Schema): boolean {
  const type = s.type
  return (type !== undefined && type !== 'string') || s.format !== undefined || s.pattern !== undefined || s.enum !== undefined || s.const !== undefined
}

/** A copy of `schema` where every leaf that would reject a `${…}` string also accepts one. */
export function allowReferences(schema: Schema): Schema {
  const out: Schema = { ...schema }
  if (isSchema(out.properties)) {
    out.properties = Object.fromEntries(Object.entries(out.properties).map(([k, v]) => [k, isSchema(v) ? allowReferences(v) : v]))
  }
  if (isSchema(out.items)) out.items = allowReferences(out.items)
  if (isSchema(out.additionalProperties)) out.additionalProperties = allowReferences(out.additionalProperties)
  if (out.properties !== undefined || out.items !== undefined || out.type === 'object' || out.type === 'array') return out
  if (!rejectsReference(out)) return out
  const outer: Schema = {}
  const inner: Schema = {}
  for (const [k, v] of Object.entries(out)) (ANNOTATIONS.includes(k) ? outer : inner)[k] = v
  outer.anyOf = [inner, ENV_REFERENCE]
  return outer
}

function isSchema(v: unknown): v is Schema {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

/** Core's schema with the registry's policy blocks, references allowed everywhere. */
export function editorSchema(core: Schema, registry: PluginRegistry = builtins): Schema {
  const root = structuredClone(core)
  const mcp = (root.properties as Record<string, Schema>).mcp!
  const policies = (mcp.properties as Record<string, Schema>).policies!
  const blocks: Record<string, Schema> = {}
  for (const mod of Object.values(registry.modules)) {
    if (mod.policy === undefined || mod.optionsSchema === undefined) continue
    // `$id`/`$schema` would make a nested resource with its own base URI; the block is plain inline here.
    const { $id: _id, $schema: _schema, ...block } = structuredClone(mod.optionsSchema)
    blocks[mod.policy] = block
  }
  policies.properties = blocks
  policies.additionalProperties = false
  return {
    $schema: root.$schema,
    $comment: "Generated from schemas/config.schema.json and the built-in plugins' schemas (plugins/editor-schema.ts): do not edit.",
    ...allowReferences(root),
  }
}

/** The editor schema as written to disk. */
export async function renderEditorSchema(): Promise<string> {
  const core = JSON.parse(await readFile(packagePath('schemas/config.schema.json'), 'utf8')) as Schema
  return JSON.stringify(editorSchema(core), null, 2) + '\n'
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await writeFile(packagePath('schemas/editor.schema.json'), await renderEditorSchema())
}
