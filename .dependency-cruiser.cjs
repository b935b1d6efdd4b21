/**
 * Import rules of mcp-proxy (README "Architecture"), checked in CI by
 * `npm run deps`. bin/ is the composition root and may import anything;
 * test/ and bench/ are not checked here.
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
      comment: 'core/targets/ moves bytes to MCP servers: it knows no MCP routing, no admin, no plugin, no tokens.',
      severity: 'error',
      from: { path: '^core/targets/' },
      to: { path: ['^plugins/', '^core/mcp/', '^core/admin', '^node_modules/jose/'] },
    },
    {
      name: 'plugins-use-the-public-contract',
      comment: 'A plugin, built-in or not, imports from core/ only its public entry (core/plugin-api.ts, or core/index.ts for embedders). The registry files beside the plugin folders (plugins/index.ts, the editor schema generator) are composed by bin/ and are not held to it.',
      severity: 'error',
      from: { path: '^plugins/[^/]+/' },
      to: { path: '^core/', pathNot: '^core/(plugin-api|index)\\.ts$' },
    },
    {
      name: 'plugins-through-provides-needs',
      comment: 'A plugin reaches another plugin through provides/needs, not by importing it: only the type of a provided value may be imported. Only the registry (plugins/index.ts) imports them all. plugins/oauth-common/ is a library, not a plugin: any plugin may use it.',
      severity: 'error',
      from: { path: '^plugins/([^/]+)/', pathNot: '^plugins/oauth-common/' },
      to: { path: '^plugins/', pathNot: ['^plugins/$1/', '^plugins/oauth-common/'], dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'oauth-common-is-no-plugin',
      comment: 'plugins/oauth-common/ holds the OAuth helpers several plugins share (parameters, discovery, metadata, redirect URIs, rate limit, client metadata): a plain library with no PluginModule, which uses no plugin (only the type of a provided value) and is not the registry.',
      severity: 'error',
      from: { path: '^plugins/oauth-common/' },
      to: { path: '^plugins/', pathNot: '^plugins/oauth-common/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'admin-off-the-data-path',
      comment: 'The admin listener and UI look at the gateway; the request path (server, pipeline, /mcp, targets) never calls into them.',
      severity: 'error',
      from: { path: ['^core/(mcp|targets)/', '^core/(server|pipeline)\\.ts$'] },
      to: { path: '^core/admin' },
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
      from: { path: '^(core|plugins|bin)/', pathNot: '^bin/(dev-idp|demo)\\.ts$' },
      to: { dependencyTypes: ['npm-dev'], dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'not-to-unresolvable',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
    {
      name: 'no-circular',
      comment: 'An import cycle makes start-up order depend on which module is imported first.',
      severity: 'warn',
      from: { path: '^(core|plugins|bin)/' },
      to: { circular: true, viaOnly: { dependencyTypesNot: ['type-only'] } },
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
