/**
 * Client ID metadata documents (MCP 2025-11-25 "Client ID Metadata
 * Documents"; draft-ietf-oauth-client-id-metadata-document): a client_id that
 * is an https URL names the client's metadata, fetched here.
 *
 * The URL comes from anyone who can open the authorize endpoint, so the
 * fetch is a server-side request forgery risk (draft §6.4): https only, the
 * name resolved once and every address checked to be public, the connection
 * pinned to the checked address (no DNS rebinding between check and
 * connect), no redirects, a size cap read incrementally, one deadline for the
 * whole exchange. Documents are cached as their Cache-Control allows,
 * bounded in time and count.
 */
import { request as httpsRequest } from 'node:https'
import { lookup as dnsLookup } from 'node:dns/promises'
import { BlockList, isIP, type LookupFunction } from 'node:net'
import { CimdThrottle, type CimdFetchLimits } from './cimd-throttle.ts'

export interface CimdOptions extends CimdFetchLimits {
  readonly timeoutMs: number
  readonly maxBytes: number
  readonly maxCacheSeconds: number
  readonly defaultCacheSeconds: number
  readonly maxEntries: number
  readonly testOnlyAllowLoopback: boolean
  readonly testOnlyCa?: string
}

export interface CimdClient {
  readonly clientId: string
  readonly clientName: string | undefined
  readonly redirectUris: readonly string[]
  /** The document's host: what the consent page shows as verified. */
  readonly host: string
}

/** What a client is told when a document cannot be used: the same for every cause, so the fetch is no oracle for arbitrary https URLs. */
export const CIMD_UNUSABLE = "the client metadata document at client_id could not be used (the gateway's log has the reason)"

/**
 * A metadata document client refused. `message` is the detail, for the log
 * only; `shown` is what the client may see (draft §6.4: the fetch must not
 * tell a caller about the URLs it can reach).
 */
export class CimdError extends Error {
  readonly shown: string
  readonly retryAfter: number | undefined
  constructor(detail: string, shown = CIMD_UNUSABLE, retryAfter?: number) {
    super(detail)
    this.shown = shown
    this.retryAfter = retryAfter
  }
}

/** How a fetch resolves names and opens requests (injected by tests, which must never connect to the addresses refused). */
export interface CimdNet {
  readonly lookup: (host: string) => Promise<Array<{ address: string; family: number }>>
  readonly request: typeof httpsRequest
}

const REAL_NET: CimdNet = { lookup: host => dnsLookup(host, { all: true, verbatim: true }), request: httpsRequest }

/** Addresses a metadata fetch may never reach (RFC 6890 special-purpose and private ranges). */
const BLOCKED = new BlockList()
for (const [net, prefix] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const)
  BLOCKED.addSubnet(net, prefix, 'ipv4')
for (const [net, prefix] of [
  ['::', 128],
  ['::1', 128],
  ['64:ff9b::', 96],
  ['64:ff9b:1::', 48],
  ['100::', 64],
  ['2001::', 23],
  ['2001:db8::', 32],
  ['2002::', 16],
  ['fc00::', 7],
  ['fe80::', 10],
  ['fec0::', 10],
  ['ff00::', 8],
] as const)
  BLOCKED.addSubnet(net, prefix, 'ipv6')

const LOOPBACK = new Set(['127.0.0.1', '::1'])

/** The 16 bytes of an IPv6 address (zone dropped, a dotted IPv4 tail read), or undefined. */
export function ipv6Bytes(address: string): number[] | undefined {
  let a = address.toLowerCase()
  const zone = a.indexOf('%')
  if (zone !== -1) a = a.slice(0, zone)
  if (isIP(a) !== 6) return undefined
  const tail = /:(\d+\.\d+\.\d+\.\d+)$/.exec(a)
  if (tail !== null) {
    const v4 = tail[1]!.split('.').map(Number)
    a = a.slice(0, tail.index + 1) + ((v4[0]! << 8) | v4[1]!).toString(16) + ':' + ((v4[2]! << 8) | v4[3]!).toString(16)
  }
  const cut = a.indexOf('::')
  let groups: string[]
  if (cut === -1) groups = a.split(':')
  else {
    const head = cut === 0 ? [] : a.slice(0, cut).split(':')
    const rest = cut + 2 === a.length ? [] : a.slice(cut + 2).split(':')
    groups = [...head, ...new Array<string>(8 - head.length - rest.length).fill('0'), ...rest]
  }
  return groups.flatMap(g => {
    const n = parseInt(g, 16)
    return [n >> 8, n & 255]
  })
}

/**
 * The IPv4 address an IPv6 address carries, for the forms that reach (or are
 * treated as) that IPv4 host: IPv4-mapped ::ffff:0:0/96, IPv4-compatible
 * ::/96 (deprecated, RFC 4291 §2.5.5.1, still routed to the IPv4 host by
 * some stacks) and IPv4-translated ::ffff:0:0:0/96 (SIIT, RFC 2765). NAT64
 * 64:ff9b::/96 is blocked as a whole (BLOCKED), whatever it carries.
 */
