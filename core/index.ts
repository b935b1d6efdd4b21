/**
 * Public API of the package (`import { definePlugin, ProxyError } from 'mcp-idp-gateway'`):
 * the plugin contract (core/plugin-api.ts) for third-party plugins, and what
 * embedders need to load a config and start the gateway.
 */
export * from './plugin-api.ts'
export { EMPTY_REGISTRY } from './plugin.ts'
export { loadConfig, validateConfig } from './config.ts'
export type { GatewayConfig, LoadedConfig } from './config.ts'
export { startGateway, VERSION } from './gateway.ts'
export type { RunningGateway, StartOptions } from './gateway.ts'
