/**
 * Whether a value shows in an id the gateway hands out (a sealed session id must hide the upstream's
 * session id and the owner's address), in any of the encodings a careless implementation would use:
 * the text itself, hex, base64 and base64url, searched in the id as it is and in the bytes the id
 * decodes to (base64url / base64), plus the raw bytes in those decoded bytes.
 */

/** The encodings of `secret` a test searches for; each at least 4 bytes long, so chance hits stay negligible. */
function forms(secret: string | Buffer): Array<[string, string]> {
  const bytes = Buffer.isBuffer(secret) ? secret : Buffer.from(secret, 'utf8')
  if (bytes.length < 4) throw new Error('hidden(): a secret of at least 4 bytes, or chance matches make the check meaningless')
  const out: Array<[string, string]> = [
    ['hex', bytes.toString('hex')],
    ['HEX', bytes.toString('hex').toUpperCase()],
    ['base64', bytes.toString('base64').replace(/=+$/, '')],
    ['base64url', bytes.toString('base64url')],
  ]
  if (!Buffer.isBuffer(secret)) out.unshift(['text', secret])
  return out
}

/**
 * The places where `secret` shows in `id` ("hex in the id", "raw bytes in the base64url-decoded id", ...);
 * empty when it is hidden. A UUID is also searched as its 16 bytes.
 */
export function foundIn(id: string, secrets: Array<string | Buffer>): string[] {
  const hits: string[] = []
  const decoded: Array<[string, Buffer]> = [
    ['base64url-decoded id', Buffer.from(id, 'base64url')],
    ['base64-decoded id', Buffer.from(id, 'base64')],
  ]
  const all: Array<string | Buffer> = []
  for (const s of secrets) {
    all.push(s)
    if (typeof s === 'string' && /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s)) all.push(Buffer.from(s.replace(/-/g, ''), 'hex'))
  }
  for (const s of all) {
    const label = Buffer.isBuffer(s) ? `bytes ${s.toString('hex')}` : JSON.stringify(s)
    for (const [name, form] of forms(s)) {
      // Text and hex are searched without regard to case; base64 forms are case-sensitive by nature.
      const inId = name.startsWith('base64') ? id.includes(form) : id.toLowerCase().includes(form.toLowerCase())
      if (inId) hits.push(`${label} as ${name} in the id`)
      for (const [where, bytes] of decoded) if (bytes.includes(Buffer.from(form, 'latin1'))) hits.push(`${label} as ${name} in the ${where}`)
    }
    const raw = Buffer.isBuffer(s) ? s : Buffer.from(s, 'utf8')
    for (const [where, bytes] of decoded) if (bytes.includes(raw)) hits.push(`${label} as raw bytes in the ${where}`)
  }
  return hits
}
