/**
 * The Entra emulator's on-behalf-of grant (learn.microsoft.com, "Microsoft identity platform and OAuth
 * 2.0 On-Behalf-Of flow"): `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`,
 * `requested_token_use=on_behalf_of`, `assertion` = a user's access token whose `aud` is the calling
 * app (its client id or `api://<client id>`), `scope` = one downstream API's scopes or its `.default`.
 * The answer is a token for the downstream API in the format that API accepts (v1: `aud` = its
 * identifier URI, `appid`; v2: `aud` = its app id, `azp`), with `scp`, the user's `oid` and a `sub`
 * pairwise to the downstream app. The errors are Entra's, in its body shape (entra-errors.ts):
 * AADSTS50013 (assertion signature, issuer or audience), AADSTS500133 (assertion expired), AADSTS65001
 * (no consent; `suberror: consent_required`), AADSTS50076/50079 (MFA required, with a `claims`
 * challenge), AADSTS500011 (unknown resource), AADSTS70011 (unknown scope), AADSTS28000 (two resources).
 */
import { createHash, randomUUID } from 'node:crypto'
import { jwtVerify, type CryptoKey, type JWTPayload } from 'jose'
import { entraError, type EntraErrorAnswer } from './entra-errors.ts'

export const JWT_BEARER = 'urn:ietf:params:oauth:grant-type:jwt-bearer'
const OIDC_SCOPES = ['openid', 'profile', 'email', 'offline_access']

/** A downstream API the calling app holds delegated permissions on (its "API permissions"). */
export interface EntraDownstreamApi {
  /** The API's application (client) id, a GUID: `aud` of its v2 tokens. */
  readonly appId: string
  /** Its application ID URI (`api://crm`, `https://graph.microsoft.com`): `aud` of its v1 tokens. */
  readonly identifierUri: string
  /** Delegated scopes it exposes (short names). */
  readonly scopes: readonly string[]
  /** Tenant-wide (admin) consent for the calling app. Default true; a user's own consent (setConsent) overrides it. */
  readonly consented?: boolean
  /** A Conditional Access policy requiring MFA: the assertion must carry `amr` `mfa`. */
  readonly requireMfa?: boolean
  /** With requireMfa: the user has not registered MFA yet (AADSTS50079 instead of AADSTS50076). */
  readonly mfaEnrollmentRequired?: boolean
  /** `accessTokenAcceptedVersion` of the API. Default 2. */
  readonly tokenVersion?: 1 | 2
}

/** One OBO request the emulator answered (no token kept). */
export interface OboRecord {
  /** The assertion's `oid`, once verified. */
  readonly oid?: string
  /** The downstream API's app id, once the scope named one. */
  readonly api?: string
  readonly scp?: string
  /** The AADSTS code answered, when refused. */
  readonly error?: number
}

/** What the grant needs from the emulator. */
export interface OboContext {
  readonly tenant: string
  readonly clientId: string
  readonly issuerV1: string
  readonly issuerV2: string
  readonly publicKey: CryptoKey
  readonly ttl: number
  readonly apis: EntraDownstreamApi[]
  /** The user's consent to (client, api), when set; undefined falls back to the API's `consented`. */
  consentOf(oid: string, apiAppId: string): boolean | undefined
  /** A display name and username for the token, by oid. */
  userOf(oid: string): { name: string; preferredUsername: string } | undefined
  sign(payload: JWTPayload, issuer: string, audience: string): Promise<string>
  readonly log: OboRecord[]
}

/** `sub` as Entra issues it: pairwise per (user, application). */
export function pairwiseSub(oid: string, appId: string): string {
  return createHash('sha256')
    .update(oid + appId)
    .digest('base64url')
    .slice(0, 43)
}

