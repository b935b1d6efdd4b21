/**
 * The Entra emulator's redirect URI rule: exact match, except that a registered loopback
 * `http://127.0.0.1/...` or `http://localhost/...` URI matches any port (Entra's rule for the mobile
 * and desktop platform, after RFC 8252 §7.3).
 */
function isLoopback(u: URL): boolean {
  return u.protocol === 'http:' && (u.hostname === '127.0.0.1' || u.hostname === 'localhost' || u.hostname === '[::1]')
}

export function redirectAllowed(registered: readonly string[], value: string): boolean {
  let v: URL
  try {
    v = new URL(value)
  } catch {
    return false
  }
  return registered.some(r => {
    if (r === value) return true
    const ru = new URL(r)
    return isLoopback(ru) && isLoopback(v) && ru.hostname === v.hostname && ru.pathname === v.pathname && ru.search === v.search
  })
}
