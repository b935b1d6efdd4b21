/**
 * The stateless MCP revision 2026-07-28 on /mcp: no initialize, no
 * Mcp-Session-Id; each POST carries one request whose `_meta` holds the
 * protocol version and client capabilities, mirrored in the
 * `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers (checked here,
 * MCP 2026-07-28 "Streamable HTTP: Server Validation"). A target that speaks
 * the revision itself (asked once with `server/discover`, or configured) gets
 * each request as it is: `_meta`, input requests with their keys,
 * `inputResponses` and `requestState` untouched (native forwarding); any
 * other target's requests are translated onto pooled session-era upstreams
 * (modern-pool.ts). Both go through the same router (router.ts: naming,
 * authorization, merged lists) as the session era.
 * endpoint.ts decides the era (revision.ts) and calls `post()` here; what
 * this revision refuses is thrown as a ProxyError like every other error.
 */
import type { Logger } from 'pino'
import type { RequestContext } from '../../context.ts'
import type { Plugin } from '../../plugin.ts'
import type { JsonRpcId, JsonRpcMessage, UpstreamFactory } from '../../targets/types.ts'
import { ProxyError, RPC } from '../../errors.ts'
import { SseStream, SSE_HEADERS, type StreamLimits } from '../sse.ts'
import { META, META_PREFIX, MODERN_REVISION, MODERN_RPC, SESSION_REVISIONS, TASKS_EXTENSION } from '../protocol.ts'
import { mergeCapabilities } from '../routing/naming.ts'
import { GATEWAY_INFO, LIST_KEYS, NAMED, Router, invalidList, type ListMethod, type NamedMethod } from '../routing/router.ts'
import { randomBytes } from 'node:crypto'
import { isNotModern, type Bridged, type CallHooks, type PoolCall, type PooledUpstream, type PoolMode, type UpstreamPool } from '../upstreams/pool.ts'
import { subjectKeyOf } from '../routing/subject-key.ts'
import { tracer } from '../../observability/tracing.ts'
import { ParamHeaderCache, paramHeaderMismatch, type ParamHeader } from './param-headers.ts'
import { isTerminal } from '../upstreams/task-ledger.ts'
import { createTaskSeal, type TaskSeal } from '../upstreams/task-seal.ts'
import { createMemoryState, type SharedState } from '../../cluster/shared-state.ts'

/** Every revision /mcp serves, newest first (what `supported` lists). */
export const SUPPORTED_VERSIONS: readonly string[] = [MODERN_REVISION, ...SESSION_REVISIONS]

const CACHEABLE = new Set(['server/discover', 'tools/list', 'prompts/list', 'resources/list', 'resources/templates/list', 'resources/read'])
/**
 * Methods whose `Mcp-Name` header is required, and the param it mirrors (MCP 2026-07-28 streamable
 * HTTP "Standard Headers"; the tasks extension, SEP-2663, adds its methods naming `params.taskId`).
 */
const NAME_SOURCE: Record<string, 'name' | 'uri' | 'taskId'> = {
  'tools/call': 'name', 'prompts/get': 'name', 'resources/read': 'uri', 'tasks/get': 'taskId', 'tasks/update': 'taskId', 'tasks/cancel': 'taskId',
}
const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']
const KEEPALIVE_MS = 15_000
/** How long a parked upstream call waits for the client's retry with `inputResponses`. */
const INPUT_TTL_MS = 120_000
/**
 * Native upstreams per (target, subject): one. A server of the revision takes concurrent requests
 * on one connection, and a change one request makes (a list change, say) must reach the
 * subscriptions/listen another holds on that connection (stdio has no shared bus between processes).
 */
const NATIVE_PER_KEY = 1
/** Upstream calls one subject may have parked on InputRequiredResults at once. */
const MAX_PARKED_PER_SUBJECT = 32
/**
 * An upstream sends the input requests of one round together (the SDK awaits them all at once):
 * after one arrives, the round is collected until none follows for this long.
 */
const ROUND_GATHER_MS = 25
/** The client capability each bridged server-to-client request needs (MCP 2026-07-28 `_meta`). */
const NEEDS: Readonly<Record<string, string>> = { 'sampling/createMessage': 'sampling', 'elicitation/create': 'elicitation', 'roots/list': 'roots' }
const BRIDGED: readonly Bridged[] = ['sampling', 'elicitation', 'roots']
const SENTINEL = /^=\?base64\?([A-Za-z0-9+/]*={0,2})\?=$/
/** A header value sent as it is (MCP 2026-07-28 "Value Encoding"); anything else is Base64-wrapped. */
const PLAIN_VALUE = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/

/** `Mcp-Name` (and `Mcp-Param-*`) value for an upstream: plain when it can be, else the Base64 sentinel form. */
function encodeHeaderValue (v: string): string {
  return PLAIN_VALUE.test(v) && !v.startsWith('=?base64?') ? v : `=?base64?${Buffer.from(v, 'utf8').toString('base64')}?=`
}

/** HTTP status of an error answer (MCP 2026-07-28 streamable HTTP: -32021 and the header errors are 400). */
function errorStatus (res: JsonRpcMessage): number {
  const code = res.error?.code
  return code === MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY || code === MODERN_RPC.HEADER_MISMATCH || code === MODERN_RPC.UNSUPPORTED_PROTOCOL_VERSION ? 400 : 200
}

export interface ModernOptions {
  readonly targets: readonly UpstreamFactory[]
  /** Plugins with `allowMcpOperation`; empty means no filtering. */
  readonly checkers: readonly Plugin[]
  readonly pool: UpstreamPool
  readonly log: Logger
  readonly failClosed: boolean
  /** Bounds of every SSE answer and listen stream (sse.ts). */
  readonly streams: StreamLimits
  /** `mcp.limits.maxInputRequestsPerRound`; default 16. */
  readonly maxInputsPerRound?: number
  /** `mcp.limits.maxTasksPerSession`, here per subject: unfinished tasks one subject may have; default 100. */
  readonly maxTasks?: number
  /** Seals task ids (task-seal.ts): under the cluster/worker secret, any process serves a task. Default: a per-process key. */
  readonly taskSeal?: TaskSeal
  /** Where each subject's unfinished tasks are counted (memory, the primary's store under workers, Redis). Default: memory. */
  readonly shared?: SharedState
  /**
   * Mints the `requestState` of a parked translated call. With `workers` or `cluster`: an id sealed to
   * this process as a session's owner id is (cluster-forward.ts), so a retry landing elsewhere is
   * relayed here. Default: 192 random bits.
   */
  readonly mintState?: () => string
}

/** A task's slot lasts its ttlMs; without one, setTimeout's bound (about 24 days), as it was in memory. */
const TASK_LEASE_MAX_MS = 2 ** 31 - 1

