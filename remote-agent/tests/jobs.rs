//! Background jobs end to end: `serve` on pipes, the daemon and the shims it
//! starts, with real faults (SIGKILLed serve, daemon, shim).
//!
//! Every test gets its own home (so its own state dir, daemon and socket) and
//! kills whatever it started when it ends.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Agent, BIN, TempDir, json, kill, procs_with, procs_with_env};
use outpost_protocol::{
    CapturedOutput, ErrorKind, ExecResult, JobCollect, JobEvent, JobInfo, JobLog, JobRead, JobSpec,
    JobState, JobWait, JobWaited, Request, Response, WaitReason, WatchSpec,
};

/// A host of its own: a home, and the agents, daemon and jobs started in it.
struct Host {
    home: TempDir,
    next_id: u64,
}

impl Host {
    fn new(label: &str) -> Host {
        Host {
            home: TempDir::new(label),
            next_id: 0,
        }
    }

    fn agent(&self) -> Agent {
        Agent::start_with(
            Command::new(BIN)
                .env("HOME", self.home.path())
                .env_remove("XDG_RUNTIME_DIR"),
        )
    }

    fn state(&self) -> PathBuf {
        self.home.path().join(".outpost")
    }

    fn job_dir(&self, name: &str) -> PathBuf {
        self.state().join("jobs").join(name)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn call(&mut self, agent: &mut Agent, body: Request) -> Response {
        let id = self.id();
        agent.call(id, body)
    }

    fn start(&mut self, agent: &mut Agent, spec: JobSpec) -> JobInfo {
        job(self.call(agent, Request::JobStart(spec)))
    }

    fn status(&mut self, agent: &mut Agent, name: &str) -> JobInfo {
        job(self.call(
            agent,
            Request::JobStatus {
                name: name.to_string(),
            },
        ))
    }

    fn wait(&mut self, agent: &mut Agent, req: JobWait) -> JobWaited {
        let id = self.id();
        agent.request(id, Request::JobWait(req));
        match agent.last(id, Duration::from_secs(60)) {
            Response::JobWaited(w) => w,
            other => panic!("expected JobWaited, got {other:?}"),
        }
    }

    fn wait_end(&mut self, agent: &mut Agent, name: &str) -> JobWaited {
        let w = self.wait(agent, wait_req(name, 30_000));
        assert_eq!(w.reason, WaitReason::Ended, "{w:?}");
        w
    }

    fn read(&mut self, agent: &mut Agent, req: JobRead) -> JobLog {
        match self.call(agent, Request::JobRead(req)) {
            Response::JobLog(l) => l,
            other => panic!("expected JobLog, got {other:?}"),
        }
    }

    fn collect(&mut self, agent: &mut Agent, name: &str, remove: bool) -> (JobInfo, ExecResult) {
        let req = JobCollect {
            name: name.into(),
            output_limit: 1000,
            remove_if_ended: remove,
            detach: true,
        };
        match self.call(agent, Request::JobCollect(req)) {
            Response::JobCollected { job, result } => (job, result),
            other => panic!("expected JobCollected, got {other:?}"),
        }
    }

    fn events(&mut self, agent: &mut Agent, name: &str) -> Vec<JobEvent> {
        match self.call(
            agent,
            Request::JobEvents {
                name: Some(name.to_string()),
                after_seq: 0,
                limit: 0,
            },
        ) {
            Response::JobEvents(e) => e,
            other => panic!("expected JobEvents, got {other:?}"),
        }
    }

    fn kinds(&mut self, agent: &mut Agent, name: &str) -> Vec<String> {
        self.events(agent, name)
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    /// The event kinds of a job that ended: the daemon records the end event
    /// just after the exit that `wait` reports, so this waits for it.
    fn kinds_after_end(&mut self, agent: &mut Agent, name: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let kinds = self.kinds(agent, name);
            if kinds.len() >= 2 || Instant::now() > deadline {
                return kinds;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn daemon(&self) -> Option<(i32, PathBuf)> {
        let info = json(&self.state().join("run/daemon.json"))?;
        Some((
            info["process"]["pid"].as_i64()? as i32,
            PathBuf::from(info["socket"].as_str()?),
        ))
    }

    /// Pid of the shim, and of the job's main process, from the job's files.
    fn pids(&self, name: &str) -> (i32, i32) {
        let dir = self.job_dir(name);
        let pid = |file: &str| {
            json(&dir.join(file))
                .and_then(|v| v["pid"].as_i64())
                .unwrap_or(0) as i32
        };
        (pid("shim.json"), pid("child.json"))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Everything started here inherited this home: agents, daemons
        // (including one still waiting for the lock), shims and jobs.
        let entry = format!("HOME={}", self.home.path().display());
        for _ in 0..3 {
            for pid in procs_with_env(&entry) {
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some((_, socket)) = self.daemon()
            && let Some(dir) = socket.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn job(r: Response) -> JobInfo {
    match r {
        Response::Job(j) => j,
        other => panic!("expected Job, got {other:?}"),
    }
}

fn bad_request(r: Response) -> String {
    match r {
        Response::Error(e) if e.kind == ErrorKind::BadRequest => e.message,
        other => panic!("expected BadRequest, got {other:?}"),
    }
}

fn spec(command: &str) -> JobSpec {
    JobSpec {
        command: command.into(),
        ..Default::default()
    }
}

fn named(name: &str, command: &str) -> JobSpec {
    JobSpec {
        name: Some(name.into()),
        ..spec(command)
    }
}

fn wait_req(name: &str, timeout_ms: u64) -> JobWait {
    JobWait {
        name: name.into(),
        cursor: 0,
        timeout_ms,
        pattern: None,
        silence_ms: None,
        max_bytes: 1 << 20,
    }
}

fn read_req(name: &str) -> JobRead {
    JobRead {
        name: name.into(),
        offset: None,
        tail_lines: None,
        grep: None,
        max_bytes: 1 << 20,
    }
}

#[test]
fn exit_codes_are_exact_and_default_names_never_collide() {
    let mut host = Host::new("jobs-codes");
    let mut agent = host.agent();
    let first = Instant::now();
    let seven = host.start(&mut agent, spec("exit 7"));
    let cold = first.elapsed();
    let t = Instant::now();
    let killed = host.start(&mut agent, spec("kill -9 $$"));
    let warm = t.elapsed();
    let liar = host.start(&mut agent, spec("echo EXIT_CODE=0; exit 3"));
    eprintln!("job start: {cold:?} with the daemon's start, {warm:?} warm");
    // A job this short may have ended by the time the answer is written.
    assert!(matches!(seven.state, JobState::Running | JobState::Exited));
    assert!(seven.pid.is_some());
    // Started within the same second with default names: all distinct.
    assert!(
        seven.name.starts_with("job-") && seven.name.len() == 24,
        "{}",
        seven.name
    );
    assert!(seven.name != killed.name && killed.name != liar.name && seven.name != liar.name);

    let w = host.wait_end(&mut agent, &seven.name);
    assert_eq!((w.job.exit_code, w.job.signal), (Some(7), None));
    assert_eq!(w.job.state, JobState::Exited);
    let w = host.wait_end(&mut agent, &killed.name);
    assert_eq!((w.job.exit_code, w.job.signal), (None, Some(9)));
    let w = host.wait_end(&mut agent, &liar.name);
    assert_eq!((w.job.exit_code, w.job.signal), (Some(3), None));
    assert_eq!(w.output, b"EXIT_CODE=0\n");
    assert_eq!(w.cursor_after, 12);

    // stdout and stderr interleave in one log, in order.
    let both = host.start(&mut agent, spec("echo a; echo b >&2; echo c"));
    let w = host.wait_end(&mut agent, &both.name);
    assert_eq!(w.output, b"a\nb\nc\n");

    assert_eq!(
        host.kinds_after_end(&mut agent, &seven.name),
        ["started", "failed"]
    );
    assert_eq!(
        host.kinds_after_end(&mut agent, &both.name),
        ["started", "completed"]
    );
    let failed = host.events(&mut agent, &killed.name).pop().unwrap();
    assert_eq!(failed.detail, "killed by signal 9");

    let mut list = |state, limit| match host.call(&mut agent, Request::JobList { state, limit }) {
        Response::Jobs { jobs, omitted } => (jobs, omitted),
        other => panic!("{other:?}"),
    };
    let (listed, omitted) = list(None, 0);
    assert_eq!((listed.len(), omitted), (4, 0));
    // The newest first; a limit leaves the older ones out, and says so.
    let (newest, omitted) = list(None, 1);
    assert_eq!((newest.len(), omitted), (1, 3));
    assert_eq!(newest[0].name, both.name);
    let (running, omitted) = list(Some(JobState::Running), 0);
    assert!(running.is_empty() && omitted == 0);

    // Job files are private.
    use std::os::unix::fs::PermissionsExt;
    let dir = host.job_dir(&seven.name);
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.clone()), 0o700);
    assert_eq!(mode(dir.join("exit.json")), 0o600);
    assert_eq!(mode(dir.join("log")), 0o600);
}

fn text(c: &CapturedOutput) -> String {
    String::from_utf8_lossy(&[c.head.as_slice(), c.tail.as_slice()].concat()).into_owned()
}

/// Jobs an `exec_bash` runs so that it may outlast its call: stdout and
/// stderr apart as an exec gives them, an exact timeout, no trace when the
/// call collects them, a background job like any once it is left running.
#[test]
fn split_jobs_answer_like_an_exec() {
    let mut host = Host::new("jobs-split");
    let mut agent = host.agent();
    let split = |command: &str, timeout_ms| JobSpec {
        split_streams: true,
        timeout_ms,
        ..spec(command)
    };

    let quick = host.start(
        &mut agent,
        split("echo out; echo err >&2; printf 'tail\\n'; exit 3", None),
    );
    let merged = host.wait_end(&mut agent, &quick.name);
    // Both streams reach the merged log too (their order is as read).
    let mut lines: Vec<&[u8]> = merged.output.split(|&b| b == b'\n').collect();
    lines.sort();
    assert_eq!(lines, [&b""[..], b"err", b"out", b"tail"]);
    let (job, r) = host.collect(&mut agent, &quick.name, true);
    assert_eq!(job.state, JobState::Exited);
    assert_eq!((r.exit_code, r.signal, r.timed_out), (Some(3), None, false));
    assert_eq!(
        (text(&r.stdout), text(&r.stderr)),
        ("out\ntail\n".into(), "err\n".into())
    );
    assert!(
        !host.job_dir(&quick.name).exists(),
        "collected jobs are removed"
    );

    let big = host.start(
        &mut agent,
        split(
            "head -c 100000 /dev/zero | tr '\\0' a; echo; echo last",
            None,
        ),
    );
    host.wait_end(&mut agent, &big.name);
    let (_, r) = host.collect(&mut agent, &big.name, true);
    assert_eq!(
        (r.stdout.head.len(), r.stdout.omitted),
        (500, 100_006 - 1000)
    );
    assert!(r.stdout.tail.ends_with(b"a\nlast\n"));

    // The timeout ends the whole tree, background processes too.
    let slow = host.start(
        &mut agent,
        split("echo start; sleep 300 & sleep 301; echo never", Some(1500)),
    );
    let token = json(&host.job_dir(&slow.name).join("spec.json")).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let w = host.wait_end(&mut agent, &slow.name);
    assert!(w.job.timed_out, "{w:?}");
    let (_, r) = host.collect(&mut agent, &slow.name, false);
    assert!(r.timed_out && r.signal == Some(15), "{r:?}");
    assert!(r.duration_ms >= 1500 && r.duration_ms < 10_000, "{r:?}");
    assert_eq!(text(&r.stdout), "start\n");
    assert!(procs_with_env(&format!("OUTPOST_EXEC_TOKEN={token}")).is_empty());
    assert_eq!(
        host.events(&mut agent, &slow.name),
        [],
        "not left running: no events"
    );

    // Left running by its call: output so far, then a background job whose
    // start and end are events.
    let long = host.start(&mut agent, split("echo begun; sleep 1; echo done", None));
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read(host.job_dir(&long.name).join("stdout")).is_ok_and(|o| o == b"begun\n")
    }));
    let (job, r) = host.collect(&mut agent, &long.name, true);
    assert_eq!((job.state, r.exit_code), (JobState::Running, None));
    assert_eq!(text(&r.stdout), "begun\n");
    assert_eq!(
        host.kinds_after_end(&mut agent, &long.name),
        ["started", "completed"]
    );
    let (_, r) = host.collect(&mut agent, &long.name, true);
    assert_eq!(
        (r.exit_code, text(&r.stdout)),
        (Some(0), "begun\ndone\n".into())
    );
    assert!(
        host.job_dir(&long.name).exists(),
        "a background job is kept"
    );

    // A call that gives up on its job without detaching it (it cancels it)
    // leaves no event behind either.
    let dropped = host.start(&mut agent, split("sleep 30", None));
    let req = JobCollect {
        name: dropped.name.clone(),
        output_limit: 0,
        remove_if_ended: true,
        detach: false,
    };
    match host.call(&mut agent, Request::JobCollect(req.clone())) {
        Response::JobCollected { job, .. } => assert_eq!(job.state, JobState::Running),
        other => panic!("{other:?}"),
    }
    host.call(
        &mut agent,
        Request::JobCancel {
            name: dropped.name.clone(),
            grace_ms: 100,
        },
    );
    host.call(&mut agent, Request::JobCollect(req));
    assert!(!host.job_dir(&dropped.name).exists());
    let all = match host.call(
        &mut agent,
        Request::JobEvents {
            name: None,
            after_seq: 0,
            limit: 0,
        },
    ) {
        Response::JobEvents(e) => e,
        other => panic!("{other:?}"),
    };
    assert!(
        all.iter()
            .all(|e| e.job != dropped.name && e.job != quick.name),
        "{all:?}"
    );

    let plain = host.start(&mut agent, spec("true"));
    let req = JobCollect {
        name: plain.name.clone(),
        output_limit: 1000,
        remove_if_ended: true,
        detach: true,
    };
    let message = bad_request(host.call(&mut agent, Request::JobCollect(req)));
    assert!(message.contains("one merged log"), "{message}");
}

#[test]
fn a_job_outlives_serve_and_the_daemon() {
    let mut host = Host::new("jobs-survive");
    let mut agent = host.agent();
    let script = "for i in $(seq 1 40); do echo line $i; sleep 0.05; done; exit 5";
    let a = host.start(&mut agent, spec(script));
    let b = host.start(&mut agent, spec("sleep 2; echo done"));
    let c = host.start(&mut agent, spec("sleep 30.6161"));
    let (daemon, _) = host.daemon().expect("a daemon runs");

    // The connection goes: serve is SIGKILLed mid-job.
    std::thread::sleep(Duration::from_millis(300));
    agent.child.kill().unwrap();
    let _ = agent.child.wait();
    let mut agent = host.agent();
    assert_eq!(host.status(&mut agent, &a.name).state, JobState::Running);

    // The daemon goes too; the jobs do not notice, and a new daemon (started
    // by the next serve, once spoken to) adopts them.
    kill(daemon, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(2), || !alive(daemon)));
    assert_eq!(host.status(&mut agent, &b.name).state, JobState::Running);
    let mut second = host.agent();
    assert_eq!(host.status(&mut second, &b.name).state, JobState::Running);
    assert!(
        wait_until(Duration::from_secs(5), || host
            .daemon()
            .is_some_and(|(pid, _)| pid != daemon && alive(pid))),
        "no new daemon"
    );

    // The new daemon watches the adopted jobs: a shim killed now is noticed.
    let (shim, child) = host.pids(&c.name);
    kill(shim, libc::SIGKILL);
    kill(-child, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(5), || {
            host.kinds(&mut agent, &c.name) == ["started", "interrupted"]
        }),
        "{:?}",
        host.events(&mut agent, &c.name)
    );
    assert_eq!(host.status(&mut agent, &c.name).state, JobState::Lost);

    let w = host.wait_end(&mut agent, &a.name);
    assert_eq!((w.job.exit_code, w.job.signal), (Some(5), None));
    let expected: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(w.output).unwrap(), expected);
    let w = host.wait_end(&mut agent, &b.name);
    assert_eq!(w.job.exit_code, Some(0));
    assert_eq!(w.output, b"done\n");
    assert_eq!(
        host.kinds_after_end(&mut agent, &b.name),
        ["started", "completed"]
    );
    assert_eq!(
        host.kinds_after_end(&mut agent, &a.name),
        ["started", "failed"]
    );
}

