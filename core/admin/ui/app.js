// mcp-proxy management page. Plain browser JavaScript, no framework, no
// external assets; served from the admin listener under a CSP without
// 'unsafe-inline', so every handler is attached here and every value from the
// API is written as text (textContent), never as HTML.
'use strict'

const FAST_MS = 2000
const SLOW_MS = 15000
const SVG = 'http://www.w3.org/2000/svg'

const $ = sel => document.querySelector(sel)

/** Builds an element; children are nodes or strings (inserted as text). */
function el(tag, attrs, ...children) {
  const e = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue
    if (k === 'class') e.className = v
    else if (k.startsWith('data-')) e.setAttribute(k, String(v))
    else if (k === 'title') e.title = String(v)
    else e[k] = v
  }
  for (const c of children) {
    if (c === undefined || c === null) continue
    e.append(c instanceof Node ? c : document.createTextNode(String(c)))
  }
  return e
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag)
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v))
  return e
}

function setStatus(text, isError) {
  const s = $('#status')
  s.textContent = text
  s.className = isError ? 'error' : 'muted'
}

/** A message about something the operator did; stays until the next one. */
function notice(text, isError) {
  const n = $('#notice')
  n.textContent = text
  n.className = isError ? 'error' : 'notice'
}

async function api(path, init) {
  const res = await fetch(path, { credentials: 'same-origin', headers: { accept: 'application/json' }, ...init })
  if (res.status === 401) {
    // admin.token is set and the cookie is gone: back to the sign-in page.
    window.location.assign('/ui')
    throw new Error('admin token required')
  }
  const body = await res.json().catch(() => null)
  if (!res.ok) {
    const msg = body?.error_description ? body.error_description : `HTTP ${res.status}`
    const err = new Error(msg)
    err.status = res.status
    throw err
  }
  return body
}

function ago(ms) {
  if (ms === null || ms === undefined) return ''
  return duration(Math.max(0, Date.now() - ms)) + ' ago'
}

