//! OAuth 2.1 for the HTTP server, beside its bearer tokens: what hosted
//! agents and `/mcp` logins speak to a remote MCP server.
//!
//! The server describes itself as a protected resource (RFC 9728, at
//! `/.well-known/oauth-protected-resource[/mcp]`, and a 401's
//! `WWW-Authenticate` points there) and is its own authorization server
//! for one owner (RFC 8414 metadata at
//! `/.well-known/oauth-authorization-server`):
//!
//! * `POST /register`: dynamic client registration (RFC 7591), public
//!   clients only; redirect URIs must be https, or http on a loopback
//!   address (whose port may differ at sign-in, RFC 8252).
//! * `GET /authorize`: authorization code with PKCE, S256 only; shows the
//!   [`consent`] page. `POST /authorize`: the owner approves with the
//!   one-time approval code this server prints on its console (50 random
//!   bits; each use prints the next; five wrong tries refuse codes for
//!   30 s, doubling up to 15 min) or with its bearer token.
//! * `POST /token`: the code (single use, 60 s; a second use revokes what
//!   the first got) for a 1 h access token bound to the MCP URL it was
//!   asked for (RFC 8707) and a rotating refresh token; or a refresh.
//! * `POST /revoke`: ends the grant a token belongs to (RFC 7009).
//!
//! Grants and clients live in [`crate::ops::grants`]. Every token is
//! refused on another resource, after it expires, or once revoked, with
//! a `WWW-Authenticate` that says which.
//!
//! With `[oauth]` in the config, an [`external`] authorization server
//! issues the tokens instead: the resource metadata names it, and the
//! built-in endpoints answer 404.

mod consent;
mod external;

pub(super) use consent::escape;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderMap, HeaderValue, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;
use subtle::ConstantTimeEq;

use super::Caller;
use super::answers::{self, Body, bare, json as json_answer, text};
use super::endpoint::{PATH, PublicUrl};
use super::tokens::Tokens;
use crate::ops::grants::{Grants, Invalid, digest, random};

/// The one owner the built-in server signs in.
pub const SUBJECT: &str = "owner";
/// The one scope: the MCP endpoint.
const SCOPE: &str = "mcp";
const CODE_TTL: Duration = Duration::from_secs(60);
/// How long a consent page may wait for its answer.
const CONSENT_TTL: Duration = Duration::from_secs(600);
/// Wrong approval codes before tries are refused for a while, doubling
/// from [`FIRST_LOCKOUT`] up to [`MAX_LOCKOUT`].
const MAX_WRONG: u32 = 5;
const FIRST_LOCKOUT: Duration = Duration::from_secs(30);
const MAX_LOCKOUT: Duration = Duration::from_secs(15 * 60);
/// Consent pages waiting at once; past this the oldest goes.
const MAX_PENDING: usize = 64;
const MAX_BODY: usize = 64 * 1024;
const RESOURCE_METADATA: &str = "/.well-known/oauth-protected-resource";
const SERVER_METADATA: &str = "/.well-known/oauth-authorization-server";

/// The paths this module answers.
pub fn serves(path: &str) -> bool {
    matches!(
        path,
        "/authorize" | "/token" | "/register" | "/revoke" | SERVER_METADATA | RESOURCE_METADATA
    ) || path == format!("{RESOURCE_METADATA}{PATH}")
}

/// The authorization server and the resource's token check.
pub struct Authority {
    grants: Grants,
    external: Option<external::External>,
    tokens: Arc<Tokens>,
    /// Host names a request may name (loopback, and the address bound).
    hosts: Vec<String>,
    /// Where a TLS proxy serves this server, if one does.
    public: Option<PublicUrl>,
    approval: Mutex<Approval>,
    pending: Mutex<HashMap<String, Consent>>,
    codes: Mutex<HashMap<String, Code>>,
}

/// The approval code in force, and the wrong tries against it.
struct Approval {
    code: String,
    wrong: u32,
    lockouts: u32,
    locked_until: Option<Instant>,
}

/// An authorization request waiting on the consent page.
#[derive(Clone)]
struct Consent {
    client_id: String,
    client_name: String,
    redirect_uri: String,
    challenge: String,
    state: Option<String>,
    resource: String,
    issuer: String,
    asked: Instant,
}

/// An authorization code issued, by its digest.
struct Code {
    consent: Consent,
    issued: Instant,
    used: bool,
    /// Presented again: whatever its first use gets is revoked.
    replayed: bool,
}