#[test]
fn cancel_kills_the_whole_tree() {
    let mut host = Host::new("jobs-cancel");
    let mut agent = host.agent();
    let j = host.start(
        &mut agent,
        spec("setsid sleep 301.4242 & trap '' TERM; sleep 302.4242"),
    );
    // The sleeps themselves, not bash (whose command line holds both
    // numbers before its trap has run).
    assert!(wait_until(Duration::from_secs(5), || {
        procs_with("sleep\u{0}301.4242").len() + procs_with("sleep\u{0}302.4242").len() >= 2
    }));
    let t = Instant::now();
    let c = job(host.call(
        &mut agent,
        Request::JobCancel {
            name: j.name.clone(),
            grace_ms: 300,
        },
    ));
    let took = t.elapsed();
    eprintln!("cancel with a 300 ms grace, TERM ignored: {took:?}");
    assert_eq!(c.state, JobState::Cancelled, "{c:?}");
    assert_eq!((c.exit_code, c.signal), (None, Some(9)));
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(
        procs_with("4242").is_empty(),
        "processes of the job survived"
    );
    assert!(wait_until(Duration::from_secs(2), || {
        host.kinds(&mut agent, &j.name) == ["started", "cancelled"]
    }));
    // Cancelling an ended job changes nothing.
    let again = job(host.call(
        &mut agent,
        Request::JobCancel {
            name: j.name.clone(),
            grace_ms: 0,
        },
    ));
    assert_eq!(again.state, JobState::Cancelled);
}

