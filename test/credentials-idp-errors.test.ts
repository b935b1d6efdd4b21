/**
 * An IdP's refusal, as IdPs write it, sorted into what the MCP client can act
 * on (core/credentials/idp-errors.ts): Entra's AADSTS numbers (from
 * `error_codes` or the description), `suberror` and `claims`; OIDC and RFC
 * 6749 / 8693 `error` codes. The answers are pinned whole: status, code,
 * message (target and code only) and the `WWW-Authenticate` challenge with
 * RFC 7235 quoting. The same mappings run against the real Entra emulator in
 * test/credentials-obo.test.ts.
 */
import t from 'tap'
import { classifyRefusal, readRefusal } from '../core/credentials/idp-errors.ts'

const RMD = 'https://gw.example/.well-known/oauth-protected-resource/mcp'
const challenge = { resourceMetadataUrl: RMD, scope: 'openid crm' }

function sorted(body: Record<string, unknown>, c = challenge) {
  const f = classifyRefusal('graph', 'on-behalf-of exchange', readRefusal(body), c)
  return {
    reason: f.reason,
    code: f.error.code,
    status: f.error.statusCode,
    message: f.error.message,
    challenge: f.error.headers['www-authenticate'],
    retry: f.error.headers['retry-after'],
  }
}

t.test("Entra: consent, MFA, the caller's assertion, scope and client errors", async t => {
  t.same(
    sorted({
      error: 'invalid_grant',
      error_description: 'AADSTS65001: The user or administrator has not consented to use the application with ID ...',
      error_codes: [65001],
      suberror: 'consent_required',
    }),
    {
      reason: 'step_up',
      code: 'MCPP_ERR_TARGET_STEP_UP',
      status: 403,
      message: "target graph: the identity provider needs the user's consent (AADSTS65001)",
      challenge: `Bearer error="insufficient_scope", scope="openid crm", resource_metadata="${RMD}"`,
      retry: undefined,
    }
  )
  const claims = '{"access_token":{"capolids":{"essential":true,"values":["c1"]}}}'
  t.same(
    sorted({
      error: 'invalid_grant',
      error_description: 'AADSTS50076: Due to a configuration change ... you must use multi-factor authentication',
      error_codes: [50076],
      suberror: 'basic_action',
      claims,
    }),
    {
      reason: 'step_up',
      code: 'MCPP_ERR_TARGET_STEP_UP',
      status: 401,
      message: 'target graph: the identity provider needs the user to authenticate again (AADSTS50076)',
      challenge: `Bearer error="insufficient_claims", claims="${Buffer.from(claims).toString('base64')}", resource_metadata="${RMD}"`,
      retry: undefined,
    },
    "the IdP's claims challenge, base64 as Microsoft's claims challenges carry it"
  )
  t.match(
    sorted({ error: 'interaction_required', error_description: 'AADSTS50079: ...' }),
    { status: 401, message: /\(AADSTS50079\)$/ },
    'the code read from the description'
  )
  t.same(
    sorted({ error: 'interaction_required', error_description: 'AADSTS50079: ...' }).challenge,
    `Bearer error="insufficient_claims", resource_metadata="${RMD}"`,
    'no claims: none in the challenge'
  )
  for (const code of [50013, 500133]) {
    t.same(sorted({ error: 'invalid_grant', error_description: `AADSTS${code}: Assertion failed`, error_codes: [code] }), {
      reason: 'invalid_token',
      code: 'MCPP_ERR_UNAUTHORIZED',
      status: 401,
      message: `target graph: the identity provider refused the caller's token (AADSTS${code})`,
      challenge: `Bearer error="invalid_token", resource_metadata="${RMD}"`,
      retry: undefined,
    })
  }
  t.match(sorted({ error: 'invalid_scope', error_description: 'AADSTS70011: The provided value for scope is not valid.', error_codes: [70011] }), {
    reason: 'refused',
    code: 'MCPP_ERR_TARGET_CREDENTIAL',
    status: 502,
    message: 'target graph: the identity provider refused the on-behalf-of exchange (AADSTS70011)',
    challenge: undefined,
  })
  t.match(sorted({ error: 'invalid_client', error_description: 'AADSTS7000215: Invalid client secret provided.', error_codes: [7000215] }), {
    status: 502,
    reason: 'refused',
  })
  t.match(sorted({ error: 'invalid_grant', error_description: 'AADSTS70000: The provided grant is invalid.', error_codes: [70000] }), {
    status: 401,
    reason: 'invalid_token',
  })
})

t.test('RFC 6749 / 8693 / OIDC codes of other IdPs', async t => {
  t.match(sorted({ error: 'consent_required' }), { status: 403, reason: 'step_up', message: /\(consent_required\)$/ })
  t.match(sorted({ error: 'login_required' }), { status: 401, reason: 'step_up' })
  t.match(sorted({ error: 'insufficient_user_authentication', error_description: 'RFC 9470' }), { status: 401, reason: 'step_up' })
  t.match(sorted({ error: 'invalid_grant', error_description: 'subject_token is invalid' }), {
    status: 401,
    reason: 'invalid_token',
    message: /\(invalid_grant\)$/,
  })
  t.match(sorted({ error: 'invalid_token' }), { status: 401, reason: 'invalid_token' })
  for (const error of ['invalid_target', 'invalid_scope', 'invalid_client', 'unauthorized_client', 'invalid_request', 'unsupported_grant_type']) {
    t.match(sorted({ error }), { status: 502, reason: 'refused', message: `target graph: the identity provider refused the on-behalf-of exchange (${error})` })
  }
  t.match(sorted({ error: 'temporarily_unavailable' }), { status: 503, code: 'MCPP_ERR_IDP_UNAVAILABLE', reason: 'unavailable', retry: '5' })
})

t.test("what the IdP wrote is never echoed beyond a well-formed error code; the challenge's scope is quoted", async t => {
  t.match(sorted({ error: 'bad"code\r\nx: y' }), { message: 'target graph: the identity provider refused the on-behalf-of exchange (unrecognised error)' })
  t.match(sorted({ error: 'x'.repeat(65) }), { message: /\(unrecognised error\)$/ })
  t.match(sorted({}), { status: 502, message: /\(unrecognised error\)$/ })
  t.match(sorted({ error: 'invalid_scope', error_description: 'AADSTS70011: scope api://secret-internal-name is invalid' }), { message: /\(AADSTS70011\)$/ })
  t.notMatch(sorted({ error: 'invalid_scope', error_description: 'scope api://secret-internal-name is invalid' }).message, 'secret-internal-name')
  const quoted = sorted({ error: 'consent_required' }, { resourceMetadataUrl: RMD, scope: 'a"b c\\d' })
  t.equal(quoted.challenge, `Bearer error="insufficient_scope", scope="a\\"b c\\\\d", resource_metadata="${RMD}"`)
  t.equal(
    sorted({ error: 'consent_required' }, { resourceMetadataUrl: RMD, scope: '' }).challenge,
    `Bearer error="insufficient_scope", resource_metadata="${RMD}"`,
    'no scopes: no scope parameter'
  )
})
