/**
 * The version lives in package.json (core/version.ts reads it there for
 * --version, the admin API and serverInfo). Where the docs and manifests must
 * write it out — the tarball name `npm pack` makes, the image tag in the
 * Dockerfile comments, README and docs, the Kustomize `newTag` — it must be
 * that version, and the CHANGELOG has an entry for it below "Unreleased".
 */
import t from 'tap'
import { readFile, readdir } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')
const { version } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }

/** Every place a version is written out: the tarball, the image tag, the Kustomize newTag. */
function written(text: string): string[] {
  const patterns = [/mcp-idp-gateway-(\d+\.\d+\.\d+[\w.-]*?)\.tgz/g, /mcp-idp-gateway:(\d+\.\d+\.\d+[\w.-]*)/g, /^\s*newTag:\s*["']?([\w.-]+)/gm]
  return patterns.flatMap(re => [...text.matchAll(re)].map(m => m[1]!))
}

async function kustomizations(dir: string): Promise<string[]> {
  const out: string[] = []
  for (const e of await readdir(join(ROOT, dir), { withFileTypes: true })) {
    const rel = join(dir, e.name)
    if (e.isDirectory()) out.push(...(await kustomizations(rel)))
    else if (e.name === 'kustomization.yaml') out.push(rel)
  }
  return out
}

t.test("every version written in the README, docs, Dockerfile and Kustomize is package.json's", async t => {
  const docs = (await readdir(join(ROOT, 'docs'))).filter(f => f.endsWith('.md')).map(f => join('docs', f))
  const files = ['README.md', 'Dockerfile', ...docs, ...(await kustomizations('deploy'))]
  let count = 0
  for (const f of files) {
    for (const v of written(await readFile(join(ROOT, f), 'utf8'))) {
      count++
      t.equal(v, version, `${f}: ${v}`)
    }
  }
  t.ok(count >= 5, `found the written versions (${count})`)
})

t.test('the CHANGELOG keeps an Unreleased section and has an entry for the current version', async t => {
  const text = await readFile(join(ROOT, 'CHANGELOG.md'), 'utf8')
  const sections = [...text.matchAll(/^## \[([^\]]+)\]/gm)].map(m => m[1]!)
  t.equal(sections[0], 'Unreleased')
  t.ok(sections.includes(version), `## [${version}] is in CHANGELOG.md`)
})

t.test('the patterns find a stale version', async t => {
  t.same(written('npm i -g ./mcp-idp-gateway-0.0.9.tgz\n  newTag: 0.0.8\nimage mcp-idp-gateway:1.2.3 .'), ['0.0.9', '1.2.3', '0.0.8'])
})
