/**
 * Per-target call metrics, measured where each upstream call is tracked in
 * flight (calls.ts, used by both eras): `mcp_proxy_upstream_duration_seconds`
 * and `mcp_proxy_upstream_requests_total` by method, `mcp_proxy_tool_calls_total`
 * and `mcp_proxy_tool_call_duration_seconds` by tool. Metric handles are bound
 * once per label set, so a call costs a map lookup and a clock read.
 */
import type { Metrics, Counter, Histogram, CounterHandle, HistogramHandle } from '../../observability/metrics.ts'
import type { JsonRpcMessage } from '../../targets/types.ts'
import { methodLabel, AdvertisedNames } from '../../observability/metric-labels.ts'

/** `outcome` of mcp_proxy_tool_calls_total: `tool_error` is a result with isError (MCP server/tools, "Error Handling"). */
const TOOL_OUTCOMES = ['ok', 'tool_error', 'error', 'closed'] as const
type ToolOutcome = (typeof TOOL_OUTCOMES)[number]
type ToolMeters = { duration: HistogramHandle } & Record<ToolOutcome, CounterHandle>
interface MethodMeters {
  duration: HistogramHandle
  ok: CounterHandle
  error: CounterHandle
  closed: CounterHandle
}
interface Meters {
  duration: Histogram
  requests: Counter
  toolDuration: Histogram
  toolCalls: Counter
}

/** How a call ended: answered (`ok`, `error`), or never answered (upstream closed, send failed, timed out, cancelled). */
export type CallOutcome = 'ok' | 'error' | 'closed'

/** What a call in flight carries for its metrics. */
export interface CallTiming {
  readonly meters: MethodMeters
  readonly t0: bigint
  readonly tool?: ToolMeters
  readonly list?: boolean
}

/** Methods a client can name freely: past this many, handles are made per call instead of kept. */
const MAX_METHOD_HANDLES = 256

/** The call metrics of one target. */
export class TargetCallMeter {
  readonly target: string
  readonly #meters: Meters
  readonly #byMethod = new Map<string, MethodMeters>()
  /** Tool names this target advertised (label values), and their metric handles. */
  readonly #tools: AdvertisedNames
  readonly #byTool = new Map<string, ToolMeters>()

  constructor(target: string, meters: Meters, maxToolLabels: number) {
    this.target = target
    this.#meters = meters
    this.#tools = new AdvertisedNames(maxToolLabels)
    this.#tool('other')
  }

  /** A request goes upstream. */
  sent(message: JsonRpcMessage): CallTiming {
    const method = message.method ?? ''
    let tool: ToolMeters | undefined
    if (method === 'tools/call') {
      const name = message.params?.name
      tool = this.#tool(typeof name === 'string' ? this.#tools.label(name) : 'other')
    }
    return { meters: this.#method(method), t0: process.hrtime.bigint(), tool, list: method === 'tools/list' }
  }

  /** The call ended; `response` is the upstream's answer when there is one. */
  settled(timing: CallTiming, outcome: CallOutcome, response?: JsonRpcMessage): void {
    const seconds = Number(process.hrtime.bigint() - timing.t0) / 1e9
    timing.meters.duration.observe(seconds)
    timing.meters[outcome].inc()
    if (timing.tool !== undefined) {
      timing.tool.duration.observe(seconds)
      timing.tool[outcome === 'ok' && (response?.result as { isError?: unknown } | undefined)?.isError === true ? 'tool_error' : outcome].inc()
    } else if (timing.list === true && outcome === 'ok') {
      // The tools this target advertises become label values (bounded, metric-labels.ts).
      const tools = (response?.result as { tools?: unknown } | undefined)?.tools
      if (Array.isArray(tools)) {
        for (const t of tools) {
          const name = (t as { name?: unknown } | null)?.name
          if (this.#tools.add(name)) this.#tool(name)
        }
      }
    }
  }

  #method(name: string): MethodMeters {
    // A label value from a bounded set: the client names the method (metric-labels.ts).
    const method = methodLabel(name)
    let m = this.#byMethod.get(method)
    if (m === undefined) {
      const labels = { target: this.target, method }
      const { duration, requests } = this.#meters
      m = {
        duration: duration.labels(labels),
        ok: requests.labels({ ...labels, outcome: 'ok' }),
        error: requests.labels({ ...labels, outcome: 'error' }),
        closed: requests.labels({ ...labels, outcome: 'closed' }),
      }
      if (this.#byMethod.size < MAX_METHOD_HANDLES) this.#byMethod.set(method, m)
    }
    return m
  }

  /** The handles of one tool label, made once; every series starts at 0. */
  #tool(tool: string): ToolMeters {
    let m = this.#byTool.get(tool)
    if (m === undefined) {
      const labels = { target: this.target, tool }
      const { toolDuration, toolCalls } = this.#meters
      toolDuration.init(labels)
      const counter = (outcome: ToolOutcome): CounterHandle => {
        toolCalls.init({ ...labels, outcome })
        return toolCalls.labels({ ...labels, outcome })
      }
      m = { duration: toolDuration.labels(labels), ok: counter('ok'), tool_error: counter('tool_error'), error: counter('error'), closed: counter('closed') }
      // Bounded: tool labels come from AdvertisedNames (at most maxToolLabels, plus other).
      this.#byTool.set(tool, m)
    }
    return m
  }
}

/** One TargetCallMeter per target name, registering the call metrics once. */
export function createCallMeters(targets: readonly string[], metrics: Metrics, maxToolLabels = 200): Map<string, TargetCallMeter> {
  const meters: Meters = {
    duration: metrics.histogram('mcp_proxy_upstream_duration_seconds', 'Time from forwarding a request to an upstream to its answer, by target and MCP method'),
    requests: metrics.counter('mcp_proxy_upstream_requests_total', 'Requests forwarded to upstreams by target, MCP method and outcome (ok, error, closed)'),
    toolCalls: metrics.counter(
      'mcp_proxy_tool_calls_total',
      'tools/call requests forwarded to upstreams by target, tool (advertised names, else other) and outcome (ok, tool_error, error, closed)'
    ),
    toolDuration: metrics.histogram('mcp_proxy_tool_call_duration_seconds', 'Time from forwarding a tools/call upstream to its answer, by target and tool'),
  }
  return new Map(targets.map(t => [t, new TargetCallMeter(t, meters, maxToolLabels)]))
}
