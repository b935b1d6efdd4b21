/**
 * The client address of a request: the TCP peer, or, when the peer is a
 * reverse proxy listed in `mcp.trustedProxies`, the address that proxy put in
 * X-Forwarded-For. The header is read right to left and only as far as the
 * hops are trusted: every proxy appends the address it saw, so the entries
 * left of the first untrusted one were written by the client and prove
 * nothing. Without trusted proxies the header is never read.
 *
 * Between replicas (`cluster`), a replica that relays a request to the
 * session's owner passes the address it resolved in `Mcp-Proxy-Client`,
 * authenticated with an HMAC under a key derived from `cluster.secret` over
 * that address and the request it travels with (method, target, session id,
 * time): the owner keys anonymous callers by it, as if the client had come to
 * it directly. Without a valid MAC the header is ignored (and logged): a
 * client cannot name an address of its choosing, nor reuse a relayed header
 * on another request or session.
 */
import { createHmac, hkdfSync, timingSafeEqual } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import { BlockList, isIP } from 'node:net'
import type { Logger } from 'pino'

/** The relayed client address: `v1 <unix seconds> <address> <base64url HMAC-SHA256>`. */
export const RELAYED_CLIENT_HEADER = 'mcp-proxy-client'

/**
 * How far a relayed header's time may be from the owner's clock: covers the
 * forward itself and clock skew between hosts; the binding to the method,
 * target and session id already stops reuse on another request.
 */
const RELAY_MAX_SKEW_S = 300

export interface ClientRelay {
  /** The header value a relay sends for `address` with this request. */
  sign(address: string, method: string, url: string, sessionId: string | undefined): string
  /** The authenticated address of a relayed request; undefined (logged) when the header is absent or not authentic. */
  verify(req: IncomingMessage): string | undefined
}

export function createClientRelay(secret: string, log: Logger): ClientRelay {
  // A key of its own (HKDF info), never the session-id sealing key.
  const key = Buffer.from(hkdfSync('sha256', secret, 'mcp-proxy', 'relayed client address v1', 32))
  const mac = (ts: string, address: string, method: string, url: string, sid: string): Buffer =>
    createHmac('sha256', key).update(`v1\n${ts}\n${address}\n${method}\n${url}\n${sid}`).digest()
  return {
    sign(address, method, url, sessionId) {
      const ts = String(Math.floor(Date.now() / 1000))
      return `v1 ${ts} ${address} ${mac(ts, address, method, url, sessionId ?? '').toString('base64url')}`
    },
    verify(req) {
      const value = req.headers[RELAYED_CLIENT_HEADER]
      if (value === undefined) return undefined
      const parts = typeof value === 'string' ? value.split(' ') : []
      const sid = req.headers['mcp-session-id']
      const ok =
        parts.length === 4 &&
        parts[0] === 'v1' &&
        /^\d{1,12}$/.test(parts[1]!) &&
        Math.abs(Date.now() / 1000 - Number(parts[1])) <= RELAY_MAX_SKEW_S &&
        isIP(parts[2]!) !== 0 &&
        (() => {
          const given = Buffer.from(parts[3]!, 'base64url')
          const want = mac(parts[1]!, parts[2]!, req.method ?? 'GET', req.url ?? '/', typeof sid === 'string' ? sid : '')
          return given.length === want.length && timingSafeEqual(given, want)
        })()
      if (ok) return parts[2]
      log.warn({ remote: req.socket.remoteAddress }, 'client address header not authenticated: ignored')
      return undefined
    },
  }
}

export interface Cidr {
  readonly address: string
  readonly prefix: number
  readonly family: 'ipv4' | 'ipv6'
}

/** `10.0.0.0/8`, `fd00::/8`, or a single address (`192.0.2.1`, `::1`); an error message when it is neither. */
export function parseCidr(text: string): Cidr | string {
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
function unmap(address: string): string {
  return address.length > 7 && address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address
}

/**
 * One X-Forwarded-For entry as an address: `192.0.2.1`, `192.0.2.1:443`,
 * `[2001:db8::1]` or `[2001:db8::1]:443` (some proxies add the port);
 * undefined when it is none of these.
 */
function entryAddress(entry: string): string | undefined {
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
  readonly #relay: ClientRelay | undefined

  /** `cidrs` are validated by the config loader (parseCidr); an invalid one here is a programming error. */
  constructor(cidrs: readonly string[] = [], relay?: ClientRelay) {
    this.#relay = relay
    if (cidrs.length === 0) return
    const list = new BlockList()
    for (const text of cidrs) {
      const c = parseCidr(text)
      if (typeof c === 'string') throw new TypeError(c)
      list.addSubnet(c.address, c.prefix, c.family)
    }
    this.#trusted = list
  }

  #isTrusted(address: string): boolean {
    return this.#trusted!.check(address, isIP(address) === 4 ? 'ipv4' : 'ipv6')
  }

  /** The client address of a request: relayed by a replica (authenticated), else from its peer and X-Forwarded-For. */
  of(req: IncomingMessage): string {
    if (this.#relay !== undefined && req.headers[RELAYED_CLIENT_HEADER] !== undefined) {
      const relayed = this.#relay.verify(req)
      if (relayed !== undefined) return relayed
    }
    return this.resolve(req.socket.remoteAddress, req.headers['x-forwarded-for'])
  }

  /** The client address for a peer and its X-Forwarded-For header (string, or the joined lines). */
  resolve(peer: string | undefined, forwardedFor: string | string[] | undefined): string {
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
