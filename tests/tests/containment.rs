//! What a prompt-injected model may try through `outpost mcp`'s file tools,
//! and what stops it: local paths stay inside the roots (configured, the
//! client's, else the start directory), credential stores are never synced,
//! and a message too large to read still gets an answer.
//!
//! Driven through the real `outpost mcp` binary with rmcp's MCP client,
//! against the zero-config `local` sandbox.

// MCP roots are deprecated for a later protocol revision; clients send them today.
#![allow(deprecated)]

mod common;

use std::path::Path;

use common::mcp_client::{Client, call};
use outpost_e2e::{TempDir, target_bin};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ListRootsResult, Root,
};
use rmcp::service::RequestContext;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// A client that declares roots and answers `roots/list` with `roots`.
#[derive(Clone)]
struct RootsClient {
    roots: Vec<String>,
}

impl ClientHandler for RootsClient {
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        Ok(ListRootsResult::new(
            self.roots
                .iter()
                .map(|uri| Root::new(uri.clone()))
                .collect(),
        ))
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_roots().build(),
            Implementation::new("roots-test", "1"),
        )
    }
}

type RootsService = rmcp::service::RunningService<RoleClient, RootsClient>;

fn command(home: &Path, cwd: &Path, config: Option<&Path>) -> tokio::process::Command {
    tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
        cmd.arg("mcp")
            .env_clear()
            .env("HOME", home)
            .env("PATH", std::env::var("PATH").unwrap())
            .current_dir(cwd);
        if let Some(config) = config {
            cmd.env("OUTPOST_CONFIG", config);
        }
    })
}

/// `outpost mcp` with no roots capability on the client's side.
async fn plain(home: &Path, cwd: &Path, config: Option<&Path>) -> Client {
    let transport = TokioChildProcess::new(command(home, cwd, config)).unwrap();
    ().serve(transport).await.unwrap()
}

async fn with_roots(home: &Path, cwd: &Path, roots: &[&Path]) -> RootsService {
    let client = RootsClient {
        roots: roots
            .iter()
            .map(|r| format!("file://{}", r.display()))
            .collect(),
    };
    let transport = TokioChildProcess::new(command(home, cwd, None)).unwrap();
    client.serve(transport).await.unwrap()
}

async fn call_on(
    client: &RootsService,
    tool: &'static str,
    args: serde_json::Value,
) -> (bool, String) {
    let result = client
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    (result.is_error.unwrap_or(false), text)
}

