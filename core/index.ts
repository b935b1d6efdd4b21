/**
 * Public API of the package (`import { definePlugin, ProxyError } from 'mcp-idp-gateway'`):
 * what third-party plugins and embedders may rely on.
 */
export { definePlugin, PLUGIN_API_VERSION, EMPTY_REGISTRY } from './plugin.ts'
export type { Plugin, PluginModule, PluginEnv, PluginRegistry, PluginDescription, RouteDef, McpOperation } from './plugin.ts'
export type { RequestContext, ResponseContext, Reply, AuthInfo, McpMessageInfo, Denial } from './context.ts'
export { ProxyError, ERROR_CODES, RPC, createError } from './errors.ts'
export type { ErrorCode, CoreErrorCode, ErrorFactory, ProxyErrorOptions } from './errors.ts'
export { loadConfig, validateConfig } from './config.ts'
export type { GatewayConfig, LoadedConfig } from './config.ts'
export { startGateway, VERSION } from './gateway.ts'
export type { RunningGateway, StartOptions } from './gateway.ts'