export function embeddedIpv4(bytes: readonly number[]): string | undefined {
  const zero = (from: number, to: number): boolean => bytes.slice(from, to).every(b => b === 0)
  const ffff = (i: number): boolean => bytes[i] === 255 && bytes[i + 1] === 255
  const carried = zero(0, 10) && (ffff(10) || (bytes[10] === 0 && bytes[11] === 0))
  const translated = zero(0, 8) && ffff(8) && bytes[10] === 0 && bytes[11] === 0
  return carried || translated ? bytes.slice(12).join('.') : undefined
}

/** Whether a metadata fetch may connect to `address`. */
export function addressAllowed(address: string, allowLoopback: boolean): boolean {
  const family = isIP(address)
  if (family === 0) return false
  if (allowLoopback && LOOPBACK.has(address)) return true
  if (family === 4) return !BLOCKED.check(address, 'ipv4')
  const bytes = ipv6Bytes(address)
  if (bytes === undefined) return false
  // An IPv6 form carrying an IPv4 address is judged as that IPv4 address (which also makes :: and ::1 0.0.0.x: refused).
  // (BlockList would match an ::ffff:0:0/96 rule against every IPv4 address.)
  const v4 = embeddedIpv4(bytes)
  if (v4 !== undefined) return addressAllowed(v4, allowLoopback)
  return !BLOCKED.check(address, 'ipv6')
}

/** Whether `clientId` is meant as a metadata document URL (and so must pass `checkCimdUrl`). */
export function looksLikeCimd(clientId: string): boolean {
  return /^https?:\/\//i.test(clientId)
}

/** Why `clientId` cannot be a metadata document URL (draft §3), or undefined. */
export function cimdUrlProblem(clientId: string): string | undefined {
  if (clientId.length > 2048) return 'is too long'
  let u: URL
  try {
    u = new URL(clientId)
  } catch {
    return 'is not a URL'
  }
  if (u.protocol !== 'https:') return 'must use https'
  if (u.username !== '' || u.password !== '') return 'must not contain user information'
  if (u.hash !== '' || clientId.includes('#')) return 'must not contain a fragment'
  if (u.pathname === '/' || u.pathname === '') return 'must have a path'
  if (/\/\.\.?(\/|$)/.test(u.pathname)) return 'must not contain dot segments'
  if (u.href !== clientId) return 'must be in normal form'
  return undefined
}

interface CacheEntry {
  readonly client: CimdClient
  readonly until: number
}

export class CimdResolver {
  readonly #opts: CimdOptions
  readonly #cache = new Map<string, CacheEntry>()
  readonly #inflight = new Map<string, Promise<CimdClient>>()
  readonly #throttle: CimdThrottle
  readonly #net: CimdNet

  constructor(opts: CimdOptions, net: CimdNet = REAL_NET) {
    this.#opts = opts
    this.#throttle = new CimdThrottle(opts)
    this.#net = net
  }