/// A remote tree on the local sandbox holding `authorized_keys2`.
fn attacker_tree(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("authorized_keys2"), "ssh-ed25519 AAAA attacker\n").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_local_roots_hold_against_dotdot_in_missing_directories() {
    let top = TempDir::new("contain-roots");
    let home = top.path().join("home");
    let proj = top.path().join("proj");
    let remote = top.path().join("remote");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::create_dir_all(&proj).unwrap();
    attacker_tree(&remote);
    let config = top.path().join("config.toml");
    std::fs::write(
        &config,
        format!("local_roots = [{:?}]\n", proj.display().to_string()),
    )
    .unwrap();
    let client = plain(&home, top.path(), Some(&config)).await;

    // The finding: `..` after a missing directory left the root.
    for local in [
        format!("{}/nonexist/../../home/.ssh", proj.display()),
        format!(
            "{}/q/../../../../{}/escaped",
            proj.display(),
            top.path().display()
        ),
    ] {
        let (err, r) = call(
            &client,
            "sync_remote_to_local",
            json!({"remote_path": remote, "local_path": local}),
        )
        .await;
        assert!(err, "{local}: {r}");
        assert!(r.to_string().contains("outside"), "{r}");
    }
    assert!(!home.join(".ssh/authorized_keys2").exists());
    assert!(!proj.join("nonexist").exists() && !proj.join("q").exists());
    assert!(!top.path().join("escaped").exists());

    // A symlink inside the root that leads out is not followed.
    std::os::unix::fs::symlink(home.join(".ssh"), proj.join("keys")).unwrap();
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": proj.join("keys")}),
    )
    .await;
    assert!(err && r.to_string().contains("symlink"), "{r}");
    assert!(!home.join(".ssh/authorized_keys2").exists());

    // Inside the root it works, and creates what is missing.
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": proj.join("a/b")}),
    )
    .await;
    assert!(!err, "{r}");
    assert!(proj.join("a/b/authorized_keys2").is_file());
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_local_roots_the_start_directory_is_the_root() {
    let top = TempDir::new("contain-default");
    let home = top.path().join("home");
    let work = top.path().join("work");
    let remote = top.path().join("remote");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").unwrap();
    std::fs::create_dir_all(&work).unwrap();
    attacker_tree(&remote);
    let client = plain(&home, &work, None).await;

    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": home.join(".ssh"), "remote_path": top.path().join("stolen")}),
    )
    .await;
    assert!(err && r.to_string().contains("outside"), "{r}");
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": home.join(".ssh")}),
    )
    .await;
    assert!(err && r.to_string().contains("outside"), "{r}");
    assert!(!top.path().join("stolen").exists());
    assert!(!home.join(".ssh/authorized_keys2").exists());

    // Relative paths are taken from the start directory, and work.
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": "pulled"}),
    )
    .await;
    assert!(!err, "{r}");
    assert!(work.join("pulled/authorized_keys2").is_file());
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_roots_replace_the_start_directory_and_secrets_stay_home() {
    let top = TempDir::new("contain-client");
    let home = top.path().join("home");
    let remote = top.path().join("remote");
    let elsewhere = top.path().join("elsewhere");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").unwrap();
    std::fs::write(home.join("notes.txt"), "notes\n").unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    attacker_tree(&remote.join(".ssh"));
    std::fs::write(remote.join("readme"), "hi\n").unwrap();
    // The client says the project is the whole home.
    let client = with_roots(&home, &elsewhere, &[&home]).await;

    // The start directory is not a root any more.
    let (err, text) = call_on(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": elsewhere.join("x")}),
    )
    .await;
    assert!(err && text.contains("client's roots"), "{text}");

    // A pull into the home never writes ~/.ssh, and a push of the home never
    // carries ~/.ssh along.
    let (err, text) = call_on(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote, "local_path": home}),
    )
    .await;
    assert!(!err, "{text}");
    assert_eq!(
        std::fs::read_to_string(home.join("readme")).unwrap(),
        "hi\n"
    );
    assert!(!home.join(".ssh/authorized_keys2").exists());
    let pushed = top.path().join("pushed");
    let (err, text) = call_on(
        &client,
        "sync_local_to_remote",
        json!({"local_path": home, "remote_path": pushed}),
    )
    .await;
    assert!(!err, "{text}");
    assert!(pushed.join("notes.txt").is_file());
    assert!(!pushed.join(".ssh").exists(), "credentials were pushed");
    let (err, text) = call_on(
        &client,
        "sync_local_to_remote",
        json!({"local_path": home.join(".ssh"), "remote_path": pushed}),
    )
    .await;
    assert!(err && text.contains("credentials"), "{text}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_answered_even_past_the_message_limit() {
    let top = TempDir::new("contain-big");
    let home = top.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let client = plain(&home, top.path(), None).await;
    let target = top.path().join("big.txt");

    // 17 MB: readable, but past what write_remote_file takes.
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": target, "content": "a".repeat(17_000_000)}),
    )
    .await;
    assert!(err, "{r}");
    assert!(r.to_string().contains("sync_local_to_remote"), "{r}");
    assert!(!target.exists());

    // 40 MB: past what the server reads at all; still answered, with the limit.
    let args = json!({"remote_path": target, "content": "b".repeat(40_000_000)});
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        client.call_tool(
            CallToolRequestParams::new("write_remote_file")
                .with_arguments(args.as_object().unwrap().clone()),
        ),
    )
    .await
    .expect("an oversized message must be answered");
    let err = answer.unwrap_err().to_string();
    assert!(err.contains("MiB limit"), "{err}");
    assert!(!target.exists());

    // The connection still serves.
    let (err, r) = call(&client, "exec_bash", json!({"command": "echo alive"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], "alive\n");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_remote_agent_leaves_no_command_running() {
    // The finding: `kill -9` of the remote `outpost-agent serve` during
    // `sleep 301` left bash and sleep running under PID 1.
    let sshd = outpost_e2e::Sshd::start();
    let state = common::scratch("contain-orphans");
    let fleet = common::fleet(&sshd, state.path());
    let session = fleet.get(Some(common::BOX)).unwrap();
    let marker = "sleep 301.4242";
    let running = {
        let session = session.clone();
        tokio::spawn(async move { common::run(&session, &format!("{marker}; echo done")).await })
    };
    assert!(
        outpost_e2e::wait_until(std::time::Duration::from_secs(10), || {
            !outpost_e2e::pids_with_cmdline(marker).is_empty()
        }),
        "the command never started"
    );
    let agents = format!("{}/agents/", sshd.remote_dir().display());
    let serve: Vec<i32> = outpost_e2e::pids_with_cmdline(&agents)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split('\0').any(|arg| arg == "serve"))
        })
        .collect();
    assert_eq!(
        serve.len(),
        1,
        "one agent serves this connection: {serve:?}"
    );
    // SAFETY: plain kill(2) of a process this test's sshd started.
    unsafe {
        libc::kill(serve[0], libc::SIGKILL);
    }
    let started = std::time::Instant::now();
    let result = running.await.unwrap();
    assert!(
        result.is_err(),
        "the call reports the lost connection: {result:?}"
    );
    let gone = outpost_e2e::wait_until(std::time::Duration::from_millis(1500), || {
        outpost_e2e::pids_with_cmdline(marker).is_empty()
    });
    assert!(
        gone,
        "processes outlived the agent {:?} after {:?}",
        outpost_e2e::pids_with_cmdline(marker),
        started.elapsed()
    );
    // The next call connects afresh and works.
    let again = common::run(&session, "echo back").await.unwrap();
    assert_eq!(common::stdout(&again), "back\n");
}

