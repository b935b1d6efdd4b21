// The import rules of .dependency-cruiser.cjs (docs/architecture.md), run through
// dependency-cruiser's own API on a throwaway tree laid out like the repository:
// every forbidden import is flagged under its rule, and the allowed ones are not.
// A cycle is reported once, on its first edge.
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { cruise } from 'dependency-cruiser'
import extractDepcruiseOptions from 'dependency-cruiser/config-utl/extract-depcruise-options'

const repo = join(dirname(fileURLToPath(import.meta.url)), '..')

// file -> its imports; each comment names the rule the import must trip (none: allowed).
const TREE: Record<string, string[]> = {
  'core/plugin-api.ts': ["export { ProxyError } from './errors.ts'"],
  'core/index.ts': ["export * from './plugin-api.ts'", "export { startGateway } from './gateway.ts'"],
  'core/errors.ts': [],
  'core/context.ts': [
    // Type-only edges count: the engine does not even name an MCP type.
    "import type { Endpoint } from './mcp/endpoint.ts' // engine-knows-no-mcp",
  ],
  'core/plugin.ts': ["import './mcp/protocol.ts' // engine-knows-no-mcp", "import './observability/metrics.ts'"],
  'core/admin/admin.ts': ["import '../targets/stdio.ts'", "import '../observability/metrics.ts'"],
  'core/admin/probes.ts': [],
  'core/gateway.ts': [
    "import './admin/admin.ts'",
    "import './admin/probes.ts'",
    "import './mcp/endpoint.ts'",
    "import './cluster/workers.ts'",
    "import '../test/helpers/harness.ts' // no-tests-in-the-product",
  ],
  'core/plugin-loader.ts': ["import '../plugins/cors/index.ts' // core-knows-no-plugin", "import './credentials/index.ts'"],
  'core/server.ts': [
    "import './admin/admin.ts' // admin-off-the-data-path",
    "import './mcp/endpoint.ts' // engine-knows-no-mcp",
    "import './pipeline.ts'",
    "import './observability/metrics.ts'",
    "import './cluster/client-address.ts'",
  ],
  'core/pipeline.ts': ["import type { Shape } from './admin/admin.ts' // admin-off-the-data-path"],
  'core/config.ts': ["import 'oidc-provider' // no-dev-dependencies-in-the-product", "import 'jose'"],
  'core/mcp/endpoint.ts': [
    "import './legacy/session.ts'",
    "import './modern/handler.ts'",
    "import './protocol.ts'",
    "import './cluster.ts'",
    "import '../admin/admin.ts' // admin-off-the-data-path",
  ],
  'core/mcp/protocol.ts': [],
  'core/mcp/cluster.ts': ["import '../cluster/forward.ts'", "import '../cluster/shared-state.ts'"],
  // MCP reaches core/cluster/ through core/mcp/cluster.ts only (above); a type-only edge past it counts too.
  'core/mcp/upstreams/task-seal.ts': [
    "import '../cluster.ts'",
    "import '../../cluster/seal.ts' // mcp-reaches-the-cluster-through-one-door",
    "import type { Shape } from '../../cluster/shared-state.ts' // mcp-reaches-the-cluster-through-one-door",
  ],
  'core/mcp/routing/router.ts': ["import '../../targets/stdio.ts'", "import '../protocol.ts'"],
  // MCP reaches core/credentials/ through core/mcp/credentials.ts only, and that file through the index only; type-only edges count too.
  'core/mcp/credentials.ts': [
    "import '../credentials/index.ts'",
    "import type { Shape } from '../credentials/target-auth.ts' // credentials-are-entered-by-their-index",
  ],
  'core/mcp/upstreams/pooled-upstream.ts': [
    "import '../credentials.ts'",
    "import type { Shape } from '../../credentials/index.ts' // mcp-reaches-credentials-through-one-door",
  ],
  'core/mcp/upstreams/pool.ts': ["import '../../targets/http.ts'", "import '../routing/router.ts'"],
  'core/mcp/legacy/session.ts': [
    "import './passthrough.ts'",
    "import '../routing/router.ts'",
    "import '../upstreams/pool.ts'",
    "import '../protocol.ts'",
    "import '../modern/handler.ts' // eras-apart",
  ],
  'core/mcp/legacy/passthrough.ts': ["import type { Shape } from '../modern/param-headers.ts' // eras-apart"],
  'core/mcp/modern/handler.ts': [
    "import './param-headers.ts'",
    "import '../routing/router.ts'",
    "import '../upstreams/pool.ts'",
    "import '../cluster.ts'",
    "import '../legacy/passthrough.ts' // eras-apart",
  ],
  'core/mcp/modern/param-headers.ts': ['export type Shape = string'],
  'core/cluster/workers.ts': [
    // The primary is a composition root: it serves the probes of all workers.
    "import '../admin/probes.ts'",
    "import '../observability/metrics.ts'",
    "import '../errors.ts'",
    "import './shared-state.ts'",
    "import '../targets/stdio.ts' // cluster-knows-no-mcp",
    "import type { Endpoint } from '../mcp/endpoint.ts' // cluster-knows-no-mcp",
  ],
  'core/cluster/forward.ts': ["import '../errors.ts'", "import '../admin/probes.ts' // admin-off-the-data-path"],
  'core/cluster/shared-state.ts': ["import type { Readiness } from '../admin/probes.ts' // admin-off-the-data-path"],
  // A worker answers the primary's readiness questions: process management, not the request path.
  'core/cluster/worker.ts': ["import type { Readiness } from '../admin/probes.ts'", "import './shared-state.ts'"],
  'core/cluster/client-address.ts': [],
  'core/cluster/seal.ts': [],
  'core/observability/metrics.ts': ["import '../admin/probes.ts' // admin-off-the-data-path"],
  'core/observability/tracing.ts': [
    "import type { RequestContext } from '../context.ts'",
    "import './metrics.ts'",
    "import type { JsonRpcMessage } from '../targets/types.ts' // observability-is-a-side-system",
    "import '../mcp/protocol.ts' // observability-is-a-side-system",
  ],
  'core/targets/stdio.ts': [
    // Not even the vocabulary file: targets stay free of core/mcp/.
    "import '../mcp/protocol.ts' // targets-are-transports",
    "import './lifecycle.ts'",
    "import './types.ts'",
  ],
  // A cycle made of a value edge and a type-only edge is still a cycle.
  'core/targets/lifecycle.ts': ["import type { Shape } from './stdio.ts' // no-circular"],
  'core/targets/types.ts': [],
  'core/targets/http.ts': [
    "import 'jose' // targets-are-transports",
    "import '../errors.ts'",
    "import type { Shape } from './types.ts'",
    // A transport never learns where its extra headers come from, not even a type.
    "import type { TargetAuth } from '../credentials/index.ts' // targets-are-transports",
    "import type { Shape } from '../credentials/types.ts' // targets-are-transports",
  ],
  // The credential layer: a side system over the engine's errors, config and observability.
  'core/credentials/index.ts': [
    "import './target-auth.ts'",
    "import type { Shape } from './types.ts'",
    "import '../errors.ts'",
    "import type { TargetConfig } from '../config.ts'",
    "import '../observability/metrics.ts'",
    "import 'jose'",
    "import '../mcp/protocol.ts' // credentials-are-a-side-system",
    "import type { UpstreamAttachment } from '../targets/types.ts' // credentials-are-a-side-system",
  ],
  'core/credentials/types.ts': ['export type Shape = string'],
  'core/credentials/target-auth.ts': ["import '../../plugins/cors/index.ts' // core-knows-no-plugin"],
  'plugins/index.ts': ["import './cors/index.ts'", "import './registration/index.ts'"],
  'plugins/cors/provided.ts': ['export type Shape = string'],
  'plugins/cors/index.ts': [
    "import '../../core/plugin-api.ts'",
    "import '../../core/errors.ts' // plugins-use-the-public-contract",
    // The shared OAuth library is no plugin: any plugin may use it.
    "import '../oauth-common/discovery.ts'",
  ],
  'plugins/oauth-common/params.ts': [
    "import '../../core/plugin-api.ts'",
    "import '../../core/errors.ts' // plugins-use-the-public-contract",
    "import type { Shape } from '../cors/provided.ts'",
    "import '../cors/index.ts' // oauth-common-is-no-plugin",
  ],
  'plugins/registration/index.ts': [
    "import './rate-limit.ts'",
    "import '../../core/index.ts'",
    "import type { Shape } from '../cors/provided.ts'",
    // A type import beside a value import does not hide the value import.
    "import type { Other } from '../cors/index.ts'",
    "import '../cors/index.ts' // plugins-through-provides-needs",
  ],
  'plugins/registration/rate-limit.ts': [],
  'plugins/oauth-common/discovery.ts': [],
  'bin/mcp-proxy.ts': [
    "import '../plugins/index.ts'",
    "import '../core/errors.ts'",
    "import '../core/admin/admin.ts'",
    "import '../core/mcp/endpoint.ts'",
    "import 'oidc-provider' // no-dev-dependencies-in-the-product",
  ],
  'bin/dev-idp.ts': ["import 'oidc-provider'", "import './dev-idp-token-exchange.ts'"],
  'bin/dev-idp-token-exchange.ts': ["import 'oidc-provider'"],
  'test/helpers/harness.ts': [],
}