/** A stable policy id for an API's MFA policy (what `capolids` names). */
function policyId(api: EntraDownstreamApi): string {
  const h = createHash('sha256').update(`policy:${api.appId}`).digest('hex')
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`
}

type Answer = { status: 200; body: Record<string, unknown> } | EntraErrorAnswer

/** Serves one OBO request whose client is already authenticated (`method`: how). */
export async function onBehalfOf(c: OboContext, form: URLSearchParams, method: 'secret' | 'certificate'): Promise<Answer> {
  const record: { -readonly [K in keyof OboRecord]: OboRecord[K] } = {}
  c.log.push(record)
  const answer = await grant(c, form, method, record)
  if (answer.status !== 200) record.error = (answer.body.error_codes as number[])[0]
  return answer
}

async function grant(
  c: OboContext,
  form: URLSearchParams,
  method: 'secret' | 'certificate',
  record: { oid?: string; api?: string; scp?: string }
): Promise<Answer> {
  for (const p of ['requested_token_use', 'assertion', 'scope']) {
    if (!form.get(p)) return entraError('invalid_request', `AADSTS900144: The request body must contain the following parameter: '${p}'.`)
  }
  if (form.get('requested_token_use') !== 'on_behalf_of') {
    // Our wording: the emulator serves no other jwt-bearer use.
    return entraError(
      'invalid_request',
      "AADSTS900144: The request body must contain the following parameter: 'requested_token_use' with the value 'on_behalf_of'."
    )
  }
  const verified = await verifyAssertion(c, form.get('assertion')!)
  if (!('user' in verified)) return verified
  const assertion = verified.user
  record.oid = assertion.oid
  const target = resolveScope(c, form.get('scope')!)
  if ('status' in target) return target
  const { api, scopes } = target
  record.api = api.appId
  const consented = c.consentOf(assertion.oid, api.appId) ?? api.consented ?? true
  if (!consented) {
    return entraError(
      'invalid_grant',
      `AADSTS65001: The user or administrator has not consented to use the application with ID '${c.clientId}' named 'mcp-gateway'. Send an interactive authorization request for this user and resource.`,
      { suberror: 'consent_required' }
    )
  }
  const amr = Array.isArray(assertion.amr) ? (assertion.amr as string[]) : []
  if (api.requireMfa === true && !amr.includes('mfa')) {
    const claims = JSON.stringify({ access_token: { capolids: { essential: true, values: [policyId(api)] } } })
    const [code, verb] = api.mfaEnrollmentRequired === true ? ['50079', 'enroll in'] : ['50076', 'use']
    return entraError(
      'interaction_required',
      `AADSTS${code}: Due to a configuration change made by your administrator, or because you moved to a new location, you must ${verb} multifactor authentication to access '${api.appId}'.`,
      { claims }
    )
  }
  record.scp = scopes.join(' ')
  return { status: 200, body: await downstreamToken(c, assertion, api, scopes, method) }
}

/** The assertion: signed by this emulator, issued by it (v1 or v2), for the calling app, not expired. */
async function verifyAssertion(c: OboContext, assertion: string): Promise<{ user: JWTPayload & { oid: string } } | EntraErrorAnswer> {
  let payload: JWTPayload
  try {
    ;({ payload } = await jwtVerify(assertion, c.publicKey, { issuer: [c.issuerV2, c.issuerV1], clockTolerance: 0 }))
  } catch (err) {
    const code = (err as { code?: string }).code
    if (code === 'ERR_JWT_EXPIRED') {
      const exp = (err as { payload?: JWTPayload }).payload?.exp ?? 0
      return entraError(
        'invalid_grant',
        `AADSTS500133: Assertion is not within its valid time range. Ensure that the access token is not expired before using it for user assertion, or request a new token. Current time: ${new Date().toISOString()}, expiry time of assertion ${new Date(exp * 1000).toISOString()}.`
      )
    }
    const reason = code === 'ERR_JWT_CLAIM_VALIDATION_FAILED' ? 'The token issuer does not match the API version.' : 'The key was not found.'
    return entraError('invalid_grant', `AADSTS50013: Assertion failed signature validation. [Reason - ${reason}]`)
  }
  const audiences = Array.isArray(payload.aud) ? payload.aud : [payload.aud]
  if (!audiences.some(a => a === c.clientId || a === `api://${c.clientId}`)) {
    return entraError(
      'invalid_grant',
      `AADSTS50013: Assertion audience does not match the Client app presenting the assertion. The audience in the assertion was '${audiences.join(',')}' and the expected audience is '${c.clientId}' or one of the Application Id URIs of this Web API.`
    )
  }
  // OBO works for user principals only (the doc's "Client limitations"): an app-only token has no user.
  if (typeof payload.oid !== 'string' || payload.idtyp === 'app') {
    return entraError('invalid_grant', 'AADSTS50013: Assertion is invalid. [Reason - An app-only token cannot be exchanged on behalf of a user.]')
  }
  return { user: payload as JWTPayload & { oid: string } }
}

