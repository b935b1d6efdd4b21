/**
 * `Mcp-Param-{Name}` headers of revision 2026-07-28 (streamable HTTP, "Custom
 * Headers from Tool Parameters", SEP-2243): a tool argument whose schema
 * carries `x-mcp-header` is mirrored by the client in a header, so that
 * intermediaries can route on it. The gateway processes the body, so it must
 * check that each header it recognizes matches the body ("Server Validation"):
 * decoded when Base64-wrapped, refused when malformed, different, or absent
 * while the body holds the value. Which headers a tool has comes from its
 * `inputSchema`, learnt from the `tools/list` answers the gateway relays (or
 * fetches itself once per target and `REFRESH_MS`).
 */

/** One annotated argument: the header's name part and the `properties` chain to the value. */
export interface ParamHeader {
  readonly name: string
  readonly path: readonly string[]
}

/** RFC 9110 field-name token (`1*tchar`), which an `x-mcp-header` value must be. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** A plain header value: visible ASCII, space and tab only (RFC 9110 field values). */
const PLAIN = /^[\t\x20-\x7e]*$/
const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/
/** Nesting followed when reading annotations; deeper schemas are not walked (bounded work). */
const MAX_DEPTH = 8

/**
 * The annotated arguments of a tool's `inputSchema`. Only annotations reachable through
 * `properties` keys alone count (the revision makes any other placement invalid).
 */
export function paramHeadersOf(inputSchema: unknown): ParamHeader[] {
  const out: ParamHeader[] = []
  const walk = (schema: unknown, path: string[]): void => {
    if (path.length > MAX_DEPTH || schema === null || typeof schema !== 'object') return
    const props = (schema as { properties?: unknown }).properties
    if (props === null || typeof props !== 'object' || Array.isArray(props)) return
    for (const [key, def] of Object.entries(props as Record<string, unknown>)) {
      if (def === null || typeof def !== 'object') continue
      const name = (def as Record<string, unknown>)['x-mcp-header']
      if (typeof name === 'string' && TOKEN.test(name)) out.push({ name, path: [...path, key] })
      walk(def, [...path, key])
    }
  }
  walk(inputSchema, [])
  return out
}

function valueAt(args: unknown, path: readonly string[]): unknown {
  let v: unknown = args
  for (const key of path) {
    if (v === null || typeof v !== 'object' || !Object.hasOwn(v, key)) return undefined
    v = (v as Record<string, unknown>)[key]
  }
  return v
}

/**
 * Why the request's `Mcp-Param-*` headers do not match `args`, or undefined when they do.
 * `header` reads a request header by its lower-case name.
 */
export function paramHeaderMismatch(annotations: readonly ParamHeader[], args: unknown, header: (lowerName: string) => string | undefined): string | undefined {
  for (const { name, path } of annotations) {
    const label = `Mcp-Param-${name}`
    const raw = header(`mcp-param-${name.toLowerCase()}`)
    const body = valueAt(args, path)
    if (raw === undefined) {
      if (body === undefined || body === null) continue
      return `required ${label} header is missing`
    }
    let value = raw
    // The wrapper marks Base64 only when both markers are there; otherwise the value is literal.
    if (raw.startsWith('=?base64?') && raw.endsWith('?=') && raw.length >= 11) {
      const encoded = raw.slice(9, -2)
      if (!B64.test(encoded)) return `${label} header is not valid Base64`
      value = Buffer.from(encoded, 'base64').toString('utf8')
    } else if (!PLAIN.test(raw)) {
      return `${label} header contains invalid characters`
    }
    if (!matches(value, body)) return `${label} header value '${value}' does not match body value '${body === undefined ? '(absent)' : JSON.stringify(body)}'`
  }
  return undefined
}

function matches(value: string, body: unknown): boolean {
  if (typeof body === 'string') return value === body
  if (typeof body === 'boolean') return value === String(body)
  // Integers are compared as numbers (42.0 equals 42), as the revision recommends.
  if (typeof body === 'number') return value.trim() !== '' && Number(value) === body
  return false
}

/** How long learnt annotations are trusted before a call to a tool not among them refetches them. */
export const REFRESH_MS = 10_000

/** Annotations per target and tool, learnt from `tools/list` answers. */
export class ParamHeaderCache {
  readonly #byTarget = new Map<string, { at: number; tools: Map<string, ParamHeader[]> }>()

  /** Records one page of a target's `tools/list` answer (upstream names). */
  learn(target: string, tools: readonly unknown[], firstPage: boolean): void {
    let entry = this.#byTarget.get(target)
    if (entry === undefined || firstPage) {
      entry = { at: Date.now(), tools: new Map() }
      this.#byTarget.set(target, entry)
    }
    for (const t of tools) {
      if (t === null || typeof t !== 'object') continue
      const { name, inputSchema } = t as { name?: unknown; inputSchema?: unknown }
      if (typeof name !== 'string') continue
      entry.tools.set(name, paramHeadersOf(inputSchema))
    }
  }

  /** The tool's annotations, or undefined when the target's list is unknown or older than REFRESH_MS and lacks the tool. */
  lookup(target: string, tool: string): ParamHeader[] | undefined {
    const entry = this.#byTarget.get(target)
    if (entry === undefined) return undefined
    const found = entry.tools.get(tool)
    if (found !== undefined) return found
    return Date.now() - entry.at < REFRESH_MS ? [] : undefined
  }
}
