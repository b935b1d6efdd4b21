/**
 * A failed listen() names the setting behind it: "mcp.port 3000 is already in
 * use (EADDRINUSE)" tells the operator which key to change, where Node's own
 * "listen EADDRINUSE: address already in use 0.0.0.0:3000" does not (three
 * listeners, mcp, admin and probes, may share a host).
 */

/** `key` is the port's config path (`mcp.port`); its host is the sibling `.host`. */
export function listenError(err: unknown, key: string, port: number, host: string): unknown {
  const code = (err as NodeJS.ErrnoException | undefined)?.code
  const hostKey = key.replace(/\.port$/, '.host')
  let message: string
  if (code === 'EADDRINUSE') message = `${key} ${port} is already in use (EADDRINUSE) on ${host}`
  else if (code === 'EACCES') message = `${key} ${port} on ${host}: permission denied (EACCES; ports below 1024 need privileges)`
  else if (code === 'EADDRNOTAVAIL') message = `${hostKey} ${host} is not an address of this machine (EADDRNOTAVAIL)`
  else return err
  return Object.assign(new Error(message, { cause: err }), { code })
}