/// An OAuth error answer: its `error`, status and description.
struct Failure(&'static str, StatusCode, String);

fn fail(error: &'static str, why: impl Into<String>) -> Failure {
    Failure(error, StatusCode::BAD_REQUEST, why.into())
}

impl Approval {
    /// A new code, printed for the owner: 10 letters of 32 (no 0/O, 1/I),
    /// 5 random bits each, so 50 bits.
    fn renew(&mut self) -> std::io::Result<()> {
        const LETTERS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
        let mut raw = [0u8; 10];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut raw)?;
        self.code = raw
            .iter()
            .map(|b| LETTERS[usize::from(b & 31)] as char)
            .collect();
        self.wrong = 0;
        let shown = format!("{}-{}", &self.code[..5], &self.code[5..]);
        eprintln!("outpost mcp: OAuth approval code: {shown} (enter it on the consent page)");
        Ok(())
    }
}

impl Authority {
    /// The built-in authorization server, or the `[oauth]` one's check;
    /// an error when its keys cannot be read.
    pub fn new(
        config: &crate::config::Config,
        tokens: Arc<Tokens>,
        hosts: Vec<String>,
        public: Option<PublicUrl>,
    ) -> anyhow::Result<Authority> {
        let external = config
            .oauth
            .as_ref()
            .map(external::External::load)
            .transpose()?;
        let authority = Authority {
            grants: Grants::new(&config.home),
            external,
            tokens,
            hosts,
            public,
            approval: Mutex::new(Approval {
                code: String::new(),
                wrong: 0,
                lockouts: 0,
                locked_until: None,
            }),
            pending: Mutex::new(HashMap::new()),
            codes: Mutex::new(HashMap::new()),
        };
        let mut approval = authority.approval.lock().unwrap_or_else(|p| p.into_inner());
        approval.renew().context("cannot make an approval code")?;
        drop(approval);
        Ok(authority)
    }

    /// `http://HOST` as the request names this server, if the name is one
    /// it answers to (against DNS rebinding, as rmcp checks `/mcp`); the
    /// public https URL when it came through the proxy.
    pub(super) fn base(&self, headers: &HeaderMap) -> Option<String> {
        let host = headers.get(HOST)?.to_str().ok()?;
        // A proxy may pass the name without the port.
        let name_only = host.rsplit_once(':').map_or(host, |(name, _)| name);
        if let Some(public) = &self.public
            && (host.eq_ignore_ascii_case(&public.authority)
                || name_only.eq_ignore_ascii_case(&public.host)
                || host.eq_ignore_ascii_case(&public.host))
        {
            return Some(public.base.clone());
        }
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        self.hosts
            .iter()
            .any(|h| h == name)
            .then(|| format!("http://{host}"))
    }