  /** The client a metadata document URL names, fetched for `clientAddress`; throws CimdError (`shown` is safe to show). */
  async resolve(clientId: string, clientAddress?: string): Promise<CimdClient> {
    const problem = cimdUrlProblem(clientId)
    if (problem !== undefined) throw new CimdError(`client_id ${problem}`, `client_id ${problem}`)
    const hit = this.#cache.get(clientId)
    if (hit !== undefined && hit.until > Date.now()) return hit.client
    const pending = this.#inflight.get(clientId)
    if (pending !== undefined) return pending
    const release = this.#throttle.acquire(clientAddress)
    if (typeof release !== 'function') {
      throw new CimdError(
        `client metadata document fetches limited: ${release.reason}`,
        'too many client metadata document fetches; retry later',
        release.retryAfter
      )
    }
    const p = this.#fetch(clientId).finally(() => {
      release()
      this.#inflight.delete(clientId)
    })
    this.#inflight.set(clientId, p)
    return p
  }

  async #fetch(clientId: string): Promise<CimdClient> {
    const url = new URL(clientId)
    const deadline = AbortSignal.timeout(this.#opts.timeoutMs)
    const host = url.hostname.replace(/^\[|\]$/g, '')
    let addresses: Array<{ address: string; family: number }>
    if (isIP(host) !== 0) {
      addresses = [{ address: host, family: isIP(host) }]
    } else {
      try {
        addresses = await this.#net.lookup(host)
      } catch {
        throw new CimdError('client_id host does not resolve')
      }
    }
    if (deadline.aborted) throw new CimdError('client metadata document fetch timed out')
    // Every address must be public: a name that resolves to one private address is refused outright.
    if (addresses.length === 0 || !addresses.every(a => addressAllowed(a.address, this.#opts.testOnlyAllowLoopback))) {
      throw new CimdError('client_id host resolves to a private or reserved address')
    }
    const pinned = addresses[0]!
    const lookup: LookupFunction = (_name, options, cb) => {
      if ((options as { all?: boolean }).all === true) (cb as unknown as (e: null, a: typeof addresses) => void)(null, [pinned])
      else cb(null, pinned.address, pinned.family)
    }
    const { status, headers, body } = await new Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }>(
      (resolve, reject) => {
        const req = this.#net.request(
          url,
          {
            method: 'GET',
            headers: { accept: 'application/json', 'user-agent': 'mcp-proxy oauth facade' },
            lookup,
            signal: deadline,
            ...(this.#opts.testOnlyAllowLoopback && this.#opts.testOnlyCa !== undefined ? { ca: this.#opts.testOnlyCa } : {}),
          },
          res => {
            const status = res.statusCode ?? 0
            if (status >= 300 && status < 400) {
              res.destroy()
              reject(new CimdError(`client metadata document answered ${status}: redirects are not followed`))
              return
            }
            const declared = Number(res.headers['content-length'] ?? '0')
            if (declared > this.#opts.maxBytes) {
              res.destroy()
              reject(new CimdError(`client metadata document is larger than ${this.#opts.maxBytes} bytes`))
              return
            }
            const chunks: Buffer[] = []
            let size = 0
            res.on('data', (c: Buffer) => {
              size += c.length
              if (size > this.#opts.maxBytes) {
                res.destroy()
                reject(new CimdError(`client metadata document is larger than ${this.#opts.maxBytes} bytes`))
                return
              }
              chunks.push(c)
            })
            res.on('end', () => resolve({ status, headers: res.headers, body: Buffer.concat(chunks) }))
            res.on('error', () => reject(new CimdError('client metadata document fetch failed')))
          }
        )
        req.on('error', (err: Error) => {
          reject(
            err instanceof CimdError
              ? err
              : new CimdError(deadline.aborted ? 'client metadata document fetch timed out' : 'client metadata document could not be fetched')
          )
        })
        req.end()
      }
    )
    if (status !== 200) throw new CimdError(`client metadata document answered ${status}`)
    const type = String(headers['content-type'] ?? '')
      .split(';')[0]!
      .trim()
      .toLowerCase()
    if (type !== 'application/json' && !type.endsWith('+json')) throw new CimdError('client metadata document is not application/json')
    let doc: unknown
    try {
      doc = JSON.parse(body.toString('utf8'))
    } catch {
      throw new CimdError('client metadata document is not valid JSON')
    }
    const client = parseDocument(clientId, doc, url.hostname)
    const seconds = cacheSeconds(headers['cache-control'], this.#opts)
    if (seconds > 0) {
      if (this.#cache.size >= this.#opts.maxEntries) this.#cache.delete(this.#cache.keys().next().value!)
      this.#cache.set(clientId, { client, until: Date.now() + seconds * 1000 })
    }
    return client
  }
}

/** Checks the document (draft §4): client_id equal to the URL, redirect URIs listed, a public client. */
export function parseDocument(clientId: string, doc: unknown, host: string): CimdClient {
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new CimdError('client metadata document is not a JSON object')
  const d = doc as Record<string, unknown>
  if (d.client_id !== clientId) throw new CimdError('client metadata document names another client_id than its URL')
  const uris = d.redirect_uris
  if (!Array.isArray(uris) || uris.length === 0 || !uris.every(u => typeof u === 'string')) {
    throw new CimdError('client metadata document lists no redirect_uris')
  }
  const method = d.token_endpoint_auth_method
  if (method !== undefined && method !== 'none') throw new CimdError('only public clients (token_endpoint_auth_method none) are supported')
  if ('client_secret' in d) throw new CimdError('a client metadata document must not contain a client_secret')
  const name = typeof d.client_name === 'string' ? d.client_name.slice(0, 200) : undefined
  return { clientId, clientName: name, redirectUris: uris as string[], host }
}

/** Seconds a response may be cached: its max-age (none for no-store/no-cache), bounded by the options. */
export function cacheSeconds(header: string | string[] | undefined, opts: Pick<CimdOptions, 'maxCacheSeconds' | 'defaultCacheSeconds'>): number {
  const v = Array.isArray(header) ? header.join(',') : (header ?? '')
  if (/(^|,)\s*(no-store|no-cache)\s*(,|$)/i.test(v)) return 0
  const m = /(?:^|,)\s*max-age\s*=\s*"?(\d+)"?/i.exec(v)
  const seconds = m !== null ? Number(m[1]) : opts.defaultCacheSeconds
  return Math.min(seconds, opts.maxCacheSeconds)
}
