/**
 * How the Entra emulator authenticates a confidential app at its token endpoint: a client secret (in
 * the form, or HTTP Basic) or a certificate credential, i.e. a `client_assertion` JWT (RFC 7523
 * `private_key_jwt`) signed with a key registered on the app and named by the `x5t` header (the
 * certificate's base64url SHA-1 thumbprint), `iss` = `sub` = the app id, `aud` = the token endpoint
 * (learn.microsoft.com, "Microsoft identity platform application authentication certificate credentials").
 */
import type { IncomingMessage } from 'node:http'
import { decodeProtectedHeader, importJWK, jwtVerify, type CryptoKey, type JWK } from 'jose'
import { entraError, type EntraErrorAnswer } from './entra-errors.ts'

const ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer'

/** A certificate credential registered on the app: its thumbprint and public key. */
export interface EntraCertificate {
  /** The `x5t` a client assertion names it by (base64url SHA-1 of the certificate). */
  readonly x5t: string
  /** The certificate's public key. */
  readonly publicKey: CryptoKey | JWK
}

/** How the client authenticated; `none` for a public client's request. */
export type ClientAuthMethod = 'secret' | 'certificate' | 'none'

export interface ClientAuthInput {
  readonly clientId: string
  /** The app's secret, when it has one. */
  readonly clientSecret: string | undefined
  readonly certificates: readonly EntraCertificate[]
  /** Audiences a client assertion may name: the token endpoint URLs. */
  readonly assertionAudiences: readonly string[]
}

/** The client id the request claims (form, Basic, or the assertion's `sub`) and the credential it presented. */
export function presentedClient(req: IncomingMessage, form: URLSearchParams): { clientId: string | null; secret: string | null } {
  let clientId = form.get('client_id')
  let secret = form.get('client_secret')
  const basic = /^basic\s+(.+)$/i.exec(req.headers.authorization ?? '')
  if (basic !== null) {
    const [u, p] = Buffer.from(basic[1]!, 'base64').toString('utf8').split(':')
    clientId = decodeURIComponent(u ?? '')
    secret = decodeURIComponent(p ?? '')
  }
  return { clientId, secret }
}

/**
 * Checks the presented credential; `required`: a confidential flow (client_credentials, OBO, or an app
 * with a secret) that must present one. Answers the method used, or Entra's error.
 */
export async function authenticateClient(
  a: ClientAuthInput,
  form: URLSearchParams,
  secret: string | null,
  required: boolean
): Promise<ClientAuthMethod | EntraErrorAnswer> {
  const assertion = form.get('client_assertion')
  if (assertion !== null) return certificateAuth(a, form, assertion)
  if (secret === null) {
    if (!required) return 'none'
    return entraError('invalid_client', "AADSTS7000218: The request body must contain the following parameter: 'client_assertion' or 'client_secret'.")
  }
  if (a.clientSecret === undefined || secret !== a.clientSecret) {
    return entraError(
      'invalid_client',
      `AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '${a.clientId}'.`
    )
  }
  return 'secret'
}

async function certificateAuth(a: ClientAuthInput, form: URLSearchParams, assertion: string): Promise<'certificate' | EntraErrorAnswer> {
  if (form.get('client_assertion_type') !== ASSERTION_TYPE) {
    return entraError('invalid_request', `AADSTS50027: JWT token is invalid or malformed. client_assertion_type must be '${ASSERTION_TYPE}'.`)
  }
  let x5t: string | undefined
  try {
    x5t = decodeProtectedHeader(assertion).x5t
  } catch {
    return entraError('invalid_request', 'AADSTS50027: JWT token is invalid or malformed.')
  }
  const cert = a.certificates.find(c => c.x5t === x5t)
  const keyNotFound = `AADSTS700027: Client assertion contains an invalid signature. [Reason - The key was not found., Thumbprint of key used by client: '${x5t ?? ''}', Please visit the Azure Portal, Graph Explorer or directly use MS Graph to see configured keys for app Id '${a.clientId}'.]`
  if (cert === undefined) return entraError('invalid_client', keyNotFound)
  const key = 'kty' in cert.publicKey ? await importJWK(cert.publicKey, 'RS256') : cert.publicKey
  try {
    await jwtVerify(assertion, key, { issuer: a.clientId, subject: a.clientId, audience: [...a.assertionAudiences], requiredClaims: ['exp', 'jti'] })
  } catch (err) {
    const code = (err as { code?: string }).code
    if (code === 'ERR_JWT_EXPIRED') return entraError('invalid_client', 'AADSTS700024: Client assertion is not within its valid time range.')
    if (code === 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED') {
      return entraError(
        'invalid_client',
        keyNotFound.replace('The key was not found.', 'The provided signature value did not match the expected signature value.')
      )
    }
    // AADSTS50027 (InvalidJwtToken) covers an unexpected audience or issuer; for a client credential it is invalid_client.
    return entraError(
      'invalid_client',
      `AADSTS50027: JWT token is invalid or malformed. [Reason - the client assertion's audience, issuer or subject is not valid for app '${a.clientId}' (${code ?? 'invalid'}).]`
    )
  }
  return 'certificate'
}
