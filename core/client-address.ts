/**
 * The client address of a request: the TCP peer, or, when the peer is a
 * reverse proxy listed in `mcp.trustedProxies`, the address that proxy put in
 * X-Forwarded-For. The header is read right to left and only as far as the
 * hops are trusted: every proxy appends the address it saw, so the entries
 * left of the first untrusted one were written by the client and prove
 * nothing. Without trusted proxies the header is never read.
 */
import { BlockList, isIP } from 'node:net'

export interface Cidr { readonly address: string; readonly prefix: number; readonly family: 'ipv4' | 'ipv6' }

/** `10.0.0.0/8`, `fd00::/8`, or a single address (`192.0.2.1`, `::1`); an error message when it is neither. */
export function parseCidr (text: string): Cidr | string {
  const slash = text.indexOf('/')
  const address = unmap(slash === -1 ? text : text.slice(0, slash))
  const version = isIP(address)
  if (version === 0) return `"${text}" is not an IP address or CIDR range`
  const max = version === 4 ? 32 : 128
  const prefixText = slash === -1 ? String(max) : text.slice(slash + 1)
  if (!/^\d{1,3}$/.test(prefixText) || Number(prefixText) > max) return `"${text}" has a prefix length outside 0-${max}`
  return { address, prefix: Number(prefixText), family: version === 4 ? 'ipv4' : 'ipv6' }
}

/** `::ffff:192.0.2.1` (an IPv4 peer on a dual-stack socket) -> `192.0.2.1`. */
function unmap (address: string): string {
  return address.length > 7 && address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address
}

/**
 * One X-Forwarded-For entry as an address: `192.0.2.1`, `192.0.2.1:443`,
 * `[2001:db8::1]` or `[2001:db8::1]:443` (some proxies add the port);
 * undefined when it is none of these.
 */
function entryAddress (entry: string): string | undefined {
  let a = entry.trim()
  if (a.startsWith('[')) {
    const end = a.indexOf(']')
    if (end === -1) return undefined
    a = a.slice(1, end)
  } else if (a.indexOf(':') !== -1 && a.indexOf(':') === a.lastIndexOf(':')) {
    a = a.slice(0, a.indexOf(':'))
  }
  a = unmap(a)
  return isIP(a) === 0 ? undefined : a
}

export class ClientAddresses {
  readonly #trusted: BlockList | undefined

  /** `cidrs` are validated by the config loader (parseCidr); an invalid one here is a programming error. */
  constructor (cidrs: readonly string[] = []) {
    if (cidrs.length === 0) return
    const list = new BlockList()
    for (const text of cidrs) {
      const c = parseCidr(text)
      if (typeof c === 'string') throw new TypeError(c)
      list.addSubnet(c.address, c.prefix, c.family)
    }
    this.#trusted = list
  }

  #isTrusted (address: string): boolean {
    return this.#trusted!.check(address, isIP(address) === 4 ? 'ipv4' : 'ipv6')
  }

  /** The client address for a peer and its X-Forwarded-For header (string, or the joined lines). */
  resolve (peer: string | undefined, forwardedFor: string | string[] | undefined): string {
    let current = unmap(peer ?? '')
    if (this.#trusted === undefined || forwardedFor === undefined || current === '' || !this.#isTrusted(current)) return current
    const header = Array.isArray(forwardedFor) ? forwardedFor.join(',') : forwardedFor
    let end = header.length
    while (end > 0) {
      const comma = header.lastIndexOf(',', end - 1)
      const hop = entryAddress(header.slice(comma + 1, end))
      // A trusted proxy wrote this entry: if it is not an address, the proxy is the best we know.
      if (hop === undefined) return current
      current = hop
      if (!this.#isTrusted(current)) return current
      end = comma === -1 ? 0 : comma
    }
    return current
  }
}
