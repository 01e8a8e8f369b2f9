//! Streamable HTTP: the same tools as on stdio, at `http://ADDR/mcp`, for
//! clients that connect rather than spawn a server, and for several clients
//! at once sharing one fleet of connections (each session, or each
//! stateless request, gets its own [`OutpostServer`] over the shared
//! [`Fleet`] and [`Shared`] state).
//!
//! Every request must carry `Authorization: Bearer <token>`: a token below,
//! or an OAuth access token from the built-in authorization server
//! ([`super::oauth`], whose endpoints are served beside `/mcp`); any other
//! gets 401 with a line saying what is missing and where the token is. Tokens
//! are compared in constant time. The default token is
//! `$OUTPOST_HTTP_TOKEN`, else the one in `$OUTPOST_HOME/http-token` (mode
//! 0600), made on first use and printed once with the client configuration
//! lines; each file `$OUTPOST_HOME/http-tokens/NAME` (0600) adds a caller
//! NAME with a token of its own. The token a request carries names its
//! [`Caller`], who alone sees the tasks and transfers it starts.
//!
//! Against DNS rebinding, rmcp's service answers 403 to a `Host` that is not
//! a loopback name (or the address bound) and to an `Origin` that is not a
//! loopback origin. A non-loopback address is served only with a token the
//! user set up beforehand.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONNECTION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::admission::{self, Admission};
use super::endpoint::{PATH, PublicUrl};
use super::oauth::{self, Authority};
use super::status::{self, StatusPage};
use super::tokens::{CALLERS_DIR, TOKEN_ENV, TokenSource, Tokens, bearer_token, tokens};
use super::{MAX_MESSAGE_BYTES, OutpostServer, Shared};
use crate::fleet::Fleet;

/// A client that sends no complete request head within this is dropped.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// one can be found (else `null`) for a body that is not JSON, `-32600` for
/// a batch (MCP has none since 2025-06-18), 413 past the message limit.
async fn well_formed(
    request: Request<Incoming>,
) -> Result<Request<Full<Bytes>>, Response<BoxBody<Bytes, Infallible>>> {
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_MESSAGE_BYTES);
    let bytes = match limited.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let mut response = unavailable(&format!(
                "the request body could not be read: {e} (at most {} per message)",
                crate::ops::human_bytes(MAX_MESSAGE_BYTES as u64)
            ));
            *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            return Err(response);
        }
    };
    if parts.method == hyper::Method::POST {
        let refusal = match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Err(e) => Some((
                super::linelimit::top_level_id(&bytes),
                rmcp::model::ErrorCode::PARSE_ERROR,
                format!("the message is not JSON ({e}); send one JSON-RPC message, valid UTF-8 JSON"),
            )),
            Ok(serde_json::Value::Array(_)) => Some((
                None,
                rmcp::model::ErrorCode::INVALID_REQUEST,
                "batches are not accepted (MCP has none since 2025-06-18); send one message per request"
                    .to_string(),
            )),
            Ok(_) => None,
        };
        if let Some((id, code, message)) = refusal {
            let body = serde_json::json!({
                "jsonrpc": "2.0", "id": id, "error": {"code": code.0, "message": message},
            });
            let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return Err(response);
        }
    }
    Ok(Request::from_parts(parts, Full::new(bytes)))
}

/// A 503 that says which limit was reached.
fn unavailable(why: &str) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("outpost: {why}\n"))).boxed());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Answers a connection past [`admission::MAX_CONNECTIONS`] with a 503 and
/// closes it, without reading its request.
async fn turn_away(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = format!(
        "outpost: {} connections are open, the most this server takes; try again shortly\n",
        admission::MAX_CONNECTIONS
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n{body}",
        body.len()
    );
    let write = stream.write_all(response.as_bytes());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), write).await;
}

fn bare(status: StatusCode) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = status;
    response
}