export interface ModernHandler {
  /** Serves one POST whose era is modern; `body` is the parsed JSON. */
  post(ctx: RequestContext, body: unknown): Promise<void>
  /** Open subscriptions/listen streams. */
  readonly listening: number
  /** Ends listen streams gracefully (a result, then the stream ends). */
  close(): void
}

/** An upstream call in flight and the upstream it holds. */
interface Running {
  readonly entry: PooledUpstream
  readonly call: PoolCall
  readonly hooks: CallHooks
  /**
   * Server-to-client requests of the call not yet turned into input requests: taken from the
   * moment the call is sent (a fast upstream may ask before anyone waits) and while it is parked.
   */
  readonly asked: JsonRpcMessage[]
  /** Wakes whoever waits for `asked`. */
  wake: (() => void) | undefined
  /** Takes a server request into `asked`: the call's `onServerRequest` except while it is parked. */
  readonly take: ((req: JsonRpcMessage) => void) | undefined
}

/** An upstream's final answer, and the upstream that gave it (whose serverInfo the answer carries). */
interface Settled { readonly res: JsonRpcMessage; readonly entry: PooledUpstream }

/** One server-to-client request of a parked call, under the key the client answers it by. */
interface Ask { readonly key: string; readonly serverRequestId: JsonRpcId }

/** An upstream call parked on an InputRequiredResult until the client retries. */
interface Continuation {
  readonly run: Running
  readonly subjectKey: string
  readonly method: string
  /** The name or URI as the client sent it. */
  readonly name: unknown
  readonly asks: readonly Ask[]
  readonly timer: NodeJS.Timeout
}

/** -32002 (resource not found) is reserved from 2026-07-28 on; the revision uses -32602. */
function modernError (res: JsonRpcMessage): JsonRpcMessage {
  if (res.error?.code === RPC.RESOURCE_NOT_FOUND) res.error.code = RPC.INVALID_PARAMS
  return res
}

function header (ctx: RequestContext, name: string): string | undefined {
  const v = ctx.req.headers[name]
  return Array.isArray(v) ? v.join(', ') : v
}

function mismatch (message: string): ProxyError {
  return new ProxyError('MCPP_ERR_HEADER_MISMATCH', 400, 'Header mismatch: ' + message, { rpcCode: MODERN_RPC.HEADER_MISMATCH })
}

function invalidParams (message: string): ProxyError {
  return new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, message, { rpcCode: RPC.INVALID_PARAMS })
}

/** `Mcp-Name` as the client meant it: the Base64 sentinel form decoded (MCP 2026-07-28 "Value Encoding"). */
function decodeHeaderValue (v: string): string | undefined {
  if (!v.startsWith('=?base64?')) return v
  const m = SENTINEL.exec(v)
  if (m === null) return undefined
  return Buffer.from(m[1]!, 'base64').toString('utf8')
}

/** Checks the request metadata headers against the body (MCP 2026-07-28 "Server Validation"). */
function validate (ctx: RequestContext, msg: JsonRpcMessage): void {
  const version = header(ctx, 'mcp-protocol-version')
  if (version === undefined || version === '') throw mismatch('required MCP-Protocol-Version header is missing')
  if (version !== MODERN_REVISION) {
    throw new ProxyError('MCPP_ERR_PROTOCOL_VERSION', 400, 'Unsupported protocol version', { rpcCode: MODERN_RPC.UNSUPPORTED_PROTOCOL_VERSION, data: { supported: SUPPORTED_VERSIONS, requested: version } })
  }
  const meta = msg.params?._meta as Record<string, unknown> | undefined
  const metaVersion = meta?.[META.protocolVersion]
  if (typeof metaVersion !== 'string') throw invalidParams(`Invalid params: _meta["${META.protocolVersion}"] is required`)
  if (metaVersion !== version) throw mismatch(`MCP-Protocol-Version header value '${version}' does not match body value '${metaVersion}'`)
  const caps = meta![META.clientCapabilities]
  if (caps === null || typeof caps !== 'object' || Array.isArray(caps)) throw invalidParams(`Invalid params: _meta["${META.clientCapabilities}"] is required`)
  const method = header(ctx, 'mcp-method')
  if (method === undefined) throw mismatch('required Mcp-Method header is missing')
  if (method !== msg.method) throw mismatch(`Mcp-Method header value '${method}' does not match body value '${String(msg.method)}'`)
  const source = NAME_SOURCE[msg.method!]
  if (source !== undefined) {
    const raw = header(ctx, 'mcp-name')
    if (raw === undefined) throw mismatch('required Mcp-Name header is missing')
    const name = decodeHeaderValue(raw)
    if (name === undefined) throw mismatch('Mcp-Name header is not a valid Base64 sentinel value')
    const body = msg.params?.[source]
    if (name !== body) throw mismatch(`Mcp-Name header value '${name}' does not match body value '${String(body)}'`)
  }
}

/** Params for the session-era upstream: the revision's own `_meta` keys removed. */
function upstreamParams (params: Record<string, unknown> | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(params ?? {}) }
  const meta = out._meta as Record<string, unknown> | undefined
  if (meta !== undefined) {
    const rest: Record<string, unknown> = {}
    for (const k of Object.keys(meta)) if (!k.startsWith(META_PREFIX)) rest[k] = meta[k]
    if (Object.keys(rest).length === 0) delete out._meta
    else out._meta = rest
  }
  return out
}

/** The `tools` of a tools/list result, or none. */
function toolsOf (result: unknown): unknown[] {
  const tools = (result as { tools?: unknown } | undefined)?.tools
  return Array.isArray(tools) ? tools : []
}

/** One client request: where its answer goes (JSON, or SSE once a notification must go first). */
class Exchange {
  readonly ctx: RequestContext
  readonly id: JsonRpcId
  readonly subjectKey: string
  readonly calls = new Set<PoolCall>()
  readonly logLevel: string | undefined
  readonly clientCapabilities: Record<string, unknown>
  /** The client's `_meta` as sent: what a native upstream gets with each request. */
  meta: Record<string, unknown> = {}
  stream: SseStream | undefined
  readonly streams: StreamLimits
  finished = false
  aborted = false
  #queue: Promise<void> = Promise.resolve()

  constructor (ctx: RequestContext, id: JsonRpcId, subjectKey: string, logLevel: string | undefined, clientCapabilities: Record<string, unknown>, streams: StreamLimits) {
    this.ctx = ctx
    this.streams = streams
    this.id = id
    this.subjectKey = subjectKey
    this.logLevel = logLevel
    this.clientCapabilities = clientCapabilities
    ctx.res.once('close', () => {
      if (this.finished) return
      // Closing the response is the cancellation signal (MCP 2026-07-28 "Cancellation").
      this.aborted = true
      for (const c of this.calls) c.cancel('client disconnected')
    })
  }

  get subject (): string | undefined { return this.ctx.auth?.subject }

