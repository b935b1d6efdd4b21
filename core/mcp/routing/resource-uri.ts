/**
 * The resource URI the per-operation rules see and the upstream is sent.
 *
 * A client may spell one resource many ways (`demo://r/a/../b`, `DEMO://r/b`,
 * `demo://r/a/%2e%2e/b`, a tab inside the string...). The official SDKs read
 * `params.uri` with the WHATWG URL parser (TypeScript: `new URL(uri)`; Python:
 * pydantic's `AnyUrl`, the same standard) and act on its serialization, so a
 * rule that saw the client's spelling could allow one resource while the
 * upstream serves another. With rules configured the gateway therefore
 * parses the URI with the same parser, lets the rules see its serialization
 * and forwards exactly that string: what was checked is what the upstream
 * acts on, whichever way it compares (re-parsing a serialization gives the
 * same serialization). WHATWG leaves some things to the server that some
 * servers then decode themselves into paths (`%2F`, `%5C`, `%00`, and a
 * backslash, which is not a separator in non-special schemes such as
 * `demo:` but is in a Windows path): such a URI is refused rather than
 * guessed at. A string that does not parse is refused too (-32602), never
 * passed on unnormalized. Only when rules are configured: without them the
 * gateway does not read URIs (hot path).
 */

/** Encoded path separators and NUL, and a literal backslash (see above), before any query or fragment. */
const AMBIGUOUS = /%2f|%5c|%00|\\/i

export type ResourceUri = { readonly uri: string } | { readonly invalid: string }

/** The normalized form of `uri`, or why it is refused. */
export function normalizeResourceUri(uri: string): ResourceUri {
  let href: string
  try {
    href = new URL(uri).href
  } catch {
    return { invalid: 'not a valid URI' }
  }
  const end = href.search(/[?#]/)
  if (AMBIGUOUS.test(end < 0 ? href : href.slice(0, end))) return { invalid: 'it holds an encoded path separator, NUL or backslash' }
  return { uri: href }
}
