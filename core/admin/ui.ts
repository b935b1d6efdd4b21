/**
 * The management page's assets: core/admin/ui/index.html, app.js and app.css,
 * committed as plain source (no bundler, no CDN) and read once when the
 * admin listener is created. The script and stylesheet are separate files so
 * the page runs under a CSP without 'unsafe-inline'.
 */
import { readFileSync } from 'node:fs'
import { packagePath } from '../config.ts'

export interface UiAssets {
  readonly html: string
  readonly js: string
  readonly css: string
}

let cached: UiAssets | undefined

export function loadUiAssets(): UiAssets {
  cached ??= Object.freeze({
    html: readFileSync(packagePath('core/admin/ui/index.html'), 'utf8'),
    js: readFileSync(packagePath('core/admin/ui/app.js'), 'utf8'),
    css: readFileSync(packagePath('core/admin/ui/app.css'), 'utf8'),
  })
  return cached
}

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`)
}

/** The page shown instead of /ui while `admin.token` is set and not yet presented. */
export function loginPage(message?: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mcp-proxy admin: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><link rel="stylesheet" href="/ui/app.css"></head>
<body class="login"><main><h1>mcp-proxy admin</h1>
<form method="post" action="/ui/login">
<label for="token">Admin token (<code>admin.token</code>)</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Sign in</button>
${message !== undefined ? `<p class="error" role="alert">${escapeHtml(message)}</p>` : ''}
</form></main></body></html>`
}
