/**
 * Public API of the package (`import { definePlugin, ProxyError } from 'mcp-idp-gateway'`):
 * what third-party plugins and embedders may rely on.
 */
export { definePlugin, PLUGIN_API_VERSION } from './plugin.ts'
export type { Plugin, PluginModule, PluginEnv, RouteDef, McpOperation } from './plugin.ts'
export type { RequestContext, ResponseContext, Reply, AuthInfo, McpMessageInfo } from './context.ts'
export { ProxyError, ERROR_CODES, RPC } from './errors.ts'
export type { ErrorCode, ProxyErrorOptions } from './errors.ts'
export { loadConfig, validateConfig } from './config.ts'
export type { GatewayConfig, LoadedConfig } from './config.ts'
export { startGateway, VERSION } from './gateway.ts'
export type { RunningGateway, StartOptions } from './gateway.ts'