#[test]
fn wait_returns_on_end_match_silence_and_timeout() {
    let mut host = Host::new("jobs-wait");
    let mut agent = host.agent();

    // The job prints the time it ends; the wait must notice within 200 ms.
    let j = host.start(&mut agent, spec("sleep 0.7; date +%s%N"));
    let w = host.wait_end(&mut agent, &j.name);
    let returned = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let ended: u128 = String::from_utf8(w.output).unwrap().trim().parse().unwrap();
    let lag = Duration::from_nanos((returned.as_nanos() - ended) as u64);
    eprintln!("JobWait returned {lag:?} after the job's last output");
    assert!(lag < Duration::from_millis(200), "{lag:?}");

    let j = host.start(
        &mut agent,
        spec("echo warming up; sleep 0.3; echo 'epoch 3 loss=0.25'; echo next; sleep 30"),
    );
    let mut req = wait_req(&j.name, 20_000);
    req.pattern = Some("loss=[0-9.]+".into());
    let w = host.wait(&mut agent, req);
    assert_eq!(w.reason, WaitReason::Matched, "{w:?}");
    assert_eq!(w.output, b"warming up\nepoch 3 loss=0.25\n");
    assert_eq!(w.cursor_after, 29);
    assert_eq!(w.job.state, JobState::Running);

    let mut req = wait_req(&j.name, 20_000);
    req.cursor = w.cursor_after;
    req.silence_ms = Some(400);
    let t = Instant::now();
    let w = host.wait(&mut agent, req);
    assert_eq!(w.reason, WaitReason::Silent, "{w:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(w.output, b"next\n");

    // Only the tail is returned; `omitted` counts the rest.
    let mut req = wait_req(&j.name, 100);
    req.max_bytes = 5;
    let t = Instant::now();
    let w = host.wait(&mut agent, req);
    assert_eq!(w.reason, WaitReason::TimedOut);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        (w.output.as_slice(), w.omitted, w.cursor_after),
        (&b"next\n"[..], 29, 34)
    );

    // A cancelled wait answers at once.
    let id = host.id();
    agent.request(id, Request::JobWait(wait_req(&j.name, 60_000)));
    std::thread::sleep(Duration::from_millis(100));
    agent.send(&outpost_protocol::ClientMessage::Cancel { id });
    assert!(matches!(
        agent.last(id, Duration::from_secs(2)),
        Response::JobWaited(JobWaited {
            reason: WaitReason::TimedOut,
            ..
        })
    ));
    host.call(
        &mut agent,
        Request::JobCancel {
            name: j.name,
            grace_ms: 100,
        },
    );
}

