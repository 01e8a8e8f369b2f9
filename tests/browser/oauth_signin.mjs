// Signs in to an Outpost HTTP server as an OAuth client would, through a
// real browser: discovery from the 401, dynamic registration, PKCE, the
// consent page in Chromium, the redirect back to a loopback listener.
//
// node oauth_signin.mjs MCP_URL APPROVAL_CODE BEARER_TOKEN COUNT SHOT_DIR
// The first sign-in is approved with the approval code (after a wrong
// one), the others with the bearer token. Prints one JSON line:
// {client_id, redirect_uri, token_endpoint, revocation_endpoint,
//  wrong_code_refused, signins: [{code, verifier, state, iss}]}.
import { createServer } from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const [mcpUrl, approvalCode, bearer, count, shotDir] = process.argv.slice(2);

const fail = (why) => { console.error(why); process.exit(1); };
const b64url = (buf) => buf.toString('base64url');

// Discovery, as a client that knows only the MCP URL.
const first = await fetch(mcpUrl, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
if (first.status !== 401) fail(`expected 401, got ${first.status}`);
const challenge = first.headers.get('www-authenticate') ?? '';
const metadataUrl = /resource_metadata="([^"]+)"/.exec(challenge)?.[1] ?? fail(`no resource_metadata in ${challenge}`);
const resource = await (await fetch(metadataUrl)).json();
const issuer = resource.authorization_servers[0];
const server = await (await fetch(`${issuer}/.well-known/oauth-authorization-server`)).json();

// Where the browser comes back to.
const arrivals = [];
let arrived = () => {};
const callback = createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  // The browser asks for /favicon.ico too.
  if (url.pathname !== '/callback') { res.statusCode = 404; res.end(); return; }
  arrivals.push(Object.fromEntries(url.searchParams));
  res.end('signed in; you may close this page');
  arrived();
});
await new Promise((ok) => callback.listen(0, '127.0.0.1', ok));
const redirectUri = `http://127.0.0.1:${callback.address().port}/callback`;

const registered = await fetch(server.registration_endpoint, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ client_name: 'Browser <b>test</b> client', redirect_uris: [redirectUri] }),
});
if (registered.status !== 201) fail(`registration: ${registered.status} ${await registered.text()}`);
const client = await registered.json();

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
const page = await browser.newPage();
let wrongCodeRefused = false;
const signins = [];
for (let i = 0; i < Number(count); i++) {
  const verifier = b64url(randomBytes(48));
  const state = b64url(randomBytes(12));
  const url = new URL(server.authorization_endpoint);
  for (const [k, v] of Object.entries({
    response_type: 'code', client_id: client.client_id, redirect_uri: redirectUri,
    code_challenge: b64url(createHash('sha256').update(verifier).digest()),
    code_challenge_method: 'S256', state, scope: 'mcp', resource: resource.resource,
  })) url.searchParams.set(k, v);
  await page.goto(url.href);
  const shown = await page.textContent('#client');
  if (shown !== 'Browser <b>test</b> client') fail(`consent page names ${shown}`);
  if (i === 0) {
    await page.screenshot({ path: join(shotDir, 'oauth-consent.png') });
    await page.fill('#proof', 'AAAA-AAAA');
    await page.click('button[value=approve]');
    wrongCodeRefused = (await page.textContent('[role=alert]'))?.includes('not right') ?? false;
  }
  const back = new Promise((ok) => { arrived = ok; });
  await page.fill('#proof', i === 0 ? approvalCode : bearer);
  await page.click('button[value=approve]');
  await Promise.race([back, new Promise((_, no) => setTimeout(() => no(new Error('no redirect back')), 10000))]);
  const answer = arrivals.at(-1);
  if (answer.state !== state) fail(`state came back as ${answer.state}`);
  signins.push({ code: answer.code, verifier, state, iss: answer.iss });
}
await browser.close();
callback.close();
console.log(JSON.stringify({
  client_id: client.client_id, redirect_uri: redirectUri,
  token_endpoint: server.token_endpoint, revocation_endpoint: server.revocation_endpoint,
  wrong_code_refused: wrongCodeRefused, signins,
}));
