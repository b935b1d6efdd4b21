/**
 * core/client-address.ts: which address X-Forwarded-For may name, and the
 * config errors for a bad mcp.trustedProxies entry.
 */
import t from 'tap'
import { ClientAddresses, parseCidr } from '../core/cluster/client-address.ts'
import { validateConfig } from '../core/config.ts'

t.test('without trusted proxies the header is never read', async t => {
  const c = new ClientAddresses()
  t.equal(c.resolve('192.0.2.10', '203.0.113.1'), '192.0.2.10')
  t.equal(c.resolve('::ffff:192.0.2.10', undefined), '192.0.2.10', 'an IPv4 peer on a dual-stack socket')
})

t.test('read right to left while the hops are trusted', async t => {
  const c = new ClientAddresses(['10.0.0.0/8', '2001:db8::/32', '192.0.2.1'])
  t.equal(c.resolve('10.1.2.3', '198.51.100.1, 203.0.113.5'), '203.0.113.5', 'the address the proxy saw, not what the client claimed')
  t.equal(c.resolve('10.1.2.3', '198.51.100.1, 203.0.113.5, 10.9.9.9'), '203.0.113.5', 'through two trusted proxies')
  t.equal(c.resolve('10.1.2.3', ['198.51.100.1', '203.0.113.5']), '203.0.113.5', 'repeated header lines')
  t.equal(c.resolve('192.0.2.2', '203.0.113.5'), '192.0.2.2', 'an untrusted peer: its header is ignored')
  t.equal(c.resolve('::ffff:192.0.2.1', '203.0.113.5'), '203.0.113.5', 'a single trusted address, IPv4-mapped peer')
  t.equal(c.resolve('2001:db8::7', '[2001:db8:1::9]:443, 203.0.113.6:8080'), '203.0.113.6', 'ports and brackets')
  t.equal(c.resolve('2001:db8::7', '2001:db8:1::9'), '2001:db8:1::9', 'every hop trusted: the leftmost')
  t.equal(c.resolve('10.1.2.3', 'unknown, not-an-ip'), '10.1.2.3', 'garbage from a trusted proxy: the proxy is the best known')
  t.equal(c.resolve('10.1.2.3', ''), '10.1.2.3')
})

t.test('parseCidr and config errors name the entry', async t => {
  t.same(parseCidr('10.0.0.0/8'), { address: '10.0.0.0', prefix: 8, family: 'ipv4' })
  t.same(parseCidr('::1'), { address: '::1', prefix: 128, family: 'ipv6' })
  t.match(parseCidr('10.0.0.0/33'), /prefix length outside 0-32/)
  t.match(parseCidr('proxy.local'), /not an IP address/)
  await t.rejects(
    validateConfig({ mcp: { port: 1, trustedProxies: ['10.0.0.0/8', 'lb.internal', 'fd00::/129'], targets: [{ name: 'a', stdio: { cmd: 'node' } }] } }),
    { message: /mcp\.trustedProxies\[1\]: "lb\.internal" is not an IP address[\s\S]*mcp\.trustedProxies\[2\]: "fd00::\/129" has a prefix length outside 0-128/ }
  )
})
