//! `outpost mcp --http`: real MCP clients (rmcp's Streamable HTTP client)
//! with the bearer token, two at once on one fleet, and raw requests without
//! the token, with a wrong one or from a foreign `Origin`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::mcp_client::{Client, ProgressLog, call};
use outpost_e2e::{TempDir, target_bin};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

/// `outpost mcp --http 127.0.0.1:0` with an empty home; killed when dropped.
struct HttpServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
    token: String,
    home: TempDir,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpServer {
    fn start() -> HttpServer {
        let home = common::scratch("http-home");
        let mut child = Command::new(target_bin("outpost"))
            .args(["mcp", "--http", "127.0.0.1:0"])
            .current_dir(std::env::temp_dir())
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var("PATH").unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The second line is the client configuration, token included (it
        // was made just now).
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let config: Value = loop {
            let line = lines.next().expect("outpost mcp --http exited").unwrap();
            if line.starts_with('{') {
                break serde_json::from_str(&line).unwrap();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let url = config["url"].as_str().unwrap();
        let addr = url
            .strip_prefix("http://")
            .and_then(|u| u.strip_suffix("/mcp"))
            .unwrap()
            .to_string();
        let token = config["headers"]["Authorization"]
            .as_str()
            .unwrap()
            .strip_prefix("Bearer ")
            .unwrap()
            .to_string();
        HttpServer {
            child,
            addr,
            token,
            home,
        }
    }

    async fn client<H: ClientHandler>(&self, handler: H) -> Client<H> {
        let config =
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(self.token.clone());
        handler
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .unwrap()
    }

    /// The status line and headers of a raw `initialize` POST to `path`.
    fn raw(&self, path: &str, headers: &str) -> String {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        .to_string();
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
             Connection: close\r\n{headers}\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response
    }
}

fn status(response: &str) -> &str {
    response.split(' ').nth(1).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_needs_the_token_and_serves_clients_at_once() {
    let server = HttpServer::start();
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
        let r = server.raw("/mcp", &headers);
        assert_eq!(status(&r), "401", "{r}");
        assert!(r.contains("www-authenticate: Bearer"), "{r}");
        assert!(r.ends_with("\r\n\r\n"), "a body came with the 401: {r}");
    }
    // A foreign Origin (DNS rebinding) is refused; other paths do not exist.
    let r = server.raw("/mcp", &format!("{bearer}Origin: http://evil.example\r\n"));
    assert_eq!(status(&r), "403", "{r}");
    assert_eq!(status(&server.raw("/", &bearer)), "404");
    let r = server.raw(
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

#[test]
fn a_non_loopback_address_needs_a_token_set_up_beforehand() {
    let home = common::scratch("http-home-remote");
    let out = Command::new(target_bin("outpost"))
        .args(["mcp", "--http", "0.0.0.0:0"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address") && err.contains("OUTPOST_HTTP_TOKEN"),
        "{err}"
    );
    assert!(!home.path().join(".outpost/http-token").exists());

    // A token that is too short is refused outright.
    let out = Command::new(target_bin("outpost"))
        .args(["mcp", "--http", "127.0.0.1:0"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .env("OUTPOST_HTTP_TOKEN", "short")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("at least 16"),
        "{out:?}"
    );
}
