/**
 * The management page served at /ui. Self-contained HTML (no CDN); it reads
 * the admin API. A fuller UI is tracked separately.
 */
const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mcp-proxy</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2430}
header{background:#1d2430;color:#fff;padding:10px 20px}h1{font-size:18px;margin:0}
main{padding:16px 20px;display:grid;gap:16px}section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 16px}
h2{font-size:15px;margin:0 0 8px}pre{background:#f0f2f5;padding:8px;overflow:auto;max-height:360px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:4px 8px;border-bottom:1px solid #eee}
</style></head><body>
<header><h1>mcp-proxy</h1></header>
<main>
<section><h2>Targets</h2><table id="targets"><thead><tr><th>name</th><th>kind</th><th>state</th></tr></thead><tbody></tbody></table></section>
<section><h2>Sessions</h2><table id="sessions"><thead><tr><th>id</th><th>subject</th><th>age</th><th></th></tr></thead><tbody></tbody></table></section>
<section><h2>Effective configuration (secrets redacted)</h2><pre id="config"></pre></section>
</main>
<script>
async function j(p){const r=await fetch(p);return r.json()}
function td(t){const e=document.createElement('td');e.textContent=t;return e}
async function load(){
  const cfg=await j('/api/config');document.getElementById('config').textContent=JSON.stringify(cfg,null,2)
  const t=await j('/api/targets');const tb=document.querySelector('#targets tbody');tb.replaceChildren()
  for(const x of t){const tr=document.createElement('tr');tr.append(td(x.name),td(x.kind),td(JSON.stringify(x.state??{})));tb.append(tr)}
  const s=await j('/api/sessions');const sb=document.querySelector('#sessions tbody');sb.replaceChildren()
  for(const x of s){const tr=document.createElement('tr');tr.append(td(x.id),td(x.subject??''),td(String(x.ageSeconds??'')));sb.append(tr)}
}
load().catch(e=>console.warn(e));setInterval(()=>load().catch(()=>{}),3000)
</script></body></html>`

export function renderUi (): string {
  return PAGE
}
