//! `expose_port` over a real sshd: a web server in a `network: false`
//! bubblewrap sandbox, read from this machine through the URL the tool
//! answers; a WebSocket echoed through it to Node's own client; the forward
//! comes back after the SSH connection is cut, and stops answering once the
//! sandbox is deleted.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mcp_client::{call, isolated_env, start};
use serde_json::json;

/// The body of `GET /index.html` at `url`, or why not.
fn get(url: &str) -> Result<String, String> {
    let addr = url.strip_prefix("http://").unwrap();
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /index.html HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.0 200") => Ok(body.to_string()),
        _ => Err(format!("not a page: {response:?}")),
    }
}

/// A WebSocket echo server (RFC 6455 text frames, by hand: the sandbox has
/// only Python's standard library) on 127.0.0.1:8002.
const WEBSOCKET_ECHO: &str = r#"
import base64, hashlib, socket, struct
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 8002))
server.listen()
while True:
    conn, _ = server.accept()
    stream = conn.makefile("rb")
    key = ""
    while (line := stream.readline().decode()) not in ("\r\n", ""):
        name, _, value = line.partition(":")
        if name.strip().lower() == "sec-websocket-key":
            key = value.strip()
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while len(head := stream.read(2)) == 2:
        opcode, size = head[0] & 15, head[1] & 127
        if size == 126:
            size = struct.unpack(">H", stream.read(2))[0]
        mask = stream.read(4) if head[1] & 128 else bytes(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(stream.read(size)))
        if opcode == 8:
            conn.sendall(b"\x88\x00")
            break
        reply = b"echo: " + data
        conn.sendall(bytes([0x81, len(reply)]) + reply)
    stream.close()
    conn.close()
"#;

/// What Node's own WebSocket client reads back for one message to `url`.
fn websocket_echo(url: &str, message: &str) -> String {
    let script = "const ws = new WebSocket(process.argv[1]);\n\
        ws.onopen = () => ws.send(process.argv[2]);\n\
        ws.onmessage = (e) => { console.log(e.data); ws.close(); };\n\
        ws.onclose = () => process.exit(0);\n\
        ws.onerror = (e) => { console.error('websocket error', e.message); process.exit(2); };\n\
        setTimeout(() => { console.error('no answer'); process.exit(3); }, 10000);";
    let out = Command::new(outpost_e2e::test_node())
        .args(["-e", script, &url.replace("http://", "ws://"), message])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_server_in_a_sandbox_without_network_is_served_here() {
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "box", "isolation": "bwrap", "network": false, "ttl_s": 600}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"sandbox_name": name, "command": "echo hello from the sandbox > index.html\n\
               nohup setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &\n\
               for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}),
    )
    .await;
    assert!(!err && r["exit_code"] == 0, "{r}");
    assert_eq!(r["listening"], json!([8000]), "the port it opened: {r}");

    let asked = Instant::now();
    let (err, r) = call(
        &client,
        "expose_port",
        json!({"sandbox_name": name, "port": 8000}),
    )
    .await;
    assert!(!err, "{r}");
    let url = r["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{r}");
    assert_eq!(get(&url).unwrap(), "hello from the sandbox\n");
    eprintln!(
        "expose_port: first page {:?} after the call",
        asked.elapsed()
    );
    let (err, again) = call(
        &client,
        "expose_port",
        json!({"sandbox_name": name, "port": 8000}),
    )
    .await;
    assert!(!err && again["url"] == url.as_str(), "{again}");
    let (err, status) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
    assert!(!err, "{status}");
    assert_eq!(status["ports"]["8000"], url.as_str(), "{status}");

    // A WebSocket upgrade and its frames pass both ways.
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"sandbox_name": name, "command": format!("cat > ws.py <<'EOF'\n{WEBSOCKET_ECHO}\nEOF\n\
               nohup setsid python3 ws.py >ws.log 2>&1 &\n\
               for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8002))' 2>/dev/null && exit 0; sleep 0.1; done; cat ws.log; exit 1")}),
    )
    .await;
    assert!(!err && r["exit_code"] == 0, "{r}");
    let (err, r) = call(
        &client,
        "expose_port",
        json!({"sandbox_name": name, "port": 8002}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        websocket_echo(r["url"].as_str().unwrap(), "over the forward"),
        "echo: over the forward\n"
    );

    // The SSH connection cut: the next connections bring it back.
    sshd.kill_connections();
    let deadline = Instant::now() + Duration::from_secs(20);
    let back = loop {
        match get(&url) {
            Ok(body) => break body,
            Err(e) if Instant::now() < deadline => {
                eprintln!("after the cut: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the forward did not come back: {e}"),
        }
    };
    assert_eq!(back, "hello from the sandbox\n");

    // Nothing listens on a port the sandbox does not serve.
    let (err, r) = call(
        &client,
        "expose_port",
        json!({"sandbox_name": name, "port": 8001}),
    )
    .await;
    assert!(!err, "{r}");
    assert!(get(r["url"].as_str().unwrap()).is_err());

    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert!(get(&url).is_err(), "still served after delete_sandbox");
    client.cancel().await.unwrap();
}
