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

/// `outpost mcp` polls pipes and stream sockets itself (Node-based clients
/// give their servers socket pairs) and reads or writes anything else (here
/// a file as stdout) through tokio's stdio: each serves the protocol, and
/// the end of stdin ends the server cleanly.
#[test]
fn mcp_answers_on_pipes_sockets_and_files() {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::process::Stdio;

    // Socket pairs both ways, as libuv spawns a child.
    let (stdin_ours, stdin_theirs) = UnixStream::pair().unwrap();
    let (stdout_ours, stdout_theirs) = UnixStream::pair().unwrap();
    let received = collect(stdout_ours);
    mcp_conversation(
        Stdio::from(OwnedFd::from(stdin_theirs)),
        Some(Box::new(HalfClose(stdin_ours))),
        Stdio::from(OwnedFd::from(stdout_theirs)),
        &|| received.lock().unwrap().clone(),
    );

    // One socket as both stdin and stdout, as inetd gives it.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let received = collect(ours.try_clone().unwrap());
    mcp_conversation(
        Stdio::from(OwnedFd::from(theirs.try_clone().unwrap())),
        Some(Box::new(HalfClose(ours))),
        Stdio::from(OwnedFd::from(theirs)),
        &|| received.lock().unwrap().clone(),
    );

    // A pipe in, a file out.
    let out = scratch("mcp-stdout-file");
    let out_path = out.path().join("stdout.jsonl");
    mcp_conversation(
        Stdio::piped(),
        None,
        Stdio::from(std::fs::File::create(&out_path).unwrap()),
        &|| std::fs::read_to_string(&out_path).unwrap(),
    );
}

/// Everything read from `socket`, gathered by a thread until end of file.
fn collect(mut socket: std::os::unix::net::UnixStream) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let received = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&received);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = socket.read(&mut buf) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]);
            sink.lock().unwrap().push_str(&text);
        }
    });
    received
}

/// A socket written to and, when dropped, shut for writing: the end of
/// input the other side sees while this side may still read.
struct HalfClose(std::os::unix::net::UnixStream);

impl std::io::Write for HalfClose {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for HalfClose {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Write);
    }
}

/// Starts `outpost mcp` with the given stdio, writes initialize and one
/// exec_bash call (to `stdin`, else to the piped stdin), waits for its
/// answer in `written()`, then closes stdin and expects a clean exit.
fn mcp_conversation(
    stdin: std::process::Stdio,
    writer: Option<Box<dyn std::io::Write>>,
    stdout: std::process::Stdio,
    written: &dyn Fn() -> String,
) {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let home = scratch("mcp-stdio-home");
    let mut server = Command::new(target_bin("outpost"))
        .arg("mcp")
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .current_dir(home.path())
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut writer: Box<dyn std::io::Write> = match writer {
        Some(writer) => writer,
        None => Box::new(server.stdin.take().unwrap()),
    };
    let messages = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "exec_bash", "arguments": {"command": "echo $((6*7))"}}}),
    ];
    for message in &messages {
        writeln!(writer, "{message}").unwrap();
    }
    writer.flush().unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let text = written();
        let answer = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|m| m["id"] == 2);
        if let Some(answer) = answer {
            break answer;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("no answer to the call: {text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["exit_code"], 0, "{answer}");
    assert_eq!(result["stdout"], "42\n", "{answer}");

    drop(writer);
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
