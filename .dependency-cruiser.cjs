/**
 * Import rules of mcp-proxy (docs/architecture.md, with the diagram of the
 * parts), checked in CI by `npm run deps`; test/dependency-rules.test.ts pins
 * what each rule flags and lets through. bin/ is the composition root and may
 * import anything; test/ and bench/ are not checked here. Every rule is an
 * error: a broken rule fails CI.
 * @type {import('dependency-cruiser').IConfiguration}
 */
module.exports = {
  forbidden: [
    {
      name: 'core-knows-no-plugin',
      comment: 'core/ is the gateway; plugins are handed to it (plugins/index.ts, by bin/), never imported by it.',
      severity: 'error',
      from: { path: '^core/' },
      to: { path: '^plugins/' },
    },
    {
      name: 'targets-are-transports',
      comment:
        "core/targets/ moves bytes to MCP servers: it knows no MCP routing, no admin, no plugin, no tokens. What a caller's credential adds (headers, child environment) reaches a transport as an opaque UpstreamAttachment from the MCP layer, never from core/credentials/.",
      severity: 'error',
      from: { path: '^core/targets/' },
      to: { path: ['^plugins/', '^core/mcp/', '^core/admin', '^core/credentials/', '^node_modules/jose/'] },
    },
    {
      name: 'credentials-are-a-side-system',
      comment:
        "core/credentials/ (what each target receives for each caller: token exchange, on-behalf-of, claim templates, static secrets) is asked by the MCP layer and knows neither it nor the transports: it imports neither core/mcp/ nor core/targets/ (plugins/ are out of reach of all of core/, core-knows-no-plugin). It uses the engine's errors, config types and observability only.",
      severity: 'error',
      from: { path: '^core/credentials/' },
      to: { path: ['^core/mcp/', '^core/targets/'] },
    },
    {
      name: 'credentials-are-entered-by-their-index',
      comment:
        'Everything under core/mcp/ reaches core/credentials/ through core/credentials/index.ts alone, type-only imports included: the broker, the config checks and the contract are one entry, so the credential layer can be re-cut inside without touching the MCP layer.',
      severity: 'error',
      from: { path: '^core/mcp/' },
      to: { path: '^core/credentials/', pathNot: '^core/credentials/index\\.ts$' },
    },
    {
      name: 'plugins-use-the-public-contract',
      comment:
        'A plugin, built-in or not, imports from core/ only its public entry (core/plugin-api.ts, or core/index.ts for embedders). The registry files beside the plugin folders (plugins/index.ts, the editor schema generator) are composed by bin/ and are not held to it.',
      severity: 'error',
      from: { path: '^plugins/[^/]+/' },
      to: { path: '^core/', pathNot: '^core/(plugin-api|index)\\.ts$' },
    },
    {
      name: 'plugins-through-provides-needs',
      comment:
        'A plugin reaches another plugin through provides/needs, not by importing it: only the type of a provided value may be imported. Only the registry (plugins/index.ts) imports them all. plugins/oauth-common/ is a library, not a plugin: any plugin may use it.',
      severity: 'error',
      from: { path: '^plugins/([^/]+)/', pathNot: '^plugins/oauth-common/' },
      to: { path: '^plugins/', pathNot: ['^plugins/$1/', '^plugins/oauth-common/'], dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'oauth-common-is-no-plugin',
      comment:
        'plugins/oauth-common/ holds the OAuth helpers several plugins share (parameters, discovery, metadata, redirect URIs, rate limit, client metadata): a plain library with no PluginModule, which uses no plugin (only the type of a provided value) and is not the registry.',
      severity: 'error',
      from: { path: '^plugins/oauth-common/' },
      to: { path: '^plugins/', pathNot: '^plugins/oauth-common/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'eras-apart',
      comment:
        'The two MCP eras (core/mcp/legacy/: sessions, 2024-11-05..2025-11-25; core/mcp/modern/: stateless 2026-07-28) never import each other: what both need lives in the shared core/mcp/ folders (routing/, upstreams/, protocol.ts), so one era can change or go without touching the other.',
      severity: 'error',
      from: { path: '^core/mcp/(legacy|modern)/' },
      to: { path: '^core/mcp/(legacy|modern)/', pathNot: '^core/mcp/$1/' },
    },
    {
      name: 'engine-knows-no-mcp',
      comment:
        'The engine (core/*.ts: server, context, pipeline, routes, plugin contract, errors, config, ...) is a plain HTTP gateway: MCP is one terminal handler handed to it. Only the composition files (core/gateway.ts, core/index.ts) import core/mcp/.',
      severity: 'error',
      from: { path: '^core/[^/]+$', pathNot: '^core/(gateway|index)\\.ts$' },
      to: { path: '^core/mcp/' },
    },
    {
      name: 'cluster-knows-no-mcp',
      comment:
        'core/cluster/ (primary and workers, shared state, sealing, relay, client address) moves processes and requests, whatever protocol they carry: it imports neither core/mcp/ (MCP reaches the cluster through core/mcp/cluster.ts, never the reverse) nor core/targets/ (what it needs from a transport is handed to it by the composition root).',
      severity: 'error',
      from: { path: '^core/cluster/' },
      to: { path: ['^core/mcp/', '^core/targets/'] },
    },
    {
      name: 'mcp-reaches-the-cluster-through-one-door',
      comment:
        'Everything under core/mcp/ reaches core/cluster/ (shared state, relay, sealing) through core/mcp/cluster.ts alone, type-only imports included: what MCP needs of the deployment is one object (McpCluster) built by the composition root, so a change to the cluster touches one MCP file, and the endpoint and handlers take one option instead of a handful.',
      severity: 'error',
      from: { path: '^core/mcp/', pathNot: '^core/mcp/cluster\\.ts$' },
      to: { path: '^core/cluster/' },
    },
    {
      name: 'mcp-reaches-credentials-through-one-door',
      comment:
        'Everything under core/mcp/ reaches core/credentials/ (what each target receives for each caller) through core/mcp/credentials.ts alone, type-only imports included: the caller built from the request, the attachment handed to a transport, the pre-flight and the refusals live in one file, so the credential layer can change behind one MCP file.',
      severity: 'error',
      from: { path: '^core/mcp/', pathNot: '^core/mcp/credentials\\.ts$' },
      to: { path: '^core/credentials/' },
    },
    {
      name: 'observability-is-a-side-system',
      comment:
        "core/observability/ (metrics, labels, process metrics, tracing, the access log) is called by every part and knows none of them: it imports neither core/targets/ nor core/mcp/ (the shapes it records are its own or the engine's).",
      severity: 'error',
      from: { path: '^core/observability/' },
      to: { path: ['^core/targets/', '^core/mcp/'] },
    },
    {
      name: 'admin-off-the-data-path',
      comment:
        "The admin listener, UI and probes look at the gateway; nothing on the request path (engine, /mcp, targets, observability, and the cluster files a request goes through: relay, session ids, client address, shared state, sealing) calls into them. Only the composition roots (core/gateway.ts, core/index.ts, bin/) wire them in, and the cluster's process management (primary and workers: the primary serves the probes of all workers and asks them for readiness).",
      severity: 'error',
      from: {
        path: '^core/',
        pathNot: ['^core/admin/', '^core/(gateway|index)\\.ts$', '^core/cluster/(?!(forward|session-ids|client-address|shared-state|seal)\\.ts$)'],
      },
      to: { path: '^core/admin/' },
    },
    {
      name: 'no-tests-in-the-product',
      comment: 'Shipped code never imports test helpers or fixtures.',
      severity: 'error',
      from: { path: '^(core|plugins|bin)/' },
      to: { path: '^(test|bench)/' },
    },
    {
      name: 'no-dev-dependencies-in-the-product',
      comment: 'The package installs production dependencies only; the dev IdP and the demo are not shipped (package.json "files").',
      severity: 'error',
      from: { path: '^(core|plugins|bin)/', pathNot: '^bin/(dev-idp|dev-idp-token-exchange|demo)\\.ts$' },
      to: { dependencyTypes: ['npm-dev'], dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'not-to-unresolvable',
      comment: 'An import that resolves to nothing fails at start-up, and the rules above cannot see where it points.',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
    {
      name: 'no-circular',
      comment:
        'An import cycle makes start-up order depend on which module is imported first, and ties two modules into one that can be neither read nor changed alone. Type-only edges count too: a type cycle is the same knot in the design, and the next value import turns it into a runtime one.',
      severity: 'error',
      from: { path: '^(core|plugins|bin)/' },
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^dist/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default', 'types'],
      extensions: ['.ts', '.js', '.mjs', '.cjs', '.json', '.d.ts'],
    },
    skipAnalysisNotInRules: true,
  },
}
