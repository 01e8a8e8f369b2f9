//! Isolated sandboxes over the private sshd: create_sandbox to the first result,
//! exec_bash in bwrap and Landlock sandboxes vs the host, and the egress proxy's cost.

use std::time::Instant;

use outpost_e2e::{Sshd, TempDir};
use serde_json::json;

use crate::{Client, EXEC_ROUNDS, exec_true_in, mcp_client, median, ms, pct, tool, write_config};

const IDLE_ROUNDS: usize = 15;
const IDLE: std::time::Duration = std::time::Duration::from_millis(200);

pub(crate) async fn sandboxes() {
    const CREATE_ROUNDS: usize = 10;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sandboxes");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "bench", &[&sshd]);
    // The same host logged into as root: its sandboxes run on uids of
    // their own.
    let root_state = scratch.path().join("root-state");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&sshd.root_sandbox_toml("root0", &root_state));
    std::fs::write(&config, text).unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: connection, agent, daemon, the isolation probe.
    for host in ["bench0", "root0"] {
        exec_true_in(&client, host, "true", 5).await;
        let made = tool(
            &client,
            "create_sandbox",
            json!({"host": host, "isolation": "bwrap"}),
        )
        .await;
        tool(
            &client,
            "delete_sandbox",
            json!({"sandbox_name": made["sandbox_name"]}),
        )
        .await;
    }

    let (mut create, mut create_root) = (Vec::new(), Vec::new());
    let (mut first_exec, mut delete) = (Vec::new(), Vec::new());
    for _ in 0..CREATE_ROUNDS {
        for (host, times) in [("bench0", &mut create), ("root0", &mut create_root)] {
            let t = Instant::now();
            let made = tool(
                &client,
                "create_sandbox",
                json!({"host": host, "isolation": "bwrap", "network": false}),
            )
            .await;
            times.push(t.elapsed());
            let name = made["sandbox_name"].as_str().unwrap().to_string();
            exec_true_in(&client, &name, "true", 1).await;
            if host == "bench0" {
                first_exec.push(t.elapsed());
            }
            let t = Instant::now();
            tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
            if host == "bench0" {
                delete.push(t.elapsed());
            }
        }
    }

    let bwrap = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap"}),
    )
    .await;
    let landlock = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "landlock"}),
    )
    .await;
    // With no network: a namespace of its own, whose listening ports each
    // command's result reports.
    let offline = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap", "network": false}),
    )
    .await;
    let offline = offline["sandbox_name"].as_str().unwrap().to_string();
    let root_bwrap = tool(
        &client,
        "create_sandbox",
        json!({"host": "root0", "isolation": "bwrap"}),
    )
    .await;
    let (bwrap, landlock, root_bwrap) = (
        bwrap["sandbox_name"].as_str().unwrap().to_string(),
        landlock["sandbox_name"].as_str().unwrap().to_string(),
        root_bwrap["sandbox_name"].as_str().unwrap().to_string(),
    );
    let per_command = "bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --die-with-parent \
        --new-session --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp -- true";
    // Interleaved, so drift hits all alike.
    let (mut host, mut inside, mut ll, mut fresh, mut no_net) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut root_host, mut root_inside) = (Vec::new(), Vec::new());
    for _ in 0..EXEC_ROUNDS / 10 {
        host.push(exec_true_in(&client, "bench0", "true", 10).await);
        inside.push(exec_true_in(&client, &bwrap, "true", 10).await);
        no_net.push(exec_true_in(&client, &offline, "true", 10).await);
        ll.push(exec_true_in(&client, &landlock, "true", 10).await);
        fresh.push(exec_true_in(&client, "bench0", per_command, 10).await);
        root_host.push(exec_true_in(&client, "root0", "true", 10).await);
        root_inside.push(exec_true_in(&client, &root_bwrap, "true", 10).await);
    }
    // What an agent's commands meet: each after a pause (the model
    // thinking), when moving a process into a cgroup would cost most (see
    // the agent's sandbox/cgroup_entry.rs).
    let (mut idle_host, mut idle_inside) = (Vec::new(), Vec::new());
    for _ in 0..IDLE_ROUNDS {
        tokio::time::sleep(IDLE).await;
        idle_host.push(exec_true_in(&client, "bench0", "true", 1).await);
        tokio::time::sleep(IDLE).await;
        idle_inside.push(exec_true_in(&client, &root_bwrap, "true", 1).await);
    }
    let (host, inside, ll, fresh) = (median(host), median(inside), median(ll), median(fresh));
    let no_net = median(no_net);
    let (root_host, root_inside) = (median(root_host), median(root_inside));
    for name in [&bwrap, &landlock, &root_bwrap, &offline] {
        tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    }
    let egress = egress_cost(&client).await;
    client.cancel().await.ok();

    println!();
    println!(
        "isolated sandboxes over SSH (unprivileged bwrap; root's on uids of their own), warm client"
    );
    println!(
        "  create_sandbox (bwrap, no network)       median {}  p90 {}",
        ms(median(create.clone())),
        ms(pct(create, 0.9))
    );
    println!(
        "  create → first exec_bash result          median {}  (E2B advertises ~150 ms for a cloud sandbox)",
        ms(median(first_exec))
    );
    println!(
        "  delete_sandbox (bwrap)                   median {}  p90 {}",
        ms(median(delete.clone())),
        ms(pct(delete, 0.9))
    );
    println!(
        "  exec_bash('true') on the host            median {}",
        ms(host)
    );
    println!(
        "  exec_bash('true') in a bwrap sandbox     median {}  (+{})",
        ms(inside),
        ms(inside.saturating_sub(host))
    );
    println!(
        "  the same with no network (ports watched) median {}  (+{})",
        ms(no_net),
        ms(no_net.saturating_sub(host))
    );
    println!(
        "  exec_bash('true') in a landlock sandbox  median {}  (+{})",
        ms(ll),
        ms(ll.saturating_sub(host))
    );
    println!(
        "  as root: create_sandbox (bwrap, own uid) median {}  p90 {}",
        ms(median(create_root.clone())),
        ms(pct(create_root, 0.9))
    );
    // Against the unprivileged login's host exec: a root login's own runs
    // root's ~/.bashrc (bash does for `bash -c` under sshd), which a
    // sandbox's clean environment skips.
    println!(
        "  as root: exec_bash('true') in bwrap      median {}  (+{} over the login above; root's host exec {})",
        ms(root_inside),
        ms(root_inside.saturating_sub(host)),
        ms(root_host)
    );
    let (idle_root_host, idle_root_inside) = (median(idle_host), median(idle_inside.clone()));
    println!(
        "  as root, each after {} ms idle: in bwrap median {}  p90 {}  (+{} over the login's host exec after the same, {})",
        IDLE.as_millis(),
        ms(idle_root_inside),
        ms(pct(idle_inside, 0.9)),
        ms(idle_root_inside.saturating_sub(idle_root_host)),
        ms(idle_root_host)
    );
    println!(
        "  exec_bash(a new bwrap per command)       median {}  (+{})",
        ms(fresh),
        ms(fresh.saturating_sub(host))
    );
    let [(direct_get, proxied_get), (direct_tcp, proxied_tcp)] = egress;
    println!(
        "  allow_hosts proxy: an HTTP GET            {proxied_get:.2} ms vs {direct_get:.2} ms on the host (+{:.2} ms)",
        proxied_get - direct_get
    );
    println!(
        "  allow_hosts proxy: a CONNECT tunnel       {proxied_tcp:.2} ms vs a TCP connect {direct_tcp:.2} ms (+{:.2} ms)",
        proxied_tcp - direct_tcp
    );
}