/// A 401 that says what is missing and where the token is (the path is
/// the same for every server, so it tells nothing of this machine), with
/// the OAuth `challenge`.
fn unauthorized(
    authorization: Option<&HeaderValue>,
    oauth: Option<crate::ops::grants::Invalid>,
    challenge: HeaderValue,
) -> Response<BoxBody<Bytes, Infallible>> {
    let problem = match (authorization, oauth) {
        (None, _) => "this request has no `Authorization: Bearer <token>` header",
        (Some(v), _) if bearer_token(v.as_bytes()).is_none() => {
            "the Authorization header is not `Bearer <token>`"
        }
        (Some(_), Some(invalid)) if invalid != crate::ops::grants::Invalid::Unknown => {
            invalid.describe()
        }
        (Some(_), _) => "the bearer token is not one this server accepts",
    };
    let body = format!(
        "outpost: {problem}. The token is in ~/.outpost/http-token (or \
         $OUTPOST_HOME/http-token, or ${TOKEN_ENV} where the server started); \
         `outpost mcp --http` prints the client configuration when it starts. \
         OAuth clients sign in through this server's /authorize.\n"
    );
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    let headers = response.headers_mut();
    headers.insert(WWW_AUTHENTICATE, challenge);
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Serves MCP over HTTP at `addr` until SIGTERM/SIGINT.
pub async fn serve_http(
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    public: Option<PublicUrl>,
) -> anyhow::Result<()> {
    // `[::ffff:0.0.0.0]` is the IPv4 wildcard too.
    if addr.ip().to_canonical().is_unspecified() {
        bail!(
            "refusing to serve {addr}: name the address clients will use (e.g. 127.0.0.1, or \
             this machine's address on a private network), so that its Host header can be checked"
        );
    }
    let tokens = tokens(&fleet.config.home)?;
    if !addr.ip().is_loopback()
        && let TokenSource::Made(path) = &tokens.source
    {
        // Nobody has the token yet, and it would guard a port others reach.
        let _ = std::fs::remove_file(path);
        bail!(
            "refusing to serve {addr} (not a loopback address) with a token made just now; \
             set {TOKEN_ENV} (or run once on 127.0.0.1 to make {}) and give it to the clients",
            path.display()
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    announce(&tokens, bound, public.as_ref());

    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !bound.ip().is_loopback() {
        hosts.push(bound.ip().to_string());
    }
    if let Some(public) = &public {
        hosts.push(public.host.clone());
    }
    let tokens = Arc::new(tokens);
    let authority = Arc::new(Authority::new(
        &fleet.config,
        tokens.clone(),
        hosts.clone(),
        public.clone(),
    )?);
    let status_page = Arc::new(StatusPage::new(fleet.clone()));
    let stop = CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
        .with_max_request_body_bytes(MAX_MESSAGE_BYTES)
        .with_cancellation_token(stop.child_token());
    let (fleet_for_sessions, shared) = (fleet.clone(), Shared::new(&fleet));
    let sessions = Arc::new(LocalSessionManager::default());
    let admission = Arc::new(Admission::new(sessions.clone()));
    let service = StreamableHttpService::new(
        move || {
            Ok(OutpostServer::with_shared(
                fleet_for_sessions.clone(),
                shared.clone(),
            ))
        },
        sessions.clone(),
        config,
    );
    let front = Arc::new(Front {
        service,
        tokens,
        admission: admission.clone(),
        authority,
        status_page,
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, most likely: retrying at once
                    // would spin (and log) until one frees up.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = &mut interrupted => break,
        };
        let _ = stream.set_nodelay(true);
        let Some(place) = admission.connection() else {
            tokio::spawn(turn_away(stream));
            continue;
        };
        let front = front.clone();
        tokio::spawn(async move {
            let _place = place;
            let handle = hyper::service::service_fn(move |request: Request<Incoming>| {
                let front = front.clone();
                async move { Ok::<_, Infallible>(front.answer(request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), handle);
            if let Err(e) = connection.await {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
    tracing::info!("shutting down");
    stop.cancel();
    for session in fleet.sessions() {
        session.disconnect().await;
    }
    Ok(())
}

/// Everything a request may meet: MCP (rmcp's service behind the token
/// check and the session bounds), OAuth's endpoints and the status page.
struct Front {
    service: StreamableHttpService<OutpostServer, LocalSessionManager>,
    tokens: Arc<Tokens>,
    admission: Arc<Admission>,
    authority: Arc<Authority>,
    status_page: Arc<StatusPage>,
}

impl Front {
    async fn answer(&self, mut request: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
        let authorization = request.headers().get(AUTHORIZATION);
        let caller = match self.tokens.caller(authorization.map(HeaderValue::as_bytes)) {
            Some(caller) => Ok(caller),
            None => match authorization.and_then(|v| bearer_token(v.as_bytes())) {
                Some(token) => self
                    .authority
                    .caller(request.headers(), token)
                    .map_err(Some),
                None => Err(None),
            },
        };
        let path = request.uri().path();
        let mut response = if path != PATH && oauth::serves(path) {
            self.authority.handle(request).await
        } else if status::serves(path) {
            self.status_page
                .handle(request, caller.is_ok(), &self.authority)
                .await
        } else if path != PATH {
            bare(StatusCode::NOT_FOUND)
        } else if let Ok(caller) = caller {
            // rmcp hands the request's parts, these extensions
            // among them, to the handler ([`Caller::of`]).
            request.extensions_mut().insert(caller.clone());
            let request = match well_formed(request).await {
                Ok(request) => request,
                Err(refusal) => return refusal,
            };
            let response = self.service.handle(request).await;
            // An `initialize` that opened a session: within the limits?
            let opened = response
                .headers()
                .get(HEADER_SESSION_ID)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            match opened {
                Some(id) => match self.admission.opened(&id, &caller).await {
                    Ok(()) => response,
                    Err(why) => unavailable(&why),
                },
                None => response,
            }
        } else {
            let problem = caller.err().flatten();
            unauthorized(
                authorization,
                problem,
                self.authority.challenge(request.headers(), problem),
            )
        };
        if response.status().is_client_error() || response.status().is_server_error() {
            // A refusal may leave the request's body unread; hyper
            // then closes the connection unannounced, racing the
            // client's next request on it. Announce the close.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Tells the person at the terminal where to point their client: the
/// ready `claude mcp add` and `codex mcp add` lines and the JSON form. The
/// token itself is shown only when it was made just now; otherwise the
/// lines read it where it is kept.
fn announce(tokens: &Tokens, bound: SocketAddr, public: Option<&PublicUrl>) {
    let url = match public {
        Some(public) => format!("{}{PATH}", public.base),
        None => format!("http://{bound}{PATH}"),
    };
    let (value, whence, env_value) = match &tokens.source {
        TokenSource::Made(path) => (
            tokens.value.clone(),
            format!("a new token, saved in {}", path.display()),
            format!("$(cat {})", path.display()),
        ),
        TokenSource::File(path) => (
            format!("$(cat {})", path.display()),
            format!("the token in {}", path.display()),
            format!("$(cat {})", path.display()),
        ),
        TokenSource::Env => (
            format!("${TOKEN_ENV}"),
            format!("the token in ${TOKEN_ENV}"),
            format!("${TOKEN_ENV}"),
        ),
    };
    let json_value = match &tokens.source {
        TokenSource::Made(_) => tokens.value.clone(),
        TokenSource::File(path) => format!("<the token in {}>", path.display()),
        TokenSource::Env => format!("<${TOKEN_ENV}>"),
    };
    let others = match tokens.callers.len() {
        0 => String::new(),
        n => format!("; {n} more caller(s) with tokens of their own in {CALLERS_DIR}/"),
    };
    let behind = match public {
        Some(_) => format!("; listening on {bound} behind that proxy"),
        None => String::new(),
    };
    eprintln!("outpost mcp: serving MCP at {url} ({whence}{others}{behind}); Ctrl-C stops.");
    eprintln!("Claude Code:");
    eprintln!(
        "  claude mcp add --transport http outpost {url} --header \"Authorization: Bearer {value}\""
    );
    eprintln!("Codex (the token in ${TOKEN_ENV} where Codex runs):");
    eprintln!("  export {TOKEN_ENV}=\"{env_value}\"");
    eprintln!("  codex mcp add outpost --url {url} --bearer-token-env-var {TOKEN_ENV}");
    eprintln!(
        "OAuth clients (hosted agents, a `/mcp` login): give them {url} alone; they sign in \
         through this server, approved with the code below."
    );
    eprintln!("Other clients (JSON):");
    eprintln!(
        "{}",
        serde_json::json!({"type": "http", "url": url, "headers": {"Authorization": format!("Bearer {json_value}")}})
    );
}
