/**
 * The pino root logger. Secrets are redacted by path as a second line of
 * defence; the first is never putting them in a log call. Levels are written
 * as names and times as ISO 8601 by default, so `grep -i warn` and a human
 * reading a line both work; `levels: number` / `time: epoch` keep pino's own
 * numeric output for pipelines that expect it.
 */
import { pino, stdTimeFunctions, type Logger, type LoggerOptions as PinoOptions } from 'pino'

export type { Logger }

export interface LoggerOptions {
  level?: string
  format?: 'json' | 'pretty'
  /** `name` ("warn") or `number` (40, pino's default). */
  levels?: 'name' | 'number'
  /** `iso` ("2026-01-02T03:04:05.678Z") or `epoch` (milliseconds, pino's default). */
  time?: 'iso' | 'epoch'
  destination?: NodeJS.WritableStream
}

const REDACT = [
  'req.headers.authorization',
  'headers.authorization',
  'authorization',
  'token',
  'access_token',
  'refresh_token',
  'id_token',
  'client_secret',
  'clientSecret',
  'password',
  '*.clientSecret',
  '*.token',
  '*.password',
]

/** pino's formatter: the level's name in place of its number. */
function levelName(label: string): { level: string } {
  return { level: label }
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const base: PinoOptions = { level: opts.level ?? 'info', redact: { paths: REDACT, censor: '[redacted]' }, base: { name: 'mcp-proxy' } }
  if (opts.format === 'pretty') {
    // pino-pretty reads pino's numeric levels and formats the time itself.
    return pino({ ...base, transport: { target: 'pino-pretty', options: { colorize: process.stdout.isTTY === true, translateTime: 'SYS:HH:MM:ss.l' } } })
  }
  if (opts.levels !== 'number') base.formatters = { level: levelName }
  if (opts.time !== 'epoch') base.timestamp = stdTimeFunctions.isoTime
  return opts.destination !== undefined ? pino(base, opts.destination as never) : pino(base)
}
