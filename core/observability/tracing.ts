/**
 * OpenTelemetry tracing hooks (docs/admin-and-observability.md "Tracing (OpenTelemetry)"), off by default. This module
 * imports nothing of OpenTelemetry: `startTracing` loads tracing-otel.ts
 * (and with it the @opentelemetry packages) by dynamic import only when
 * `tracing.enabled` is true. Call sites read `tracer` and do nothing while it
 * is undefined, so with tracing off a request pays one undefined check per
 * hook and allocates nothing.
 *
 * Tracing is process-wide, as OpenTelemetry's own providers are: the gateway
 * that starts it owns it until its close.
 */
import type { Logger } from 'pino'
import type { Tracer, TracingConfig } from './tracer.ts'

export type { EndSpan, Tracer, TracingConfig } from './tracer.ts'

/** The active tracer, or undefined while tracing is off (the default). */
export let tracer: Tracer | undefined

/** Loads OpenTelemetry and starts exporting; does nothing (false) unless `config.enabled`. */
export async function startTracing(config: TracingConfig | undefined, log: Logger, version: string): Promise<boolean> {
  if (config?.enabled !== true) return false
  const { createTracer } = await import('./tracing-otel.ts')
  await tracer?.shutdown()
  tracer = createTracer(config, log, version)
  // The endpoint without any user:password part: credentials are never logged.
  const shown = new URL(config.endpoint)
  log.info({ endpoint: shown.origin + shown.pathname, samplingRatio: config.samplingRatio }, 'tracing: exporting spans over OTLP/HTTP')
  return true
}

/** Exports the spans left (waiting at most `exportTimeoutMs`) and stops the active tracer, if any. */
export async function stopTracing(): Promise<void> {
  const t = tracer
  tracer = undefined
  await t?.shutdown()
}
