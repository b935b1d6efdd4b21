/**
 * The pino root logger. Secrets are redacted by path as a second line of
 * defence; the first is never putting them in a log call.
 */
import { pino, type Logger } from 'pino'

export type { Logger }

export interface LoggerOptions { level?: string; format?: 'json' | 'pretty'; destination?: NodeJS.WritableStream }

const REDACT = [
  'req.headers.authorization', 'headers.authorization', 'authorization', 'token', 'access_token', 'refresh_token',
  'id_token', 'client_secret', 'clientSecret', 'password', '*.clientSecret', '*.token', '*.password',
]

export function createLogger (opts: LoggerOptions = {}): Logger {
  const base = { level: opts.level ?? 'info', redact: { paths: REDACT, censor: '[redacted]' }, base: { name: 'mcp-proxy' } }
  if (opts.format === 'pretty') {
    return pino({ ...base, transport: { target: 'pino-pretty', options: { colorize: process.stdout.isTTY === true, translateTime: 'SYS:HH:MM:ss.l' } } })
  }
  return opts.destination !== undefined ? pino(base, opts.destination as never) : pino(base)
}
