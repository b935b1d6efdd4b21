/**
 * Built-in `authorization` plugin: every rule of `mcp.policies.authorization.rules`
 * must hold (docs/authorization.md). Rules that read only `jwt`/`request`
 * gate the whole `/mcp` endpoint in `onRequest` (403); rules that read `mcp.*`
 * are checked per MCP operation through `allowMcpOperation`, which the MCP
 * layer calls to filter list results and to refuse calls. The rule text is
 * never sent to the caller; it is logged and shown in `describe()`.
 */
import { definePlugin, ProxyError, type McpOperation, type Plugin, type PluginEnv, type RequestContext } from '../../core/plugin-api.ts'
import type { ProtectedResource } from '../mcp-authentication/identity.ts'
import { compileRules } from './rules.ts'
import type { CompiledRule, RuleFailure, RuleVariables } from './rules.ts'
import optionsSchema from './schema.json' with { type: 'json' }

const NAME = 'authorization'
const DENIED = 'access denied by authorization policy'
const SCOPE_DENIED = 'the access token does not carry the scope this request needs'
/** Headers a rule never sees: they carry credentials. */
const HIDDEN_HEADERS = new Set(['authorization', 'proxy-authorization', 'cookie'])

interface RequestVars {
  readonly jwt: Readonly<Record<string, unknown>>
  readonly request: Readonly<Record<string, unknown>>
}

function headerView(raw: RequestContext['req']['headers']): Record<string, string> {
  // Null prototype: a header literally named `__proto__` stays a plain own key.
  const out = Object.create(null) as Record<string, string>
  for (const [name, value] of Object.entries(raw)) {
    const k = name.toLowerCase()
    if (value === undefined || HIDDEN_HEADERS.has(k)) continue
    Object.defineProperty(out, k, { value: Array.isArray(value) ? value.join(', ') : String(value), enumerable: true })
  }
  return Object.freeze(out)
}

/** `jwt` and `request` are the same for every check of one request: built once. */
function requestVars(ctx: RequestContext): RequestVars {
  const cached = ctx.state.get(NAME) as RequestVars | undefined
  if (cached !== undefined) return cached
  const vars: RequestVars = {
    jwt: ctx.auth?.claims ?? Object.freeze({}),
    request: Object.freeze({ headers: headerView(ctx.req.headers) }),
  }
  ctx.state.set(NAME, vars)
  return vars
}

function quoteParam(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"')
}

/** Options as validated by schema.json. */
export interface AuthorizationOptions {
  rules?: string[]
}

export interface RuleDescription {
  readonly index: number
  readonly text: string
  readonly kind: 'endpoint' | 'operation'
}

export default definePlugin<AuthorizationOptions>({
  name: NAME,
  engine: '^1',
  optionsSchema: optionsSchema as Record<string, unknown>,
  policy: 'authorization',
  summary(options) {
    const n = (options.rules ?? []).length
    return n === 0 ? 'no rules: allows every request' : `${n} rule${n === 1 ? '' : 's'} over the token claims and MCP operations, every one must hold`
  },
  check(options: AuthorizationOptions, configPath: string): void {
    compileRules(options.rules ?? [], `${configPath}.rules`)
  },
  create(options: AuthorizationOptions, env: PluginEnv): Plugin {
    const set = compileRules(options.rules ?? [], `${env.configPath}.rules`)
    const denials = env.metrics.counter('mcp_proxy_authorization_denials_total', 'Authorization denials by rule')
    for (let i = 0; i < (options.rules ?? []).length; i++) denials.init({ rule: String(i) })

    // Optional: without an authentication plugin listed before, the challenge names no scope.
    const scopes = (env.provided.protectedResource as ProtectedResource | undefined)?.scopesSupported ?? []
    const metadataUrl = `${env.baseUrl.replace(/\/+$/, '')}/.well-known/oauth-protected-resource/mcp`
    // MCP authorization "Scope challenge" (RFC 6750 §3.1): tell the client which scopes to ask for.
    const stepUpChallenge =
      'Bearer error="insufficient_scope"' +
      (scopes.length > 0 ? `, scope="${quoteParam(scopes.join(' '))}"` : '') +
      `, resource_metadata="${quoteParam(metadataUrl)}"`

    const description: readonly RuleDescription[] = Object.freeze(set.rules.map(r => Object.freeze({ index: r.index, text: r.text, kind: r.kind })))
    env.log.debug({ endpoint: set.endpoint.length, operation: set.operation.length }, 'authorization rules compiled')

    function logDenial(ctx: RequestContext, failure: RuleFailure, level: 'info' | 'debug', extra?: Record<string, unknown>): void {
      const { rule, outcome } = failure
      const fields: Record<string, unknown> = { rule: rule.index, ruleText: rule.text, reason: outcome.reason, ...extra }
      if (outcome.reason === 'evaluation error') fields.error = String((outcome.error as Error | undefined)?.message ?? outcome.error)
      ctx.log[level](
        fields,
        outcome.reason === 'group overage' ? 'authorization denied: group overage (token has _claim_names/hasgroups instead of groups)' : 'authorization denied'
      )
    }

    function recordDenial(ctx: RequestContext, rule: CompiledRule): void {
      ctx.denial = { rule: rule.index, reason: rule.text }
      denials.inc({ rule: String(rule.index) })
    }

    return {
      name: NAME,

      onRequest: function authorizeEndpoint(ctx: RequestContext): void {
        if (ctx.path !== '/mcp' || ctx.method === 'OPTIONS' || set.endpoint.length === 0) return
        const failure = set.firstFailure(set.endpoint, requestVars(ctx))
        if (failure === undefined) return
        logDenial(ctx, failure, 'info')
        recordDenial(ctx, failure.rule)
        if (failure.rule.aboutScopes) {
          throw new ProxyError('MCPP_ERR_FORBIDDEN', 403, SCOPE_DENIED, {
            oauthError: 'insufficient_scope',
            headers: { 'www-authenticate': stepUpChallenge },
          })
        }
        throw new ProxyError('MCPP_ERR_FORBIDDEN', 403, DENIED, { oauthError: 'forbidden' })
      },

      // Only present when some rule reads `mcp.*`: without it the gateway may pass a
      // single HTTP target through untouched instead of inspecting every message.
      allowMcpOperation:
        set.operation.length === 0
          ? undefined
          : function authorizeMcpOperation(ctx: RequestContext, op: McpOperation): boolean {
              const base = requestVars(ctx)
              const vars: RuleVariables = {
                jwt: base.jwt,
                request: base.request,
                mcp: { method: op.method, tool: op.tool, prompt: op.prompt, resource: op.resource },
              }
              const failure = set.firstFailure(set.operation, vars)
              if (failure === undefined) return true
              const what = op.tool?.name ?? op.prompt?.name ?? op.resource?.uri
              // The MCP layer filters list results by asking about the call each item allows
              // (op.method `tools/call` while answering `tools/list`), so the request's own
              // method tells a list filter from a refused call. Filtering is routine and per
              // item: debug, not counted as a denial.
              if (op.method.endsWith('/list') || ctx.mcp?.method?.endsWith('/list') === true) {
                logDenial(ctx, failure, 'debug', { method: op.method, item: what })
              } else {
                logDenial(ctx, failure, 'info', { method: op.method, item: what })
                recordDenial(ctx, failure.rule)
              }
              return false
            },

      describe() {
        return { rules: description }
      },
    }
  },
})