    /// The `WWW-Authenticate` of a 401 at `/mcp`: where the resource
    /// metadata is, and what was wrong with the token, if one came.
    pub fn challenge(&self, headers: &HeaderMap, problem: Option<Invalid>) -> HeaderValue {
        let mut value = match self.base(headers) {
            Some(base) => format!(
                "Bearer resource_metadata=\"{base}{RESOURCE_METADATA}{PATH}\", scope=\"{SCOPE}\""
            ),
            None => "Bearer".to_string(),
        };
        if let Some(problem) = problem {
            value.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{}\"",
                problem.describe()
            ));
        }
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// The caller an OAuth access token names, if it is live and was
    /// issued for this URL.
    pub fn caller(&self, headers: &HeaderMap, token: &[u8]) -> Result<Caller, Invalid> {
        let token = std::str::from_utf8(token).map_err(|_| Invalid::Unknown)?;
        let base = self.base(headers).ok_or(Invalid::Audience)?;
        if let Some(external) = &self.external {
            let (subject, client) = external.verify(token, &format!("{base}{PATH}"))?;
            return Ok(Caller::oauth(&subject, &client));
        }
        let bearer = self.grants.verify(token, &format!("{base}{PATH}"))?;
        let client = format!("{} ({})", bearer.client_name, bearer.client_id);
        Ok(Caller::oauth(&bearer.subject, &client))
    }

    /// Answers a request to one of the paths [`serves`] names.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let Some(base) = self.base(request.headers()) else {
            return text(StatusCode::FORBIDDEN, "outpost: this Host is not served\n");
        };
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or_default().to_string();
        if method == Method::OPTIONS {
            return cors(bare(StatusCode::NO_CONTENT));
        }
        let body = match http_body_util::Limited::new(request.into_body(), MAX_BODY)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "outpost: body too large\n"),
        };
        let issuer = self.external.as_ref().map_or(base.as_str(), |e| e.issuer());
        if self.external.is_some() && !path.starts_with(RESOURCE_METADATA) {
            return text(
                StatusCode::NOT_FOUND,
                &format!("outpost: tokens come from the authorization server at {issuer}\n"),
            );
        }
        match (method, path.as_str()) {
            (Method::GET, SERVER_METADATA) => {
                cors(json_answer(StatusCode::OK, &self.metadata(&base)))
            }
            (Method::GET, p) if p.starts_with(RESOURCE_METADATA) => cors(json_answer(
                StatusCode::OK,
                &json!({
                    "resource": format!("{base}{PATH}"),
                    "authorization_servers": [issuer],
                    "scopes_supported": [SCOPE],
                    "bearer_methods_supported": ["header"],
                    "resource_name": "Outpost",
                }),
            )),
            (Method::POST, "/register") => cors(match blocking(|| self.register(&body)) {
                Ok(client) => json_answer(StatusCode::CREATED, &client),
                Err(failure) => failure_answer(failure),
            }),
            (Method::GET, "/authorize") => self.authorize(&base, &query),
            (Method::POST, "/authorize") => self.decide(&body),
            (Method::POST, "/token") => cors(match blocking(|| self.token(&base, &body)) {
                Ok(answer) => json_answer(StatusCode::OK, &answer),
                Err(failure) => failure_answer(failure),
            }),
            (Method::POST, "/revoke") => {
                let form = form(&body).unwrap_or_default();
                if let Some(token) = form.get("token") {
                    let _ = blocking(|| self.grants.revoke_token(token));
                }
                cors(bare(StatusCode::OK))
            }
            _ => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "outpost: not a method this path takes\n",
            ),
        }
    }

    fn metadata(&self, base: &str) -> Value {
        json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("{base}/token"),
            "registration_endpoint": format!("{base}/register"),
            "revocation_endpoint": format!("{base}/revoke"),
            "scopes_supported": [SCOPE],
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
            "authorization_response_iss_parameter_supported": true,
        })
    }

    fn register(&self, body: &[u8]) -> Result<Value, Failure> {
        let invalid = |why: String| fail("invalid_client_metadata", why);
        let asked: Value = serde_json::from_slice(body)
            .map_err(|e| invalid(format!("the body is not JSON: {e}")))?;
        let uris: Vec<String> = asked["redirect_uris"]
            .as_array()
            .filter(|a| !a.is_empty() && a.len() <= 10)
            .ok_or_else(|| fail("invalid_redirect_uri", "redirect_uris: one to ten URIs"))?
            .iter()
            .map(|u| u.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| fail("invalid_redirect_uri", "redirect_uris must be strings"))?;
        for uri in &uris {
            redirect_allowed(uri).map_err(|why| fail("invalid_redirect_uri", why))?;
        }
        for (field, allowed) in [
            ("grant_types", &["authorization_code", "refresh_token"][..]),
            ("response_types", &["code"][..]),
        ] {
            if let Some(asked) = asked[field].as_array()
                && let Some(other) = asked.iter().find(|g| !allowed.iter().any(|a| g == a))
            {
                return Err(invalid(format!("{field}: {other} is not offered")));
            }
        }
        let name: String = asked["client_name"]
            .as_str()
            .unwrap_or("unnamed client")
            .chars()
            .filter(|c| !c.is_control())
            .take(100)
            .collect();
        let client = self
            .grants
            .register(&name, uris)
            .map_err(|e| Failure("server_error", StatusCode::INTERNAL_SERVER_ERROR, e))?;
        Ok(json!({
            "client_id": client.id,
            "client_id_issued_at": client.registered,
            "client_name": client.name,
            "redirect_uris": client.redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }))
    }

    /// The consent page for a well-formed request; before the client and
    /// its redirect URI are known good, a page that says what is wrong
    /// (never a redirect); after, the error goes back to the client.
    fn authorize(&self, base: &str, query: &str) -> Response<Body> {
        let params = match single_params(query.as_bytes()) {
            Ok(params) => params,
            Err(why) => return page(StatusCode::BAD_REQUEST, &consent::refusal(&why)),
        };
        let get = |name: &str| params.get(name).map(String::as_str);
        let Some(client) = get("client_id").and_then(|id| self.grants.client(id)) else {
            return page(
                StatusCode::BAD_REQUEST,
                &consent::refusal("unknown client_id: the client must register first"),
            );
        };
        let redirect = get("redirect_uri").unwrap_or_default();
        if !client
            .redirect_uris
            .iter()
            .any(|r| same_redirect(r, redirect))
        {
            return page(
                StatusCode::BAD_REQUEST,
                &consent::refusal("redirect_uri is not one this client registered"),
            );
        }
        let state = get("state").map(str::to_string);
        let back = |error: &str, why: &str| {
            redirect_to(
                redirect,
                &[("error", error), ("error_description", why)],
                state.as_deref(),
                base,
            )
        };
        if get("response_type") != Some("code") {
            return back("unsupported_response_type", "response_type must be code");
        }
        let challenge = get("code_challenge").unwrap_or_default();
        if get("code_challenge_method") != Some("S256") || !pkce_shaped(challenge, 43) {
            return back(
                "invalid_request",
                "PKCE is required: code_challenge with code_challenge_method=S256",
            );
        }
        let resource = format!("{base}{PATH}");
        if get("resource").is_some_and(|r| r.trim_end_matches('/') != resource) {
            return back("invalid_target", "resource must be this server's MCP URL");
        }
        if get("scope").is_some_and(|s| s.split(' ').any(|s| !s.is_empty() && s != SCOPE)) {
            return back("invalid_scope", "the only scope is mcp");
        }
        let Ok(id) = random(16) else {
            return back("server_error", "no randomness");
        };
        let consent = Consent {
            client_id: client.id.clone(),
            client_name: client.name.clone(),
            redirect_uri: redirect.to_string(),
            challenge: challenge.to_string(),
            state,
            resource,
            issuer: base.to_string(),
            asked: Instant::now(),
        };
        let html = consent_page(&id, &consent, None);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, c| c.asked.elapsed() < CONSENT_TTL);
        if pending.len() >= MAX_PENDING
            && let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, c)| c.asked)
                .map(|(k, _)| k.clone())
        {
            pending.remove(&oldest);
        }
        pending.insert(id, consent);
        page(StatusCode::OK, &html)
    }

    /// The owner's answer on the consent page.
    fn decide(&self, body: &[u8]) -> Response<Body> {
        let form = form(body).unwrap_or_default();
        let id = form.get("request").cloned().unwrap_or_default();
        let consent = {
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending
                .get(&id)
                .filter(|c| c.asked.elapsed() < CONSENT_TTL)
                .cloned()
        };
        let Some(consent) = consent else {
            return page(
                StatusCode::BAD_REQUEST,
                &consent::refusal(
                    "this sign-in expired or was answered; start it again from the client",
                ),
            );
        };
        let back = |params: &[(&str, &str)]| {
            redirect_to(
                &consent.redirect_uri,
                params,
                consent.state.as_deref(),
                &consent.issuer,
            )
        };
        if form.get("decision").map(String::as_str) != Some("approve") {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return back(&[
                ("error", "access_denied"),
                ("error_description", "the owner declined"),
            ]);
        }
        let proof = form.get("proof").map(String::as_str).unwrap_or_default();
        match self.proven(proof) {
            Proof::Wrong => {
                let html = consent_page(
                    &id,
                    &consent,
                    Some("That code is not right. Use the latest one the server printed."),
                );
                return page(StatusCode::FORBIDDEN, &html);
            }
            Proof::Locked(wait) => {
                let why = format!(
                    "Too many wrong codes: try again in {} s, or use the bearer token.",
                    wait.as_secs().max(1)
                );
                return page(
                    StatusCode::TOO_MANY_REQUESTS,
                    &consent_page(&id, &consent, Some(&why)),
                );
            }
            Proof::ApprovalCode | Proof::Token => {}
        }
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let Ok(code) = random(32) else {
            return back(&[("error", "server_error")]);
        };
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes.retain(|_, c| c.issued.elapsed() < CODE_TTL * 2);
        codes.insert(
            digest(&code),
            Code {
                consent: consent.clone(),
                issued: Instant::now(),
                used: false,
                replayed: false,
            },
        );
        back(&[("code", &code)])
    }

    /// Whether `proof` is the bearer token, or the approval code (which
    /// it then spends): a person at the server's console or holding its
    /// token (the status page's sign-in).
    pub fn approves(&self, proof: &str) -> bool {
        matches!(self.proven(proof), Proof::ApprovalCode | Proof::Token)
    }

    /// Which proof `proof` is. The approval code is spent, and the next one
    /// made, under the same lock as the comparison, so it works once; wrong
    /// codes lock tries out for a while (the token still works).
    fn proven(&self, proof: &str) -> Proof {
        let bearer = format!("Bearer {}", proof.trim());
        if self.tokens.caller(Some(bearer.as_bytes())).is_some() {
            return Proof::Token;
        }
        let typed: String = proof
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_uppercase())
            .collect();
        let mut approval = self.approval.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = approval.locked_until {
            match until.checked_duration_since(Instant::now()) {
                Some(wait) => return Proof::Locked(wait),
                None => approval.locked_until = None,
            }
        }
        if !typed.is_empty() && bool::from(typed.as_bytes().ct_eq(approval.code.as_bytes())) {
            if let Err(e) = approval.renew() {
                // No next code: none works until the server restarts.
                tracing::warn!("cannot make the next approval code: {e}");
                approval.code.clear();
            }
            approval.lockouts = 0;
            return Proof::ApprovalCode;
        }
        approval.wrong += 1;
        if approval.wrong >= MAX_WRONG {
            let lockout = (FIRST_LOCKOUT * 2u32.saturating_pow(approval.lockouts)).min(MAX_LOCKOUT);
            approval.wrong = 0;
            approval.lockouts += 1;
            approval.locked_until = Some(Instant::now() + lockout);
            eprintln!(
                "outpost mcp: {MAX_WRONG} wrong approval codes; codes are refused for {} s",
                lockout.as_secs()
            );
        }
        Proof::Wrong
    }

    fn token(&self, base: &str, body: &[u8]) -> Result<Value, Failure> {
        let form = single_params(body).map_err(|why| fail("invalid_request", why))?;
        let get = |name: &str| form.get(name).map(String::as_str);
        let client_id = get("client_id").ok_or_else(|| {
            Failure(
                "invalid_client",
                StatusCode::UNAUTHORIZED,
                "client_id is missing".into(),
            )
        })?;
        let issued = match get("grant_type") {
            Some("authorization_code") => {
                let code = get("code").unwrap_or_default();
                let consent = self.redeem(code)?;
                if consent.client_id != client_id {
                    return Err(fail(
                        "invalid_grant",
                        "the code was issued to another client",
                    ));
                }
                if get("redirect_uri") != Some(consent.redirect_uri.as_str()) {
                    return Err(fail(
                        "invalid_grant",
                        "redirect_uri differs from the authorization request's",
                    ));
                }
                let verifier = get("code_verifier").unwrap_or_default();
                let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(sha2::Sha256::digest(verifier.as_bytes()));
                if !pkce_shaped(verifier, 43)
                    || !bool::from(computed.as_bytes().ct_eq(consent.challenge.as_bytes()))
                {
                    return Err(fail(
                        "invalid_grant",
                        "the PKCE code_verifier does not match the challenge",
                    ));
                }
                if get("resource").is_some_and(|r| r.trim_end_matches('/') != consent.resource) {
                    return Err(fail(
                        "invalid_target",
                        "resource differs from the authorization request's",
                    ));
                }
                let issued = self
                    .grants
                    .issue(client_id, SUBJECT, SCOPE, &consent.resource, code)
                    .map_err(|e| Failure("server_error", StatusCode::INTERNAL_SERVER_ERROR, e))?;
                // A replay while the grant was being written found none to
                // revoke: revoke it now.
                let replayed = self
                    .codes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&digest(code))
                    .is_some_and(|c| c.replayed);
                if replayed {
                    let _ = self.grants.revoke_code(code);
                    return Err(fail(
                        "invalid_grant",
                        "the authorization code was used twice",
                    ));
                }
                issued
            }
            Some("refresh_token") => {
                let resource = get("resource").map(|r| r.trim_end_matches('/'));
                if resource.is_some_and(|r| r != format!("{base}{PATH}")) {
                    return Err(fail(
                        "invalid_target",
                        "resource must be this server's MCP URL",
                    ));
                }
                self.grants
                    .refresh(
                        get("refresh_token").unwrap_or_default(),
                        client_id,
                        resource,
                    )
                    .map_err(|e| fail("invalid_grant", e))?
            }
            _ => {
                return Err(fail(
                    "unsupported_grant_type",
                    "grant_type must be authorization_code or refresh_token",
                ));
            }
        };
        Ok(json!({
            "access_token": issued.access,
            "token_type": "Bearer",
            "expires_in": issued.expires_in,
            "refresh_token": issued.refresh,
            "scope": issued.scope,
        }))
    }

    /// The request an authorization code stands for, spending it. A code
    /// presented twice ends the grant its first use got.
    fn redeem(&self, code: &str) -> Result<Consent, Failure> {
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        let entry = codes
            .get_mut(&digest(code))
            .ok_or_else(|| fail("invalid_grant", "unknown authorization code"))?;
        if entry.used {
            entry.replayed = true;
            drop(codes);
            let _ = self.grants.revoke_code(code);
            return Err(fail(
                "invalid_grant",
                "the authorization code was already used; what it was exchanged for is revoked",
            ));
        }
        entry.used = true;
        if entry.issued.elapsed() > CODE_TTL {
            return Err(fail("invalid_grant", "the authorization code expired"));
        }
        Ok(entry.consent.clone())
    }
}

