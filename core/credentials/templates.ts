/**
 * Claim templates of a target's `auth.headers` and `auth.env`: `{sub}`,
 * `{realm_access.roles}`, text around placeholders, `{credential}` for the
 * minted token, `{{` and `}}` for literal braces. Compiled once at start-up
 * (a placeholder that is not a claim path is a config error there), rendered
 * per caller. A claim's value comes from the caller's token, so from anyone
 * who can get one: a value that is missing, holds control characters (a CR/LF
 * would split a header) or is over 4096 bytes refuses the request, naming the
 * claim and never the value.
 */

/** `{credential}`: the token minted by the target's exchange mode. */
export const CREDENTIAL_PLACEHOLDER = 'credential'

/** Bytes a claim's rendered value may hold. */
export const MAX_CLAIM_BYTES = 4096

/** One segment of a claim path: a JSON claim name as IdPs spell them (`sub`, `cognito:groups`, `preferred_username`). */
const SEGMENT = /^[A-Za-z_$][A-Za-z0-9_$:-]*$/

/** C0 controls and DEL: a CR/LF splits a header, a NUL cuts an environment variable. */
const CONTROL = /[\x00-\x1f\x7f]/

/** Any character beyond ASCII: sent in a header as its UTF-8 bytes. */
const NON_ASCII = /[^\x00-\x7f]/

type Part = string | { readonly path: readonly string[]; readonly name: string }

/** A compiled template. */
export interface Template {
  /** The template as configured (for messages). */
  readonly source: string
  readonly parts: readonly Part[]
  /** The claim paths it reads (`realm_access.roles`), without `credential`. */
  readonly claims: readonly string[]
  readonly usesCredential: boolean
  /** True when it reads nothing of the caller (no placeholder). */
  readonly constant: boolean
}

/** Why a caller's claim cannot be rendered (the value itself is never kept). */
export interface ClaimProblem {
  readonly claim: string
  readonly why: 'missing' | 'not a value' | 'control characters' | 'too large'
}

/**
 * Compiles `source`; returns the template, or a message saying what is wrong
 * (the caller prefixes the config path).
 */
export function compileTemplate(source: string): Template | string {
  const parts: Part[] = []
  const claims: string[] = []
  let usesCredential = false
  let text = ''
  for (let i = 0; i < source.length; i++) {
    const c = source[i]!
    if ((c === '{' || c === '}') && source[i + 1] === c) {
      text += c
      i++
      continue
    }
    if (c === '}') return `a lone "}" at ${i} (write "}}" for a literal brace)`
    if (c !== '{') {
      text += c
      continue
    }
    const end = source.indexOf('}', i + 1)
    if (end < 0) return `an unclosed "{" at ${i} (write "{{" for a literal brace)`
    const name = source.slice(i + 1, end).trim()
    const path = name.split('.')
    if (name === '' || !path.every(s => SEGMENT.test(s))) {
      return `placeholder {${source.slice(i + 1, end)}} is not a claim path (like {sub} or {realm_access.roles})`
    }
    if (text !== '') parts.push(text)
    text = ''
    parts.push({ path, name })
    if (name === CREDENTIAL_PLACEHOLDER) usesCredential = true
    else if (!claims.includes(name)) claims.push(name)
    i = end
  }
  if (text !== '') parts.push(text)
  return Object.freeze({ source, parts: Object.freeze(parts), claims: Object.freeze(claims), usesCredential, constant: claims.length === 0 && !usesCredential })
}

/** A claim's value as text: strings as they are, numbers and booleans as text, arrays joined by `,`. */
function valueText(v: unknown): string | undefined {
  if (typeof v === 'string') return v
  if (typeof v === 'number' || typeof v === 'boolean') return String(v)
  if (!Array.isArray(v)) return undefined
  let out = ''
  for (let i = 0; i < v.length; i++) {
    const x = v[i] as unknown
    if (typeof x !== 'string' && typeof x !== 'number' && typeof x !== 'boolean') return undefined
    out += (i === 0 ? '' : ',') + String(x)
  }
  return out
}

function lookup(claims: Readonly<Record<string, unknown>>, path: readonly string[]): unknown {
  let v: unknown = claims
  for (const seg of path) {
    if (v === null || typeof v !== 'object' || Array.isArray(v) || !Object.hasOwn(v, seg)) return undefined
    v = (v as Record<string, unknown>)[seg]
  }
  return v
}

/**
 * Renders `t` for one caller. `credential` fills `{credential}` (checked by
 * the caller to be present when the template uses it). Returns the text, or
 * the first claim that cannot be used.
 */
export function renderTemplate(t: Template, claims: Readonly<Record<string, unknown>>, credential?: string): string | ClaimProblem {
  let out = ''
  for (const p of t.parts) {
    if (typeof p === 'string') {
      out += p
      continue
    }
    if (p.name === CREDENTIAL_PLACEHOLDER) {
      out += credential ?? ''
      continue
    }
    const raw = lookup(claims, p.path)
    if (raw === undefined || raw === null) return { claim: p.name, why: 'missing' }
    const text = valueText(raw)
    if (text === undefined) return { claim: p.name, why: 'not a value' }
    if (CONTROL.test(text)) return { claim: p.name, why: 'control characters' }
    if (text.length > MAX_CLAIM_BYTES / 3 && Buffer.byteLength(text) > MAX_CLAIM_BYTES) return { claim: p.name, why: 'too large' }
    out += text
  }
  return out
}

/**
 * A rendered value as an HTTP header field value: characters beyond ASCII
 * travel as their UTF-8 bytes (Node writes a header string as latin1, one
 * byte per character, and refuses characters above U+00FF), so the target
 * reads back the claim as the IdP wrote it.
 */
export function headerValue(text: string): string {
  return NON_ASCII.test(text) ? Buffer.from(text, 'utf8').toString('latin1') : text
}

export function isClaimProblem(v: string | ClaimProblem): v is ClaimProblem {
  return typeof v !== 'string'
}

/** What a ClaimProblem says, without the value. */
export function describeProblem(p: ClaimProblem): string {
  switch (p.why) {
    case 'missing':
      return `the caller's token has no claim "${p.claim}"`
    case 'not a value':
      return `claim "${p.claim}" is not a string, number, boolean or array of them`
    case 'control characters':
      return `claim "${p.claim}" holds control characters`
    case 'too large':
      return `claim "${p.claim}" is over ${MAX_CLAIM_BYTES} bytes`
  }
}
