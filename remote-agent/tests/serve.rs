//! End-to-end tests of `outpost-agent serve`: the built binary on pipes, driven
//! with the protocol crate's codec, as the controller would.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use outpost_protocol::limits::MAX_STDIN_LEN;
use outpost_protocol::{
    AgentMessage, ClientMessage, DecodeEvent, ErrorKind, ExecRequest, ExecResult, FrameDecoder,
    Hello, OutputStream, PROTOCOL_VERSION, Request, Response, decode, encode_frame,
};

const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");

/// A tiny controller: a running agent, its stdin, and responses by request id.
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Option<AgentMessage>>,
    hello: Hello,
    pending: HashMap<u64, Vec<Response>>,
}

impl Agent {
    fn start() -> Agent {
        let mut child = Command::new(BIN)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn agent");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().unwrap();
        let (hello_tx, hello_rx) = channel();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut dec = FrameDecoder::after_preamble();
            let mut buf = vec![0u8; 64 * 1024];
            let mut hello_tx = Some(hello_tx);
            loop {
                let n = stdout.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    let _ = tx.send(None);
                    return;
                }
                dec.push(&buf[..n]);
                while let Some(ev) = dec.next_event().expect("valid stream") {
                    let DecodeEvent::Frame(payload) = ev else {
                        panic!("agent printed noise before the preamble");
                    };
                    match hello_tx.take() {
                        Some(h) => h.send(decode::<Hello>(&payload).unwrap()).unwrap(),
                        None => tx.send(Some(decode(&payload).unwrap())).unwrap(),
                    }
                }
            }
        });
        let hello = hello_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("hello");
        Agent {
            child,
            stdin,
            rx,
            hello,
            pending: HashMap::new(),
        }
    }

    fn send(&mut self, msg: &ClientMessage) {
        let frame = encode_frame(msg).unwrap();
        self.send_raw(&frame);
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, id: u64, body: Request) {
        self.send(&ClientMessage::Request { id, body });
    }

    fn exec(&mut self, id: u64, req: ExecRequest) {
        self.request(id, Request::Exec(req));
    }

    /// All responses of `id` up to and including the final one.
    fn responses(&mut self, id: u64, within: Duration) -> Vec<Response> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(list) = self.pending.get(&id)
                && list.last().is_some_and(Response::is_final)
            {
                return self.pending.remove(&id).unwrap();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Some(AgentMessage::Response { id: rid, body })) => {
                    self.pending.entry(rid).or_default().push(body)
                }
                Ok(None) => panic!("agent closed stdout while waiting for {id}"),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no final response for {id} in {within:?}")
                }
                Err(RecvTimeoutError::Disconnected) => panic!("reader gone"),
            }
        }
    }

    fn last(&mut self, id: u64, within: Duration) -> Response {
        self.responses(id, within).pop().unwrap()
    }

    fn done(&mut self, id: u64, within: Duration) -> ExecResult {
        match self.last(id, within) {
            Response::ExecDone(r) => r,
            other => panic!("expected ExecDone for {id}, got {other:?}"),
        }
    }

    fn run(&mut self, id: u64, req: ExecRequest) -> ExecResult {
        self.exec(id, req);
        self.done(id, Duration::from_secs(10))
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the agent to exit; its exit code.
    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "agent did not exit in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ex(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: None,
        output_limit: 1 << 20,
        stream: false,
    }
}

fn whole(out: &outpost_protocol::CapturedOutput) -> Vec<u8> {
    assert_eq!(out.omitted, 0);
    [out.head.as_slice(), out.tail.as_slice()].concat()
}

fn text(out: &outpost_protocol::CapturedOutput) -> String {
    String::from_utf8(whole(out)).unwrap()
}

/// Live processes whose command line contains `marker`.
fn procs_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .collect()
}

