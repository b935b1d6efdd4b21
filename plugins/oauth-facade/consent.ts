/**
 * The consent page: a plain HTML form (no script, works without JavaScript)
 * that names the client, its verified domain for a metadata-document client,
 * where the browser will be sent and the scopes, with approve and deny
 * buttons. The MCP security best practices ("Confused deputy problem") make
 * this a MUST for a proxy that uses one static client id at the IdP.
 *
 * CSRF: the form carries a random token that must equal both the one in a
 * cookie set with the page and the one sealed into the transaction; another
 * site can neither read the page nor set the cookie. The page may not be
 * framed (clickjacking).
 */
import type { OutgoingHttpHeaders } from 'node:http'

export interface ConsentView {
  readonly clientName: string | undefined
  readonly clientId: string
  readonly kind: 'cimd' | 'dcr' | 'preregistered'
  /** CIMD: the document's host, verified by fetching it over https. */
  readonly verifiedHost: string | undefined
  readonly redirectHost: string
  readonly scopes: readonly string[]
  readonly user: string | undefined
  readonly action: string
  readonly tx: string
  readonly csrf: string
}

export const CSRF_COOKIE = 'mcp_facade_csrf'
export const REMEMBER_COOKIE = 'mcp_facade_consent'

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!)
}

/** Headers of every page the facade renders: never cached, never framed, no script. */
export const PAGE_HEADERS: OutgoingHttpHeaders = Object.freeze({
  'content-type': 'text/html; charset=utf-8',
  'cache-control': 'no-store',
  pragma: 'no-cache',
  'x-frame-options': 'DENY',
  'content-security-policy': "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'",
  'referrer-policy': 'no-referrer',
  'x-content-type-options': 'nosniff',
})

export function renderConsent(v: ConsentView): string {
  const name = v.clientName ?? (v.kind === 'cimd' ? v.verifiedHost! : 'An unnamed application')
  const who =
    v.kind === 'cimd'
      ? `<p>Its identity was verified at <strong id="verified-host">${escapeHtml(v.verifiedHost!)}</strong>.</p>`
      : v.kind === 'dcr'
        ? '<p>This application registered itself; its name is not verified.</p>'
        : "<p>This application was registered by the gateway's operator.</p>"
  const scopes =
    v.scopes.length > 0 ? `<ul id="scopes">${v.scopes.map(s => `<li>${escapeHtml(s)}</li>`).join('')}</ul>` : '<p id="scopes">No particular scopes.</p>'
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>Allow access?</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:3rem auto;padding:0 1rem}button{font-size:1rem;padding:.5rem 1.2rem;margin-right:.5rem}code{word-break:break-all}</style>
</head><body>
<h1>Allow <span id="client-name">${escapeHtml(name)}</span> to use the MCP gateway${v.user !== undefined ? ` as <span id="user">${escapeHtml(v.user)}</span>` : ''}?</h1>
${who}
<p>Client id: <code id="client-id">${escapeHtml(v.clientId)}</code></p>
<p>After your decision you will be sent to <strong id="redirect-host">${escapeHtml(v.redirectHost)}</strong>.</p>
<p>Requested scopes:</p>
${scopes}
<form method="post" action="${escapeHtml(v.action)}">
<input type="hidden" name="tx" value="${escapeHtml(v.tx)}">
<input type="hidden" name="csrf" value="${escapeHtml(v.csrf)}">
<button type="submit" name="decision" value="approve" id="approve">Allow</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button>
</form>
</body></html>
`
}

export function renderError(title: string, message: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(title)}</title></head>
<body><h1>${escapeHtml(title)}</h1><p id="error">${escapeHtml(message)}</p></body></html>
`
}

/** One cookie's value from a Cookie header, or undefined. */
export function readCookie(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined
  for (const part of header.split(';')) {
    const i = part.indexOf('=')
    if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim()
  }
  return undefined
}

/**
 * A cookie's name as the gateway sets and reads it: on https with the
 * `__Host-` prefix (RFC 6265bis §4.1.3.2), which browsers accept only with
 * Secure, Path=/ and no Domain, so neither a sibling subdomain nor a plain
 * http page on the same host can set or shadow it. Plain http (loopback
 * development) keeps the bare name: browsers refuse `__Host-` without Secure.
 */
export function cookieName(name: string, secure: boolean): string {
  return secure ? `__Host-${name}` : name
}

/** Set-Cookie for `name` (bare: the prefix is added here on https, where the path is always /). */
export function cookie(name: string, value: string, o: { path: string; maxAge: number; secure: boolean }): string {
  return o.secure
    ? `${cookieName(name, true)}=${value}; Path=/; Max-Age=${o.maxAge}; Secure; HttpOnly; SameSite=Lax`
    : `${name}=${value}; Path=${o.path}; Max-Age=${o.maxAge}; HttpOnly; SameSite=Lax`
}
