//! Undo, branch and ports on the local host: checkpoint and restore of a
//! 10,000-file, 1 GiB work dir against `cp -a` of the same tree (the floor
//! for a copy on this filesystem), a fork, and the first byte through
//! `expose_port` after the call; a terminal's keystroke-to-screen time.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use outpost_e2e::TempDir;
use serde_json::json;

use crate::{mcp_client, ms, timed, tool};

const POPULATE: &str = "python3 - <<'EOF'\nimport os\nfor d in range(100):\n    os.makedirs(f'd{d}', exist_ok=True)\n    for f in range(100):\n        with open(f'd{d}/f{f}.txt', 'w') as out:\n            out.write(''.join(f'line {i} of {d}/{f}\\n' for i in range(40)))\nEOF\nfor i in 0 1 2 3; do head -c 268435456 /dev/urandom > big$i; done";

pub(crate) async fn checkpoints() {
    let scratch = TempDir::new("bench-checkpoints");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let client = mcp_client(&home, None).await;
    let made = tool(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 3600}),
    )
    .await;
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let work = made["work_dir"].as_str().unwrap().to_string();
    let run = |command: &'static str| {
        tool(
            &client,
            "exec_bash",
            json!({"sandbox_name": name, "command": command, "timeout_s": 600}),
        )
    };
    run(POPULATE).await;

    // What the filesystem still owes for writing 1 GiB and 10,000 files (or
    // for removing a copy of them: XFS frees inodes and shared extents in
    // the background) is paid by whatever runs next, up to 2.5 s of it: each
    // measurement starts from a settled filesystem, as a work dir an agent
    // checkpoints has mostly been written seconds or minutes before.
    let settle = || {
        Command::new("sync").status().unwrap();
    };
    settle();
    // The floor: the same tree copied by cp (reflinks where it can).
    let copy = scratch.path().join("cp-copy");
    let mut cp = Command::new("cp");
    cp.args(["-a", &work]).arg(&copy);
    let (cp_took, _) = timed(cp);
    std::fs::remove_dir_all(&copy).unwrap();
    settle();

    let t = Instant::now();
    let r = tool(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    let first = t.elapsed();
    println!(
        "first checkpoint of 10,000 files + 1 GiB: {} ({} files shared copy-on-write)",
        ms(first),
        r["copy_on_write"].as_u64().unwrap_or(0)
    );
    println!(
        "  vs cp -a of the same tree: {} ({:.2}x)",
        ms(cp_took),
        first.as_secs_f64() / cp_took.as_secs_f64()
    );
    // The usual next one: a few files edited since (after the file clock's
    // slack, so the bench measures the sharing, not the slack).
    tokio::time::sleep(Duration::from_millis(100)).await;
    run("for d in $(seq 0 9); do echo edit >> d$d/f9.txt; done").await;
    let t = Instant::now();
    let r = tool(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    let next = t.elapsed();
    let checkpoint = r["checkpoint"].as_str().unwrap().to_string();
    println!(
        "next checkpoint, 10 files edited: {} ({} files unchanged, shared with the first; {:.2}x cp -a)",
        ms(next),
        r["unchanged"].as_u64().unwrap_or(0),
        next.as_secs_f64() / cp_took.as_secs_f64()
    );

    run("for d in $(seq 0 9); do echo x >> d$d/f1.txt; rm d$d/f2.txt; done; printf y | dd of=big0 bs=1 seek=7 conv=notrunc status=none").await;
    settle();
    let t = Instant::now();
    let r = tool(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": checkpoint}),
    )
    .await;
    println!(
        "restore after 21 changes: {} ({} files, {} bytes written back)",
        ms(t.elapsed()),
        r["files"],
        r["bytes"]
    );
    let t = Instant::now();
    tool(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": checkpoint}),
    )
    .await;
    println!("restore with nothing to do: {}", ms(t.elapsed()));
    let t = Instant::now();
    tool(
        &client,
        "diff_checkpoint",
        json!({"checkpoint": checkpoint}),
    )
    .await;
    println!("diff with nothing changed: {}", ms(t.elapsed()));

    settle();
    let t = Instant::now();
    let fork = tool(&client, "fork_sandbox", json!({"sandbox_name": name})).await;
    println!("fork of the same sandbox: {}", ms(t.elapsed()));
    tool(
        &client,
        "delete_sandbox",
        json!({"sandbox_name": fork["sandbox_name"]}),
    )
    .await;

    run("echo page > index.html; nohup setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &\nfor i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1").await;
    let t = Instant::now();
    let r = tool(
        &client,
        "expose_port",
        json!({"sandbox_name": name, "port": 8000}),
    )
    .await;
    let addr = r["url"].as_str().unwrap().strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).unwrap();
    println!("expose_port: first byte {} after the call", ms(t.elapsed()));
    let t = Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    stream.read_exact(&mut first).unwrap();
    println!("  a later connection: first byte {}", ms(t.elapsed()));

    // Keystroke to screen: a key sent without waiting, then read until the
    // terminal shows it (`cat` echoes each line).
    let r = tool(
        &client,
        "open_terminal",
        json!({"sandbox_name": name, "command": "cat"}),
    )
    .await;
    let terminal = r["terminal"].as_str().unwrap().to_string();
    let mut took = Vec::new();
    for i in 0..20 {
        let marker = format!("key{i}");
        let t = Instant::now();
        let sent = tool(
            &client,
            "send_terminal",
            json!({"terminal": terminal, "text": marker, "wait_ms": 0}),
        )
        .await;
        // The echo may be on the screen the send answers with already;
        // then a read would wait for output after it.
        let mut screen = sent["screen"].as_str().unwrap().to_string();
        while !screen.contains(&marker) {
            let r = tool(
                &client,
                "read_terminal",
                json!({"terminal": terminal, "wait_ms": 1000}),
            )
            .await;
            screen = r["screen"].as_str().unwrap().to_string();
        }
        took.push(t.elapsed());
    }
    took.sort();
    println!(
        "terminal keystroke to screen: median {} (max {}) over 20",
        ms(took[10]),
        ms(took[19])
    );
    tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    client.cancel().await.unwrap();
}
