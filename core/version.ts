/**
 * The gateway's version, read once at start-up from package.json: the one
 * place it comes from (--version, the start-up log, the admin API, serverInfo
 * on /mcp, the clientInfo of the admin's "try it").
 */
import { readFileSync } from 'node:fs'
import { packagePath } from './config.ts'

export const VERSION: string = (JSON.parse(readFileSync(packagePath('package.json'), 'utf8')) as { version: string }).version
