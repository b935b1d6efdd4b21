/**
 * The refusals of a new session (or listen stream, or pooled upstream) for
 * want of room, one code per reason so that a log line or an alert says which
 * bound was hit: the gateway shutting down, `mcp.session.maxSessions`,
 * `mcp.session.maxSessionsPerSubject`, and the pool's process cap. Shared by
 * both eras and the passthrough, so each reason reads the same everywhere.
 */
import { ProxyError, RPC } from '../errors.ts'

/** Seconds a client is told to wait before it tries again (`Retry-After`). */
const RETRY_AFTER_SECONDS = '10'

export function shuttingDown(retryAfter = RETRY_AFTER_SECONDS): ProxyError {
  return new ProxyError('MCPP_ERR_SHUTTING_DOWN', 503, 'Service Unavailable: the gateway is shutting down', {
    rpcCode: RPC.SERVER_ERROR,
    headers: { 'retry-after': retryAfter },
    expose: true,
  })
}

export function sessionLimit(): ProxyError {
  return new ProxyError('MCPP_ERR_SESSION_LIMIT', 503, 'Service Unavailable: session limit reached', {
    rpcCode: RPC.SERVER_ERROR,
    headers: { 'retry-after': RETRY_AFTER_SECONDS },
    expose: true,
  })
}

export function subjectSessionLimit(): ProxyError {
  return new ProxyError('MCPP_ERR_SUBJECT_SESSION_LIMIT', 429, 'Too Many Requests: session limit for this subject reached', {
    rpcCode: RPC.SERVER_ERROR,
    headers: { 'retry-after': RETRY_AFTER_SECONDS },
  })
}

export function processLimit(): ProxyError {
  return new ProxyError('MCPP_ERR_PROCESS_LIMIT', 503, 'Service Unavailable: upstream process limit reached', {
    rpcCode: RPC.SERVER_ERROR,
    headers: { 'retry-after': RETRY_AFTER_SECONDS },
    expose: true,
  })
}
