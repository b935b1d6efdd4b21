/**
 * Every relative link in README.md and docs/*.md resolves: the file exists in
 * the repository and, with a #fragment, the target Markdown file has a heading
 * with that anchor (GitHub's slugs). The README's Contents lists every '## '
 * section, so the table of contents cannot rot when sections come and go.
 */
import t from 'tap'
import { readFile, readdir, stat } from 'node:fs/promises'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')

/** Lines outside fenced code blocks, where Markdown links and headings live. */
function prose(text: string): string[] {
  let fence = false
  return text.split('\n').filter(line => {
    if (line.startsWith('```')) {
      fence = !fence
      return false
    }
    return !fence
  })
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to '-', repeats numbered. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>()
  const out = new Set<string>()
  for (const line of prose(text)) {
    const m = /^#{1,6} (.*)$/.exec(line)
    if (!m) continue
    const base = m[1]!
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N}_\- ]/gu, '')
      .replaceAll(' ', '-')
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    out.add(n === 0 ? base : `${base}-${n}`)
  }
  return out
}

/** Link targets of `[label](target)`, inline code spans removed first. */
function links(text: string): string[] {
  return prose(text).flatMap(line => [...line.replace(/`[^`]*`/g, '``').matchAll(/\]\(([^)\s]+)\)/g)].map(m => m[1]!))
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false
  )
}

const docs = (await readdir(join(ROOT, 'docs'))).filter(f => f.endsWith('.md')).map(f => join('docs', f))
const files = ['README.md', ...docs]
const texts = new Map<string, string>()
for (const f of files) texts.set(f, await readFile(join(ROOT, f), 'utf8'))

t.test('relative links and #anchors in README.md and docs/*.md resolve', async t => {
  t.ok(docs.length >= 3, 'the moved sections are in docs/')
  for (const file of files) {
    for (const target of links(texts.get(file)!)) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//')) continue
      const [path, fragment] = target.split('#', 2) as [string, string | undefined]
      const dest = path === '' ? file : relative(ROOT, join(ROOT, dirname(file), path))
      t.ok(!dest.startsWith('..') && (await exists(join(ROOT, dest))), `${file}: ${target} exists`)
      if (fragment === undefined) continue
      const destText = texts.get(dest) ?? (dest.endsWith('.md') ? await readFile(join(ROOT, dest), 'utf8').catch(() => '') : '')
      t.ok(anchors(destText).has(fragment), `${file}: ${target} names a heading`)
    }
  }
})

t.test('the README Contents lists every section', async t => {
  const readme = texts.get('README.md')!
  const lines = prose(readme)
  const start = lines.indexOf('## Contents')
  t.ok(start >= 0, 'README has a Contents section')
  const end = lines.findIndex((l, i) => i > start && l.startsWith('## '))
  const toc = new Set(lines.slice(start, end).flatMap(l => [...l.matchAll(/\]\(#([^)]+)\)/g)].map(m => m[1]!)))
  const sections = lines.filter(l => l.startsWith('## ') && l !== '## Contents')
  t.ok(sections.length >= 10)
  const slugs = anchors(sections.join('\n'))
  for (const s of slugs) t.ok(toc.has(s), `Contents links #${s}`)
})

t.test('the anchor rules match GitHub on headings with code, punctuation and repeats', async t => {
  t.same(
    [...anchors('## Metrics (`GET /metrics`)\n### Revision 2026-07-28 (stateless)\n## A\n## A\n```\n# not a heading\n```')],
    ['metrics-get-metrics', 'revision-2026-07-28-stateless', 'a', 'a-1']
  )
  t.same(links('see [x](a.md#b) and `[y](not-a-link)`\n```\n[z](in-code)\n```'), ['a.md#b'])
})
