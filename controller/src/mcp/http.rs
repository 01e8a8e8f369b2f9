//! Streamable HTTP: the same tools as on stdio, at `http://ADDR/mcp`, for
//! clients that connect rather than spawn a server, and for several clients
//! at once sharing one fleet of connections (each session gets its own
//! [`OutpostServer`] over the shared [`Fleet`]).
//!
//! Every request must carry `Authorization: Bearer <token>`; any other gets
//! 401 and nothing else, compared in constant time. The token is
//! `$OUTPOST_HTTP_TOKEN`, else the one in `$OUTPOST_HOME/http-token` (mode
//! 0600), made on first use and printed once with the client configuration
//! line. Against DNS rebinding, rmcp's service answers 403 to a `Host` that
//! is not a loopback name (or the address bound) and to an `Origin` that is
//! not a loopback origin. A non-loopback address is served only with a token
//! the user set up beforehand.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONNECTION, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use super::{MAX_MESSAGE_BYTES, OutpostServer};
use crate::fleet::Fleet;

/// Where `outpost mcp --http` listens when given no address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8742";
/// The one path served.
pub const PATH: &str = "/mcp";
const TOKEN_ENV: &str = "OUTPOST_HTTP_TOKEN";
const TOKEN_FILE: &str = "http-token";
/// A client that sends no complete request head within this is dropped.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Shorter tokens are refused: they could be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// The bearer token clients must send, and where it came from.
pub struct Token {
    value: String,
    source: TokenSource,
}

enum TokenSource {
    Env,
    File(PathBuf),
    /// Made just now (and saved there): the user has not seen it yet.
    Made(PathBuf),
}

/// `$OUTPOST_HTTP_TOKEN`, else the token file under `home`, else a new
/// random token saved there.
pub fn token(home: &Path) -> anyhow::Result<Token> {
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
        return Ok(Token {
            value,
            source: TokenSource::Env,
        });
    }
    let path = home.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mode = std::fs::metadata(&path)?.permissions().mode();
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
            Ok(Token {
                value,
                source: TokenSource::File(path),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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
            Ok(Token {
                value,
                source: TokenSource::Made(path),
            })
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

/// Whether `request` carries the token.
fn authorized(request: &Request<Incoming>, token: &str) -> bool {
    request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
}

fn bare(status: StatusCode) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Serves MCP over HTTP at `addr` until SIGTERM/SIGINT.
pub async fn serve_http(fleet: Arc<Fleet>, addr: SocketAddr) -> anyhow::Result<()> {
    if addr.ip().is_unspecified() {
        bail!(
            "refusing to serve {addr}: name the address clients will use (e.g. 127.0.0.1, or \
             this machine's address on a private network), so that its Host header can be checked"
        );
    }
    let token = token(&fleet.config.home)?;
    if !addr.ip().is_loopback()
        && let TokenSource::Made(path) = &token.source
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
    announce(&token, bound);

    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !bound.ip().is_loopback() {
        hosts.push(bound.ip().to_string());
    }
    let stop = CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
        .with_max_request_body_bytes(MAX_MESSAGE_BYTES)
        .with_cancellation_token(stop.child_token());
    let shared = fleet.clone();
    let service = StreamableHttpService::new(
        move || Ok(OutpostServer::new(shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let token = Arc::new(token.value);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = &mut interrupted => break,
        };
        let _ = stream.set_nodelay(true);
        let (service, token) = (service.clone(), token.clone());
        tokio::spawn(async move {
            let handle = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (service, token) = (service.clone(), token.clone());
                async move {
                    let mut response = if request.uri().path() != PATH {
                        bare(StatusCode::NOT_FOUND)
                    } else if !authorized(&request, &token) {
                        bare(StatusCode::UNAUTHORIZED)
                    } else {
                        service.handle(request).await
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

/// Tells the person at the terminal where to point their client.
fn announce(token: &Token, bound: SocketAddr) {
    let url = format!("http://{bound}{PATH}");
    let (header, whence) = match &token.source {
        TokenSource::Made(path) => (
            format!("Bearer {}", token.value),
            format!("a new token, saved in {}", path.display()),
        ),
        TokenSource::File(path) => (
            format!("Bearer <the token in {}>", path.display()),
            format!("the token in {}", path.display()),
        ),
        TokenSource::Env => (
            format!("Bearer <${TOKEN_ENV}>"),
            format!("the token in ${TOKEN_ENV}"),
        ),
    };
    eprintln!("outpost mcp: serving MCP at {url} ({whence}); Ctrl-C stops. Client configuration:");
    eprintln!(
        "{}",
        serde_json::json!({"type": "http", "url": url, "headers": {"Authorization": header}})
    );
}