#[test]
fn a_lost_job_is_reported_and_resumed_once() {
    let mut host = Host::new("jobs-lost");
    let mut agent = host.agent();
    let mut s = named("train", "echo first run; sleep 300.5151");
    s.watch = WatchSpec {
        auto_resume: true,
        resume_command: Some("echo resumed; sleep 300.5151".into()),
        max_resume_attempts: 1,
        resume_delay_s: 0,
        ..Default::default()
    };
    let j = host.start(&mut agent, s);
    assert_eq!(j.name, "train");

    // Kill the shim and the job: no exit record is written.
    let lose = |host: &Host, job_too: bool| {
        let (shim, child) = host.pids("train");
        assert!(alive(shim) && alive(child));
        kill(shim, libc::SIGKILL);
        if job_too {
            kill(-child, libc::SIGKILL);
        }
    };
    // First only the shim: what is left of the run is ended before the
    // loss is recorded, so the two runs never run side by side.
    lose(&host, false);
    assert!(
        wait_until(Duration::from_secs(5), || {
            host.kinds(&mut agent, "train") == ["started", "interrupted", "resume_started"]
        }),
        "{:?}",
        host.events(&mut agent, "train")
    );
    let interrupted = &host.events(&mut agent, "train")[1];
    assert!(
        interrupted
            .detail
            .contains("its remaining process was ended"),
        "{}",
        interrupted.detail
    );
    assert_eq!(procs_with("300.5151").len(), 1);
    let info = host.status(&mut agent, "train");
    assert_eq!((info.state, info.resume_attempts), (JobState::Running, 1));
    assert!(wait_until(Duration::from_secs(2), || {
        std::fs::read(host.job_dir("train").join("log")).unwrap() == b"first run\nresumed\n"
    }));

    // Lost again: reported, but the one allowed attempt is used.
    lose(&host, true);
    assert!(wait_until(Duration::from_secs(5), || {
        host.kinds(&mut agent, "train").len() == 4
    }));
    std::thread::sleep(Duration::from_millis(500));
    let events = host.events(&mut agent, "train");
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["started", "interrupted", "resume_started", "interrupted"]
    );
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(
        events[3].detail.contains("no resume: 1 of 1 attempts used"),
        "{}",
        events[3].detail
    );
    let info = host.status(&mut agent, "train");
    assert_eq!((info.state, info.resume_attempts), (JobState::Lost, 1));
    let left: Vec<String> = procs_with("300.5151")
        .iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            let token = env
                .split(|&b| b == 0)
                .find(|e| e.starts_with(b"OUTPOST_EXEC_TOKEN="))
                .map(|e| String::from_utf8_lossy(e).into_owned());
            format!("{stat} {token:?}")
        })
        .collect();
    assert!(left.is_empty(), "{left:?} {:?}", host.pids("train"));

    // A lost job can still be cancelled, which ends its story.
    let c = job(host.call(
        &mut agent,
        Request::JobCancel {
            name: "train".into(),
            grace_ms: 100,
        },
    ));
    assert_eq!(c.state, JobState::Cancelled);
}

