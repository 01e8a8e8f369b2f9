//! What the agent's integration tests share: a tiny controller that drives
//! `outpost-agent serve` over pipes, and helpers to look at processes.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentMessage, ClientMessage, DecodeEvent, ExecRequest, ExecResult, FrameDecoder, Hello,
    HostMetrics, Request, Response, decode, encode_frame,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");

/// A test whose component (bwrap, Slurm, the test account, Landlock) is
/// missing says so and returns; under `CI=true` it fails instead, so that
/// a failed set-up step can never turn into passing tests.
pub fn skip(what: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what}: CI=true, so a missing component fails the test");
    }
    eprintln!("skipped: {what}");
}

/// A tiny controller: a running agent, its stdin, and responses by request id.
pub struct Agent {
    pub child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Option<AgentMessage>>,
    pub hello: Hello,
    pending: HashMap<u64, Vec<Response>>,
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(&mut Command::new(BIN))
    }

    /// Runs `cmd serve` (an agent binary set up by the caller: environment,
    /// working directory).
    pub fn start_with(cmd: &mut Command) -> Agent {
        let cmd = cmd
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn_retrying(cmd);
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

    pub fn send(&mut self, msg: &ClientMessage) {
        let frame = encode_frame(msg).unwrap();
        self.send_raw(&frame);
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    pub fn request(&mut self, id: u64, body: Request) {
        self.send(&ClientMessage::Request { id, body });
    }

    pub fn exec(&mut self, id: u64, req: ExecRequest) {
        self.request(id, Request::Exec(req));
    }

    /// All responses of `id` up to and including the final one.
    pub fn responses(&mut self, id: u64, within: Duration) -> Vec<Response> {
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

    pub fn last(&mut self, id: u64, within: Duration) -> Response {
        self.responses(id, within).pop().unwrap()
    }

    pub fn done(&mut self, id: u64, within: Duration) -> ExecResult {
        match self.last(id, within) {
            Response::ExecDone(r) => r,
            other => panic!("expected ExecDone for {id}, got {other:?}"),
        }
    }

    pub fn run(&mut self, id: u64, req: ExecRequest) -> ExecResult {
        self.exec(id, req);
        self.done(id, Duration::from_secs(10))
    }

    /// Sends `body` as request `id` and returns its final response.
    pub fn call(&mut self, id: u64, body: Request) -> Response {
        self.request(id, body);
        self.last(id, Duration::from_secs(15))
    }

    pub fn metrics(&mut self, id: u64) -> HostMetrics {
        match self.call(id, Request::Metrics) {
            Response::Metrics(m) => m,
            other => panic!("expected Metrics for {id}, got {other:?}"),
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the agent to exit; its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
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

/// Live processes whose command line contains `marker`.
pub fn procs_with(marker: &str) -> Vec<i32> {
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

pub fn json(path: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Signals a process, or a process group when `pid` is negative.
pub fn kill(pid: i32, sig: i32) {
    if pid.abs() > 1 {
        // SAFETY: plain syscall.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Live processes whose environment holds exactly `entry` (`NAME=value`).
pub fn procs_with_env(entry: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// Spawns `cmd`, retrying while a concurrent fork in another test still holds
/// the freshly copied executable open for writing (ETXTBSY).
pub fn spawn_retrying(cmd: &mut Command) -> Child {
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

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("outpost-agent-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The unprivileged test account scripts/setup-test-env makes, when this
/// runs as root and it exists.
pub fn test_account() -> Option<(u32, u32)> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let out = Command::new("id")
        .args(["-u", "outpost-test"])
        .output()
        .ok()?;
    let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    let out = Command::new("id")
        .args(["-g", "outpost-test"])
        .output()
        .ok()?;
    let gid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some((uid, gid))
}
