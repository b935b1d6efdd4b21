/**
 * The Entra emulator's users: the default one (logged in when no `login_hint` names another) and any
 * more a test configures by login name, each with a stable `oid` and the `amr` of their sign-ins.
 */
import { randomUUID } from 'node:crypto'

export interface EntraUser {
  readonly oid: string
  readonly name: string
  readonly preferredUsername: string
  /** App roles assigned to the user on the app registration. */
  readonly roles: readonly string[]
  /** Authentication methods of the user's sign-in (`amr`). Default `['pwd']`; an authorize request with `claims` adds `mfa`. */
  readonly amr: readonly string[]
}

/** The users by login name: the default one first. */
export function usersOf(opts: { user?: Partial<EntraUser>; users?: Readonly<Record<string, Partial<EntraUser>>> }): Map<string, EntraUser> {
  const make = (u: Partial<EntraUser> | undefined, login?: string): EntraUser => ({
    oid: u?.oid ?? randomUUID(),
    name: u?.name ?? (login === undefined ? 'Ada Admin' : login),
    preferredUsername: u?.preferredUsername ?? (login === undefined ? 'ada@contoso.test' : login.includes('@') ? login : `${login}@contoso.test`),
    roles: u?.roles ?? ['mcp.admin'],
    amr: u?.amr ?? ['pwd'],
  })
  const first = make(opts.user)
  const users = new Map([[first.preferredUsername, first]])
  for (const [login, u] of Object.entries(opts.users ?? {})) users.set(login, make(u, login))
  return users
}
