/**
 * Runs plugin hooks: `onRequest` forward until one answers, then `onResponse`
 * in reverse for every plugin that ran. It owns nothing else.
 *
 * Both runners stay synchronous while every hook answers synchronously (the
 * usual case: a token cache hit, CORS, rules), and switch to awaiting from
 * the first hook that returns a promise. A request then costs no promise and
 * no microtask turn per hook.
 */
import type { Plugin } from './plugin.ts'
import type { RequestContext, ResponseContext, Reply } from './context.ts'

/**
 * A hook's answer to await: any thenable (a third-party plugin may return a
 * promise of another library), as an `await` on it would.
 */
function isThenable(r: unknown): r is PromiseLike<unknown> {
  return r !== null && typeof r === 'object' && typeof (r as Partial<PromiseLike<unknown>>).then === 'function'
}

export class Pipeline {
  readonly plugins: readonly Plugin[]
  readonly #requestHooks: ReadonlyArray<Plugin>
  constructor(plugins: readonly Plugin[]) {
    this.plugins = Object.freeze([...plugins])
    this.#requestHooks = this.plugins
  }

  /**
   * Runs `onRequest` hooks in order. Gives the Reply that short-circuited,
   * if any (a promise of it once a hook was asynchronous), and records in
   * `ran` how many plugins ran (for `onResponse`). A throwing hook counts as
   * having run; its error is thrown (or rejects the promise).
   */
  runRequest(ctx: RequestContext, ran: { count: number }): Reply | undefined | Promise<Reply | undefined> {
    const hooks = this.#requestHooks
    for (let i = 0; i < hooks.length; i++) {
      ran.count = i + 1
      const hook = hooks[i]!.onRequest
      if (hook === undefined) continue
      const r = hook.call(hooks[i], ctx)
      if (r === undefined) continue
      if (isThenable(r)) return this.#awaitRequest(ctx, ran, r as PromiseLike<void | Reply>, i + 1)
      return r as Reply
    }
    return undefined
  }

  /** The rest of `runRequest` once hook `next - 1` returned a promise. */
  async #awaitRequest(ctx: RequestContext, ran: { count: number }, pending: PromiseLike<void | Reply>, next: number): Promise<Reply | undefined> {
    const first = await pending
    if (first !== undefined) return first
    const hooks = this.#requestHooks
    for (let i = next; i < hooks.length; i++) {
      ran.count = i + 1
      const hook = hooks[i]!.onRequest
      if (hook === undefined) continue
      const r = hook.call(hooks[i], ctx)
      const reply = isThenable(r) ? await r : r
      if (reply !== undefined) return reply
    }
    return undefined
  }

  /**
   * Runs `onResponse` in reverse for the first `count` plugins. Returns a
   * promise only once a hook returned one.
   */
  runResponse(rctx: ResponseContext, count: number): void | Promise<void> {
    for (let i = count - 1; i >= 0; i--) {
      const hook = this.plugins[i]!.onResponse
      if (hook === undefined) continue
      const r = hook.call(this.plugins[i], rctx)
      if (isThenable(r)) return this.#awaitResponse(rctx, r, i - 1)
    }
  }

  async #awaitResponse(rctx: ResponseContext, pending: PromiseLike<void>, next: number): Promise<void> {
    await pending
    for (let i = next; i >= 0; i--) {
      const hook = this.plugins[i]!.onResponse
      if (hook === undefined) continue
      const r = hook.call(this.plugins[i], rctx)
      if (isThenable(r)) await r
    }
  }
}