  /** Writes in order: the first notification turns the answer into an SSE stream. */
  #enqueue (fn: () => Promise<void> | void): Promise<void> {
    this.#queue = this.#queue.then(fn).catch(err => { this.ctx.log.debug({ err }, 'write failed') })
    return this.#queue
  }

  notify (msg: JsonRpcMessage): void {
    if (this.finished || this.aborted) return
    void this.#enqueue(async () => {
      if (this.finished) return
      if (this.stream === undefined) {
        await this.ctx.writeHead(200, { ...SSE_HEADERS })
        this.stream = new SseStream(this.ctx.res, this.streams)
      }
      this.stream.send(msg)
    })
  }

  answer (msg: JsonRpcMessage, status = 200): Promise<void> {
    msg.id = this.id
    return this.#enqueue(async () => {
      if (this.finished) return
      this.finished = true
      if (this.stream !== undefined) {
        this.stream.end(msg)
        return
      }
      if (this.ctx.res.destroyed) return
      const body = JSON.stringify(msg)
      await this.ctx.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      this.ctx.res.end(body)
    })
  }

  fail (code: number, message: string, status = 200, data?: unknown): Promise<void> {
    return this.answer({ jsonrpc: '2.0', error: data === undefined ? { code, message } : { code, message, data } }, status)
  }
}