#[test]
fn two_hundred_concurrent_jobs_end_with_their_codes() {
    let mut host = Host::new("jobs-many");
    let mut agent = host.agent();
    let t = Instant::now();
    let ids: Vec<(u64, i32)> = (0..200)
        .map(|i| {
            let id = host.id();
            agent.request(
                id,
                Request::JobStart(named(&format!("many-{i}"), &format!("exit $(({i} % 5))"))),
            );
            (id, i % 5)
        })
        .collect();
    for (id, _) in &ids {
        let j = job(agent.last(*id, Duration::from_secs(30)));
        assert!(
            matches!(j.state, JobState::Running | JobState::Exited),
            "{j:?}"
        );
    }
    eprintln!("200 jobs started in {:?}", t.elapsed());
    for (i, (_, code)) in ids.iter().enumerate() {
        let w = host.wait_end(&mut agent, &format!("many-{i}"));
        assert_eq!(
            (w.job.exit_code, w.job.signal),
            (Some(*code), None),
            "job {i}"
        );
    }
    eprintln!("200 jobs started and ended in {:?}", t.elapsed());
}

#[test]
fn a_gigabyte_log_is_read_in_bounded_memory() {
    let mut host = Host::new("jobs-big");
    let mut agent = host.agent();
    let j = host.start(
        &mut agent,
        spec("head -c 1G /dev/zero; echo; echo second; echo done"),
    );
    let mut req = wait_req(&j.name, 60_000);
    req.pattern = Some("^done$".into());
    let w = host.wait(&mut agent, req);
    assert_eq!(w.reason, WaitReason::Matched);
    assert_eq!(w.cursor_after, (1 << 30) + 13);
    assert_eq!(w.output.len(), 1 << 20);
    assert_eq!(w.omitted, (1 << 30) + 13 - (1 << 20));
    assert!(w.output.ends_with(b"\0\nsecond\ndone\n"));

    let mut req = read_req(&j.name);
    req.tail_lines = Some(2);
    let log = host.read(&mut agent, req);
    assert_eq!(log.data, b"second\ndone\n");
    assert_eq!(log.log_size, (1 << 30) + 13);

    let mut req = read_req(&j.name);
    req.tail_lines = Some(1);
    req.grep = Some("sec".into());
    assert_eq!(host.read(&mut agent, req).data, b"second\n");

    let mut req = read_req(&j.name);
    req.offset = Some((1 << 30) - 2);
    req.max_bytes = 4;
    let page = host.read(&mut agent, req);
    assert_eq!(
        (page.data.as_slice(), page.next_offset),
        (&b"\0\0\ns"[..], (1 << 30) + 2)
    );

    let serve_kib = rss_kib(agent.child.id() as i32);
    let (daemon, _) = host.daemon().unwrap();
    let daemon_kib = rss_kib(daemon);
    eprintln!("after a 1 GiB log: serve VmRSS {serve_kib} KiB, daemon VmRSS {daemon_kib} KiB");
    assert!(serve_kib < 64 * 1024, "{serve_kib}");
    assert!(daemon_kib < 64 * 1024, "{daemon_kib}");
    host.wait_end(&mut agent, &j.name);
}

