/**
 * What a client sees for one call, as comparable text: the result, or the
 * error's code and message. Used to show that a refused call is answered
 * exactly like a call to an item that does not exist.
 */
export async function outcome(call: () => Promise<unknown>, names: readonly string[]): Promise<string> {
  let text: string
  try {
    text = JSON.stringify({ result: await call() })
  } catch (err) {
    const e = err as { code?: unknown; message?: unknown; data?: unknown }
    text = JSON.stringify({ error: { code: e.code, message: e.message, data: e.data } })
  }
  // Longest first, so a prefixed name is replaced before its unprefixed part.
  for (const n of [...names].sort((a, b) => b.length - a.length)) text = text.split(n).join('<name>')
  return text
}