export function createModernHandler (opts: ModernOptions): ModernHandler {
  const { pool, checkers, log } = opts
  const maxInputs = opts.maxInputsPerRound ?? 16
  const router = new Router(opts.targets, checkers)
  const multi = router.multi
  const listens = new Set<() => void>()
  const continuations = new Map<string, Continuation>()
  let inputSeq = 0
  const paramHeaders = new ParamHeaderCache()
  const maxTasks = opts.maxTasks ?? 100
  /**
   * A server MUST check on every task-related request that the caller may access the task (SEP-2663,
   * Security Implications, "Auth binding"); the upstream sees no subjects (one pooled HTTP upstream
   * serves all), so the id the client sees is the task sealed to the subject whose call created it,
   * and tasks/* are answered only for an id that opens for the caller (never probed upstream).
   * The per-subject count lives in shared state, so it holds across workers and replicas.
   */
  const taskSeal = opts.taskSeal ?? createTaskSeal(undefined)
  const taskSlots = opts.shared ?? createMemoryState()
  const taskSlotKey = (subjectKey: string): string => 'tasks\u0000' + subjectKey
  const paramFetches = new Map<string, Promise<void>>()

  /** A tool's `Mcp-Param-*` annotations: learnt from lists, else one shared `tools/list` per target. */
  async function paramHeadersFor (ex: Exchange, factory: UpstreamFactory, tool: string): Promise<ParamHeader[]> {
    const known = paramHeaders.lookup(factory.target, tool)
    if (known !== undefined) return known
    let fetching = paramFetches.get(factory.target)
    if (fetching === undefined) {
      fetching = (async () => {
        let cursor: unknown
        const seen = new Set<unknown>()
        do {
          const { res } = await forward(ex, factory, 'tools/list', cursor === undefined ? {} : { cursor })
          const result = res.result as Record<string, unknown> | undefined
          paramHeaders.learn(factory.target, Array.isArray(result?.tools) ? result.tools : [], cursor === undefined)
          seen.add(cursor)
          cursor = result?.nextCursor
        } while (typeof cursor === 'string' && !seen.has(cursor))
      })().finally(() => paramFetches.delete(factory.target))
      paramFetches.set(factory.target, fetching)
    }
    try {
      await fetching
    } catch (err) {
      // The call itself goes to the same upstream and meets the same fault.
      log.debug({ target: factory.target, err: (err as Error).message }, 'tools/list for Mcp-Param headers failed')
    }
    return paramHeaders.lookup(factory.target, tool) ?? []
  }

  /** Results of this revision: `resultType`, caching hints, serverInfo (MCP 2026-07-28 Caching, `_meta`). */
  function decorate (ex: Exchange, method: string, result: Record<string, unknown>, serverInfo: unknown): Record<string, unknown> {
    if (result.resultType === undefined) result.resultType = 'complete'
    if (CACHEABLE.has(method) && result.resultType === 'complete') {
      // The gateway cannot know how long an upstream's answer stays fresh.
      if (typeof result.ttlMs !== 'number' || result.ttlMs < 0) result.ttlMs = 0
      // Authenticated callers get results of their own upstreams, filtered by their rules.
      result.cacheScope = checkers.length > 0 || ex.ctx.auth !== undefined || result.cacheScope === 'private' ? 'private' : 'public'
    }
    const meta = (result._meta ?? {}) as Record<string, unknown>
    result._meta = { ...meta, [META.serverInfo]: serverInfo }
    return result
  }

  /** The serverInfo an answer carries: the gateway's with several targets, else that of the upstream that answered. */
  function serverInfoOf (entry: PooledUpstream | undefined): unknown {
    if (multi || entry === undefined) return GATEWAY_INFO
    return entry.serverInfo ?? GATEWAY_INFO
  }

  /** Progress and log hooks of `ex` (a retried request takes over the upstream call's hooks). */
  function hookTo (ex: Exchange, hooks: CallHooks): CallHooks {
    const min = ex.logLevel === undefined ? -1 : LOG_LEVELS.indexOf(ex.logLevel)
    hooks.onProgress = (m) => ex.notify(m)
    hooks.onLog = min < 0 ? undefined : (m) => { if (LOG_LEVELS.indexOf(String(m.params?.level)) >= min) ex.notify(m) }
    return hooks
  }

  /** Targets' eras as found by their `server/discover` (protocol: auto), and the probes under way. */
  const eras = new Map<string, PoolMode>()
  const probes = new Map<string, Promise<void>>()

  /**
   * Whether `factory` speaks 2026-07-28: configured, or asked once with
   * `server/discover` (MCP 2026-07-28 versioning: cached per server, asked
   * again when the cached answer fails). A probe that fails (network, 5xx)
   * fails this request and is tried again by the next one.
   */
  async function eraOf (ex: Exchange, factory: UpstreamFactory): Promise<PoolMode> {
    if (factory.protocol === '2026-07-28') return 'modern'
    if (factory.protocol === 'session') return 'session'
    const known = eras.get(factory.target)
    if (known !== undefined) return known
    let probe = probes.get(factory.target)
    if (probe === undefined) {
      probe = (async () => {
        try {
          // The probing upstream stays pooled: this subject's request uses it next.
          pool.release(await pool.acquire(factory, ex.subjectKey, ex.subject, NATIVE_PER_KEY, { mode: 'modern' }))
          eras.set(factory.target, 'modern')
        } catch (err) {
          if (!isNotModern(err)) throw err
          eras.set(factory.target, 'session')
        }
        log.info({ target: factory.target, era: eras.get(factory.target) }, 'target era found by server/discover')
      })().finally(() => probes.delete(factory.target))
      probes.set(factory.target, probe)
    }
    await probe
    return eras.get(factory.target) ?? 'session'
  }

  /** A leased upstream of `factory` in its era; a native one that stopped speaking the revision is asked again. */
  async function lease (ex: Exchange, factory: UpstreamFactory): Promise<PooledUpstream> {
    const mode = await eraOf(ex, factory)
    // A translated upstream declares exactly the bridgeable capabilities this client declared (pooled per set).
    const capabilities = BRIDGED.filter(k => ex.clientCapabilities[k] !== undefined && ex.clientCapabilities[k] !== null)
    try {
      return mode === 'modern'
        ? await pool.acquire(factory, ex.subjectKey, ex.subject, NATIVE_PER_KEY, { mode })
        : await pool.acquire(factory, ex.subjectKey, ex.subject, undefined, { capabilities })
    } catch (err) {
      if (mode !== 'modern' || factory.protocol === '2026-07-28' || !isNotModern(err)) throw err
      eras.set(factory.target, 'session')
      return pool.acquire(factory, ex.subjectKey, ex.subject, undefined, { capabilities })
    }
  }

  /** The revision's request headers for a native HTTP upstream (MCP 2026-07-28 streamable HTTP, "Standard Headers"). */
  function modernHeaders (ex: Exchange, target: string, method: string, params: Record<string, unknown>): Record<string, string> {
    const h: Record<string, string> = { 'mcp-protocol-version': MODERN_REVISION, 'mcp-method': method }
    const source = NAME_SOURCE[method]
    const name = source === undefined ? undefined : params[source]
    if (typeof name === 'string') h['mcp-name'] = encodeHeaderValue(name)
    if (method === 'tools/call' && typeof name === 'string') {
      // Mirrored where the upstream's tool declares them; the client's values were checked against the arguments.
      for (const a of paramHeaders.lookup(target, name) ?? []) {
        const v = header(ex.ctx, 'mcp-param-' + a.name.toLowerCase())
        if (v !== undefined) h['mcp-param-' + a.name.toLowerCase()] = v
      }
    }
    return h
  }

  /** Leases an upstream of `factory` and starts one request on it; the caller releases the lease. */
  async function start (ex: Exchange, factory: UpstreamFactory, method: string, params: Record<string, unknown>, bridge = false): Promise<Running> {
    const entry = await lease(ex, factory)
    try {
      const caps = entry.initResult?.capabilities as Record<string, unknown> | undefined
      const native = entry.mode === 'modern'
      if (!native && ex.logLevel !== undefined && caps?.logging !== undefined) {
        // The session-era upstream keeps one level per process; set it for this request.
        await entry.call({ jsonrpc: '2.0', method: 'logging/setLevel', params: { level: ex.logLevel } }).done
      }
      const hooks = hookTo(ex, {})
      if (native) {
        // As the client sent it: protocol version, client info, per-request capabilities, log level.
        params = { ...params, _meta: { ...ex.meta, ...((params._meta ?? {}) as Record<string, unknown>) } }
        hooks.headers = modernHeaders(ex, factory.target, method, params)
      }
      const msg: JsonRpcMessage = { jsonrpc: '2.0', method, params }
      const traced = tracer?.upstreamCall(ex.ctx, factory.target, msg)
      const asked: JsonRpcMessage[] = []
      const take = bridge && !native ? (req: JsonRpcMessage): void => { asked.push(req); run.wake?.() } : undefined
      const run: Running & { call: PoolCall } = { entry, hooks, call: undefined as unknown as PoolCall, asked, wake: undefined, take }
      hooks.onServerRequest = take
      run.call = entry.call(msg, hooks)
      if (traced !== undefined) void run.call.done.then(traced)
      return run
    } catch (err) {
      pool.release(entry)
      throw err
    }
  }

  /** Leases an upstream, forwards one request, releases. */
  async function forward (ex: Exchange, factory: UpstreamFactory, method: string, params: Record<string, unknown>): Promise<{ res: JsonRpcMessage; entry: PooledUpstream }> {
    // The access log's target: with one target every request is its; fan-outs name none.
    if (!multi) ex.ctx.target = factory.target
    const run = await start(ex, factory, method, params)
    try {
      ex.calls.add(run.call)
      const res = await run.call.done
      ex.calls.delete(run.call)
      return { res: modernError(res), entry: run.entry }
    } finally {
      pool.release(run.entry)
    }
  }

  /**
   * Waits for the upstream's answer to a tools/call, prompts/get or
   * resources/read. A server-to-client request arriving first (sampling,
   * elicitation) becomes an InputRequiredResult (MCP 2026-07-28, Multi
   * Round-Trip Requests): the upstream call stays open, its lease held, under
   * a single-use random `requestState` bound to the subject, the method and
   * the name, until the client retries with `inputResponses` or it expires
   * (with workers or replicas the retry is relayed to this process: endpoint.ts).
   * Resolves with the final answer and the upstream that gave it, or undefined when `ex` was answered here.
   */
  async function settle (ex: Exchange, run: Running, method: string, name: unknown): Promise<Settled | undefined> {
    ex.calls.add(run.call)
    let answered: JsonRpcMessage | undefined
    void run.call.done.then(res => { answered = res; run.wake?.() })
    const wait = (ms?: number): Promise<void> => new Promise<void>(resolve => {
      const timer = ms === undefined ? undefined : setTimeout(() => { run.wake = undefined; resolve() }, ms)
      run.wake = () => { clearTimeout(timer); run.wake = undefined; resolve() }
    })
    // The first server request (or the answer), then the rest of its round.
    while (answered === undefined && run.asked.length === 0) await wait()
    if (answered === undefined) {
      let seen = run.asked.length
      for (;;) {
        await wait(ROUND_GATHER_MS)
        if (answered !== undefined || run.asked.length === seen || run.asked.length >= maxInputs) break
        seen = run.asked.length
      }
    }
    ex.calls.delete(run.call)
    const reqs = run.asked.splice(0)
    // Past the bound the round is cut: the rest are refused, the tool decides what that means.
    for (const req of reqs.splice(maxInputs)) run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'too many input requests in one round' })
    if (answered !== undefined || reqs.length === 0) {
      // Asked and answered without waiting for the client: its requests are moot, the answer stands.
      for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'request already answered' })
      pool.release(run.entry)
      return { res: modernError(answered ?? await run.call.done), entry: run.entry }
    }
    const refuse = (why: string): void => {
      for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.METHOD_NOT_FOUND, message: 'Method not found' })
      run.call.cancel(why)
      pool.release(run.entry)
    }
    const missing = reqs.map(r => NEEDS[String(r.method)] ?? String(r.method)).find(need => ex.clientCapabilities[need] === undefined)
    if (missing !== undefined || ex.aborted) {
      // A server MUST NOT rely on capabilities the client did not declare (MCP 2026-07-28 `_meta`).
      refuse('client lacks a required capability')
      await ex.fail(MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY, 'Missing required client capability', 400, { requiredCapabilities: { [missing ?? 'sampling']: {} } })
      return undefined
    }
    const parked = [...continuations.values()].filter(c => c.subjectKey === ex.subjectKey).length
    if (parked >= MAX_PARKED_PER_SUBJECT) {
      for (const req of reqs) run.entry.answer(req.id!, undefined, { code: RPC.INTERNAL_ERROR, message: 'too many pending input requests' })
      run.call.cancel('too many pending input requests')
      pool.release(run.entry)
      await ex.fail(RPC.SERVER_ERROR, 'Too many requests waiting for input', 429)
      return undefined
    }
    const state = opts.mintState?.() ?? randomBytes(24).toString('base64url')
    const asks: Ask[] = []
    const inputRequests: Record<string, unknown> = {}
    for (const req of reqs) {
      const key = 'input-' + String(++inputSeq)
      asks.push({ key, serverRequestId: req.id! })
      const params = { ...(req.params ?? {}) }
      const meta = params._meta as Record<string, unknown> | undefined
      if (meta !== undefined) {
        // The upstream's progress token (the gateway's mapped one) is no business of the client's.
        const { progressToken: _, ...rest } = meta
        if (Object.keys(rest).length === 0) delete params._meta
        else params._meta = rest
      }
      inputRequests[key] = { method: req.method, params }
    }
    const timer = setTimeout(() => {
      if (continuations.get(state) !== cont) return
      continuations.delete(state)
      run.call.cancel('input request expired')
      pool.release(run.entry)
    }, INPUT_TTL_MS)
    timer.unref()
    const cont: Continuation = { run, subjectKey: ex.subjectKey, method, name, asks, timer }
    continuations.set(state, cont)
    // Parked: another call on this upstream may take a server request meanwhile (stdio routes by "the only one").
    run.hooks.onServerRequest = undefined
    const result = { resultType: 'input_required', inputRequests, requestState: state }
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, method, result, serverInfoOf(run.entry)) })
    return undefined
  }

  /** A retry carrying `requestState`: answers the upstream's request and goes on waiting for the original call. */
  async function resume (ex: Exchange, method: string, name: unknown, params: Record<string, unknown>): Promise<Settled | undefined> {
    const state = params.requestState
    const cont = typeof state === 'string' ? continuations.get(state) : undefined
    // requestState is attacker-controlled: only an unexpired, unused state of this subject, method and name counts.
    if (cont === undefined || cont.subjectKey !== ex.subjectKey || cont.method !== method || cont.name !== name) {
      await ex.fail(RPC.INVALID_PARAMS, 'Invalid params: unknown or expired requestState')
      return undefined
    }
    continuations.delete(state as string)
    clearTimeout(cont.timer)
    // Keys the gateway did not ask for are ignored (MCP 2026-07-28 MRTR, error handling).
    cont.run.hooks.onServerRequest = cont.run.take
    const responses = params.inputResponses as Record<string, unknown> | undefined
    for (const ask of cont.asks) {
      const answer = responses?.[ask.key]
      if (answer === undefined) cont.run.entry.answer(ask.serverRequestId, undefined, { code: RPC.INVALID_PARAMS, message: 'no input response' })
      else cont.run.entry.answer(ask.serverRequestId, answer)
    }
    hookTo(ex, cont.run.hooks)
    return settle(ex, cont.run, method, cont.name)
  }

  async function discover (ex: Exchange): Promise<void> {
    const parts = await Promise.allSettled(opts.targets.map(f => lease(ex, f)))
    const live: PooledUpstream[] = []
    const failed: string[] = []
    parts.forEach((p, i) => {
      if (p.status === 'fulfilled') { live.push(p.value); pool.release(p.value) } else failed.push(opts.targets[i]!.target)
    })
    if (live.length === 0 || (failed.length > 0 && opts.failClosed)) {
      await ex.fail(RPC.SERVER_ERROR, `upstream ${failed.join(', ')} failed to start`, 502)
      return
    }
    const caps = (e: PooledUpstream): Record<string, unknown> => {
      const c = { ...((e.initResult?.capabilities ?? {}) as Record<string, unknown>) }
      delete c.tasks // tasks are an extension from 2026-07-28 on; the gateway does not bridge them
      return c
    }
    const result: Record<string, unknown> = {
      supportedVersions: SUPPORTED_VERSIONS,
      capabilities: multi ? mergeCapabilities(live.map(caps)) : caps(live[0]!),
    }
    const instructions = router.instructions(live)
    if (instructions !== undefined) result.instructions = instructions
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, 'server/discover', result, serverInfoOf(live[0])) })
  }

  async function list (ex: Exchange, method: ListMethod, params: Record<string, unknown>): Promise<void> {
    if (!multi) {
      const { res, entry } = await forward(ex, opts.targets[0]!, method, params)
      if (res.error !== undefined) { await ex.answer(res); return }
      // The result is decorated below, so it must be an object even when no rule reads its items.
      const invalid = router.checkList(entry.target, method, res.result) ?? (res.result === null || typeof res.result !== 'object' ? invalidList(entry.target, method, LIST_KEYS[method], res.result) : undefined)
      if (invalid !== undefined) {
        log.warn({ target: entry.target, method, err: invalid.message }, 'invalid upstream list result')
        await ex.fail(invalid.code, invalid.message)
        return
      }
      const result = res.result as Record<string, unknown>
      if (method === 'tools/list') paramHeaders.learn(entry.target, toolsOf(result), params.cursor === undefined)
      router.filterResult(ex.ctx, method, result, entry.target)
      await ex.answer({ jsonrpc: '2.0', result: decorate(ex, method, result, serverInfoOf(entry)) })
      return
    }
    const fetch = async (f: UpstreamFactory, page: Record<string, unknown>): Promise<JsonRpcMessage> => {
      const { res } = await forward(ex, f, method, page)
      if (method === 'tools/list') paramHeaders.learn(f.target, toolsOf(res.result), page.cursor === undefined)
      return res
    }
    const merged = await router.mergeLists(ex.ctx, method, fetch, () => ex.aborted, log, opts.failClosed)
    if (merged.error !== undefined) { await ex.answer(merged); return }
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, method, merged.result as Record<string, unknown>, GATEWAY_INFO) })
  }

  /**
   * Throws 400 / -32020 when the `Mcp-Param-*` headers do not match the arguments (MCP 2026-07-28
   * streamable HTTP, "Server Behavior for Custom Headers"): whoever routed on the header saw
   * what the upstream would not execute.
   */
  async function checkParamHeaders (ex: Exchange, factory: UpstreamFactory, tool: string, args: unknown): Promise<void> {
    const annotations = await paramHeadersFor(ex, factory, tool)
    if (annotations.length === 0) return
    const why = paramHeaderMismatch(annotations, args, name => header(ex.ctx, name))
    if (why === undefined) return
    log.info({ target: factory.target, tool, reason: why }, 'Mcp-Param header refused')
    throw mismatch(why)
  }

  /** tools/call, prompts/get, resources/read: route by name or URI, refuse what the rules deny. */
  async function named (ex: Exchange, method: NamedMethod, params: Record<string, unknown>): Promise<void> {
    const { kind, field } = NAMED[method]
    const value = params[field]
    // An unknown target prefix (the gateway's own namespace), or a resource URI refused (resource-uri.ts).
    const routed = typeof value === 'string' ? router.route(kind, value) : { answer: router.unknown(kind, value) }
    if ('answer' in routed) {
      await ex.answer(modernError(routed.answer))
      return
    }
    const { target: factory } = routed
    const name = routed.name as string
    ex.ctx.target = factory.target
    let settled: Settled | undefined
    const standIn = router.refuse(ex.ctx, method, kind, name, factory.target)
    if (standIn === undefined && kind === 'tool') await checkParamHeaders(ex, factory, name, params.arguments)
    const native = standIn === undefined && await eraOf(ex, factory) === 'modern'
    if (standIn !== undefined) {
      // Refused: answered exactly as the upstream answers an item it does not have.
      delete params.inputResponses
      delete params.requestState
      params[field] = standIn.value
      settled = await settle(ex, await start(ex, factory, method, params, true), method, value)
      if (settled !== undefined) settled = { res: standIn.restore(settled.res), entry: settled.entry }
    } else if (native) {
      // inputResponses and requestState are the upstream's own (MCP 2026-07-28 Multi Round-Trip Requests): as they are.
      params[field] = name
      settled = await settle(ex, await start(ex, factory, method, params, true), method, value)
    } else if (params.requestState !== undefined) {
      settled = await resume(ex, method, value, params)
    } else {
      delete params.inputResponses
      params[field] = name
      settled = await settle(ex, await start(ex, factory, method, params, true), method, value)
    }
    if (settled === undefined) return
    const { res, entry } = settled
    if (res.error !== undefined) { await ex.answer(res, errorStatus(res)); return }
    if (native && kind === 'tool' && (res.result as { resultType?: unknown } | undefined)?.resultType === 'task') {
      await adoptTask(ex, factory, name, res, entry)
      return
    }
    // As in the session era: URIs in results carry their target, so the gateway's resources/read takes them.
    if (kind === 'resource') router.markContents(factory.target, res)
    else router.markUris(factory.target, res)
    const result = (res.result ?? {}) as Record<string, unknown>
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, method, result, serverInfoOf(entry)) })
  }

  /**
   * A CreateTaskResult (SEP-2663): the task recorded as the calling subject's, its id as the client
   * sees it. Past the subject's limit the upstream's task is cancelled and the call refused: whether
   * a call becomes a task is the server's decision, known only from its answer.
   */
  async function adoptTask (ex: Exchange, factory: UpstreamFactory, tool: string, res: JsonRpcMessage, entry: PooledUpstream): Promise<void> {
    const result = res.result as Record<string, unknown>
    const upstreamId = result.taskId
    if (typeof upstreamId !== 'string') {
      await ex.fail(RPC.INTERNAL_ERROR, `upstream ${factory.target} answered a task without a taskId`)
      return
    }
    const cancelUpstream = (): void => {
      forward(ex, factory, 'tasks/cancel', { taskId: upstreamId }).catch((err: unknown) => {
        log.debug({ target: factory.target, err: (err as Error).message }, 'cancelling a refused task failed')
      })
    }
    const ttlMs = typeof result.ttlMs === 'number' && result.ttlMs > 0 ? result.ttlMs : undefined
    // Past its ttlMs the server may forget the task (SEP-2663): so does its id, and its slot's lease ends.
    const sealed = taskSeal.seal(ex.subjectKey, { target: factory.target, tool, taskId: upstreamId, expires: ttlMs === undefined ? 0 : Date.now() + ttlMs })
    if (sealed === undefined) {
      cancelUpstream()
      await ex.fail(RPC.INTERNAL_ERROR, `upstream ${factory.target} answered a task id too long to keep`)
      return
    }
    let joined: boolean
    try {
      joined = await taskSlots.join(taskSlotKey(ex.subjectKey), factory.target + '\n' + upstreamId, maxTasks, Math.min(ttlMs ?? TASK_LEASE_MAX_MS, TASK_LEASE_MAX_MS))
    } catch (err) {
      cancelUpstream()
      throw err
    }
    if (!joined) {
      log.warn({ target: factory.target, tool, limit: maxTasks }, 'task refused: too many unfinished tasks (mcp.limits.maxTasksPerSession)')
      cancelUpstream()
      await ex.fail(RPC.SERVER_ERROR, `Too many tasks: ${maxTasks} unfinished (mcp.limits.maxTasksPerSession: ${maxTasks}); wait for one to end`)
      return
    }
    result.taskId = sealed
    // With several targets the id is named <target>_<sealed id>, as every other name of a target.
    router.markTasks(factory.target, res)
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, 'tools/call', result, serverInfoOf(entry)) })
  }

  /**
   * tasks/get, tasks/update, tasks/cancel (SEP-2663): only a task the calling subject created, whose
   * tool the rules still allow; anything else is an unknown task (-32602), as the extension answers
   * an id it does not recognize. Forwarded to the task's target under its own id.
   */
  async function taskRequest (ex: Exchange, method: string, params: Record<string, unknown>): Promise<void> {
    const ext = (ex.clientCapabilities.extensions as Record<string, unknown> | undefined)?.[TASKS_EXTENSION]
    if (ext === undefined || ext === null) {
      // SEP-2663: the task methods need the extension negotiated (SEP-2575 Missing Required Capabilities).
      await ex.fail(MODERN_RPC.MISSING_REQUIRED_CLIENT_CAPABILITY, 'Missing required client capability', 400, { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } })
      return
    }
    const clientId = params.taskId
    const named = multi ? router.resolveTask(clientId) : undefined
    const task = taskSeal.open(ex.subjectKey, multi ? named?.taskId : clientId)
    const factory = task === undefined || (multi && named?.target.target !== task.target) ? undefined : opts.targets.find(f => f.target === task.target)
    if (task === undefined || factory === undefined || !router.allows(ex.ctx, 'tools/call', 'tool', task.tool, factory.target)) {
      await ex.fail(RPC.INVALID_PARAMS, `Unknown task: ${String(clientId)}`)
      return
    }
    ex.ctx.target = factory.target
    const { res, entry } = await forward(ex, factory, method, { ...params, taskId: task.taskId })
    if (res.error !== undefined) { await ex.answer(res, errorStatus(res)); return }
    const result = (res.result ?? {}) as Record<string, unknown>
    // The slot is free once the task is seen ended (a terminal status, or the cancel acknowledged).
    if (method === 'tasks/cancel' || isTerminal(result.status)) {
      taskSlots.leave(taskSlotKey(ex.subjectKey), factory.target + '\n' + task.taskId).catch((err: unknown) => {
        log.warn({ err: (err as Error).message }, 'freeing a task slot in shared state failed (its lease expires)')
      })
    }
    router.markTasks(factory.target, res)
    if (typeof result.taskId === 'string') result.taskId = clientId
    // A finished task's inlined result: its URIs as the client sees them, as a tools/call result's.
    if (result.result !== null && typeof result.result === 'object') router.markUris(factory.target, { jsonrpc: '2.0', result: result.result })
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, method, result, serverInfoOf(entry)) })
  }

  async function complete (ex: Exchange, params: Record<string, unknown>): Promise<void> {
    const routed = router.completion(ex.ctx, params.ref as { type?: string; name?: unknown; uri?: unknown } | undefined)
    if (routed === undefined) { await ex.fail(RPC.INVALID_PARAMS, 'Unknown completion reference'); return }
    const factory = routed.target
    ex.ctx.target = factory.target
    const forwarded = await forward(ex, factory, 'completion/complete', params)
    const { entry } = forwarded
    // Refused: the upstream's answer for a reference it does not have, with the caller's name.
    const res = routed.standIn === undefined ? forwarded.res : routed.standIn.restore(forwarded.res)
    if (res.error !== undefined) { await ex.answer(res); return }
    await ex.answer({ jsonrpc: '2.0', result: decorate(ex, 'completion/complete', (res.result ?? {}) as Record<string, unknown>, serverInfoOf(entry)) })
  }

  /**
   * subscriptions/listen (MCP 2026-07-28 Subscriptions): holds one upstream
   * per target for the stream's life, subscribes the requested resources on
   * it, and relays the opted-in change notifications tagged with the
   * subscription id (the listen request's id).
   */
  async function listen (ex: Exchange, params: Record<string, unknown>): Promise<void> {
    const want = (params.notifications ?? {}) as { toolsListChanged?: unknown; promptsListChanged?: unknown; resourcesListChanged?: unknown; resourceSubscriptions?: unknown }
    const all: PooledUpstream[] = []
    const parts = await Promise.allSettled(opts.targets.map(f => lease(ex, f)))
    for (const p of parts) if (p.status === 'fulfilled') all.push(p.value)
    const releaseAll = (): void => { for (const e of all) pool.release(e) }
    if (all.length === 0) { await ex.fail(RPC.SERVER_ERROR, 'no upstream available', 502); return }
    // Native targets hold a subscriptions/listen of their own; session-era ones are listened to here.
    const held = all.filter(e => e.mode === 'session')
    const natives = all.filter(e => e.mode === 'modern')
    const capOf = (e: PooledUpstream, kind: string, flag: string): boolean => {
      const c = (e.initResult?.capabilities as Record<string, Record<string, unknown> | undefined> | undefined)?.[kind]
      return c?.[flag] === true
    }
    const agreed: Record<string, unknown> = {}
    if (want.toolsListChanged === true && held.some(e => capOf(e, 'tools', 'listChanged'))) agreed.toolsListChanged = true
    if (want.promptsListChanged === true && held.some(e => capOf(e, 'prompts', 'listChanged'))) agreed.promptsListChanged = true
    if (want.resourcesListChanged === true && held.some(e => capOf(e, 'resources', 'listChanged'))) agreed.resourcesListChanged = true
    /** target -> upstream URIs subscribed there. */
    const subscribed = new Map<PooledUpstream, Set<string>>()
    const acked: string[] = []
    if (Array.isArray(want.resourceSubscriptions)) {
      for (const uri of want.resourceSubscriptions) {
        if (typeof uri !== 'string') continue
        const routed = router.route('resource', uri)
        const entry = 'answer' in routed ? undefined : held.find(e => e.target === routed.target.target)
        if (entry === undefined || !capOf(entry, 'resources', 'subscribe')) continue
        const name = (routed as { name: string }).name
        if (!router.allowsWatch(ex.ctx, name, entry.target)) continue
        const set = subscribed.get(entry) ?? new Set<string>()
        if (set.has(name)) { acked.push(uri); continue }
        // Counted on the upstream: another holder of the same URI keeps its subscription when this stream ends.
        const r = await entry.subscribe(name)
        if (r.error !== undefined) continue
        set.add(name)
        subscribed.set(entry, set)
        acked.push(uri)
      }
    }
    const tag = (): Record<string, unknown> => ({ [META.subscriptionId]: ex.id })
    let stream: SseStream | undefined
    /** Notifications that arrive between an upstream's acknowledgement and the client's. */
    const early: JsonRpcMessage[] = []
    const relay = (m: JsonRpcMessage): void => { if (stream === undefined) early.push(m); else stream.send(m) }
    let ended = false
    let shutdown = (): void => {}
    // Each native upstream gets the part of the filter that is its (its own URIs), acknowledges, then streams.
    const upstreamListens = await Promise.all(natives.map(async entry => {
      const mine: Record<string, unknown> = {}
      for (const k of ['toolsListChanged', 'promptsListChanged', 'resourcesListChanged'] as const) if (want[k] === true) mine[k] = true
      const uris = new Map<string, string>()
      if (Array.isArray(want.resourceSubscriptions)) {
        for (const uri of want.resourceSubscriptions) {
          if (typeof uri !== 'string') continue
          const routed = router.route('resource', uri)
          if ('answer' in routed || routed.target.target !== entry.target) continue
          const name = routed.name as string
          if (!router.allowsWatch(ex.ctx, name, entry.target)) continue
          uris.set(name, uri)
        }
        mine.resourceSubscriptions = [...uris.keys()]
      }
      let ack!: (n: Record<string, unknown> | undefined) => void
      const acknowledged = new Promise<Record<string, unknown> | undefined>(resolve => { ack = resolve })
      const params = { _meta: { ...ex.meta }, notifications: mine }
      const call = entry.call({ jsonrpc: '2.0', method: 'subscriptions/listen', params }, {
        timeoutMs: 0,
        headers: { 'mcp-protocol-version': MODERN_REVISION, 'mcp-method': 'subscriptions/listen' },
        onNotification: (m) => {
          const p = { ...(m.params ?? {}) } as Record<string, unknown>
          if (m.method === 'notifications/subscriptions/acknowledged') { ack(p.notifications as Record<string, unknown> | undefined); return }
          if (ended) return
          if (m.method === 'notifications/resources/updated') {
            const uri = typeof p.uri === 'string' ? uris.get(p.uri) : undefined
            if (uri === undefined) return
            p.uri = uri
          } else {
            const flag = m.method === 'notifications/tools/list_changed' ? 'toolsListChanged' : m.method === 'notifications/prompts/list_changed' ? 'promptsListChanged' : m.method === 'notifications/resources/list_changed' ? 'resourcesListChanged' : undefined
            if (flag === undefined || agreed[flag] !== true) return
          }
          relay({ jsonrpc: '2.0', method: m.method, params: { ...p, _meta: { ...((p._meta ?? {}) as Record<string, unknown>), ...tag() } } })
        },
      })
      // The upstream's listen ending (its graceful result, or a failure) ends the client's.
      let upstreamAcked = false
      void acknowledged.then(() => { upstreamAcked = true })
      void call.done.then(res => {
        if (!upstreamAcked && res.error !== undefined) {
          // Refused before acknowledging: the target is left out of the acknowledgement, which lists
          // only what was agreed (MCP 2026-07-28 subscriptions, "Acknowledgment"); the operator sees why.
          log.warn({ target: entry.target, code: res.error.code, err: res.error.message }, 'upstream refused subscriptions/listen; left out of the acknowledgement')
        } else if (res.error !== undefined) {
          log.debug({ target: entry.target, err: res.error.message }, 'upstream subscriptions/listen ended')
        }
        ack(undefined)
        shutdown()
      })
      ex.calls.add(call)
      const got = await acknowledged
      if (got !== undefined) {
        for (const k of ['toolsListChanged', 'promptsListChanged', 'resourcesListChanged']) if (got[k] === true) agreed[k] = true
        if (Array.isArray(got.resourceSubscriptions)) for (const u of got.resourceSubscriptions) if (typeof u === 'string' && uris.has(u)) acked.push(uris.get(u)!)
      }
      return call
    }))
    if (acked.length > 0) agreed.resourceSubscriptions = acked
    const cancelNatives = (): void => { for (const c of upstreamListens) { ex.calls.delete(c); c.cancel('subscription ended') } }
    if (ex.aborted || ex.ctx.res.destroyed) { cancelNatives(); unsubscribeAll(); releaseAll(); return }
    await ex.ctx.writeHead(200, { ...SSE_HEADERS })
    stream = new SseStream(ex.ctx.res, opts.streams)
    ex.stream = stream
    stream.send({ jsonrpc: '2.0', method: 'notifications/subscriptions/acknowledged', params: { _meta: tag(), notifications: agreed } })
    for (const m of early.splice(0)) stream.send(m)
    const out = stream
    const listeners = held.map(entry => {
      const fn = (msg: JsonRpcMessage): void => {
        let flag: string | undefined
        switch (msg.method) {
          case 'notifications/tools/list_changed': flag = 'toolsListChanged'; break
          case 'notifications/prompts/list_changed': flag = 'promptsListChanged'; break
          case 'notifications/resources/list_changed': flag = 'resourcesListChanged'; break
          case 'notifications/resources/updated': {
            const uri = msg.params?.uri
            if (typeof uri !== 'string' || subscribed.get(entry)?.has(uri) !== true) return
            out.send({ jsonrpc: '2.0', method: msg.method, params: { ...msg.params, uri: router.clientUri(entry.target, uri), _meta: tag() } })
            return
          }
        }
        if (flag === undefined || agreed[flag] !== true) return
        out.send({ jsonrpc: '2.0', method: msg.method, params: { ...(msg.params ?? {}), _meta: tag() } })
      }
      entry.listeners.add(fn)
      return [entry, fn] as const
    })
    const keepAlive = setInterval(() => out.keepAlive(), KEEPALIVE_MS)
    keepAlive.unref()
    function unsubscribeAll (): void {
      for (const [entry, uris] of subscribed) for (const uri of uris) entry.unsubscribe(uri)
      subscribed.clear()
    }
    const end = (graceful: boolean): void => {
      if (ended) return
      ended = true
      ex.finished = true
      listens.delete(shutdown)
      clearInterval(keepAlive)
      for (const [entry, fn] of listeners) entry.listeners.delete(fn)
      cancelNatives()
      unsubscribeAll()
      releaseAll()
      // Graceful closure: a result for the listen request, then the stream ends.
      if (graceful) out.end({ jsonrpc: '2.0', id: ex.id, result: { resultType: 'complete', _meta: tag() } })
      else out.end()
    }
    shutdown = (): void => end(true)
    listens.add(shutdown)
    out.onClose(() => end(false))
    // An upstream that ends ends the subscription: its state (subscriptions) is gone.
    for (const entry of all) entry.onGone.add(shutdown)
    out.onClose(() => { for (const entry of all) entry.onGone.delete(shutdown) })
  }

  async function dispatch (ex: Exchange, msg: JsonRpcMessage): Promise<void> {
    const method = msg.method!
    const params = upstreamParams(msg.params)
    switch (method) {
      case 'server/discover': return discover(ex)
      case 'tools/list': case 'prompts/list': case 'resources/list': case 'resources/templates/list': return list(ex, method, params)
      case 'tools/call': case 'prompts/get': case 'resources/read': return named(ex, method, params)
      case 'completion/complete': return complete(ex, params)
      case 'subscriptions/listen': return listen(ex, msg.params ?? {})
      case 'tasks/get': case 'tasks/update': case 'tasks/cancel': return taskRequest(ex, method, params)
      default:
        // Not in this revision (initialize, ping, logging/setLevel, resources/subscribe, tasks/result, tasks/list, ...).
        return ex.fail(RPC.METHOD_NOT_FOUND, `Method not found: ${method}`, 404)
    }
  }

  return {
    async post (ctx: RequestContext, body: unknown): Promise<void> {
      if (Array.isArray(body)) {
        throw new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, `Invalid Request: JSON-RPC batches are not part of protocol revision ${MODERN_REVISION}`, { rpcCode: RPC.INVALID_REQUEST })
      }
      const msg = body as JsonRpcMessage
      if (msg.method === undefined) {
        throw new ProxyError('MCPP_ERR_INVALID_REQUEST', 400, 'Invalid Request: clients send no JSON-RPC responses in this revision', { rpcCode: RPC.INVALID_REQUEST })
      }
      if (msg.id === undefined || msg.id === null) {
        // No client notification is defined over HTTP in this revision; accepted and dropped.
        await ctx.writeHead(202, { 'content-length': 0 })
        ctx.res.end()
        return
      }
      validate(ctx, msg)
      const meta = msg.params?._meta as Record<string, unknown>
      const level = meta[META.logLevel]
      const ex = new Exchange(ctx, msg.id, subjectKeyOf(ctx), typeof level === 'string' && LOG_LEVELS.includes(level) ? level : undefined, meta[META.clientCapabilities] as Record<string, unknown>, opts.streams)
      ex.meta = meta
      try {
        await dispatch(ex, msg)
      } catch (err) {
        if (ex.finished || ctx.headersSent) {
          log.warn({ err: (err as Error).message }, 'modern request failed after the answer began')
          if (!ex.finished) await ex.fail(RPC.INTERNAL_ERROR, 'internal error')
          return
        }
        throw err
      }
    },

    get listening (): number { return listens.size },

    close (): void {
      for (const end of [...listens]) end()
      for (const [state, c] of continuations) {
        continuations.delete(state)
        clearTimeout(c.timer)
        c.run.call.cancel('gateway closing')
        pool.release(c.run.entry)
      }
    },
  }
}
