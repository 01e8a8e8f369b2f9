//! `outpost mcp --http`: real MCP clients (rmcp's Streamable HTTP client)
//! with the bearer token, two at once on one fleet, and raw requests without
//! the token, with a wrong one or from a foreign `Origin`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::mcp_client::{ProgressLog, call};
use outpost_e2e::{McpHttp, target_bin};
use serde_json::{Value, json};

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

    // Without the token, or with a wrong one: 401, and a line that says
    // what is missing and where the token is.
    let bearer = format!("Authorization: Bearer {}\r\n", server.token);
    for (headers, problem) in [
        (
            String::new(),
            "has no `Authorization: Bearer <token>` header",
        ),
        (
            "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n".into(),
            "not one this server accepts",
        ),
        (
            format!("Authorization: {}\r\n", server.token),
            "is not `Bearer <token>`",
        ),
    ] {
        let r = raw(&server, "/mcp", &headers);
        assert_eq!(status(&r), "401", "{r}");
        assert!(r.contains("www-authenticate: Bearer"), "{r}");
        let body = r.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert!(
            body.contains(problem) && body.contains("~/.outpost/http-token"),
            "{r}"
        );
        assert!(!body.contains(&server.token), "{r}");
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
    // A foreign Origin (DNS rebinding) is refused; other paths than MCP's,
    // OAuth's and the status page's do not exist.
    let r = raw(
        &server,
        "/mcp",
        &format!("{bearer}Origin: http://evil.example\r\n"),
    );
    assert_eq!(status(&r), "403", "{r}");
    assert_eq!(status(&raw(&server, "/elsewhere", &bearer)), "404");
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
    for wildcard in ["0.0.0.0:0", "[::]:0", "[::ffff:0.0.0.0]:0"] {
        let err = refused(home.path(), wildcard, Some("0123456789abcdef0123"));
        assert!(err.contains("name the address"), "{wildcard}: {err}");
    }

    // A token that is too short is refused outright.
    let err = refused(home.path(), "127.0.0.1:0", Some("short"));
    assert!(err.contains("at least 16"), "{err}");
}

/// One 2026-07-28 request, stateless, on a connection of its own, from the
/// holder of `token`; a client that declares MCP Tasks. Returns the
/// JSON-RPC `result`, or `error`.
async fn modern(
    server: &McpHttp,
    token: &str,
    method: &str,
    name: &str,
    params: Value,
) -> Result<Value, Value> {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw-modern", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let response = reqwest::Client::new()
        .post(format!("http://{}/mcp", server.addr))
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Connection", "close")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    // A JSON body, or an event stream whose events are JSON-RPC messages.
    let message = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(text.as_str()))
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|m| m["id"] == 7)
        .unwrap_or_else(|| panic!("no answer to {method}: {text}"));
    match message.get("error") {
        Some(error) => Err(error.clone()),
        None => Ok(message["result"].clone()),
    }
}

