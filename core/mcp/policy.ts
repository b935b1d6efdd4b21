/**
 * Per-operation authorization shared by both eras: the plugins' hook
 * `allowMcpOperation` decides which tools, prompts and resources a caller
 * may see in list results and may call. Rules see the upstream (unprefixed)
 * name and the target separately.
 */
import type { RequestContext } from '../context.ts'
import type { Plugin, McpOperation } from '../plugin.ts'

export type OperationKind = 'tool' | 'prompt' | 'resource'

/** Whether every checker allows `method` on the named item of `target`. No checkers: always. */
export function allowOperation (checkers: readonly Plugin[], ctx: RequestContext, method: string, kind: OperationKind, name: string, target: string): boolean {
  if (checkers.length === 0) return true
  const op: McpOperation = kind === 'tool'
    ? { method, tool: { name, target } }
    : kind === 'prompt' ? { method, prompt: { name, target } } : { method, resource: { uri: name, target } }
  for (const p of checkers) if (!p.allowMcpOperation!(ctx, op)) return false
  return true
}

/** The items of one list result (upstream names) the caller may see. */
export function filterListItems (checkers: readonly Plugin[], ctx: RequestContext, listMethod: string, items: unknown[], target: string): unknown[] {
  if (checkers.length === 0) return items
  switch (listMethod) {
    case 'tools/list': return items.filter(t => allowOperation(checkers, ctx, 'tools/call', 'tool', (t as { name: string }).name, target))
    case 'prompts/list': return items.filter(p => allowOperation(checkers, ctx, 'prompts/get', 'prompt', (p as { name: string }).name, target))
    case 'resources/list': return items.filter(r => allowOperation(checkers, ctx, 'resources/read', 'resource', (r as { uri: string }).uri, target))
    default: return items.filter(r => allowOperation(checkers, ctx, 'resources/read', 'resource', (r as { uriTemplate: string }).uriTemplate, target))
  }
}
