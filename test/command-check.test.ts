/**
 * core/targets/command-check.ts: whether a stdio target's command could be
 * spawned, checked on the real file system without spawning it.
 */
import t from 'tap'
import { mkdtemp, writeFile, chmod, mkdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join, basename, dirname } from 'node:path'
import { commandProblem } from '../core/targets/command-check.ts'
import type { StdioTargetConfig } from '../core/config.ts'

const stdio = (c: Partial<StdioTargetConfig> & { cmd: string }): StdioTargetConfig => ({ args: [], env: {}, ...c })

t.test('paths, bare names through PATH, working directories', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpp-command-check-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  await writeFile(join(dir, 'server.sh'), '#!/bin/sh\n')
  await chmod(join(dir, 'server.sh'), 0o755)
  await writeFile(join(dir, 'data.txt'), 'not a program')
  await mkdir(join(dir, 'sub'))
  t.equal(await commandProblem(stdio({ cmd: process.execPath }), dir), undefined, 'an absolute path to an executable')
  t.equal(await commandProblem(stdio({ cmd: './server.sh' }), dir), undefined, 'a path relative to the working directory')
  t.equal(await commandProblem(stdio({ cmd: '../server.sh', cwd: 'sub' }), dir), undefined, 'cwd is relative to the config directory')
  t.equal(await commandProblem(stdio({ cmd: './data.txt' }), dir), './data.txt: command not found (ENOENT)', 'a file that is not executable')
  t.equal(await commandProblem(stdio({ cmd: './sub' }), dir), './sub: command not found (ENOENT)', 'a directory')
  t.equal(
    await commandProblem(stdio({ cmd: basename(process.execPath), env: { PATH: dirname(process.execPath) } }), dir),
    undefined,
    "a bare name found on the child's PATH"
  )
  t.equal(await commandProblem(stdio({ cmd: 'mcpp-no-such-server' }), dir), 'mcpp-no-such-server: command not found (ENOENT)')
  t.match(await commandProblem(stdio({ cmd: process.execPath, cwd: 'missing' }), dir), /^working directory .*missing: ENOENT$/)
  t.match(await commandProblem(stdio({ cmd: process.execPath, cwd: 'data.txt' }), dir), /^working directory .*data\.txt: ENOTDIR$/)
})
