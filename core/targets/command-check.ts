/**
 * Whether a stdio target could be spawned at all, without spawning it: its
 * working directory exists and its command resolves the way spawn() (execvp)
 * resolves it — a name with a slash against the working directory, a bare
 * name through the child's PATH — to an executable file. For readiness
 * (docs/configuration.md "Reference (summary)", `mcp.readiness.targets`): a target whose command does not exist fails every
 * session. Asynchronous only: it runs at start-up and on a timer.
 */
import { access, stat, constants } from 'node:fs/promises'
import { delimiter, join, resolve } from 'node:path'
import type { StdioTargetConfig } from '../config.ts'
import { childEnv } from './stdio.ts'

async function executable(path: string): Promise<boolean> {
  try {
    const s = await stat(path)
    if (!s.isFile()) return false
    await access(path, constants.X_OK)
    return true
  } catch {
    return false
  }
}

/** Why the target cannot start (the wording of a failed spawn), or undefined when it can. */
export async function commandProblem(config: Readonly<StdioTargetConfig>, baseDir: string): Promise<string | undefined> {
  const cwd = resolve(baseDir, config.cwd ?? '.')
  try {
    if (!(await stat(cwd)).isDirectory()) return `working directory ${cwd}: ENOTDIR`
  } catch (err) {
    return `working directory ${cwd}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`
  }
  const cmd = config.cmd
  if (cmd.includes('/') || (process.platform === 'win32' && cmd.includes('\\'))) {
    return (await executable(resolve(cwd, cmd))) ? undefined : `${cmd}: command not found (ENOENT)`
  }
  // Windows resolves through PATHEXT as well; only the POSIX rule is checked there.
  if (process.platform === 'win32') return undefined
  const path = childEnv(config.env).PATH ?? ''
  for (const dir of path.split(delimiter)) {
    if (dir !== '' && (await executable(join(resolve(cwd, dir), cmd)))) return undefined
  }
  return `${cmd}: command not found (ENOENT)`
}
