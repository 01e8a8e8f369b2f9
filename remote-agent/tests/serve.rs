//! End-to-end tests of `outpost-agent serve`: the built binary on pipes, driven
//! with the protocol crate's codec, as the controller would.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, BIN, procs_with, spawn_retrying};
use outpost_protocol::limits::MAX_STDIN_LEN;
use outpost_protocol::{
    ClientMessage, ErrorKind, ExecRequest, OutputStream, PROTOCOL_VERSION, Request, Response,
};

fn ex(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: None,
        output_limit: 1 << 20,
        stream: false,
        progress_ms: None,
        hand_over: None,
    }
}

fn whole(out: &outpost_protocol::CapturedOutput) -> Vec<u8> {
    assert_eq!(out.omitted, 0);
    [out.head.as_slice(), out.tail.as_slice()].concat()
}

fn text(out: &outpost_protocol::CapturedOutput) -> String {
    String::from_utf8(whole(out)).unwrap()
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
    assert_eq!(h.capabilities, ["exec", "metrics", "cancel", "gpu-lease"]);
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

    // A request kind from a newer controller: Request { id: 3, body: <variant 40> }.
    let payload = [0u8, 3, 40];
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
fn progress_comes_periodically_and_output_is_still_captured() {
    let mut agent = Agent::start();
    let mut req = ex(
        "echo first; sleep 0.6; printf 'second\\n\\n' >&2; sleep 0.6; printf 'bar 10%%\\rbar 90%%'",
    );
    req.progress_ms = Some(100);
    agent.exec(1, req);
    let mut responses = agent.responses(1, Duration::from_secs(10));
    let Some(Response::ExecDone(r)) = responses.pop() else {
        panic!("no ExecDone");
    };
    assert_eq!(text(&r.stdout), "first\nbar 10%\rbar 90%");
    assert_eq!(text(&r.stderr), "second\n\n");
    let progress: Vec<_> = responses
        .into_iter()
        .map(|resp| match resp {
            Response::ExecProgress(p) => p,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // One per 100 ms for about 1.2 s, the first after one period.
    assert!(progress.len() >= 6, "{progress:?}");
    assert!(progress[0].elapsed_ms >= 100, "{:?}", progress[0]);
    let lines: Vec<&str> = progress.iter().map(|p| p.last_line.as_str()).collect();
    assert!(lines.contains(&"first"), "{lines:?}");
    assert!(lines.contains(&"second"), "{lines:?}");
    let last = progress.last().unwrap();
    assert!(
        last.last_line == "second" || last.last_line == "bar 90%",
        "{last:?}"
    );
    assert!(last.lines <= 3 && last.stdout_bytes <= 23, "{last:?}");
    assert!(
        progress
            .windows(2)
            .all(|w| w[0].elapsed_ms <= w[1].elapsed_ms),
        "{progress:?}"
    );
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
    let m = agent.metrics(2);
    assert!(m.cpu_count > 0);
    assert!(m.mem_total_bytes > 0 && m.mem_available_bytes <= m.mem_total_bytes);
    assert_eq!(m.mem_used_bytes, m.mem_total_bytes - m.mem_available_bytes);
    assert!(m.uptime_s > 0);
}

/// `/proc/meminfo` fields in bytes.
fn meminfo(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn metrics_agree_with_proc() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let m = agent.metrics(1);
    // The first answer is a fresh sample, with CPU use over its first
    // interval already.
    assert_eq!(m.age_ms, 0, "{m:?}");
    assert!(
        m.cpu_usage_pct.is_some_and(|u| (0.0..=100.0).contains(&u)),
        "{m:?}"
    );

    assert_eq!(m.mem_total_bytes, meminfo("MemTotal"));
    let available = meminfo("MemAvailable") as f64;
    let diff = (m.mem_available_bytes as f64 - available).abs();
    assert!(
        diff <= available * 0.05,
        "{} vs {available}",
        m.mem_available_bytes
    );
    assert_eq!(m.swap_total_bytes, meminfo("SwapTotal"));

    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    assert_eq!(m.cpu_count as usize, cpus);

    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap();
    let load: Vec<f64> = loadavg
        .split_whitespace()
        .take(3)
        .map(|v| v.parse().unwrap())
        .collect();
    for (got, want) in [m.load_1m, m.load_5m, m.load_15m].into_iter().zip(load) {
        assert!(
            (got - want).abs() <= 0.5 + want * 0.2,
            "load {got} vs {want}"
        );
    }

    let procs = std::fs::read_dir("/proc")
        .unwrap()
        .filter(|e| {
            e.as_ref().is_ok_and(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
        })
        .count() as f64;
    let got = f64::from(m.process_count);
    assert!(
        (got - procs).abs() <= 20.0 + procs * 0.2,
        "{got} processes vs {procs}"
    );

    let home = std::env::var("HOME").unwrap();
    let disk = m
        .disks
        .iter()
        .find(|d| d.role == "home")
        .expect("home disk");
    assert_eq!(disk.path, home);
    assert!(disk.total_bytes > 0 && disk.available_bytes <= disk.total_bytes);
    let resolved = std::fs::canonicalize(&home).unwrap();
    assert!(resolved.starts_with(&disk.mount_point), "{disk:?}");
    // The working directory is listed only when it is another filesystem.
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &std::path::Path| std::fs::metadata(p).unwrap().dev();
    let cwd = std::env::current_dir().unwrap();
    let cwd_listed = m.disks.iter().any(|d| d.role == "cwd");
    assert_eq!(
        cwd_listed,
        dev(&cwd) != dev(resolved.as_path()),
        "{:?}",
        m.disks
    );

    // The sampler refreshes about once a second; later answers come from it.
    let m = loop {
        let m = agent.metrics(2);
        if m.cpu_usage_pct.is_some() || started.elapsed() > Duration::from_secs(4) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let usage = m.cpu_usage_pct.expect("CPU usage after a sampler tick");
    assert!((0.0..=100.0).contains(&usage), "{usage}");
    assert_eq!(m.per_cpu_pct.len(), m.cpu_count as usize);
    assert!(m.per_cpu_pct.iter().all(|p| (0.0..=100.0).contains(p)));
    assert!(m.age_ms < 2000, "age {} ms", m.age_ms);
    let asked = Instant::now();
    agent.metrics(3);
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
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
    // Nothing happens until the controller speaks: one it started and
    // dropped unused must change nothing.
    std::thread::sleep(Duration::from_millis(300));
    assert!(agents.join("old").exists(), "removed before a request");
    let ping = ClientMessage::Request {
        id: 1,
        body: Request::Ping,
    };
    let frame = outpost_protocol::encode_frame(&ping).unwrap();
    agent.stdin.as_mut().unwrap().write_all(&frame).unwrap();
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

/// Resident KiB of `pid`.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn memory_a_transfer_freed_goes_back_once_the_session_is_quiet() {
    use outpost_protocol::{AgentMessage, DecodeEvent, FrameDecoder, ReadFiles, ReadSpec, decode};
    use std::io::Read;

    let dir = std::env::temp_dir().join(format!("outpost-agent-heap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Content that does not compress, so that pieces are sent as read.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let content: Vec<u8> = (0..6 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(dir.join("big"), &content).unwrap();

    let mut child = spawn_retrying(
        Command::new(BIN)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut decoder = FrameDecoder::after_preamble();
    let mut buf = vec![0u8; 64 * 1024];
    let mut hello_seen = false;
    // Reads until the final responses of `ids`, counting their FileData
    // bytes.
    let mut until_final = |ids: &[u64]| -> usize {
        let mut data = 0;
        let mut left = ids.to_vec();
        loop {
            while let Some(event) = decoder.next_event().unwrap() {
                let DecodeEvent::Frame(payload) = event else {
                    continue;
                };
                if !hello_seen {
                    hello_seen = true;
                    continue;
                }
                let AgentMessage::Response { id: got, body } = decode(&payload).unwrap();
                if !left.contains(&got) {
                    continue;
                }
                if let Response::FileData { data: d, .. } = &body {
                    data += d.len();
                }
                if body.is_final() {
                    left.retain(|&id| id != got);
                    if left.is_empty() {
                        return data;
                    }
                }
            }
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "the agent closed its output");
            decoder.push(&buf[..n]);
        }
    };
    let mut send = |id: u64, body: Request| {
        let frame = outpost_protocol::encode_frame(&ClientMessage::Request { id, body }).unwrap();
        stdin.write_all(&frame).unwrap();
    };
    send(1, Request::Ping);
    until_final(&[1]);
    let before = rss_kib(pid);

    // Two reads of 6 MiB while nobody reads the output: every piece is read
    // and waits in the agent, 12 MiB at once.
    let read = || {
        Request::ReadFiles(ReadFiles {
            root: dir.display().to_string(),
            reads: vec![ReadSpec {
                path: b"big".to_vec(),
                ranges: None,
            }],
        })
    };
    send(2, read());
    send(3, read());
    std::thread::sleep(Duration::from_secs(1));
    let held = rss_kib(pid);
    // Each piece's content carries its encoding's tag byte.
    assert!(until_final(&[2, 3]) > 12 << 20);
    let after = rss_kib(pid);
    // Heartbeats go on meanwhile; they move no content.
    for id in 10..18 {
        send(id, Request::Ping);
        until_final(&[id]);
        std::thread::sleep(Duration::from_millis(500));
    }
    let quiet = rss_kib(pid);
    eprintln!("agent RSS: before {before} KiB, held {held}, after {after}, quiet {quiet}");
    drop(stdin);
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(held > before + 10 * 1024, "{before} → {held} KiB");
    if cfg!(target_env = "gnu") {
        // The pieces' memory was kept for reuse when they were sent...
        assert!(after > before + 8 * 1024, "{before} → {after} KiB");
        // ...and went back once transfers were quiet.
        assert!(
            quiet < before + 4 * 1024,
            "{before} → {after} → {quiet} KiB"
        );
    }
}
