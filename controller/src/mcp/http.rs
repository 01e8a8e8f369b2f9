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
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
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
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use super::admission::{self, Admission};
use super::oauth::{self, Authority};
use super::status::{self, StatusPage};
use super::{Caller, MAX_MESSAGE_BYTES, OutpostServer, Shared};
use crate::fleet::Fleet;

/// Where `outpost mcp --http` listens when given no address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8742";
/// The one path served.
pub const PATH: &str = "/mcp";
const TOKEN_ENV: &str = "OUTPOST_HTTP_TOKEN";
const TOKEN_FILE: &str = "http-token";
/// One file per further caller, named after it, holding its token.
const CALLERS_DIR: &str = "http-tokens";
/// The caller the default token names.
const DEFAULT_CALLER: &str = "default";
/// A client that sends no complete request head within this is dropped.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Shorter tokens are refused: they could be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// `--http`'s value: `ADDR:PORT`, `localhost:PORT`, or a bare `PORT` on
/// 127.0.0.1.
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let port = text
        .strip_prefix("localhost:")
        .unwrap_or(text)
        .parse::<u16>()
        .map_err(|_| format!("`{text}` is not ADDR:PORT, localhost:PORT or PORT"))?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// `--public-url`: where clients reach this server through a TLS proxy.
#[derive(Debug, Clone)]
pub struct PublicUrl {
    /// `https://HOST[:PORT]`, no path.
    pub base: String,
    /// `HOST[:PORT]`, as the proxy passes it in `Host`.
    pub authority: String,
    pub host: String,
}

/// `--public-url`'s value: an https URL with a host and no path.
pub fn parse_public_url(text: &str) -> Result<PublicUrl, String> {
    let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    let host = url.host_str().unwrap_or_default().to_string();
    if url.scheme() != "https" || host.is_empty() || url.path() != "/" || url.query().is_some() {
        return Err(format!(
            "`{text}`: give the https URL of the proxy in front of this server, with no path (e.g. https://outpost.example.org)"
        ));
    }
    let authority = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.clone(),
    };
    Ok(PublicUrl {
        base: format!("https://{authority}"),
        authority,
        host,
    })
}

/// The bearer tokens clients may send: the default one, where it came
/// from, and the named callers'.
pub struct Tokens {
    value: String,
    source: TokenSource,
    /// Each further caller's name and token.
    callers: Vec<(String, String)>,
}

enum TokenSource {
    Env,
    File(PathBuf),
    /// Made just now (and saved there): the user has not seen it yet.
    Made(PathBuf),
}

impl Tokens {
    /// Only the default token, `value` (for tests of what checks tokens).
    #[cfg(test)]
    pub(super) fn only(value: &str) -> Tokens {
        Tokens {
            value: value.to_string(),
            source: TokenSource::Env,
            callers: Vec::new(),
        }
    }

    /// The caller a request's `Authorization` value names, if any. Every
    /// token is compared, so the time taken does not tell which matched.
    pub(super) fn caller(&self, authorization: Option<&[u8]>) -> Option<Caller> {
        let given = bearer_token(authorization?)?;
        let mut found = None;
        let all = std::iter::once((DEFAULT_CALLER, self.value.as_str()))
            .chain(self.callers.iter().map(|(n, t)| (n.as_str(), t.as_str())));
        for (name, token) in all {
            if bool::from(given.ct_eq(token.as_bytes())) {
                found = Some(Caller::token(name));
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme's case
/// does not matter, RFC 7235).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
}

/// Refuses a token file others can read, or a token too short to be safe.
fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is readable by other users (mode {:o}); run chmod 600 on it",
            path.display(),
            mode & 0o777
        );
    }
    let value = text.trim().to_string();
    if value.len() < MIN_TOKEN_LEN {
        bail!(
            "{} holds {} characters; use at least {MIN_TOKEN_LEN} (or delete it to get a new token)",
            path.display(),
            value.len()
        );
    }
    Ok(value)
}

/// `$OUTPOST_HTTP_TOKEN`, else the token file under `home`, else a new
/// random token saved there; and the named callers' tokens.
pub fn tokens(home: &Path) -> anyhow::Result<Tokens> {
    let callers = caller_tokens(home)?;
    let (value, source) = default_token(home)?;
    let mut seen = std::collections::HashSet::from([value.as_str()]);
    for (name, token) in &callers {
        if !seen.insert(token.as_str()) {
            bail!(
                "the token of caller `{name}` ({}) is another caller's too; give each its own",
                home.join(CALLERS_DIR).join(name).display()
            );
        }
    }
    Ok(Tokens {
        value,
        source,
        callers,
    })
}

/// Each file of `$OUTPOST_HOME/http-tokens/`: a caller, named by the file.
fn caller_tokens(home: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let dir = home.join(CALLERS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut callers = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if name == DEFAULT_CALLER
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!(
                "{}: a caller's name is letters, digits, '-', '_' and '.', and not `{DEFAULT_CALLER}`",
                entry.path().display()
            );
        }
        callers.push((name, read_token_file(&entry.path())?));
    }
    callers.sort();
    Ok(callers)
}

