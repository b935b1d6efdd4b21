/**
 * Redaction of the effective config for the admin UI/API: secrets by name,
 * every value that came from a ${NAME} reference, target env and headers.
 */

const SECRET_KEYS = new Set(['clientSecret', 'token', 'password', 'secret', 'authorization', 'apiKey'])

export const REDACTED = '[redacted]'

export function redactConfig (config: unknown, secretPaths: ReadonlySet<string>): unknown {
  const walk = (v: unknown, path: string, parentKey: string): unknown => {
    if (secretPaths.has(path)) return REDACTED
    if (Array.isArray(v)) return v.map((x, i) => walk(x, `${path}[${i}]`, parentKey))
    if (v !== null && typeof v === 'object') {
      const out: Record<string, unknown> = {}
      for (const [k, x] of Object.entries(v)) {
        const p = path === '' ? k : `${path}.${k}`
        // Every value of a target's env map and static headers may be a credential.
        if (SECRET_KEYS.has(k) || parentKey === 'env' || parentKey === 'headers') out[k] = REDACTED
        else out[k] = walk(x, p, k)
      }
      return out
    }
    return v
  }
  return walk(config, '', '')
}
