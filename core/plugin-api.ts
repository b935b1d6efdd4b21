/**
 * The plugin contract, the one entry of core/ that plugins import (built-ins
 * and third parties alike; the import rules in .dependency-cruiser.cjs hold
 * the built-ins to it). core/index.ts, the package's entry, re-exports it, so
 * a third-party plugin gets the same names from `mcp-idp-gateway`.
 */
export { definePlugin, PLUGIN_API_VERSION } from './plugin.ts'
export type { Plugin, PluginModule, PluginEnv, PluginRegistry, PluginDescription, RouteDef, McpOperation } from './plugin.ts'
export type { RequestContext, ResponseContext, Reply, AuthInfo, AuthInfoInit, McpMessageInfo, Denial } from './context.ts'
// ctx.auth with the caller's token where only the credential layer reads it (never serialised).
export { authInfo } from './context.ts'
export { ProxyError, ERROR_CODES, RPC, createError } from './errors.ts'
export type { ErrorCode, CoreErrorCode, ErrorFactory, ProxyErrorOptions } from './errors.ts'
export { readCapped, BodyTooLargeError } from './read-capped.ts'
// Nested options validated the way the loader validates a plugin's (formats, defaults, config paths in errors).
export { createAjv, formatAjvErrors } from './config.ts'
// A live binding: undefined while tracing is off, so a plugin's span costs one check then.
export { tracer } from './observability/tracing.ts'
export type { Tracer, EndSpan } from './observability/tracing.ts'