#[test]
fn hello_describes_the_agent() {
    let agent = Agent::start();
    let h = &agent.hello;
    assert_eq!(h.protocol_version, PROTOCOL_VERSION);
    assert_eq!(h.agent_version, env!("CARGO_PKG_VERSION"));
    let expected = blake3::hash(&std::fs::read(BIN).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(h.build_hash, expected);
    assert_eq!(h.os, std::env::consts::OS);
    assert_eq!(h.arch, std::env::consts::ARCH);
    assert!(
        h.libc.starts_with("glibc ") || h.libc == "musl",
        "{}",
        h.libc
    );
    assert_eq!(h.capabilities, ["exec", "metrics", "cancel"]);
    assert_eq!(h.pid, agent.child.id());
}

#[test]
fn exec_reports_output_cwd_env_and_stdin() {
    let mut agent = Agent::start();
    let mut req = ex("echo out; echo err >&2; pwd; echo \"$FOO\"; cat");
    req.cwd = Some("/tmp".into());
    req.env = vec![("FOO".into(), "bar baz".into())];
    req.stdin = Some(b"from stdin".to_vec());
    let r = agent.run(1, req);
    assert_eq!(text(&r.stdout), "out\n/tmp\nbar baz\nfrom stdin");
    assert_eq!(text(&r.stderr), "err\n");
    assert_eq!(
        (r.exit_code, r.signal, r.timed_out, r.cancelled),
        (Some(0), None, false, false)
    );

    // `~` is the home directory, and so is no cwd at all.
    let home = std::env::var("HOME").unwrap();
    let mut req = ex("pwd");
    req.cwd = Some("~".into());
    assert_eq!(text(&agent.run(2, req).stdout).trim_end(), home);
    assert_eq!(text(&agent.run(3, ex("pwd")).stdout).trim_end(), home);

    // Without stdin the command reads /dev/null rather than hanging.
    assert_eq!(text(&agent.run(4, ex("cat; echo done")).stdout), "done\n");
}

#[test]
fn exit_codes_and_signals() {
    let mut agent = Agent::start();
    let r = agent.run(1, ex("exit 7"));
    assert_eq!((r.exit_code, r.signal), (Some(7), None));
    let r = agent.run(2, ex("kill -9 $$"));
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
}

#[test]
fn huge_output_is_capped_head_and_tail() {
    let mut agent = Agent::start();
    let mut req = ex("head -c 5242880 /dev/zero | tr '\\0' a; echo -n end");
    req.output_limit = 20_000;
    let r = agent.run(1, req);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.head.len() + r.stdout.tail.len(), 20_000);
    assert_eq!(r.stdout.omitted, 5_242_883 - 20_000);
    assert!(r.stdout.head.iter().all(|&b| b == b'a'));
    assert!(r.stdout.tail.ends_with(b"aend"));
}

#[test]
fn binary_output_is_passed_through() {
    let mut agent = Agent::start();
    let r = agent.run(
        1,
        ex(r"printf '\xff\x00\xfe\x80ok\x01'; printf '\xc3\x28' >&2"),
    );
    assert_eq!(whole(&r.stdout), b"\xff\x00\xfe\x80ok\x01");
    assert_eq!(whole(&r.stderr), b"\xc3\x28");
}

fn assert_times_out(command: &str, markers: &[&str]) {
    let mut agent = Agent::start();
    let mut req = ex(command);
    req.timeout_ms = Some(2000);
    let started = Instant::now();
    agent.exec(1, req);
    // Make sure the tree is really up before it has to be killed.
    std::thread::sleep(Duration::from_millis(500));
    for m in markers {
        assert!(!procs_with(m).is_empty(), "{m} not running");
    }
    let r = agent.done(1, Duration::from_secs(5));
    let took = started.elapsed();
    assert!(took < Duration::from_millis(3500), "took {took:?}");
    assert!(r.timed_out && !r.cancelled, "{r:?}");
    assert_eq!(r.exit_code, None, "{r:?}");
    assert!(r.signal.is_some(), "{r:?}");
    for m in markers {
        assert_eq!(procs_with(m), Vec::<i32>::new(), "{m} survived");
    }
}

#[test]
fn timeout_kills_a_child_that_ignores_sigterm() {
    assert_times_out("trap '' TERM; sleep 30.123", &["30.123"]);
}

#[test]
fn timeout_kills_a_child_that_left_the_session() {
    assert_times_out("setsid sleep 30.234 & sleep 30.235", &["30.234", "30.235"]);
}

#[test]
fn cancel_kills_the_tree() {
    let mut agent = Agent::start();
    agent.exec(1, ex("sleep 30.345 & sleep 30.346"));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    agent.send(&ClientMessage::Cancel { id: 1 });
    let r = agent.done(1, Duration::from_secs(5));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(r.cancelled && !r.timed_out, "{r:?}");
    assert!(procs_with("30.345").is_empty() && procs_with("30.346").is_empty());
    // Cancelling a finished or unknown request is harmless.
    agent.send(&ClientMessage::Cancel { id: 99 });
    agent.request(2, Request::Ping);
    assert_eq!(agent.last(2, Duration::from_secs(5)), Response::Pong);
}

