// An external authorization server's keys and tokens, made with Node's own
// crypto (not the library that checks them): an EC P-256 key in a JWKS and
// ES256 JWTs, good and bad. Prints {jwks, tokens: {NAME: JWT}}.
//
// node jwt.mjs ISSUER AUDIENCE
import { createHmac, generateKeyPairSync, sign } from 'node:crypto';

const [issuer, audience] = process.argv.slice(2);
const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
const jwk = { ...publicKey.export({ format: 'jwk' }), kid: 'k1', use: 'sig', alg: 'ES256' };
const b64 = (value) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url');
const now = Math.floor(Date.now() / 1000);

function jwt(claims, { key = privateKey, kid = 'k1', alg = 'ES256' } = {}) {
  const body = `${b64({ alg, typ: 'JWT', kid })}.${b64({ iss: issuer, aud: audience, sub: 'alice@example.test', client_id: 'team-agent', iat: now, exp: now + 600, ...claims })}`;
  const signature = alg === 'HS256'
    ? createHmac('sha256', JSON.stringify(jwk)).update(body).digest()
    : sign('sha256', Buffer.from(body), { key, dsaEncoding: 'ieee-p1363' });
  return `${body}.${signature.toString('base64url')}`;
}

console.log(JSON.stringify({
  jwks: { keys: [jwk] },
  tokens: {
    good: jwt({}),
    wrong_audience: jwt({ aud: 'https://elsewhere.example.test/mcp' }),
    expired: jwt({ iat: now - 7200, exp: now - 3600 }),
    wrong_issuer: jwt({ iss: 'https://impostor.example.test' }),
    other_key: jwt({}, { key: other }),
    unknown_kid: jwt({}, { kid: 'k2' }),
    symmetric: jwt({}, { alg: 'HS256' }),
    no_subject: jwt({ sub: undefined }),
  },
}));