#[test]
fn bad_input_gets_clear_errors() {
    let mut host = Host::new("jobs-bad");
    let mut agent = host.agent();
    let m = bad_request(host.call(
        &mut agent,
        Request::JobStatus {
            name: "nope".into(),
        },
    ));
    assert_eq!(m, "no job named nope");
    let m = bad_request(host.call(&mut agent, Request::JobWait(wait_req("../x", 10))));
    assert_eq!(m, "no job named ../x");

    host.start(&mut agent, named("dup", "echo hi"));
    let m = bad_request(host.call(&mut agent, Request::JobStart(named("dup", "true"))));
    assert_eq!(m, "a job named dup exists");
    let m = bad_request(host.call(&mut agent, Request::JobStart(named("a/b", "true"))));
    assert!(m.starts_with("invalid job name"), "{m}");
    let m = bad_request(host.call(&mut agent, Request::JobStart(spec("  "))));
    assert_eq!(m, "the command is empty");

    let mut req = wait_req("dup", 1000);
    req.pattern = Some("(".into());
    let m = bad_request(host.call(&mut agent, Request::JobWait(req)));
    assert!(m.starts_with("invalid pattern regex \"(\""), "{m}");
    let mut req = read_req("dup");
    req.grep = Some("[".into());
    let m = bad_request(host.call(&mut agent, Request::JobRead(req)));
    assert!(m.starts_with("invalid grep regex"), "{m}");

    let mut s = spec("true");
    s.cwd = Some("/no/such/dir".into());
    match host.call(&mut agent, Request::JobStart(s)) {
        Response::Error(e) => {
            assert_eq!(e.kind, ErrorKind::SpawnFailed);
            assert_eq!(e.message, "cwd not found: /no/such/dir");
        }
        other => panic!("{other:?}"),
    }
    // Nothing was left behind by the refused starts.
    let names: Vec<String> = std::fs::read_dir(host.state().join("jobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["dup"]);
}

/// CPU ticks (user + system) a process used so far.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
#[ignore = "measurement, takes 12 s"]
fn daemon_cost() {
    let mut host = Host::new("jobs-cost");
    let mut agent = host.agent();
    let j = host.start(&mut agent, spec("sleep 6.5"));
    let (daemon, _) = host.daemon().unwrap();
    let (shim, _) = host.pids(&j.name);
    // SAFETY: sysconf cannot fail for this name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let measure = |what: &str| {
        let before = cpu_ticks(daemon);
        std::thread::sleep(Duration::from_secs(5));
        let used = (cpu_ticks(daemon) - before) as f64 / hz;
        eprintln!(
            "daemon {what}: {:.2}% of a core over 5 s, VmRSS {} KiB",
            used / 5.0 * 100.0,
            rss_kib(daemon)
        );
    };
    std::thread::sleep(Duration::from_millis(500));
    eprintln!("shim VmRSS {} KiB", rss_kib(shim));
    measure("watching one job");
    host.wait_end(&mut agent, &j.name);
    measure("idle");
}

#[test]
fn a_long_job_list_is_cut_to_fit_one_answer() {
    // Every job a host ran stays recorded, and a job can carry up to 1 MiB
    // of watch data: the list must still fit a frame, newest first, and say
    // how many it left out.
    let mut host = Host::new("jobs-long-list");
    let mut agent = host.agent();
    let metadata = |len| Some(format!("\"{}\"", "x".repeat(len)));
    // More text than that is refused, saying what to do.
    let mut huge = named("huge", "true");
    huge.watch.metadata_json = metadata(1_100_000);
    match host.call(&mut agent, Request::JobStart(huge)) {
        Response::Error(e) => {
            assert!(
                e.message.contains("put long scripts or data in a file"),
                "{e:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    let mut names = Vec::new();
    for i in 0..6 {
        let mut s = named(&format!("big-{i}"), "true");
        s.watch.metadata_json = metadata(900_000);
        let started = host.start(&mut agent, s);
        host.wait_end(&mut agent, &started.name);
        names.push(started.name);
    }
    let request = Request::JobList {
        state: None,
        limit: 0,
    };
    match host.call(&mut agent, request) {
        Response::Jobs { jobs, omitted } => {
            assert!(jobs.len() >= 3 && jobs.len() < 6, "{}", jobs.len());
            assert_eq!(jobs.len() as u64 + omitted, 6);
            assert_eq!(jobs[0].name, names[5]);
        }
        other => panic!("{other:?}"),
    }
}