#[test]
fn many_execs_run_concurrently() {
    let mut agent = Agent::start();
    agent.exec(1000, ex("sleep 3"));
    for i in 0..50 {
        agent.exec(i, ex(&format!("sleep 0.3; echo {i}")));
    }
    let started = Instant::now();
    agent.exec(2000, ex("true"));
    assert_eq!(agent.done(2000, Duration::from_secs(5)).exit_code, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    for i in 0..50 {
        let r = agent.done(i, Duration::from_secs(10));
        assert_eq!((r.exit_code, text(&r.stdout)), (Some(0), format!("{i}\n")));
    }
    assert_eq!(agent.done(1000, Duration::from_secs(10)).exit_code, Some(0));
}

#[test]
fn stdin_eof_ends_the_agent_and_kills_running_commands() {
    let mut agent = Agent::start();
    agent.exec(1, ex("sleep 30.456; true"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!procs_with("30.456").is_empty());
    agent.close_stdin();
    // The cancelled result is still flushed before the agent exits.
    let r = agent.done(1, Duration::from_secs(5));
    assert!(r.cancelled);
    assert_eq!(agent.wait_exit(Duration::from_secs(4)), Some(0));
    assert!(procs_with("30.456").is_empty());
}

#[test]
fn sigterm_ends_the_agent_cleanly() {
    let mut agent = Agent::start();
    agent.exec(1, ex("sleep 30.567; true"));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) };
    assert_eq!(agent.wait_exit(Duration::from_secs(4)), Some(0));
    assert!(procs_with("30.567").is_empty());
}

#[test]
fn missing_cwd_is_a_spawn_failure() {
    let mut agent = Agent::start();
    let mut req = ex("true");
    req.cwd = Some("/definitely/not/here".into());
    agent.exec(1, req);
    match agent.last(1, Duration::from_secs(5)) {
        Response::Error(e) => {
            assert_eq!(e.kind, ErrorKind::SpawnFailed);
            assert_eq!(e.message, "cwd not found: /definitely/not/here");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_requests_are_answered_not_fatal() {
    let mut agent = Agent::start();
    let mut req = ex("true");
    req.stdin = Some(vec![b'x'; MAX_STDIN_LEN + 1]);
    agent.exec(1, req);
    assert!(matches!(
        agent.last(1, Duration::from_secs(5)),
        Response::Error(e) if e.kind == ErrorKind::BadRequest
    ));

    agent.exec(2, ex("sleep 0.5"));
    agent.exec(2, ex("true"));
    // The duplicate is refused at once; the original still finishes.
    assert!(matches!(
        agent.last(2, Duration::from_secs(5)),
        Response::Error(e) if e.kind == ErrorKind::BadRequest
    ));
    assert_eq!(agent.done(2, Duration::from_secs(5)).exit_code, Some(0));

    // A request kind from a newer controller: Request { id: 3, body: <variant 9> }.
    let payload = [0u8, 3, 9];
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&payload);
    agent.send_raw(&frame);
    assert!(matches!(
        agent.last(3, Duration::from_secs(5)),
        Response::Error(e) if e.kind == ErrorKind::Unsupported
    ));

    agent.request(4, Request::Ping);
    assert_eq!(agent.last(4, Duration::from_secs(5)), Response::Pong);
}

#[test]
fn undecodable_frame_ends_the_session_with_an_error() {
    let mut agent = Agent::start();
    agent.send_raw(&[3, 0, 0, 0, 0xff, 0xff, 0xff]);
    let code = agent.wait_exit(Duration::from_secs(4));
    assert!(code.is_some_and(|c| c != 0), "{code:?}");
}

#[test]
fn streaming_sends_chunks_then_an_empty_result() {
    let mut agent = Agent::start();
    let mut req = ex("printf abc; printf def >&2; head -c 200000 /dev/zero");
    req.stream = true;
    agent.exec(1, req);
    let mut responses = agent.responses(1, Duration::from_secs(10));
    let Some(Response::ExecDone(r)) = responses.pop() else {
        panic!("no ExecDone");
    };
    assert_eq!(r.stdout, Default::default());
    assert_eq!(r.stderr, Default::default());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for resp in responses {
        let Response::Output { stream, data } = resp else {
            panic!("unexpected {resp:?}");
        };
        assert!(data.len() <= outpost_protocol::limits::OUTPUT_CHUNK_LEN);
        match stream {
            OutputStream::Stdout => out.extend(data),
            OutputStream::Stderr => err.extend(data),
        }
    }
    assert_eq!(out.len(), 200_003);
    assert!(out.starts_with(b"abc"));
    assert_eq!(err, b"def");
}

#[test]
fn leftover_background_processes_do_not_hold_the_result() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let r = agent.run(1, ex("sleep 30.678 & echo started"));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        (r.exit_code, text(&r.stdout)),
        (Some(0), "started\n".into())
    );
    // Daemons started with `&` are the user's business: still running.
    let left = procs_with("30.678");
    assert_eq!(left.len(), 1);
    // SAFETY: killing the sleep this test started.
    unsafe { libc::kill(left[0], libc::SIGKILL) };
}

