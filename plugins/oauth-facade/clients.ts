/**
 * Who is asking: the client behind a `client_id` (a client ID metadata
 * document, a sealed DCR id or a pre-registered client), and the redirect
 * URIs and trusted domains that decide where the browser may be sent.
 */
import { SealError } from './seal.ts'
import { looksLikeCimd } from './cimd.ts'
import type { FacadeContext } from './facade-context.ts'
import type { ResolvedClient } from './flow.ts'

/** A client the authorize endpoint cannot accept; the reason is safe to show. */
export class ClientRefused extends Error {}

export async function resolveClient(f: FacadeContext, clientId: string, clientAddress: string): Promise<ResolvedClient> {
  const { options } = f
  if (looksLikeCimd(clientId)) {
    if (!options.cimd.enabled) throw new ClientRefused('client ID metadata documents are not accepted here')
    const c = await f.cimd.resolve(clientId, clientAddress)
    return {
      clientId,
      kind: 'cimd',
      clientName: c.clientName,
      redirectUris: c.redirectUris,
      verifiedHost: c.host,
      trusted: domainTrusted(c.host, options.consent.trustedDomains),
    }
  }
  const pre = f.preregistered.get(clientId)
  if (pre !== undefined) {
    return { clientId, kind: 'preregistered', clientName: pre.clientName, redirectUris: pre.redirectUris, verifiedHost: undefined, trusted: pre.trusted }
  }
  if (options.registration.enabled) {
    try {
      const d = await f.sealer.open<{ u: string[]; n?: string }>('client', clientId)
      return { clientId, kind: 'dcr', clientName: d.n, redirectUris: d.u, verifiedHost: undefined, trusted: false }
    } catch (err) {
      if (!(err instanceof SealError)) throw err
    }
  }
  throw new ClientRefused('unknown client_id')
}

/** A registered redirect URI matches exactly; a loopback one on any port (RFC 8252 §7.3). */
export function redirectMatches(registered: readonly string[], uri: string): boolean {
  if (registered.includes(uri)) return true
  let u: URL
  try {
    u = new URL(uri)
  } catch {
    return false
  }
  if (u.protocol !== 'http:' || !['127.0.0.1', '[::1]', 'localhost'].includes(u.hostname)) return false
  u.port = ''
  const portless = u.href
  return registered.some(r => {
    try {
      const v = new URL(r)
      if (v.protocol !== 'http:' || v.hostname !== u.hostname) return false
      v.port = ''
      return v.href === portless
    } catch {
      return false
    }
  })
}

/** Where the consent page says the browser goes next: a web redirect's host, or an app's scheme (RFC 8252 §7.1). */
export function redirectShown(uri: string): string {
  const u = new URL(uri)
  if (u.protocol === 'https:' || u.protocol === 'http:') return u.host
  return `${u.protocol}${u.host === '' ? '' : `//${u.host}`} (an application on this device)`
}

export function domainTrusted(host: string, trusted: readonly string[]): boolean {
  const h = host.toLowerCase()
  return trusted.some(d => {
    const t = d.toLowerCase()
    return t.startsWith('*.') ? h.endsWith(t.slice(1)) && h.length > t.length - 1 : h === t
  })
}
