//! The `local` transport: the same agent as a child process over pipes.

// Tests run on a multi-threaded runtime: the harness blocks (sshd, /proc
// scans) while the controller's background tasks must keep running.

mod common;

use common::*;
use outpost::config::Config;
use outpost::fleet::Fleet;
use outpost_e2e::target_bin;

/// A fleet with no configuration at all (an empty home), and that home.
fn local_fleet() -> (Fleet, outpost_e2e::TempDir) {
    let dir = scratch("local-home");
    let home = dir.path().to_string_lossy().to_string();
    let mut config = Config::load_from(&[("HOME", home.as_str())]).unwrap();
    config.agent_bin = Some(target_bin("outpost-agent"));
    (Fleet::new(config), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_gives_an_active_local_sandbox() {
    let (fleet, _home) = local_fleet();
    assert_eq!(fleet.names(), vec!["local"]);
    assert_eq!(fleet.active_name(), "local");
    let session = fleet.get(None).unwrap();
    let r = run(&session, "echo $((6*7))").await.unwrap();
    assert_eq!(stdout(&r), "42\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_exec_behaviour() {
    let (fleet, _home) = local_fleet();
    exec_suite(&fleet.get(None).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_timeouts_kill_the_whole_tree() {
    let (fleet, _home) = local_fleet();
    timeout_suite(&fleet.get(None).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_metrics_agree_with_proc() {
    let (fleet, _home) = local_fleet();
    let m = fleet.get(None).unwrap().metrics().await.unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    assert_eq!(m.cpu_count, cpus);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(m.mem_total_bytes / 1024, total_kb);
}

/// `outpost mcp` reads and writes pipes itself and anything else (here a
/// file as stdout) through tokio's stdio: both serve the protocol, and the
/// end of stdin ends the server cleanly.
#[test]
fn mcp_answers_on_a_pipe_and_into_a_file() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let home = scratch("mcp-stdio-home");
    let out_path = home.path().join("stdout.jsonl");
    let mut server = Command::new(target_bin("outpost"))
        .arg("mcp")
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .current_dir(home.path())
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let messages = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "exec_bash", "arguments": {"command": "echo $((6*7))"}}}),
    ];
    for message in &messages {
        writeln!(stdin, "{message}").unwrap();
    }
    stdin.flush().unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let written = std::fs::read_to_string(&out_path).unwrap();
        let answer = written
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|m| m["id"] == 2);
        if let Some(answer) = answer {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "no answer to the call: {written}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["exit_code"], 0, "{answer}");
    assert_eq!(result["stdout"], "42\n", "{answer}");

    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("outpost mcp did not end with its stdin");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
