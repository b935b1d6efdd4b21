import { pino, type Logger } from 'pino'
import { Writable } from 'node:stream'

/** A logger that keeps every line in memory so tests can assert on logs (and on what they never contain). */
export function memoryLogger(level = 'debug'): { log: Logger; lines: () => string[]; text: () => string } {
  const chunks: string[] = []
  const dest = new Writable({
    write(chunk, _enc, cb) {
      chunks.push(String(chunk))
      cb()
    },
  })
  const log = pino({ level }, dest)
  return { log, lines: () => chunks.join('').split('\n').filter(Boolean), text: () => chunks.join('') }
}
