/**
 * `Mcp-Param-*` headers checked against a tool call's arguments before it goes upstream (MCP
 * 2026-07-28 streamable HTTP, "Server Behavior for Custom Headers"): the tool's annotations are
 * learnt from the lists the gateway relays, else fetched with one shared `tools/list` per target.
 */
import type { UpstreamFactory } from '../../targets/types.ts'
import type { ModernContext } from './context.ts'
import { paramHeaderMismatch, type ParamHeader } from './param-headers.ts'
import type { ModernRequest } from './request.ts'
import { forward } from './upstream-call.ts'
import { header } from '../headers.ts'
import { mismatch } from './validation.ts'

/** A tool's `Mcp-Param-*` annotations: learnt from lists, else one shared `tools/list` per target. */
export async function paramHeadersFor(cx: ModernContext, ex: ModernRequest, factory: UpstreamFactory, tool: string): Promise<ParamHeader[]> {
  const known = cx.paramHeaders.lookup(factory.target, tool)
  if (known !== undefined) return known
  let fetching = cx.paramFetches.get(factory.target)
  if (fetching === undefined) {
    fetching = (async () => {
      let cursor: unknown
      const seen = new Set<unknown>()
      do {
        const { res } = await forward(cx, ex, factory, 'tools/list', cursor === undefined ? {} : { cursor })
        const result = res.result as Record<string, unknown> | undefined
        cx.paramHeaders.learn(factory.target, Array.isArray(result?.tools) ? result.tools : [], cursor === undefined)
        seen.add(cursor)
        cursor = result?.nextCursor
      } while (typeof cursor === 'string' && !seen.has(cursor))
    })().finally(() => cx.paramFetches.delete(factory.target))
    cx.paramFetches.set(factory.target, fetching)
  }
  try {
    await fetching
  } catch (err) {
    // The call itself goes to the same upstream and meets the same fault.
    cx.log.debug({ target: factory.target, err: (err as Error).message }, 'tools/list for Mcp-Param headers failed')
  }
  return cx.paramHeaders.lookup(factory.target, tool) ?? []
}

/**
 * Throws 400 / -32020 when the `Mcp-Param-*` headers do not match the arguments (MCP 2026-07-28
 * streamable HTTP, "Server Behavior for Custom Headers"): whoever routed on the header saw
 * what the upstream would not execute.
 */
export async function checkParamHeaders(cx: ModernContext, ex: ModernRequest, factory: UpstreamFactory, tool: string, args: unknown): Promise<void> {
  const annotations = await paramHeadersFor(cx, ex, factory, tool)
  if (annotations.length === 0) return
  const why = paramHeaderMismatch(annotations, args, name => header(ex.ctx, name))
  if (why === undefined) return
  cx.log.info({ target: factory.target, tool, reason: why }, 'Mcp-Param header refused')
  throw mismatch(why)
}
