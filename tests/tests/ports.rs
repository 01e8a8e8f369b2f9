//! `expose_port` over a real sshd: a web server in a `network: false`
//! bubblewrap sandbox, read from this machine through the URL the tool
//! answers; the forward comes back after the SSH connection is cut, and
//! stops answering once the sandbox is deleted.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
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
