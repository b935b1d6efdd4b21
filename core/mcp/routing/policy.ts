/**
 * Per-operation authorization shared by both eras: the plugins' hook
 * `allowMcpOperation` decides which tools, prompts and resources a caller
 * may see in list results and may call. Rules see the upstream (unprefixed)
 * name and the target separately.
 */
import type { RequestContext } from '../../context.ts'
import type { Plugin, McpOperation } from '../../plugin.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { randomBytes } from 'node:crypto'
import { normalizeResourceUri } from './resource-uri.ts'

export type OperationKind = 'tool' | 'prompt' | 'resource'

/** Whether every checker allows `method` on the named item of `target`. No checkers: always. */
export function allowOperation(checkers: readonly Plugin[], ctx: RequestContext, method: string, kind: OperationKind, name: string, target: string): boolean {
  if (checkers.length === 0) return true
  const op: McpOperation =
    kind === 'tool'
      ? { method, tool: { name, target } }
      : kind === 'prompt'
        ? { method, prompt: { name, target } }
        : { method, resource: { uri: name, target } }
  for (const p of checkers) if (!p.allowMcpOperation!(ctx, op)) return false
  return true
}

/** The items of one list result (upstream names) the caller may see. */
export function filterListItems(checkers: readonly Plugin[], ctx: RequestContext, listMethod: string, items: unknown[], target: string): unknown[] {
  if (checkers.length === 0) return items
  switch (listMethod) {
    case 'tools/list':
      return items.filter(t => allowOperation(checkers, ctx, 'tools/call', 'tool', (t as { name: string }).name, target))
    case 'prompts/list':
      return items.filter(p => allowOperation(checkers, ctx, 'prompts/get', 'prompt', (p as { name: string }).name, target))
    // As a read would see it (resource-uri.ts): a URI the gateway would refuse to read is not listed.
    case 'resources/list':
      return items.filter(r => {
        const uri = normalizeResourceUri((r as { uri: string }).uri)
        return 'uri' in uri && allowOperation(checkers, ctx, 'resources/read', 'resource', uri.uri, target)
      })
    default:
      return items.filter(r => allowOperation(checkers, ctx, 'resources/read', 'resource', (r as { uriTemplate: string }).uriTemplate, target))
  }
}

/**
 * A refused call must be indistinguishable from a call to an item that does
 * not exist (docs/authorization.md "Endpoint rules and per-operation rules"). The gateway cannot know how each upstream answers an
 * unknown name — a JSON-RPC error, or a tool result with `isError` — so it
 * asks the upstream itself: the call goes on with a stand-in name that no
 * server has, and the stand-in is replaced by the caller's name in the
 * answer. Resources keep their URI scheme, so scheme-specific handling stays
 * the same.
 */
export function deniedStandIn(original: string, kind: OperationKind): { value: string; restore(message: JsonRpcMessage): JsonRpcMessage } {
  const token = `mcp-proxy-denied-${randomBytes(12).toString('hex')}`
  const scheme = kind === 'resource' ? /^[A-Za-z][A-Za-z0-9+.-]*:/.exec(original)?.[0] : undefined
  const value = scheme === undefined ? token : `${scheme}//${token}`
  const escaped = JSON.stringify(original).slice(1, -1)
  return {
    value,
    restore(message) {
      const text = JSON.stringify(message)
      return text.includes(value) ? (JSON.parse(text.split(value).join(escaped)) as JsonRpcMessage) : message
    },
  }
}
