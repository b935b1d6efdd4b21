/**
 * Entra's token-endpoint error body (learn.microsoft.com, "Microsoft Entra authentication and
 * authorization error codes", "Handling error codes in your application"), shared by every grant of
 * the emulator: `error`, an `error_description` that starts with the AADSTS code and ends with the
 * trace and correlation ids and a timestamp on their own CRLF-separated lines, `error_codes`, the same
 * ids and timestamp as fields, `error_uri`, and for some errors `suberror` and `claims`.
 */
import { randomUUID } from 'node:crypto'

/** An Entra error answer: the HTTP status and the JSON body. */
export interface EntraErrorAnswer {
  readonly status: number
  readonly body: Record<string, unknown>
}

/** `2016-01-09 02:02:12Z`, Entra's timestamp format. */
export function entraTimestamp(at = new Date()): string {
  return at.toISOString().replace('T', ' ').slice(0, 19) + 'Z'
}

/** The trailer Entra appends to every error description. */
export function traceTrailer(traceId: string, correlationId: string, timestamp: string): string {
  return `Trace ID: ${traceId}\r\nCorrelation ID: ${correlationId}\r\nTimestamp: ${timestamp}`
}

/**
 * The body for `aadsts` (`AADSTS65001: The user or ...`); `extra` adds `suberror`, `claims`.
 * Status: 401 for invalid_client, 400 otherwise, as Entra answers.
 */
export function entraError(error: string, aadsts: string, extra: { suberror?: string; claims?: string; status?: number } = {}): EntraErrorAnswer {
  const code = Number(/^AADSTS(\d+):/.exec(aadsts)?.[1] ?? 0)
  const traceId = randomUUID()
  const correlationId = randomUUID()
  const timestamp = entraTimestamp()
  const body: Record<string, unknown> = {
    error,
    error_description: `${aadsts}\r\n${traceTrailer(traceId, correlationId, timestamp)}`,
    error_codes: [code],
    timestamp,
    trace_id: traceId,
    correlation_id: correlationId,
    error_uri: `https://login.microsoftonline.com/error?code=${code}`,
  }
  if (extra.suberror !== undefined) body.suberror = extra.suberror
  if (extra.claims !== undefined) body.claims = extra.claims
  return { status: extra.status ?? (error === 'invalid_client' ? 401 : 400), body }
}
