//! The live status page at `/` of the HTTP server: hosts with CPU, memory
//! and GPU charts over the last hour, sandboxes, jobs with a log tail and
//! the newest audit lines, updated by server-sent events
//! (`/status/events`). Everything it needs is served from here (the page,
//! its script); nothing comes from another site.
//!
//! The same people may look as may call tools: a request with a bearer
//! token (or an OAuth access token) is let in, and a browser signs in once
//! on `/login` with the token or the console's approval code, and then
//! carries a cookie (HttpOnly, SameSite=Strict, 12 h; Secure behind the
//! TLS proxy) that names a session this process keeps in memory. Browsers
//! share cookies across a host's ports, so another local web service sees
//! it; it is good only here, and only for this page.

mod snapshot;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HeaderValue, LOCATION, SET_COOKIE};
use hyper::{Method, Request, Response, StatusCode};

pub use snapshot::Sampler;

use super::answers::{self, Body, bare, with_body};
use super::oauth::{Authority, escape};
use crate::ops::grants::{digest, random};

const COOKIE_NAME: &str = "outpost_status";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
const MAX_SESSIONS: usize = 256;
const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");

/// The paths this module answers.
pub fn serves(path: &str) -> bool {
    matches!(path, "/" | "/login" | "/status.js" | "/status/events")
}

pub struct StatusPage {
    sampler: Arc<Sampler>,
    /// Signed-in browsers: the cookie's digest and when it was given.
    sessions: Mutex<HashMap<String, Instant>>,
}

impl StatusPage {
    pub fn new(fleet: Arc<crate::fleet::Fleet>) -> StatusPage {
        StatusPage {
            sampler: Sampler::new(fleet),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the request's cookie names a live session.
    fn signed_in(&self, request: &Request<Incoming>) -> bool {
        let Some(value) = cookie(request) else {
            return false;
        };
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(&digest(&value))
            .is_some_and(|given| given.elapsed() < SESSION_TTL)
    }

    /// Answers `request`; `authorized` says whether its `Authorization`
    /// header already let it in.
    pub async fn handle(
        &self,
        request: Request<Incoming>,
        authorized: bool,
        authority: &Authority,
    ) -> Response<Body> {
        let path = request.uri().path().to_string();
        // Against DNS rebinding, as for `/mcp`.
        if authority.base(request.headers()).is_none() {
            return plain(StatusCode::FORBIDDEN, "outpost: this Host is not served\n");
        }
        if request.method() == Method::POST && path == "/login" {
            return self.login(request, authority).await;
        }
        if request.method() != Method::GET {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "outpost: GET only\n");
        }
        if path == "/status.js" {
            return with_body(
                StatusCode::OK,
                SCRIPT.into(),
                "text/javascript; charset=utf-8",
            );
        }
        let allowed = authorized || self.signed_in(&request);
        match path.as_str() {
            "/" if allowed => page(StatusCode::OK, PAGE.to_string()),
            "/" | "/login" => page(StatusCode::OK, login_page(None)),
            "/status/events" if allowed => self.events(),
            _ => plain(StatusCode::UNAUTHORIZED, "outpost: sign in at / first\n"),
        }
    }

    /// The sign-in form's answer: a session cookie for the bearer token or
    /// the approval code.
    async fn login(&self, request: Request<Incoming>, authority: &Authority) -> Response<Body> {
        // Through the TLS proxy, the cookie never goes over plain http.
        let secure = authority
            .base(request.headers())
            .is_some_and(|base| base.starts_with("https://"));
        let body = http_body_util::Limited::new(request.into_body(), 8192)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let proof = url::form_urlencoded::parse(&body)
            .find(|(k, _)| k == "proof")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        if !authority.approves(&proof) {
            return page(
                StatusCode::FORBIDDEN,
                login_page(Some("That is not the token or the latest approval code.")),
            );
        }
        let Ok(value) = random(32) else {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "outpost: no randomness\n",
            );
        };
        {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            sessions.retain(|_, given| given.elapsed() < SESSION_TTL);
            if sessions.len() >= MAX_SESSIONS
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, g)| **g)
                    .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
            sessions.insert(digest(&value), Instant::now());
        }
        let mut response = bare(StatusCode::SEE_OTHER);
        let headers = response.headers_mut();
        headers.insert(LOCATION, HeaderValue::from_static("/"));
        if let Ok(cookie) = HeaderValue::from_str(&format!(
            "{COOKIE_NAME}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
            SESSION_TTL.as_secs(),
            if secure { "; Secure" } else { "" }
        )) {
            headers.insert(SET_COOKIE, cookie);
        }
        response
    }

    /// The event stream: the charts' history once, then each snapshot.
    fn events(&self) -> Response<Body> {
        let receiver = self.sampler.subscribe();
        let mut first = format!("event: history\ndata: {}\n\n", self.sampler.history());
        // A page that joins others need not wait for the next sample.
        let latest = receiver.borrow().clone();
        if !latest.is_empty() {
            first.push_str(&format!("event: snapshot\ndata: {latest}\n\n"));
        }
        let snapshots = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.changed().await.ok()?;
            let snapshot = receiver.borrow_and_update().clone();
            Some((format!("event: snapshot\ndata: {snapshot}\n\n"), receiver))
        });
        let stream = futures::stream::once(async move { first })
            .chain(snapshots)
            .map(|text| Ok::<_, Infallible>(Frame::data(Bytes::from(text))));
        let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

fn cookie(request: &Request<Incoming>) -> Option<String> {
    request
        .headers()
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE_NAME).then(|| value.to_string())
        })
}

fn login_page(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=problem role=alert>{}</p>", escape(p)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Outpost: sign in</title>\
         <meta name=viewport content='width=device-width'><style>body{{font:16px system-ui,sans-serif;\
         max-width:30rem;margin:4rem auto;padding:0 1rem}}input{{width:100%;font:inherit;padding:.4rem;\
         box-sizing:border-box}}button{{font:inherit;margin-top:.8rem;padding:.4rem 1rem}}\
         .problem{{color:#a4161a;font-weight:600}}</style></head><body><h1>Outpost status</h1>{problem}\
         <form method=post action=/login><label for=proof>The server's bearer token, or the approval \
         code it printed</label><input type=password id=proof name=proof autocomplete=off autofocus>\
         <button>Sign in</button></form></body></html>"
    )
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    answers::text(status, text)
}

/// A page that runs only this server's script.
fn page(status: StatusCode, html: String) -> Response<Body> {
    answers::page(
        status,
        html,
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; \
         form-action 'self'; frame-ancestors 'none'",
    )
}