/// Over stateless HTTP (2026-07-28) a long call becomes a task that later
/// requests find, each meeting a fresh server; another caller, with a token
/// of its own, cannot see, wait for or cancel it. Cancelling ends the
/// command's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_s_tasks_are_its_own_and_outlive_each_request() {
    let other_token = "0123456789abcdef0123456789abcdef-other";
    let server = McpHttp::start_with_callers(&[("other", other_token)]);
    let own = server.token.clone();
    let scratch = common::scratch("http-tasks");
    let pid_file = scratch.path().join("pid");

    // Quick calls answer inline, even for a client that declares tasks.
    let quick = modern(
        &server,
        &own,
        "tools/call",
        "exec_bash",
        json!({"name": "exec_bash", "arguments": {"command": "echo quick"}}),
    )
    .await
    .unwrap();
    assert_eq!(quick["structuredContent"]["stdout"], "quick\n", "{quick}");

    let command = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
    let created = modern(
        &server,
        &own,
        "tools/call",
        "exec_bash",
        json!({"name": "exec_bash", "arguments": {"command": command}}),
    )
    .await
    .unwrap();
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().unwrap().to_string();
    let task = || json!({"taskId": id.clone()});

    // The other caller: as if the task did not exist.
    for method in ["tasks/get", "tasks/cancel", "tasks/result"] {
        let err = modern(&server, other_token, method, &id, task())
            .await
            .unwrap_err();
        assert_eq!(err["code"], -32602, "{method}: {err}");
        assert_eq!(
            err["message"],
            format!("unknown task: {id}"),
            "{method}: {err}"
        );
    }
    let listed = modern(&server, other_token, "tasks/list", "", json!({}))
        .await
        .unwrap();
    assert_eq!(listed["tasks"], json!([]), "{listed}");

    // Its own caller finds it still working, on a new connection and server.
    let got = modern(&server, &own, "tasks/get", &id, task())
        .await
        .unwrap();
    assert_eq!(got["status"], "working", "{got}");
    let listed = modern(&server, &own, "tasks/list", "", json!({}))
        .await
        .unwrap();
    assert_eq!(listed["tasks"][0]["taskId"], id.as_str(), "{listed}");
    assert!(
        outpost_e2e::wait_until(Duration::from_secs(10), || pid_file.exists()),
        "the command never started"
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = || unsafe { libc::kill(pid, 0) } == 0;
    assert!(alive());

    modern(&server, &own, "tasks/cancel", &id, task())
        .await
        .unwrap();
    let mut status = Value::Null;
    for _ in 0..100 {
        let got = modern(&server, &own, "tasks/get", &id, task())
            .await
            .unwrap();
        status = got["status"].clone();
        if status != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "cancelled");
    assert!(
        outpost_e2e::wait_until(Duration::from_secs(10), || !alive()),
        "the cancelled task's command still runs"
    );

    // A task that ends: its result, for its caller alone.
    let created = modern(
        &server,
        &own,
        "tools/call",
        "exec_bash",
        json!({"name": "exec_bash", "arguments": {"command": "sleep 1.5; echo done"}}),
    )
    .await
    .unwrap();
    let id = created["taskId"].as_str().unwrap().to_string();
    let result = modern(&server, &own, "tasks/result", &id, json!({"taskId": id}))
        .await
        .unwrap();
    assert_eq!(result["structuredContent"]["stdout"], "done\n", "{result}");
    let err = modern(
        &server,
        other_token,
        "tasks/result",
        &id,
        json!({"taskId": id}),
    )
    .await
    .unwrap_err();
    assert_eq!(err["code"], -32602, "{err}");
}

/// CPU seconds process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command (which may hold spaces): utime is the 12th.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Out of file descriptors (a server limited to 48, then 120 idle
/// connections): it neither spins nor floods its log, and serves again once
/// they go.
#[test]
fn a_server_out_of_file_descriptors_waits_and_recovers() {
    let server = McpHttp::start_with(&[], Some(48));
    let idle: Vec<TcpStream> = (0..120)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let (cpu, log) = (
        cpu_seconds(server.pid()),
        server.logged.load(Ordering::Relaxed),
    );
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu_seconds(server.pid()) - cpu;
    let written = server.logged.load(Ordering::Relaxed) - log;
    assert!(
        spent < 0.6,
        "{spent:.2} s of CPU in 3 s while out of descriptors"
    );
    assert!(written < 20_000, "{written} bytes of log in 3 s");
    drop(idle);
    let bearer = format!("Authorization: Bearer {}\r\n", server.token);
    let ok = outpost_e2e::wait_until(Duration::from_secs(10), || {
        status(&raw(&server, "/mcp", &bearer)) == "200"
    });
    assert!(ok, "not served again once the connections closed");
}

