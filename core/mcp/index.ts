/**
 * The MCP session layer: the /mcp terminal handler (see endpoint.ts) and the
 * pieces other modules reuse (revisions, naming).
 */
export { createMcpEndpoint } from './endpoint.ts'
export type { McpEndpointOptions, GatewayMcpEndpoint, SessionSummary, TargetSummary } from './endpoint.ts'
export { SESSION_REVISIONS, LATEST_SESSION_REVISION, MODERN_REVISION, eraOf, negotiateRevision } from './revision.ts'
export type { Era, SessionRevision } from './revision.ts'
export { prefixName, splitName, markUri, unmarkUri, URI_SCHEME } from './naming.ts'
export { GATEWAY_INFO } from './session.ts'
export { createModernHandler, META, MODERN_RPC, SUPPORTED_VERSIONS } from './modern.ts'
export type { ModernHandler, ModernOptions } from './modern.ts'
export { UpstreamPool } from './modern-pool.ts'
export type { PooledSummary, PoolOptions } from './modern-pool.ts'
export { allowOperation, filterListItems } from './policy.ts'
export { SharedUpstream, sharedFactory } from './shared-upstream.ts'