enum Proof {
    ApprovalCode,
    Token,
    Wrong,
    /// Codes are refused for this long yet.
    Locked(Duration),
}

fn consent_page(id: &str, consent: &Consent, problem: Option<&str>) -> String {
    consent::page(&consent::Ask {
        request: id,
        client_name: &consent.client_name,
        client_id: &consent.client_id,
        redirect_uri: &consent.redirect_uri,
        scope: SCOPE,
        problem,
    })
}

/// A redirect URI a client may register: https, or http on loopback; no
/// fragment.
fn redirect_allowed(uri: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(uri).map_err(|e| format!("{uri:?} is not a URL: {e}"))?;
    if url.fragment().is_some() {
        return Err(format!("{uri:?} has a fragment"));
    }
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        _ => Err(format!(
            "{uri:?}: a redirect URI must be https, or http on a loopback address (127.0.0.1, [::1], localhost)"
        )),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    matches!(url.host_str(), Some("127.0.0.1" | "[::1]" | "localhost"))
}

/// Whether `given` is the registered URI: the same, or on loopback the same
/// but for the port (RFC 8252 §7.3: native apps pick a free one).
fn same_redirect(registered: &str, given: &str) -> bool {
    if registered == given {
        return true;
    }
    match (url::Url::parse(registered), url::Url::parse(given)) {
        (Ok(mut a), Ok(mut b)) if a.scheme() == "http" && is_loopback(&a) => {
            let _ = a.set_port(None);
            let _ = b.set_port(None);
            a == b
        }
        _ => false,
    }
}