t.test('dependency rules: each forbidden import is flagged by its rule, the allowed ones are not', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-deps-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  await writeFile(
    join(dir, 'package.json'),
    JSON.stringify({
      name: 'fixture',
      type: 'module',
      dependencies: { jose: '*' },
      devDependencies: { 'oidc-provider': '*' },
    })
  )
  // Stand-ins for a production dependency (jose) and a development one (oidc-provider).
  for (const name of ['jose', 'oidc-provider']) {
    await mkdir(join(dir, 'node_modules', name), { recursive: true })
    await writeFile(join(dir, 'node_modules', name, 'package.json'), JSON.stringify({ name, type: 'module', exports: './index.js' }))
    await writeFile(join(dir, 'node_modules', name, 'index.js'), 'export {}\n')
  }
  await writeFile(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', allowImportingTsExtensions: true, noEmit: true },
    })
  )
  const expected: string[] = []
  for (const [file, lines] of Object.entries(TREE)) {
    await mkdir(join(dir, dirname(file)), { recursive: true })
    await writeFile(join(dir, file), lines.join('\n') + '\nexport {}\n')
    for (const line of lines) {
      const rule = / \/\/ (\S+)$/.exec(line)?.[1]
      const target = /'([^']+)'/.exec(line)?.[1]
      if (rule === undefined || target === undefined) continue
      const to = target.startsWith('.') ? join(dirname(file), target) : `node_modules/${target}`
      expected.push(`${rule}: ${file} -> ${to}`)
    }
  }

  const options = await extractDepcruiseOptions(join(repo, '.dependency-cruiser.cjs'))
  const prev = process.cwd()
  // dependency-cruiser resolves the rule paths and tsconfig against the working directory.
  process.chdir(dir)
  try {
    const result = await cruise(['core', 'plugins', 'bin'], { ...options, validate: true })
    if (typeof result.output === 'string') throw new Error('expected a cruise result, got a report')
    const found = result.output.summary.violations
      .filter(v => v.rule.severity === 'error')
      .map(v => `${v.rule.name}: ${v.from} -> ${v.to.replace(/^(node_modules\/[^/]+)\/index\.js$/, '$1')}`)
    t.same(found.sort(), expected.sort())
  } finally {
    process.chdir(prev)
  }
})