fn default_token(home: &Path) -> anyhow::Result<(String, TokenSource)> {
    if let Ok(value) = std::env::var(TOKEN_ENV)
        && !value.is_empty()
    {
        let value = value.trim().to_string();
        if value.len() < MIN_TOKEN_LEN {
            bail!(
                "{TOKEN_ENV} is {} characters; use at least {MIN_TOKEN_LEN}",
                value.len()
            );
        }
        return Ok((value, TokenSource::Env));
    }
    let path = home.join(TOKEN_FILE);
    match read_token_file(&path) {
        Ok(value) => Ok((value, TokenSource::File(path))),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
        {
            let value = random_token()?;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home)
                .with_context(|| format!("cannot create {}", home.display()))?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            writeln!(file, "{value}")?;
            Ok((value, TokenSource::Made(path)))
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// 32 random bytes, hex.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom for a token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A POST whose body is one JSON message, read whole (rmcp reads it whole
/// too); else the JSON-RPC error that answers it: `-32700` with its id if
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
        let (service, tokens, admission, authority, status_page) = (
            service.clone(),
            tokens.clone(),
            admission.clone(),
            authority.clone(),
            status_page.clone(),
        );
        tokio::spawn(async move {
            let _place = place;
            let handle = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let (service, tokens, admission, authority, status_page) = (
                    service.clone(),
                    tokens.clone(),
                    admission.clone(),
                    authority.clone(),
                    status_page.clone(),
                );
                async move {
                    let authorization = request.headers().get(AUTHORIZATION);
                    let caller = match tokens.caller(authorization.map(HeaderValue::as_bytes)) {
                        Some(caller) => Ok(caller),
                        None => match authorization.and_then(|v| bearer_token(v.as_bytes())) {
                            Some(token) => authority.caller(request.headers(), token).map_err(Some),
                            None => Err(None),
                        },
                    };
                    let path = request.uri().path();
                    let mut response = if path != PATH && oauth::serves(path) {
                        authority.handle(request).await
                    } else if status::serves(path) {
                        status_page
                            .handle(request, caller.is_ok(), &authority)
                            .await
                    } else if path != PATH {
                        bare(StatusCode::NOT_FOUND)
                    } else if let Ok(caller) = caller {
                        // rmcp hands the request's parts, these extensions
                        // among them, to the handler ([`Caller::of`]).
                        request.extensions_mut().insert(caller.clone());
                        let request = match well_formed(request).await {
                            Ok(request) => request,
                            Err(refusal) => return Ok(refusal),
                        };
                        let response = service.handle(request).await;
                        // An `initialize` that opened a session: within the limits?
                        let opened = response
                            .headers()
                            .get(HEADER_SESSION_ID)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        match opened {
                            Some(id) => match admission.opened(&id, &caller).await {
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
                            authority.challenge(request.headers(), problem),
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
                    Ok::<_, Infallible>(response)
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_may_name_localhost_or_only_a_port() {
        let ok = |s: &str| parse_listen_addr(s).unwrap().to_string();
        assert_eq!(ok("127.0.0.1:9000"), "127.0.0.1:9000");
        assert_eq!(ok("[::1]:9000"), "[::1]:9000");
        assert_eq!(ok("localhost:9000"), "127.0.0.1:9000");
        assert_eq!(ok("9000"), "127.0.0.1:9000");
        let err = parse_listen_addr("example.org:9000").unwrap_err();
        assert!(err.contains("ADDR:PORT"), "{err}");
    }

    #[test]
    fn a_public_url_is_https_with_no_path() {
        let public = parse_public_url("https://Outpost.Example.org:8443").unwrap();
        assert_eq!(public.base, "https://outpost.example.org:8443");
        assert_eq!(public.host, "outpost.example.org");
        for bad in [
            "http://outpost.example.org",
            "https://x.example/mcp",
            "outpost",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_token_names_its_caller() {
        let tokens = Tokens {
            value: "d".repeat(32),
            source: TokenSource::Env,
            callers: vec![("codex".into(), "c".repeat(32))],
        };
        let caller = |h: &str| {
            tokens
                .caller(Some(h.as_bytes()))
                .map(|c| c.name().to_string())
        };
        assert_eq!(
            caller(&format!("Bearer {}", "d".repeat(32))).as_deref(),
            Some("default")
        );
        assert_eq!(
            caller(&format!("Bearer {}", "c".repeat(32))).as_deref(),
            Some("codex")
        );
        assert_eq!(caller(&format!("Bearer {}", "c".repeat(31))), None);
        assert_eq!(caller(&"c".repeat(32)), None);
        assert_eq!(tokens.caller(None), None);
    }

    #[test]
    fn callers_come_from_their_files_and_must_differ() {
        let home = std::env::temp_dir().join(format!("outpost-http-tokens-{}", std::process::id()));
        let dir = home.join(CALLERS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("codex", &format!("{}\n", "c".repeat(32)), 0o600);
        let made = tokens(&home).unwrap();
        assert!(matches!(made.source, TokenSource::Made(_)));
        assert_eq!(made.callers, vec![("codex".into(), "c".repeat(32))]);
        // The same token for two callers could not tell them apart.
        write("cursor", &format!("{}\n", "c".repeat(32)), 0o600);
        let err = tokens(&home).err().unwrap().to_string();
        assert!(err.contains("another caller's too"), "{err}");
        // A token others can read is refused, as the default one is.
        write("cursor", &"e".repeat(32), 0o644);
        let err = tokens(&home).err().unwrap().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::remove_dir_all(&home).unwrap();
    }
}
