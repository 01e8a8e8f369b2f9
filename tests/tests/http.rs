//! `outpost mcp --http`: real MCP clients (rmcp's Streamable HTTP client)
//! with the bearer token, two at once on one fleet, and raw requests without
//! the token, with a wrong one or from a foreign `Origin`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::mcp_client::{ProgressLog, call};
use outpost_e2e::{McpHttp, target_bin};
use serde_json::json;

/// The status line and headers of a raw `initialize` POST to `path`, on a
/// connection the client asks to close.
fn raw(server: &McpHttp, path: &str, headers: &str) -> String {
    raw_on(server, path, &format!("Connection: close\r\n{headers}"))
}

/// The same on a connection the client would keep: all the server sends
/// before it closes the connection or goes quiet for 10 s.
fn raw_on(server: &McpHttp, path: &str, headers: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    .to_string();
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         {headers}\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

fn status(response: &str) -> &str {
    response.split(' ').nth(1).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_needs_the_token_and_serves_clients_at_once() {
    let server = McpHttp::start();
    let token_file = server.home.path().join(".outpost/http-token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        std::fs::read_to_string(&token_file).unwrap().trim(),
        server.token
    );

    // Without the token, or with a wrong one: 401 and nothing else.
    let bearer = format!("Authorization: Bearer {}\r\n", server.token);
    for headers in [
        String::new(),
        "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n".into(),
        format!("Authorization: {}\r\n", server.token),
    ] {
        let r = raw(&server, "/mcp", &headers);
        assert_eq!(status(&r), "401", "{r}");
        assert!(r.contains("www-authenticate: Bearer"), "{r}");
        assert!(r.ends_with("\r\n\r\n"), "a body came with the 401: {r}");
    }
    // A refusal ends a connection the client would keep, and says so: its
    // body may be unread, and a connection closed unannounced races the
    // client's next request on it.
    for headers in [
        String::new(),
        format!("{bearer}Origin: http://evil.example\r\n"),
    ] {
        let r = raw_on(&server, "/mcp", &headers);
        assert!(r.contains("connection: close\r\n"), "{r}");
    }
    // A foreign Origin (DNS rebinding) is refused; other paths do not exist.
    let r = raw(
        &server,
        "/mcp",
        &format!("{bearer}Origin: http://evil.example\r\n"),
    );
    assert_eq!(status(&r), "403", "{r}");
    assert_eq!(status(&raw(&server, "/", &bearer)), "404");
    let r = raw(
        &server,
        "/mcp",
        &format!("{bearer}Origin: http://localhost:3000\r\n"),
    );
    assert_eq!(status(&r), "200", "{r}");

    // Two clients at once, each in its own session over the shared fleet;
    // progress reaches a client over its event stream.
    let log = ProgressLog::default();
    let a = server.client(log.clone()).await;
    let b = server.client(()).await;
    let (ra, rb) = tokio::join!(
        call(
            &a,
            "exec_bash",
            json!({"command": "echo a-1; sleep 4; echo a-2"})
        ),
        call(&b, "exec_bash", json!({"command": "sleep 1; echo b"})),
    );
    assert!(!ra.0 && !rb.0, "{ra:?} {rb:?}");
    assert_eq!(ra.1["stdout"], "a-1\na-2\n", "{ra:?}");
    assert_eq!(rb.1["stdout"], "b\n", "{rb:?}");
    let got = log.take();
    assert!(got.len() >= 2, "{got:?}");
    let (_, r) = call(&b, "list_sandboxes", json!({})).await;
    assert_eq!(r["active_sandbox"], "local");
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

/// `outpost mcp --http ADDR` with an empty home (and `token`, if given) run
/// to its end: each of these refuses to start.
fn refused(home: &std::path::Path, addr: &str, token: Option<&str>) -> String {
    let mut cmd = Command::new(target_bin("outpost"));
    cmd.args(["mcp", "--http", addr])
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(Stdio::null());
    if let Some(token) = token {
        cmd.env("OUTPOST_HTTP_TOKEN", token);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_non_loopback_address_needs_a_token_set_up_beforehand() {
    let home = common::scratch("http-home-remote");
    let err = refused(home.path(), "192.0.2.1:0", None);
    assert!(
        err.contains("not a loopback address") && err.contains("OUTPOST_HTTP_TOKEN"),
        "{err}"
    );
    assert!(!home.path().join(".outpost/http-token").exists());

    // A wildcard address could not have its Host header checked.
    let err = refused(home.path(), "0.0.0.0:0", Some("0123456789abcdef0123"));
    assert!(err.contains("name the address"), "{err}");

    // A token that is too short is refused outright.
    let err = refused(home.path(), "127.0.0.1:0", Some("short"));
    assert!(err.contains("at least 16"), "{err}");
}
