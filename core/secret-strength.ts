/**
 * Refuses secrets that are plainly not secret: a placeholder copied from a
 * manifest or a README (`replace-me-with-at-least-32-random-characters` passes
 * a length check) or a string with hardly any variety. A value that passes is
 * not thereby strong; one that fails is certainly shared with everyone who
 * read the same file. Generate secrets with `openssl rand -base64 48`.
 */

const PLACEHOLDER = /replace|change[-_ ]?me|changeit|example|placeholder|your[-_ ]|secret[-_ ]?here|todo|xxxx|dummy|sample/i

/** Why `value` cannot be a real secret, or undefined when it may be one. */
export function weakSecret(value: string): string | undefined {
  if (PLACEHOLDER.test(value)) return 'looks like a placeholder, not a secret: generate one (openssl rand -base64 48)'
  if (new Set(value).size < 10) return 'has fewer than 10 distinct characters: generate one (openssl rand -base64 48)'
  return undefined
}