function duration(ms) {
  const s = Math.round(ms / 1000)
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`
  const h = Math.floor(s / 3600)
  return `${h}h ${Math.floor((s % 3600) / 60)}m`
}

function time(ms) {
  return new Date(ms).toLocaleTimeString()
}

function fillBody(table, rows, columns, emptyText) {
  const tb = table.querySelector('tbody')
  if (rows.length === 0) {
    tb.replaceChildren(el('tr', {}, el('td', { class: 'empty', colSpan: columns }, emptyText)))
  } else {
    tb.replaceChildren(...rows)
  }
}

function pre(value) {
  return el('pre', {}, JSON.stringify(value, null, 2))
}

function dl(target, pairs) {
  const items = []
  for (const [k, v] of pairs) items.push(el('dt', {}, k), el('dd', {}, v === undefined || v === null || v === '' ? '—' : v))
  target.replaceChildren(...items)
}

// ---- header --------------------------------------------------------------

function renderOverview(o) {
  $('#version').textContent = `v${o.version}`
  const r = $('#ready')
  r.textContent = o.ready ? 'ready' : 'not ready'
  r.className = 'badge ' + (o.ready ? 'ready' : 'notready')
  r.title = o.reasons.join('\n')
  $('#uptime').textContent = `up ${duration(o.uptimeSeconds * 1000)} · ${o.sessions} session(s) · ${o.children} child process(es)`
  const box = $('#readiness')
  box.replaceChildren(
    o.ready
      ? el('p', {}, 'Ready: every plugin has what it needs (/readyz answers 200).')
      : el('div', {}, el('p', { class: 'error' }, 'Not ready (/readyz answers 503):'), el('ul', {}, ...o.reasons.map(x => el('li', {}, x))))
  )
}

// ---- targets -----------------------------------------------------------------

/** A target's credentials (its `auth` block): mode, what it sets (names only), cached, last failure. */
function credentialCell(c) {
  if (!c) return el('td', { class: 'muted creds' }, 'static')
  const sets = [...c.headerNames.map(n => `header ${n}`), ...c.envNames.map(n => `env ${n}`)]
  const failure = c.lastFailure ? el('div', { class: 'error creds-failure' }, `last failure: ${c.lastFailure.reason} (${ago(c.lastFailure.at)})`) : null
  return el(
    'td',
    { class: 'creds' },
    el('strong', { class: 'creds-mode' }, c.mode),
    el('div', { class: 'mono creds-sets' }, sets.length > 0 ? sets.join(', ') : '—'),
    el('div', { class: 'muted creds-cached' }, `${c.cached} cached`),
    failure
  )
}

function renderTargets(targets) {
  const rows = targets.map(t =>
    el(
      'tr',
      { 'data-target': t.name },
      el('td', {}, el('strong', {}, t.name)),
      el('td', {}, t.share === 'subject' ? `${t.kind}, shared per subject (${t.pooled.length} pooled)` : t.kind),
      el('td', { class: 'mono' }, t.command || ''),
      el('td', { class: 'num' }, t.sessions),
      el('td', { class: 'mono' }, t.pids.join(', ')),
      el('td', { class: 'num' }, t.started),
      el('td', { class: 'num' }, t.failures),
      el('td', { class: t.lastError ? 'error' : 'muted' }, t.lastError ? `${t.lastError} (${ago(t.lastErrorAt)})` : '—'),
      credentialCell(t.credentials)
    )
  )
  fillBody($('#targets'), rows, 9, 'no targets configured')
}

// ---- sessions ----------------------------------------------------------------

async function endSession(handle, subject, button) {
  // Ending a session cannot be undone: the client's next request gets 404 and it must initialize again.
  if (!window.confirm(`End session ${handle}… of ${subject}? Its upstream processes stop and the client must start a new session.`)) return
  button.disabled = true
  try {
    await api(`/api/sessions/${encodeURIComponent(handle)}`, { method: 'DELETE' })
    notice(`session ${handle}… ended`)
  } catch (err) {
    notice(`could not end session ${handle}…: ${err.message}`, true)
  }
  await refreshFast()
}

function renderSessions(sessions) {
  $('#session-count').textContent = `(${sessions.length})`
  const rows = sessions.map(s => {
    const button = el('button', { type: 'button', class: 'danger end-session', 'data-handle': s.handle, title: 'End this session' }, 'End')
    button.addEventListener('click', () => {
      void endSession(s.handle, s.subject ?? '(anonymous)', button)
    })
    return el(
      'tr',
      { 'data-handle': s.handle },
      el('td', { class: 'mono' }, `${s.id}…`),
      el('td', {}, s.subject ?? '(anonymous)'),
      el('td', {}, (s.targets || []).join(', ')),
      el('td', { class: 'mono' }, s.protocolVersion || ''),
      el('td', {}, duration(s.ageSeconds * 1000)),
      el('td', {}, `${duration(s.idleSeconds * 1000)} ago`),
      el('td', { class: 'mono' }, (s.pids || []).join(', ')),
      el('td', { class: 'num' }, s.inFlight ?? 0),
      el('td', {}, button)
    )
  })
  fillBody($('#sessions'), rows, 9, 'no live sessions')
}

// ---- requests and chart -----------------------------------------------------------

function renderRequests(list) {
  const rows = list
    .slice(0, 100)
    .map(r =>
      el(
        'tr',
        { 'data-status': r.status },
        el('td', {}, time(r.at)),
        el('td', {}, r.method),
        el('td', { class: 'mono' }, r.path),
        el('td', { class: 'mono' }, r.mcpMethod || ''),
        el('td', { class: 'mono tool' }, r.tool || ''),
        el('td', { class: 'num' }, r.status),
        el('td', { class: `decision ${r.decision}` }, r.decision),
        el('td', {}, r.reason || ''),
        el('td', {}, r.subject || ''),
        el('td', { class: 'mono' }, r.sessionId ? `${r.sessionId}…` : ''),
        el('td', { class: 'num' }, r.durationMs.toFixed(1))
      )
    )
  fillBody($('#requests'), rows, 11, 'no requests yet')
}

function renderChart(stats) {
  const chart = $('#chart')
  const W = 640
  const H = 160
  const L = 34
  const R = 44
  const T = 10
  const B = 20
  const n = stats.buckets.length
  const bw = (W - L - R) / n
  const maxCount = Math.max(1, ...stats.buckets.map(b => b.count))
  const maxLat = Math.max(1, ...stats.buckets.map(b => b.avgMs || 0))
  const y = (v, max) => T + (H - T - B) * (1 - v / max)
  const nodes = [
    svg('line', { class: 'axis', x1: L, y1: H - B, x2: W - R, y2: H - B }),
    svg('line', { class: 'axis', x1: L, y1: T, x2: L, y2: H - B }),
    svg('line', { class: 'axis', x1: W - R, y1: T, x2: W - R, y2: H - B }),
  ]
  const label = (x, yy, text, anchor) => {
    const t = svg('text', { x, y: yy, 'text-anchor': anchor })
    t.textContent = text
    return t
  }
  nodes.push(label(L - 4, T + 8, String(maxCount), 'end'), label(L - 4, H - B, '0', 'end'))
  nodes.push(label(W - R + 4, T + 8, `${maxLat.toFixed(maxLat < 10 ? 1 : 0)}ms`, 'start'))
  nodes.push(label(L, H - 6, '-5 min', 'start'), label(W - R, H - 6, 'now', 'end'))
  const points = []
  stats.buckets.forEach((b, i) => {
    const x = L + i * bw + 1
    if (b.count > 0) {
      const ok = b.count - b.errors
      const hOk = ((H - T - B) * ok) / maxCount
      const hErr = ((H - T - B) * b.errors) / maxCount
      const top = y(b.count, maxCount)
      const rect = svg('rect', { class: 'bar', x, y: top + hErr, width: Math.max(1, bw - 2), height: hOk })
      const title = svg('title', {})
      title.textContent = `${time(b.start)}: ${b.count} request(s), ${b.errors} error(s), avg ${b.avgMs.toFixed(1)} ms, max ${b.maxMs.toFixed(1)} ms`
      rect.append(title)
      nodes.push(rect)
      if (b.errors > 0) nodes.push(svg('rect', { class: 'bar err', x, y: top, width: Math.max(1, bw - 2), height: hErr }))
    }
    if (b.avgMs !== null) points.push(`${(x + bw / 2).toFixed(1)},${y(b.avgMs, maxLat).toFixed(1)}`)
  })
  if (points.length > 1) nodes.push(svg('polyline', { class: 'lat', points: points.join(' ') }))
  else if (points.length === 1) {
    const [px, py] = points[0].split(',')
    nodes.push(svg('circle', { class: 'lat', cx: px, cy: py, r: 2 }))
  }
  chart.replaceChildren(...nodes)
  const total = stats.buckets.reduce((a, b) => a + b.count, 0)
  $('#chart-scale').textContent = ` · ${total} request(s) in 5 min, bars per ${stats.bucketSeconds}s`
}

// ---- auth, OAuth, plugins, config ------------------------------------------------------

function renderOAuth(o) {
  const ks = o.keySet
  if (ks) {
    dl($('#keyset'), [
      ['location', ks.url],
      ['loaded', String(ks.loaded)],
      ['kids', (ks.kids || []).join(', ')],
      ['last fetch', ks.lastFetchAt],
      ['last success', ks.lastSuccessAt],
      ['fetches', ks.fetches],
      ['last error', ks.lastError],
    ])
  } else {
    dl($('#keyset'), [['state', 'no mcpAuthentication policy configured']])
  }
  const d = o.discovery
  if (d) {
    dl($('#discovery'), [
      ['loaded', String(d.loaded)],
      ['fetched at', d.fetchedAt ? new Date(d.fetchedAt).toISOString() : null],
      ['fetches', d.fetches],
      ['last error', d.lastError],
    ])
  } else {
    dl($('#discovery'), [['state', 'no provider bridge configured']])
  }
  const docs = Object.entries(o.documents)
  $('#oauth-docs').replaceChildren(
    ...(docs.length === 0
      ? [el('p', { class: 'muted' }, 'The gateway serves no OAuth documents (no mcpAuthentication policy).')]
      : docs.map(([path, doc], i) => el('details', { open: i < 2 }, el('summary', { class: 'mono' }, `GET ${path}`), pre(doc))))
  )
}

function renderPlugins(plugins) {
  $('#plugins').replaceChildren(
    ...(plugins.length === 0
      ? [el('p', { class: 'muted' }, 'No plugins: /mcp is open to anyone who can reach it.')]
      : plugins.map((p, i) =>
          el(
            'details',
            {},
            el('summary', {}, `${i + 1}. ${p.name}`, p.routes.length ? el('span', { class: 'muted' }, ` · ${p.routes.map(r => r.path).join(', ')}`) : null),
            pre(p.state)
          )
        ))
  )
}

// ---- try it -----------------------------------------------------------------------

function renderTry(result) {
  const out = $('#try-output')
  out.replaceChildren(
    ...result.steps.map(s => {
      const ok = s.status >= 200 && s.status < 300 && s.error === undefined
      return el(
        'li',
        {},
        el('strong', {}, s.step),
        ' ',
        el('span', { class: ok ? 'decision allowed' : 'decision error' }, s.status === 0 ? 'no answer' : `HTTP ${s.status}`),
        el('span', { class: 'muted' }, ` · ${s.durationMs} ms`),
        s.challenge ? el('div', { class: 'mono muted' }, `WWW-Authenticate: ${s.challenge}`) : null,
        s.result !== undefined ? el('details', { open: s.step === 'tools/call' }, el('summary', {}, 'result'), pre(s.result)) : null,
        s.error !== undefined ? pre(s.error) : null
      )
    })
  )
  const list = result.steps.find(s => s.step === 'tools/list')
  const tools = Array.isArray(list?.result?.tools) ? list.result.tools : null
  if (tools) {
    const select = $('#try-tool')
    const current = select.value
    select.replaceChildren(
      el('option', { value: '' }, '(list tools only)'),
      ...tools.map(t => el('option', { value: t.name, title: t.description || '' }, t.name))
    )
    if (tools.some(t => t.name === current)) select.value = current
  }
  $('#try-status').textContent = result.sessionEnded ? 'session ended' : ''
}

async function runTry(ev) {
  ev.preventDefault()
  const status = $('#try-status')
  let args
  try {
    args = JSON.parse($('#try-args').value || '{}')
    if (args === null || typeof args !== 'object' || Array.isArray(args)) throw new Error('not an object')
  } catch (err) {
    status.textContent = `arguments: ${err.message}`
    return
  }
  const tool = $('#try-tool').value
  const body = { token: $('#try-token').value }
  if (tool !== '') {
    body.tool = tool
    body.arguments = args
  }
  const button = $('#try-run')
  button.disabled = true
  status.textContent = 'running…'
  try {
    renderTry(
      await api('/api/try', { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json' }, body: JSON.stringify(body) })
    )
  } catch (err) {
    status.textContent = err.message
  } finally {
    button.disabled = false
  }
}

// ---- polling ----------------------------------------------------------------------------

let fastBusy = false
async function refreshFast() {
  if (fastBusy) return
  fastBusy = true
  try {
    const [overview, targets, sessions, requests, stats] = await Promise.all([
      api('/api/overview'),
      api('/api/targets'),
      api('/api/sessions'),
      api('/api/requests'),
      api('/api/stats'),
    ])
    renderOverview(overview)
    renderTargets(targets)
    renderSessions(sessions)
    renderRequests(requests)
    renderChart(stats)
    setStatus(`updated ${new Date().toLocaleTimeString()}`)
  } catch (err) {
    setStatus(`refresh failed: ${err.message}`, true)
  } finally {
    fastBusy = false
  }
}

async function refreshSlow() {
  try {
    const [oauth, plugins, config] = await Promise.all([api('/api/oauth'), api('/api/plugins'), api('/api/config')])
    renderOAuth(oauth)
    renderPlugins(plugins)
    $('#config').textContent = JSON.stringify(config, null, 2)
  } catch (err) {
    setStatus(`refresh failed: ${err.message}`, true)
  }
}

function start() {
  $('#try-form').addEventListener('submit', ev => {
    void runTry(ev)
  })
  void refreshFast()
  void refreshSlow()
  setInterval(() => {
    if (!document.hidden) void refreshFast()
  }, FAST_MS)
  setInterval(() => {
    if (!document.hidden) void refreshSlow()
  }, SLOW_MS)
}

document.addEventListener('DOMContentLoaded', start)
