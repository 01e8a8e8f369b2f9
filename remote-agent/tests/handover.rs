//! An exec handed over as a job at its `hand_over` time: `serve` on pipes,
//! the supervisor it forks, the shim that supervisor becomes, with real
//! faults (serve SIGKILLed before and after the hand-over).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, BIN, TempDir, kill, procs_with, procs_with_env};
use outpost_protocol::{
    ClientMessage, ExecRequest, ExecResult, HandOver, JobCollect, JobState, JobWait, Request,
    Response, WaitReason,
};

struct Host {
    home: TempDir,
    next_id: u64,
}

impl Host {
    fn new(label: &str) -> Host {
        Host {
            home: TempDir::new(label),
            next_id: 100,
        }
    }

    fn agent(&self) -> Agent {
        Agent::start_with(
            Command::new(BIN)
                .env("HOME", self.home.path())
                .env_remove("XDG_RUNTIME_DIR"),
        )
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Waits for the job to end, then its result with `limit` bytes kept
    /// per stream.
    fn result(&mut self, agent: &mut Agent, job: &str, limit: u64) -> (JobState, ExecResult) {
        let id = self.id();
        agent.request(
            id,
            Request::JobWait(JobWait {
                name: job.into(),
                cursor: 0,
                timeout_ms: 30_000,
                pattern: None,
                silence_ms: None,
                max_bytes: 0,
            }),
        );
        match agent.last(id, Duration::from_secs(40)) {
            Response::JobWaited(w) => assert_eq!(w.reason, WaitReason::Ended, "{w:?}"),
            other => panic!("expected JobWaited, got {other:?}"),
        }
        let id = self.id();
        let collect = JobCollect {
            name: job.into(),
            output_limit: limit,
            remove_if_ended: false,
            detach: false,
        };
        match agent.call(id, Request::JobCollect(collect)) {
            Response::JobCollected { job, result } => (job.state, result),
            other => panic!("expected JobCollected, got {other:?}"),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let entry = format!("HOME={}", self.home.path().display());
        for _ in 0..3 {
            for pid in procs_with_env(&entry) {
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn handing(command: &str, after_ms: u64, job: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: Some(60_000),
        output_limit: 1 << 20,
        stream: false,
        progress_ms: None,
        hand_over: Some(HandOver {
            after_ms,
            job: job.into(),
        }),
    }
}

fn handed_over(agent: &mut Agent, id: u64, req: ExecRequest) -> ExecResult {
    agent.exec(id, req);
    match agent.last(id, Duration::from_secs(20)) {
        Response::ExecHandedOver { so_far, .. } => so_far,
        other => panic!("expected ExecHandedOver, got {other:?}"),
    }
}

fn whole(out: &outpost_protocol::CapturedOutput) -> Vec<u8> {
    [out.head.as_slice(), out.tail.as_slice()].concat()
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

/// Exactly what the command wrote, before and after the hand-over, split
/// by stream, and its exact exit code; with a small limit, head and tail
/// and the count of what lies between, as an inline exec would give them.
#[test]
fn a_handed_over_exec_keeps_every_byte_and_its_exit_code() {
    let mut host = Host::new("handover-bytes");
    let mut agent = host.agent();
    let command = "seq 1 60000; echo e1 >&2; sleep 1.5; seq 60001 120000; echo e2 >&2; exit 7";
    let so_far = handed_over(&mut agent, 1, handing(command, 700, "whole"));
    let first: String = (1..=60000).map(|i| format!("{i}\n")).collect();
    let all: String = (1..=120000).map(|i| format!("{i}\n")).collect();
    assert_eq!(whole(&so_far.stdout), first.as_bytes());
    assert_eq!(whole(&so_far.stderr), b"e1\n");
    assert_eq!(so_far.exit_code, None);
    let (state, r) = host.result(&mut agent, "whole", 1 << 20);
    assert_eq!(
        (state, r.exit_code, r.signal),
        (JobState::Exited, Some(7), None)
    );
    assert_eq!(r.stdout.omitted, 0);
    assert_eq!(whole(&r.stdout), all.as_bytes());
    assert_eq!(whole(&r.stderr), b"e1\ne2\n");
    assert!(r.duration_ms >= 1500, "{}", r.duration_ms);

    // Kept as head and tail: the omitted count covers both sides of the
    // hand-over.
    let mut req = handing(command, 700, "capped");
    req.output_limit = 1000;
    let so_far = handed_over(&mut agent, 2, req);
    assert_eq!(so_far.stdout.total_len(), first.len() as u64);
    let (_, r) = host.result(&mut agent, "capped", 1000);
    assert_eq!(r.stdout.head, &all.as_bytes()[..500]);
    assert_eq!(r.stdout.tail, &all.as_bytes()[all.len() - 500..]);
    assert_eq!(r.stdout.total_len(), all.len() as u64);
    assert_eq!(r.exit_code, Some(7));

    // One that ends first is an ordinary exec: exact status, stdin, env,
    // no job, and no descriptor of serve's or the supervisor's leaks in.
    let mut req = handing("kill -9 $$", 5_000, "never-a");
    agent.exec(3, req.clone());
    let r = agent.done(3, Duration::from_secs(10));
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    req.command = "echo $GREETING; cat; ls /proc/$$/fd | tr '\\n' ' '".into();
    req.env = vec![("GREETING".into(), "hi".into())];
    req.stdin = Some(b"in\n".to_vec());
    agent.exec(4, req);
    let r = agent.done(4, Duration::from_secs(10));
    assert_eq!(String::from_utf8_lossy(&whole(&r.stdout)), "hi\nin\n0 1 2 ");
    let jobs = host.home.path().join(".outpost/jobs");
    assert!(!jobs.join("never-a").exists());

    // Supervisors are serve's children: none is left a zombie for long.
    for id in 10..40 {
        agent.run(id, handing("true", 5_000, "never-b"));
    }
    let serve = agent.child.id() as i32;
    let zombies = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
            let fields: Vec<&str> = after.split_whitespace().collect();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&serve.to_string().as_str())
        })
        .count();
    assert!(zombies <= 1, "{zombies} zombie supervisors");
}

/// Handed over, the job is no longer the connection's: serve SIGKILLed
/// leaves it running, and it ends with its exit code recorded. Before the
/// hand-over, a killed serve takes the command with it.
#[test]
fn a_killed_serve_ends_the_exec_before_its_hand_over_and_not_after() {
    let mut host = Host::new("handover-kill");
    let mut agent = host.agent();
    let marker = format!("304.{}", std::process::id());
    handed_over(
        &mut agent,
        1,
        handing(
            &format!("sleep {marker}; echo after; exit 3"),
            300,
            "outlives",
        ),
    );
    agent.exec(2, handing("sleep 305.7303", 60_000, "dies"));
    assert!(wait_until(Duration::from_secs(5), || !procs_with(
        "sleep\u{0}305.7303"
    )
    .is_empty()));
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(3), || procs_with("sleep\u{0}305.7303")
            .is_empty()),
        "an exec not yet handed over outlived its serve"
    );
    assert!(
        !procs_with(&format!("sleep\u{0}{marker}")).is_empty(),
        "the handed-over job died with serve"
    );
    for pid in procs_with(&format!("sleep\u{0}{marker}")) {
        kill(pid, libc::SIGTERM);
    }
    let mut agent = host.agent();
    let (state, r) = host.result(&mut agent, "outlives", 1000);
    assert_eq!((state, r.exit_code), (JobState::Exited, Some(3)), "{r:?}");
    assert_eq!(whole(&r.stdout), b"after\n");
}

/// The exec's timeout still kills its whole tree after the hand-over, and
/// a cancel before it ends the exec as a cancel always did.
#[test]
fn timeout_and_cancel_hold_across_the_hand_over() {
    let mut host = Host::new("handover-timeout");
    let mut agent = host.agent();
    let needle = format!("sleep 306.{}", std::process::id());
    let mut req = handing(&format!("{needle} & {needle}; wait"), 300, "timed");
    req.timeout_ms = Some(2_000);
    handed_over(&mut agent, 1, req);
    let (state, r) = host.result(&mut agent, "timed", 1000);
    assert_eq!(state, JobState::Exited);
    assert!(r.timed_out, "{r:?}");
    assert!(wait_until(Duration::from_secs(5), || procs_with(
        &needle.replace(' ', "\u{0}")
    )
    .is_empty()));

    agent.exec(2, handing("sleep 307.7303", 30_000, "cancelled"));
    std::thread::sleep(Duration::from_millis(300));
    agent.send(&ClientMessage::Cancel { id: 2 });
    let r = agent.done(2, Duration::from_secs(10));
    assert!(r.cancelled, "{r:?}");
    assert!(wait_until(Duration::from_secs(3), || procs_with(
        "sleep\u{0}307.7303"
    )
    .is_empty()));
    assert!(!host.home.path().join(".outpost/jobs/cancelled").exists());
}
