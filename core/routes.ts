/**
 * Exact-match route table built once from the plugins' `routes`.
 */
import type { Plugin, RouteDef } from './plugin.ts'
import { ProxyError } from './errors.ts'

export class RouteTable {
  readonly #routes = new Map<string, RouteDef>()
  constructor(plugins: readonly Plugin[], reserved: readonly string[] = ['/mcp']) {
    for (const p of plugins) {
      for (const r of p.routes ?? []) {
        if (reserved.includes(r.path)) throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `plugin ${p.name}: route ${r.path} is reserved`)
        if (this.#routes.has(r.path)) throw new ProxyError('MCPP_ERR_PLUGIN_LOAD', 500, `plugin ${p.name}: route ${r.path} is already taken`)
        this.#routes.set(r.path, r)
      }
    }
  }
  get(path: string): RouteDef | undefined {
    return this.#routes.get(path)
  }
  paths(): string[] {
    return [...this.#routes.keys()]
  }
}
