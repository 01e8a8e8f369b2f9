//! Terminals through MCP over stdio, on the `local` host and in a sandbox:
//! a Python REPL, `C-c`, a password prompt read from the terminal, a
//! resize, and an exit code; the screen as the emulator renders it.

mod common;

use std::time::{Duration, Instant};

use common::mcp_client::{Client, call, start};
use serde_json::{Value, json};

/// The screen once `needle` shows on it (reads until then, at most 15 s).
async fn screen_with(client: &Client, terminal: &str, needle: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (err, r) = call(
            client,
            "read_terminal",
            json!({"terminal": terminal, "wait_ms": 500}),
        )
        .await;
        assert!(!err, "{r}");
        if r["screen"].as_str().unwrap().contains(needle) {
            return r;
        }
        assert!(Instant::now() < deadline, "never showed {needle:?}: {r}");
    }
}

async fn send(client: &Client, args: Value) -> Value {
    let (err, r) = call(client, "send_terminal", args.clone()).await;
    assert!(!err, "{args}: {r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_answers_a_repl_keys_and_a_password_prompt() {
    let (client, _home) = start(&[]).await;

    let (err, r) = call(&client, "open_terminal", json!({"command": "python3 -q"})).await;
    assert!(!err, "{r}");
    let python = r["terminal"].as_str().unwrap().to_string();
    assert!(python.starts_with("local#"), "{r}");
    screen_with(&client, &python, ">>>").await;
    send(
        &client,
        json!({"terminal": python, "text": "1+1", "keys": ["Enter"]}),
    )
    .await;
    let r = screen_with(&client, &python, ">>> 1+1\n2\n>>>").await;
    assert!(!r["screen"].as_str().unwrap().contains('\x1b'), "{r}");

    let (err, r) = call(&client, "open_terminal", json!({"cols": 80, "rows": 10})).await;
    assert!(!err, "{r}");
    let bash = r["terminal"].as_str().unwrap().to_string();
    send(
        &client,
        json!({"terminal": bash, "text": "PS1='$ '; sleep 100", "keys": ["Enter"]}),
    )
    .await;
    send(&client, json!({"terminal": bash, "keys": ["C-c"]})).await;
    send(
        &client,
        json!({"terminal": bash, "text": "echo back:$?", "keys": ["Enter"]}),
    )
    .await;
    // 130: the sleep ended by SIGINT from the terminal.
    screen_with(&client, &bash, "back:130").await;

    send(
        &client,
        json!({"terminal": bash, "text": "read -s -p 'Password: ' pw < /dev/tty; echo; echo got:$pw", "keys": ["Enter"]}),
    )
    .await;
    screen_with(&client, &bash, "Password:").await;
    send(
        &client,
        json!({"terminal": bash, "text": "s3cret", "keys": ["Enter"]}),
    )
    .await;
    let r = screen_with(&client, &bash, "got:s3cret").await;
    let shown = r["screen"].as_str().unwrap();
    assert_eq!(shown.matches("s3cret").count(), 1, "echoed: {shown}");

    send(
        &client,
        json!({"terminal": bash, "cols": 100, "rows": 30, "text": "tput cols", "keys": ["Enter"]}),
    )
    .await;
    screen_with(&client, &bash, "\n100\n").await;
    // Scrolled-off lines come back once.
    let sent = send(
        &client,
        json!({"terminal": bash, "text": "seq 1 80", "keys": ["Enter"]}),
    )
    .await;
    let r = screen_with(&client, &bash, "80\n$").await;
    let mut scrolled = sent["scrollback"].as_array().cloned().unwrap_or_default();
    scrolled.extend(r["scrollback"].as_array().cloned().unwrap_or_default());
    assert_eq!(
        scrolled.iter().filter(|l| *l == "1").count(),
        1,
        "{sent}\n{r}"
    );

    send(
        &client,
        json!({"terminal": bash, "text": "exit 3", "keys": ["Enter"]}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, r) = call(
            &client,
            "read_terminal",
            json!({"terminal": bash, "wait_ms": 500}),
        )
        .await;
        if r["exit_code"] == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no exit code: {r}");
    }
    let (err, r) = call(&client, "close_terminal", json!({"terminal": python})).await;
    assert!(!err, "{r}");
    let (err, r) = call(&client, "read_terminal", json!({"terminal": python})).await;
    assert!(err && r.to_string().contains("no terminal"), "{r}");
    for (args, wanted) in [
        (json!({"terminal": bash, "keys": ["C-1"]}), "unknown key"),
        (json!({"terminal": "nope", "text": "x"}), "SANDBOX#ID"),
    ] {
        let (err, r) = call(&client, "send_terminal", args.clone()).await;
        assert!(err && r.to_string().contains(wanted), "{args}: {r}");
    }

    // In a sandbox: its work dir, its marker, and not reachable from the host.
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 300}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap();
    let (err, r) = call(&client, "open_terminal", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    let inside = r["terminal"].as_str().unwrap().to_string();
    assert!(inside.starts_with(&format!("{name}#")), "{r}");
    send(
        &client,
        json!({"terminal": inside, "text": "pwd; echo in:$OUTPOST_SANDBOX", "keys": ["Enter"]}),
    )
    .await;
    let r = screen_with(&client, &inside, "in:sbx-").await;
    assert!(
        r["screen"]
            .as_str()
            .unwrap()
            .contains(made["work_dir"].as_str().unwrap()),
        "{r}"
    );
    let id = inside.rsplit('#').next().unwrap();
    let (err, r) = call(
        &client,
        "read_terminal",
        json!({"terminal": format!("local#{id}")}),
    )
    .await;
    assert!(err, "a sandbox's terminal read as the host's: {r}");
    client.cancel().await.unwrap();
}

/// Over a real sshd: the terminal lives in the agent's daemon, so a cut SSH
/// connection loses neither its shell nor its screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_outlives_a_cut_connection() {
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let (err, r) = call(&client, "open_terminal", json!({"sandbox_name": "box"})).await;
    assert!(!err, "{r}");
    let shell = r["terminal"].as_str().unwrap().to_string();
    assert!(shell.starts_with("box#"), "{r}");
    send(
        &client,
        json!({"terminal": shell, "text": "X=41; echo before:$$", "keys": ["Enter"]}),
    )
    .await;
    let before = screen_with(&client, &shell, "before:").await;
    let pid: String = before["screen"]
        .as_str()
        .unwrap()
        .split("before:")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();

    // A call in flight when the link dies is reported, never re-sent (so
    // no text is typed twice); a read is safe to repeat until it reconnects.
    sshd.kill_connections();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (err, r) = call(&client, "read_terminal", json!({"terminal": shell})).await;
        if !err {
            assert!(r["screen"].as_str().unwrap().contains("before:"), "{r}");
            break;
        }
        assert!(r.to_string().contains("connection lost"), "{r}");
        assert!(Instant::now() < deadline, "never reconnected: {r}");
    }
    send(
        &client,
        json!({"terminal": shell, "text": "echo after:$((X+1)):$$", "keys": ["Enter"]}),
    )
    .await;
    // The same shell: its variable and its pid, and the screen kept.
    let after = screen_with(&client, &shell, &format!("after:42:{pid}")).await;
    assert!(
        after["screen"]
            .as_str()
            .unwrap()
            .contains(&format!("before:{pid}")),
        "{after}"
    );
    client.cancel().await.unwrap();
}
