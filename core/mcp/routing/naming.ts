/**
 * How several targets share one MCP namespace. Tool and prompt names become
 * `<target>_<name>` (target names cannot contain `_`, so the first `_` splits);
 * resource URIs and URI templates become `mcp-proxy://<target>/<original>`
 * (the original is appended verbatim, so templates keep their `{vars}` and
 * the mapping is reversed by stripping a fixed prefix). Task ids (the tasks
 * utility) become `<target>_<taskId>`, as names do. With one target
 * nothing is renamed.
 */

export const URI_SCHEME = 'mcp-proxy://'

export function prefixName(target: string, name: string): string {
  return target + '_' + name
}

/** `everything_echo` -> ['everything', 'echo']; undefined when there is no `_`. */
export function splitName(name: string): [string, string] | undefined {
  const i = name.indexOf('_')
  if (i <= 0 || i === name.length - 1) return undefined
  return [name.slice(0, i), name.slice(i + 1)]
}

export function markUri(target: string, uri: string): string {
  return URI_SCHEME + target + '/' + uri
}

/** `mcp-proxy://everything/test://static/1` -> ['everything', 'test://static/1']. */
export function unmarkUri(uri: string): [string, string] | undefined {
  if (!uri.startsWith(URI_SCHEME)) return undefined
  const slash = uri.indexOf('/', URI_SCHEME.length)
  if (slash <= URI_SCHEME.length) return undefined
  return [uri.slice(URI_SCHEME.length, slash), uri.slice(slash + 1)]
}

type Caps = Record<string, unknown>

/** Union of capability objects: nested objects merged, booleans OR-ed. */
export function mergeCapabilities(list: readonly Caps[]): Caps {
  const out: Caps = {}
  for (const caps of list) mergeInto(out, caps)
  return out
}

function mergeInto(out: Caps, src: Caps): void {
  for (const k of Object.keys(src)) {
    const v = src[k]
    const cur = out[k]
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
      const next: Caps = cur !== null && typeof cur === 'object' && !Array.isArray(cur) ? (cur as Caps) : {}
      mergeInto(next, v as Caps)
      out[k] = next
    } else if (typeof v === 'boolean') {
      out[k] = cur === true || v
    } else if (cur === undefined) {
      out[k] = v
    }
  }
}

/** Renames one item of a merged list result (`key` is the result field: tools, prompts, resources, resourceTemplates, tasks). */
export function renameListItem(target: string, key: string, item: unknown): unknown {
  const it = item as Record<string, unknown>
  switch (key) {
    case 'tools':
    case 'prompts':
      it.name = prefixName(target, it.name as string)
      break
    // Task ids are the server's opaque strings: named like tools, so that tasks/get and the rest route by them.
    case 'tasks':
      it.taskId = prefixName(target, it.taskId as string)
      break
    case 'resources':
      it.uri = markUri(target, it.uri as string)
      break
    default:
      it.uriTemplate = markUri(target, it.uriTemplate as string)
  }
  return it
}
