/**
 * The MCP layer's public face: the /mcp terminal handler and what the admin
 * side reads of it. Everything else in core/mcp/ is imported by path.
 */
export { createMcpEndpoint } from './endpoint.ts'
export type { McpEndpointOptions, GatewayMcpEndpoint, TargetSummary } from './endpoint.ts'
export type { SessionSummary } from './legacy/session-registry.ts'
export type { PooledSummary } from './upstreams/pool.ts'
