// A third-party plugin, loaded exactly as an npm module or a local file would
// be: a per-subject token-bucket rate limiter for /mcp. Answers 429 with
// Retry-After and a JSON-RPC error body. Plain JavaScript on purpose: a
// plugin needs nothing from this repository but the contract in
// core/plugin.ts.
//
//   mcp:
//     plugins:
//       - builtin: cors
//       - builtin: mcpAuthentication
//       - module: ./plugins/rate-limit.js
//         options: { requestsPerMinute: 120, burst: 20 }
//
// An explicit list names every stage the config asks for: with a
// `mcp.policies.authorization` block, list `builtin: authorization` too (and,
// with a `provider`, `providerBridge` and `registration`); a block no listed
// stage acts on stops start-up with exit 1 naming both.

/** @type {import('../../core/plugin.ts').PluginModule<{requestsPerMinute: number, burst: number, maxSubjects: number}>} */
const rateLimit = {
  name: 'rate-limit',
  engine: '^1',
  optionsSchema: {
    type: 'object',
    additionalProperties: false,
    required: ['requestsPerMinute'],
    properties: {
      requestsPerMinute: { type: 'integer', minimum: 1, description: 'Sustained rate per subject' },
      burst: { type: 'integer', minimum: 1, default: 10, description: 'Bucket size' },
      maxSubjects: { type: 'integer', minimum: 1, default: 100000, description: 'Buckets kept in memory' },
    },
  },
  create (options, env) {
    const perMs = options.requestsPerMinute / 60000
    const buckets = new Map()
    const limited = env.metrics.counter('mcp_proxy_rate_limited_total', 'Requests refused by the rate-limit plugin')
    return {
      name: 'rate-limit',
      onRequest: function rateLimitOnRequest (ctx) {
        if (ctx.path !== '/mcp' || ctx.method === 'OPTIONS') return
        const key = ctx.auth?.subject ?? ctx.req.socket.remoteAddress ?? 'unknown'
        const now = Date.now()
        let b = buckets.get(key)
        if (b === undefined) {
          if (buckets.size >= options.maxSubjects) buckets.delete(buckets.keys().next().value)
          b = { tokens: options.burst, at: now }
          buckets.set(key, b)
        }
        b.tokens = Math.min(options.burst, b.tokens + (now - b.at) * perMs)
        b.at = now
        if (b.tokens >= 1) {
          b.tokens -= 1
          return
        }
        limited.inc()
        ctx.denial = { reason: 'rate-limited' }
        const retryAfter = Math.max(1, Math.ceil((1 - b.tokens) / perMs / 1000))
        return {
          status: 429,
          headers: { 'retry-after': String(retryAfter) },
          body: { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Too many requests: rate limit exceeded' } },
        }
      },
      describe () {
        return { subjects: buckets.size, requestsPerMinute: options.requestsPerMinute, burst: options.burst }
      },
    }
  },
}

export default rateLimit