/// Runs `work`, which reads and writes the grants file under its lock,
/// without holding up the runtime's other tasks.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// A PKCE verifier or challenge: 43 to 128 unreserved characters.
fn pkce_shaped(text: &str, min: usize) -> bool {
    (min..=128).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// Form or query parameters, each at most once (RFC 6749 §3.1).
fn single_params(bytes: &[u8]) -> Result<HashMap<String, String>, String> {
    let mut params = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(bytes) {
        if params.insert(name.to_string(), value.to_string()).is_some() {
            return Err(format!("the parameter {name} is given twice"));
        }
    }
    Ok(params)
}

fn form(bytes: &[u8]) -> Option<HashMap<String, String>> {
    single_params(bytes).ok()
}

/// A 302 to the client's redirect URI with `params`, its `state` and our
/// issuer (RFC 9207).
fn redirect_to(
    uri: &str,
    params: &[(&str, &str)],
    state: Option<&str>,
    issuer: &str,
) -> Response<Body> {
    let Ok(mut url) = url::Url::parse(uri) else {
        return page(
            StatusCode::BAD_REQUEST,
            &consent::refusal("the redirect URI is not a URL"),
        );
    };
    {
        let mut query = url.query_pairs_mut();
        for (name, value) in params {
            query.append_pair(name, value);
        }
        if let Some(state) = state {
            query.append_pair("state", state);
        }
        query.append_pair("iss", issuer);
    }
    let mut response = bare(StatusCode::FOUND);
    if let Ok(location) = HeaderValue::from_str(url.as_str()) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}

fn failure_answer(Failure(error, status, why): Failure) -> Response<Body> {
    json_answer(status, &json!({"error": error, "error_description": why}))
}

/// The consent and refusal pages: no script at all; the form may post
/// here and the redirect may go to the client.
fn page(status: StatusCode, html: &str) -> Response<Body> {
    answers::page(
        status,
        html.to_string(),
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' http: https:; frame-ancestors 'none'",
    )
}

/// Open to scripts of any origin: these endpoints take no cookie, so
/// another site gains nothing it could not do from its own server.
fn cors(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("content-type, authorization, mcp-protocol-version"),
    );
    response
}

#[cfg(test)]
mod tests;