/// Times, inside Python, 200 plain GETs and 200 tunnel set-ups: through
/// the proxy where `HTTPS_PROXY` is set, else straight to the server.
const EGRESS_SCRIPT: &str = r#"import os, socket, time, urllib.request
n, port = 200, PORT
t = time.perf_counter()
for _ in range(n):
    urllib.request.urlopen(f"http://localhost:{port}/").read()
get = (time.perf_counter() - t) / n * 1000
t = time.perf_counter()
for _ in range(n):
    if os.environ.get("HTTPS_PROXY"):
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        s.recv(100)
    else:
        s = socket.create_connection(("localhost", port))
    s.close()
print(get, (time.perf_counter() - t) / n * 1000)
"#;

/// Milliseconds per plain HTTP GET and per tunnel set-up (CONNECT through
/// the proxy, or a TCP connect on the host), each timed inside Python over
/// 200 rounds against a server on this machine's loopback: on the host,
/// then in a `network: false` sandbox that allows only that server.
async fn egress_cost(client: &Client) -> [(f64, f64); 2] {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                let mut reader = std::io::BufReader::new(&conn);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = (&conn).write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    let command = format!(
        "python3 - <<'EOF'\n{}EOF",
        EGRESS_SCRIPT.replace("PORT", &port.to_string())
    );
    let measure = |r: serde_json::Value| -> (f64, f64) {
        let out = r["stdout"].as_str().unwrap_or_default().to_string();
        let mut f = out
            .split_whitespace()
            .map(|v| v.parse::<f64>().unwrap_or(f64::NAN));
        (f.next().unwrap_or(f64::NAN), f.next().unwrap_or(f64::NAN))
    };
    let on_host = tool(
        client,
        "exec_bash",
        json!({"command": command, "sandbox_name": "bench0", "timeout_s": 120}),
    )
    .await;
    let made = tool(
        client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap", "network": false,
               "allow_hosts": [format!("localhost:{port}")]}),
    )
    .await;
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let inside = tool(
        client,
        "exec_bash",
        json!({"command": command, "sandbox_name": name, "timeout_s": 120}),
    )
    .await;
    tool(client, "delete_sandbox", json!({"sandbox_name": name})).await;
    let ((direct_get, direct_tcp), (proxied_get, proxied_tcp)) =
        (measure(on_host), measure(inside));
    [(direct_get, proxied_get), (direct_tcp, proxied_tcp)]
}