#[test]
fn ping_and_metrics() {
    let mut agent = Agent::start();
    agent.request(1, Request::Ping);
    assert_eq!(agent.last(1, Duration::from_secs(5)), Response::Pong);
    agent.request(2, Request::Metrics);
    let Response::Metrics(m) = agent.last(2, Duration::from_secs(5)) else {
        panic!("no metrics");
    };
    assert!(m.cpu_count > 0);
    assert!(m.mem_total_bytes > 0 && m.mem_available_bytes <= m.mem_total_bytes);
    assert_eq!(m.mem_used_bytes, m.mem_total_bytes - m.mem_available_bytes);
    assert!(m.uptime_s > 0);
}

#[test]
fn command_line() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let hash = blake3::hash(&std::fs::read(BIN).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(
        line.trim_end(),
        format!(
            "outpost-agent {} ({})",
            env!("CARGO_PKG_VERSION"),
            &hash[..12]
        )
    );

    let out = Command::new(BIN).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));

    let out = Command::new(BIN).arg("diagnose").output().unwrap();
    assert!(out.status.success());
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.contains("Problems"), "{report}");
}

#[test]
fn a_gigabyte_of_output_keeps_memory_bounded() {
    let mut agent = Agent::start();
    let mut req = ex("head -c 1073741824 /dev/zero");
    req.output_limit = u64::MAX;
    let started = Instant::now();
    let r = agent.run(1, req);
    eprintln!("1 GiB took {:?}", started.elapsed());
    let limit = outpost_protocol::limits::MAX_EXEC_OUTPUT_LIMIT;
    assert_eq!(r.stdout.head.len() + r.stdout.tail.len(), limit as usize);
    assert_eq!(r.stdout.total_len(), 1 << 30);
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id())).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    eprintln!("agent peak RSS {hwm_kib} KiB");
    assert!(hwm_kib < 64 * 1024, "peak RSS {hwm_kib} KiB");
}

/// Spawns `cmd`, retrying while a concurrent fork in another test still holds
/// the freshly copied executable open for writing (ETXTBSY).
fn spawn_retrying(cmd: &mut Command) -> Child {
    for _ in 0..50 {
        match cmd.spawn() {
            Ok(child) => return child,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("spawn: {e}"),
        }
    }
    panic!("executable stayed busy");
}

#[test]
fn serve_removes_unused_agent_versions() {
    let root = std::env::temp_dir().join(format!("outpost-agent-test-{}", std::process::id()));
    let agents = root.join("agents");
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["current", "old", "in-use", ".young-upload", ".old-upload"] {
        std::fs::create_dir_all(agents.join(dir)).unwrap();
    }
    std::fs::write(agents.join("old/outpost-agent"), b"stale").unwrap();
    std::fs::write(agents.join("stray-file"), b"not a version dir").unwrap();
    let old_upload = Command::new("touch")
        .args(["-d", "20 minutes ago"])
        .arg(agents.join(".old-upload"))
        .status()
        .unwrap();
    assert!(old_upload.success());
    let current = agents.join("current/outpost-agent");
    std::fs::copy(BIN, &current).unwrap();
    // Something running from "in-use" keeps it alive.
    let sleeper = agents.join("in-use/sleep");
    std::fs::copy("/bin/sleep", &sleeper).unwrap();
    let mut sleeping = spawn_retrying(Command::new(&sleeper).arg("30"));

    let mut agent = spawn_retrying(
        Command::new(&current)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::null()),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while agents.join("old").exists() || agents.join(".old-upload").exists() {
        assert!(Instant::now() < deadline, "stale versions not removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    for kept in ["current", "in-use", ".young-upload", "stray-file"] {
        assert!(agents.join(kept).exists(), "{kept} was removed");
    }
    drop(agent.stdin.take());
    assert!(agent.wait().unwrap().success());
    let _ = sleeping.kill();
    let _ = sleeping.wait();
    let _ = std::fs::remove_dir_all(&root);
}
