/**
 * core/cluster/node.ts and core/mcp/cluster.ts: what a process is in a
 * deployment (alone, a replica, a worker) and the one object MCP sees of it.
 */
import { createConnection } from 'node:net'
import t from 'tap'
import { ClusterNode } from '../core/cluster/node.ts'
import { createMemoryState } from '../core/cluster/shared-state.ts'
import { createMcpCluster } from '../core/mcp/cluster.ts'
import { memoryLogger } from './helpers/logger.ts'

const SECRET = 'kV3n0qZbX7pL2wR9sT4yU8cE1fG6hJ5mN0aB3dK7'

t.test('alone: no secret, no relay, memory state that never expires a slot', async t => {
  const { log } = memoryLogger()
  const node = new ClusterNode({ cluster: undefined, mcpHost: '127.0.0.1', worker: undefined, log })
  t.equal(node.secret, undefined)
  t.equal(node.clientRelay, undefined)
  t.equal(await node.openForward(() => {}), undefined)
  t.equal(node.closeRelayListener(), undefined, 'no relay listener to close')
  const shared = await node.openSharedState()
  t.equal(shared.state.kind, 'memory')
  t.equal(shared.leaseMs, Number.POSITIVE_INFINITY)
  const mcp = createMcpCluster({ shared: shared.state, leaseMs: shared.leaseMs })
  t.equal(mcp.relay, undefined)
  t.equal(mcp.newSessionId, undefined, 'callers draw random ids')
  t.equal(mcp.secret, undefined, 'task ids under a per-process key')
  t.equal(mcp.sealedSessions('t'), undefined)
  const solo = createMcpCluster()
  t.equal(solo.shared.kind, 'memory', 'no parts: one process alone')
  t.equal(solo.leaseMs, Number.POSITIVE_INFINITY)
  solo.close()
})

t.test("a worker: its primary's secret and store, a loopback relay listener of its own", async t => {
  const { log } = memoryLogger()
  const primaryStore = { ...createMemoryState(), kind: 'primary' as const }
  const worker = { slot: 2, secret: SECRET, shared: primaryStore }
  const node = new ClusterNode({ cluster: undefined, mcpHost: '0.0.0.0', worker, log })
  const sibling = new ClusterNode({ cluster: undefined, mcpHost: '0.0.0.0', worker: { ...worker, slot: 1 }, log })
  t.equal(node.secret, SECRET)
  t.not(node.clientRelay, undefined)
  t.equal(node.internalToken, sibling.internalToken, 'the same internal token in every worker of a run')
  const shared = await node.openSharedState()
  t.equal(shared.state, primaryStore, "the primary's store")
  t.equal(shared.leaseMs, 60_000)
  let accepted = 0
  const relay = await node.openForward(socket => {
    accepted++
    socket.destroy()
  })
  t.not(relay, undefined)
  t.teardown(() => relay?.close())
  const id = relay!.newSessionId()
  const mcp = createMcpCluster({ workerSlot: 2, shared: shared.state, leaseMs: shared.leaseMs, relay, secret: node.secret })
  t.equal(mcp.workerSlot, 2)
  t.equal(mcp.secret, SECRET)
  t.equal(mcp.relay, relay)
  t.match(mcp.newSessionId!(), /^[A-Za-z0-9_-]+$/, 'owner ids are visible ASCII')
  t.not(id, mcp.newSessionId!(), 'each id is new')
  // Each worker's relay listener is on loopback, on a port of its own: its ids name it as their owner.
  const siblingRelay = await sibling.openForward(socket => {
    socket.destroy()
  })
  t.teardown(() => siblingRelay?.close())
  const owner = relay!.remoteOwner({ req: { headers: {} } } as never, siblingRelay!.newSessionId())
  t.match(owner, /^http:\/\/127\.0\.0\.1:\d+$/, "a sibling's id names its loopback relay listener")
  t.equal(relay!.remoteOwner({ req: { headers: {} } } as never, id), undefined, "an id of this worker's own is served here")
  await new Promise<void>((resolve, reject) => {
    const c = createConnection(Number(new URL(owner!).port), '127.0.0.1', () => {
      c.destroy()
      resolve()
    })
    c.once('error', reject)
  })
  await sibling.closeRelayListener()
  await node.closeRelayListener()
  t.equal(accepted, 0, "this node's listener saw no connection meant for the sibling")
})

t.test("sealed passthrough sessions: bound to the target and the caller's key", async t => {
  const { log } = memoryLogger()
  const node = new ClusterNode({
    cluster: { secret: SECRET, advertiseUrl: 'http://10.0.0.1:8080', forwardTimeoutMs: 1000 },
    mcpHost: '0.0.0.0',
    worker: undefined,
    log,
  })
  const relay = await node.openForward(() => {})
  t.teardown(() => relay?.close())
  const mcp = createMcpCluster({ relay, secret: node.secret })
  const sealed = mcp.sealedSessions('docs')!
  const id = sealed.seal('alice', 'upstream-1')!
  t.equal(sealed.open('alice', id), 'upstream-1')
  t.equal(sealed.open('bob', id), undefined, "another caller's id is unknown")
  t.equal(mcp.sealedSessions('other')!.open('alice', id), undefined, "another target's id is unknown")
  t.equal(node.closeRelayListener(), undefined, 'a replica relays through its advertised MCP listener, no listener of its own')
})
