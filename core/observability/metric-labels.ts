/**
 * Label values that come from clients, bounded: a JSON-RPC method name is a
 * metric label only when MCP defines it, anything else is `other`. A client
 * can name any method it likes; copying it into a label would let one caller
 * grow /metrics and the gateway's memory without limit (one series per name).
 */

/**
 * Every method of the MCP revisions served (schema.ts of 2024-11-05 through
 * 2025-11-25, plus what 2026-07-28 adds), requests and notifications of
 * both directions.
 */
const MCP_METHODS: ReadonlySet<string> = new Set([
  'initialize',
  'ping',
  'resources/list',
  'resources/templates/list',
  'resources/read',
  'resources/subscribe',
  'resources/unsubscribe',
  'prompts/list',
  'prompts/get',
  'tools/list',
  'tools/call',
  'logging/setLevel',
  'completion/complete',
  'sampling/createMessage',
  'roots/list',
  'elicitation/create',
  'tasks/get',
  'tasks/result',
  'tasks/list',
  'tasks/cancel',
  'notifications/initialized',
  'notifications/cancelled',
  'notifications/progress',
  'notifications/message',
  'notifications/resources/updated',
  'notifications/resources/list_changed',
  'notifications/tools/list_changed',
  'notifications/prompts/list_changed',
  'notifications/roots/list_changed',
  'notifications/elicitation/complete',
  'notifications/tasks/status',
  // 2026-07-28
  'server/discover',
  'subscriptions/listen',
  'notifications/subscriptions/acknowledged',
])

/** The method as a label value: its name when MCP defines it, else `other`. */
export function methodLabel(method: string): string {
  return MCP_METHODS.has(method) ? method : 'other'
}

/**
 * MCP 2025-11-25 (server/tools, "Tool names"): a tool name SHOULD be 1 to
 * 128 characters; a longer one is never a label value.
 */
const MAX_NAME_LENGTH = 128

/**
 * Names a target advertised (its tools/list answers) as label values: a
 * client can put any name in a tools/call, so only advertised names become
 * labels, at most `max` per target (the first advertised), and every other
 * name is `other`. Names are only ever added: a tool that disappears keeps
 * its series, and the cap bounds them.
 */
export class AdvertisedNames {
  readonly #names = new Set<string>()
  readonly #max: number

  constructor(max: number) {
    this.#max = max
  }

  /** Records an advertised name; true when it became a label value now. */
  add(name: unknown): name is string {
    if (typeof name !== 'string' || name === '' || name.length > MAX_NAME_LENGTH) return false
    if (this.#names.size >= this.#max || this.#names.has(name)) return false
    this.#names.add(name)
    return true
  }

  /** The name as a label value: itself when advertised, else `other`. */
  label(name: string): string {
    return this.#names.has(name) ? name : 'other'
  }
}