/// Messages the stdio transport cannot parse (a lone surrogate escape, a
/// number no float holds, invalid UTF-8) are answered by their id with
/// -32700; one with no id and a batch get the transport's Invalid request.
/// None is left unanswered, and the server goes on serving.
#[test]
fn every_request_is_answered_even_when_it_is_not_json() {
    use std::io::{BufRead, Write};
    let home = TempDir::new("contain-garbage");
    let mut server = std::process::Command::new(target_bin("outpost"))
        .arg("mcp")
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let lines: Vec<&[u8]> = vec![
        br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec_bash","arguments":{"command":"echo \ud800"}}}"#,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"exec_bash","arguments":{"command":"true","timeout_s":1e400}}}"#,
        b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"pi\xffng\"}",
        br#"{"jsonrpc":"2.0","method":"ping",}"#,
        br#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#,
        br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#,
    ];
    for line in lines {
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
    }
    stdin.flush().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = server.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(serde_json::from_str::<Value>(&line).unwrap());
        }
    });
    let mut answers = Vec::new();
    while answers.len() < 7 {
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(answer) => answers.push(answer),
            Err(_) => panic!("unanswered after {answers:?}"),
        }
    }
    let by_id = |id: i64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer for {id}: {answers:?}"))
    };
    for id in [1, 2, 3] {
        assert_eq!(by_id(id)["error"]["code"], -32700, "{answers:?}");
        let message = by_id(id)["error"]["message"].as_str().unwrap();
        assert!(message.contains("not JSON"), "{message}");
    }
    assert_eq!(by_id(5)["result"], json!({}));
    let invalid = answers
        .iter()
        .filter(|a| a.get("id").is_none() && a["error"]["code"] == -32600)
        .count();
    assert_eq!(invalid, 2, "{answers:?}");
    drop(stdin);
    let _ = server.wait();
}
