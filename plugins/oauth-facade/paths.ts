/** The facade's own endpoints (the metadata documents share the bridge's paths, oauth-common/metadata.ts). */
export const AUTHORIZE_PATH = '/oauth/authorize'
export const TOKEN_PATH = '/oauth/token'
export const CONSENT_PATH = '/oauth/consent'