/** The one downstream API the scope names, and its short scope names (`.default`: all it exposes). */
function resolveScope(c: OboContext, scope: string): { api: EntraDownstreamApi; scopes: string[] } | EntraErrorAnswer {
  let api: EntraDownstreamApi | undefined
  const names: string[] = []
  for (const s of scope.split(' ').filter(x => x !== '' && !OIDC_SCOPES.includes(x))) {
    const cut = s.lastIndexOf('/')
    const resource = cut > 0 ? s.slice(0, cut) : s
    const name = cut > 0 ? s.slice(cut + 1) : ''
    const found = c.apis.find(a => a.identifierUri === resource || a.appId === resource || `api://${a.appId}` === resource)
    if (found === undefined) {
      return entraError(
        'invalid_resource',
        `AADSTS500011: The resource principal named ${resource} was not found in the tenant named ${c.tenant}. This can happen if the application has not been installed by the administrator of the tenant or consented to by any user in the tenant. You might have sent your authentication request to the wrong tenant.`
      )
    }
    if (api !== undefined && api !== found) {
      return entraError(
        'invalid_scope',
        `AADSTS28000: Provided value for the input parameter scope is not valid because it contains more than one resource. Scope ${scope} is not valid.`
      )
    }
    api = found
    if (name === '.default') names.push(...found.scopes)
    else if (found.scopes.includes(name)) names.push(name)
    else return invalidScope(s)
  }
  if (api === undefined || names.length === 0) return invalidScope(scope)
  return { api, scopes: [...new Set(names)] }
}

function invalidScope(scope: string): EntraErrorAnswer {
  return entraError('invalid_scope', `AADSTS70011: The provided value for the input parameter 'scope' is not valid. The scope ${scope} is not valid.`)
}

async function downstreamToken(
  c: OboContext,
  user: JWTPayload & { oid: string },
  api: EntraDownstreamApi,
  scopes: string[],
  method: 'secret' | 'certificate'
): Promise<Record<string, unknown>> {
  const v1 = api.tokenVersion === 1
  const who = c.userOf(user.oid)
  const acr = method === 'certificate' ? '2' : '1'
  const claims: JWTPayload = {
    sub: pairwiseSub(user.oid, api.appId),
    oid: user.oid,
    tid: c.tenant,
    scp: scopes.join(' '),
    ver: v1 ? '1.0' : '2.0',
    uti: randomUUID().replaceAll('-', '').slice(0, 22),
    ...(user.amr !== undefined ? { amr: user.amr } : {}),
    ...(who === undefined ? {} : v1 ? { name: who.name, upn: who.preferredUsername } : { name: who.name, preferred_username: who.preferredUsername }),
    ...(v1 ? { appid: c.clientId, appidacr: acr } : { azp: c.clientId, azpacr: acr }),
  }
  const accessToken = await c.sign(claims, v1 ? c.issuerV1 : c.issuerV2, v1 ? api.identifierUri : api.appId)
  return {
    token_type: 'Bearer',
    scope: scopes.map(s => `${api.identifierUri}/${s}`).join(' '),
    expires_in: c.ttl,
    ext_expires_in: c.ttl,
    access_token: accessToken,
  }
}