/// Past its connection limit a server answers 503 at once, saying why;
/// one caller cannot hold more than its share of sessions.
#[test]
fn connections_and_sessions_are_bounded() {
    let other = "0123456789abcdef0123456789abcdef-bounded";
    let server = McpHttp::start_with_callers(&[("other", other)]);
    // Idle connections up to the limit, then one more.
    let idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let r = raw(&server, "/mcp", "");
    assert_eq!(status(&r), "503", "{r}");
    assert!(r.contains("connections are open"), "{r}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(500));

    let own = format!("Authorization: Bearer {}\r\n", server.token);
    for n in 0..64 {
        let r = raw(&server, "/mcp", &own);
        assert_eq!(status(&r), "200", "session {n}: {r}");
        assert!(r.contains("mcp-session-id"), "{r}");
    }
    let r = raw(&server, "/mcp", &own);
    assert_eq!(status(&r), "503", "{r}");
    assert!(r.contains("the most one caller may"), "{r}");
    // Another caller is not held back by this one.
    let r = raw(
        &server,
        "/mcp",
        &format!("Authorization: Bearer {other}\r\n"),
    );
    assert_eq!(status(&r), "200", "{r}");
}

/// A POST of `body` with the token; the whole response.
fn post(server: &McpHttp, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        server.token,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// A body that is not JSON is answered with -32700 and its id where one can
/// be found (else null), a batch with -32600: as JSON-RPC errors, not bare
/// HTTP statuses.
#[test]
fn every_http_request_is_answered_as_json_rpc() {
    let server = McpHttp::start();
    let cases: [(&[u8], Value, i64); 5] = [
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"\ud800"}}"#,
            json!(1),
            -32700,
        ),
        (
            br#"{"jsonrpc":"2.0","id":"two","method":"ping","params":{"n":1e400}}"#,
            json!("two"),
            -32700,
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"pi\xffng\"}",
            json!(3),
            -32700,
        ),
        (b"{\"jsonrpc\":\"2.0\",\"method\":", Value::Null, -32700),
        (
            br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#,
            Value::Null,
            -32600,
        ),
    ];
    for (body, id, code) in cases {
        let r = post(&server, body);
        assert_eq!(status(&r), "400", "{r}");
        let answer: Value = serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(answer["id"], id, "{r}");
        assert_eq!(answer["error"]["code"], code, "{r}");
    }
    // A well-formed request is served as before.
    let bearer = format!("Authorization: Bearer {}\r\n", server.token);
    assert_eq!(status(&raw(&server, "/mcp", &bearer)), "200");
}

/// A sandbox made in an HTTP session ends when the client ends its session
/// (DELETE); the server, and what other sessions made, go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_session_s_sandboxes_end_with_it() {
    let server = McpHttp::start();
    let (a, b) = (server.client(()).await, server.client(()).await);
    let mut markers = Vec::new();
    for client in [&a, &b] {
        let (err, made) = call(
            client,
            "create_sandbox",
            json!({"host": "local", "isolation": "none", "ttl_s": 60}),
        )
        .await;
        assert!(!err, "{made}");
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        let (err, r) = call(
            client,
            "exec_bash",
            json!({"sandbox_name": name, "command": "nohup setsid sleep 1000 >/dev/null 2>&1 &"}),
        )
        .await;
        assert!(!err, "{r}");
        let marker = format!("OUTPOST_SANDBOX={}", name.rsplit('/').next().unwrap());
        assert!(!outpost_e2e::pids_with_env(&marker).is_empty());
        markers.push((name, marker));
    }
    a.cancel().await.unwrap();
    assert!(
        outpost_e2e::wait_until(Duration::from_secs(10), || {
            outpost_e2e::pids_with_env(&markers[0].1).is_empty()
        }),
        "the ended session's sandbox still runs"
    );
    assert!(!outpost_e2e::pids_with_env(&markers[1].1).is_empty());
    // Its processes end first, then it is recorded as deleted.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (err, r) = call(&b, "list_sandboxes", json!({})).await;
        assert!(!err, "{r}");
        let listed = r.to_string();
        assert!(listed.contains(&markers[1].0), "{r}");
        if !listed.contains(&markers[0].0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still listed: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.cancel().await.unwrap();
    assert!(
        outpost_e2e::wait_until(Duration::from_secs(10), || {
            outpost_e2e::pids_with_env(&markers[1].1).is_empty()
        }),
        "the second session's sandbox still runs"
    );
}
