/**
 * Runs plugin hooks: `onRequest` forward until one answers, then `onResponse`
 * in reverse for every plugin that ran. It owns nothing else.
 */
import type { Plugin } from './plugin.ts'
import type { RequestContext, ResponseContext, Reply } from './context.ts'

export class Pipeline {
  readonly plugins: readonly Plugin[]
  readonly #requestHooks: ReadonlyArray<Plugin>
  constructor (plugins: readonly Plugin[]) {
    this.plugins = Object.freeze([...plugins])
    this.#requestHooks = this.plugins
  }

  /**
   * Runs `onRequest` hooks in order. Returns the Reply that short-circuited,
   * if any, and how many plugins ran (for `onResponse`). A throwing hook
   * counts as having run.
   */
  async runRequest (ctx: RequestContext, ran: { count: number }): Promise<Reply | undefined> {
    const hooks = this.#requestHooks
    for (let i = 0; i < hooks.length; i++) {
      ran.count = i + 1
      const hook = hooks[i]!.onRequest
      if (hook === undefined) continue
      const r = hook.call(hooks[i], ctx)
      const reply = r instanceof Promise ? await r : r
      if (reply !== undefined) return reply
    }
    return undefined
  }

  /** Runs `onResponse` in reverse for the first `count` plugins. */
  async runResponse (rctx: ResponseContext, count: number): Promise<void> {
    for (let i = count - 1; i >= 0; i--) {
      const hook = this.plugins[i]!.onResponse
      if (hook === undefined) continue
      const r = hook.call(this.plugins[i], rctx)
      if (r instanceof Promise) await r
    }
  }
}
