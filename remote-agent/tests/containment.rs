//! What the agent's processes leave behind when they die, and what another
//! local user can do to them, with real faults: `kill -9` of `serve`, of its
//! guard and of a job's shim, and directories planted by another user.
//!
//! Every test gets its own home (so its own state dir, daemon and socket)
//! and kills whatever it started when it ends.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, BIN, TempDir, procs_with};
use outpost_protocol::{ExecRequest, JobInfo, JobSpec, JobState, Request, Response};

fn exec(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: None,
        output_limit: 10_000,
        stream: false,
        progress_ms: None,
        hand_over: None,
    }
}

fn kill(pid: i32, sig: i32) {
    if pid != 0 {
        // SAFETY: plain syscall.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_all(marker: &str) {
    for pid in procs_with(marker) {
        kill(pid, libc::SIGKILL);
    }
}

/// (pid, ppid) of every live process.
fn parents() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z").then_some((pid, ppid))
        })
        .collect()
}

/// The guard of the `serve` with pid `serve`.
fn guard_of(serve: i32) -> Option<i32> {
    parents()
        .into_iter()
        .filter(|&(_, ppid)| ppid == serve)
        .map(|(pid, _)| pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).nth(1) == Some(b"guard"))
        })
}

/// Kills every process left in `home` (agents, daemons, shims, jobs) when
/// dropped, then removes it.
struct Home(TempDir);

impl Home {
    fn new(label: &str) -> Home {
        Home(TempDir::new(label))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn state(&self) -> PathBuf {
        self.path().join(".outpost")
    }

    fn agent(&self) -> Agent {
        Agent::start_with(
            Command::new(BIN)
                .env("HOME", self.path())
                .env_remove("XDG_RUNTIME_DIR"),
        )
    }

    fn daemon_info(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(self.state().join("run/daemon.json")).ok()?).ok()
    }

    fn daemon_pid(&self) -> i32 {
        self.daemon_info()
            .and_then(|i| i["process"]["pid"].as_i64())
            .unwrap_or(0) as i32
    }

    /// Pid of the shim of job `name`.
    fn shim_pid(&self, name: &str) -> i32 {
        let file = self.state().join("jobs").join(name).join("shim.json");
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(file).unwrap_or_default())
            .ok()
            .and_then(|v| v["pid"].as_i64())
            .unwrap_or(0) as i32
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let entry = format!("HOME={}", self.path().display());
        for _ in 0..3 {
            for pid in procs_with_env(&entry) {
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(socket) = self
            .daemon_info()
            .and_then(|i| i["socket"].as_str().map(PathBuf::from))
            && let Some(dir) = socket.parent()
            && dir.to_string_lossy().starts_with("/tmp/outpost-")
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn procs_with_env(entry: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

fn job(r: Response) -> JobInfo {
    match r {
        Response::Job(j) => j,
        other => panic!("expected Job, got {other:?}"),
    }
}

fn named(name: &str, command: &str) -> JobSpec {
    JobSpec {
        name: Some(name.into()),
        command: command.into(),
        ..Default::default()
    }
}

fn status(agent: &mut Agent, id: u64, name: &str) -> JobInfo {
    job(agent.call(id, Request::JobStatus { name: name.into() }))
}

fn event_kinds_and_details(agent: &mut Agent, id: u64, name: &str) -> Vec<(String, String)> {
    match agent.call(
        id,
        Request::JobEvents {
            name: Some(name.into()),
            after_seq: 0,
            limit: 0,
        },
    ) {
        Response::JobEvents(e) => e.into_iter().map(|e| (e.kind, e.detail)).collect(),
        other => panic!("expected JobEvents, got {other:?}"),
    }
}

#[test]
fn inline_commands_die_with_a_killed_serve() {
    let home = Home::new("guard-kill");
    let mut agent = home.agent();
    // A daemon started by a command that finished: people start daemons
    // this way, and it must outlive serve.
    let r = agent.run(
        1,
        exec("setsid sleep 310.7301 >/dev/null 2>&1 </dev/null &"),
    );
    assert_eq!(r.exit_code, Some(0));
    // Still running when serve dies: a plain command, and a tree that
    // ignores SIGTERM.
    agent.exec(2, exec("sleep 301.7302"));
    agent.exec(
        3,
        exec("trap '' TERM; sleep 302.7302 & sleep 303.7302; wait"),
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            procs_with("sleep\u{0}30").iter().len() >= 3
                && !procs_with("sleep\u{0}301.7302").is_empty()
                && !procs_with("sleep\u{0}302.7302").is_empty()
                && !procs_with("sleep\u{0}303.7302").is_empty()
        }),
        "the commands did not start"
    );
    let guard = guard_of(agent.child.id() as i32);
    // The guard holds nothing of the connection.
    let guard_stdout = guard.and_then(|g| std::fs::read_link(format!("/proc/{g}/fd/1")).ok());

    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let killed = Instant::now();
    let gone = wait_until(Duration::from_millis(1500), || {
        procs_with("7302").is_empty()
    });
    let took = killed.elapsed();
    let left = procs_with("7302");
    kill_all("7302");
    assert!(gone, "left running 1.5 s after serve was killed: {left:?}");
    eprintln!("the trees of running commands were gone {took:?} after serve's SIGKILL");
    assert!(
        !procs_with("sleep\u{0}310.7301").is_empty(),
        "the finished command's daemon was killed"
    );
    kill_all("310.7301");
    let guard = guard.expect("serve has a guard");
    assert_eq!(guard_stdout.as_deref(), Some(Path::new("/dev/null")));
    // The guard's work is done.
    assert!(wait_until(Duration::from_secs(2), || {
        !Path::new(&format!("/proc/{guard}")).exists()
            || std::fs::read_to_string(format!("/proc/{guard}/stat"))
                .is_ok_and(|s| s.contains(") Z"))
    }));
}

#[test]
fn a_killed_guard_is_replaced_and_told_everything() {
    let home = Home::new("guard-respawn");
    let mut agent = home.agent();
    let serve = agent.child.id() as i32;
    agent.exec(1, exec("sleep 304.7303"));
    assert!(wait_until(Duration::from_secs(5), || !procs_with(
        "sleep\u{0}304.7303"
    )
    .is_empty()));
    let first = guard_of(serve).expect("serve has a guard");
    kill(first, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(3), || guard_of(serve)
            .is_some_and(|g| g != first)),
        "no new guard"
    );
    // Commands keep working, and are supervised whether they started
    // before the new guard or after it.
    let r = agent.run(2, exec("echo fine"));
    assert_eq!(r.stdout.head, b"fine\n");
    agent.exec(3, exec("sleep 305.7303"));
    assert!(wait_until(Duration::from_secs(5), || !procs_with(
        "sleep\u{0}305.7303"
    )
    .is_empty()));

    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let gone = wait_until(Duration::from_millis(1500), || {
        procs_with("7303").is_empty()
    });
    let left = procs_with("7303");
    kill_all("7303");
    assert!(gone, "left running after serve was killed: {left:?}");
}

#[test]
fn a_job_whose_shim_is_killed_is_ended_never_lost_while_running() {
    let home = Home::new("shim-kill");
    let mut agent = home.agent();
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    // A tree that ignores SIGTERM, so it takes a SIGKILL to end.
    let j = job(agent.call(
        next(),
        Request::JobStart(named(
            "orphan",
            "trap '' TERM; sleep 306.7304 & sleep 307.7304; wait",
        )),
    ));
    assert_eq!(j.state, JobState::Running);
    assert!(wait_until(Duration::from_secs(5), || procs_with(
        "sleep\u{0}30"
    )
    .iter()
    .filter(|p| procs_with("7304").contains(p))
    .count()
        >= 2));

    kill(home.shim_pid("orphan"), libc::SIGKILL);
    // Whenever the job is reported lost, nothing of it runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let info = status(&mut agent, next(), "orphan");
        if info.state != JobState::Running {
            let left = procs_with("7304");
            assert!(
                left.is_empty(),
                "reported {:?} while {left:?} run",
                info.state
            );
            break info.state;
        }
        assert!(
            Instant::now() < deadline,
            "the job's processes were not ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(state, JobState::Lost);
    assert!(wait_until(
        Duration::from_secs(2),
        || event_kinds_and_details(&mut agent, next(), "orphan").len() == 2
    ));
    let events = event_kinds_and_details(&mut agent, next(), "orphan");
    assert_eq!(events[1].0, "interrupted");
    assert!(
        events[1].1.contains("died without recording an exit")
            && events[1].1.contains("remaining processes were ended"),
        "{}",
        events[1].1
    );
}

#[test]
fn a_job_orphaned_while_no_daemon_runs_is_ended_by_the_next() {
    let home = Home::new("shim-daemon-kill");
    let mut agent = home.agent();
    job(agent.call(1, Request::JobStart(named("orphan", "sleep 308.7305"))));
    let daemon = home.daemon_pid();
    assert!(daemon > 0);
    kill(daemon, libc::SIGKILL);
    kill(home.shim_pid("orphan"), libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(100));
    // Nobody supervises the job now, but it runs, and says so.
    assert!(!procs_with("sleep\u{0}308.7305").is_empty());
    let info = status(&mut agent, 2, "orphan");
    assert_eq!(info.state, JobState::Running);
    // That request also had a new daemon started, which ends the job.
    let mut id = 3;
    assert!(
        wait_until(Duration::from_secs(8), || {
            id += 1;
            let info = status(&mut agent, id, "orphan");
            if info.state == JobState::Running {
                return false;
            }
            assert!(procs_with("308.7305").is_empty());
            info.state == JobState::Lost
        }),
        "not ended"
    );
    assert_ne!(home.daemon_pid(), daemon);
}

/// The directory the daemon of the state dir `state` used before: a name
/// anyone could predict, in `/tmp`.
fn old_socket_dir(state: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let hash = blake3::hash(state.as_os_str().as_bytes()).to_hex();
    PathBuf::from(format!("/tmp/outpost-{uid}-{}", &hash[..8]))
}

/// (uid, gid) of the account that plays the other local user.
fn other_user() -> Option<(u32, u32)> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 4 && f[0] == "outpost-test")
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// A job starts and ends with exit code 0 through `agent`.
fn a_job_runs(agent: &mut Agent, name: &str) {
    let j = job(agent.call(100, Request::JobStart(named(name, "echo ran"))));
    assert_eq!(j.name, name);
    assert!(wait_until(Duration::from_secs(5), || {
        let info = status(agent, 101, name);
        info.state == JobState::Exited && info.exit_code == Some(0)
    }));
}

#[test]
fn a_squatted_socket_directory_blocks_nothing() {
    let home = Home::new("socket-squat");
    let old = old_socket_dir(&home.state());
    // Another user got there first (as the test user when there is one).
    let _ = std::fs::remove_dir_all(&old);
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some((uid, gid)) = other_user() {
        std::os::unix::fs::chown(&old, Some(uid), Some(gid)).unwrap();
    }
    let mut agent = home.agent();
    a_job_runs(&mut agent, "despite-squatter");
    let socket = PathBuf::from(home.daemon_info().unwrap()["socket"].as_str().unwrap());
    assert_eq!(socket, home.state().join("run/daemon.sock"));
    let dir = std::fs::symlink_metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(dir.mode() & 0o777, 0o700);
    let _ = std::fs::remove_dir_all(&old);

    // A runtime dir others may write to is not trusted with the socket.
    let open_runtime = home.path().join("runtime-open");
    std::fs::create_dir(&open_runtime).unwrap();
    std::fs::set_permissions(&open_runtime, std::fs::Permissions::from_mode(0o777)).unwrap();
    let open_home = Home::new("socket-open-runtime");
    let mut agent = Agent::start_with(
        Command::new(BIN)
            .env("HOME", open_home.path())
            .env("XDG_RUNTIME_DIR", &open_runtime),
    );
    a_job_runs(&mut agent, "not-in-open-runtime");
    let socket = PathBuf::from(open_home.daemon_info().unwrap()["socket"].as_str().unwrap());
    assert_eq!(socket, open_home.state().join("run/daemon.sock"));

    // A private runtime dir is used when there is one.
    let runtime = home.path().join("runtime-private");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let other_home = Home::new("socket-runtime");
    let mut agent = Agent::start_with(
        Command::new(BIN)
            .env("HOME", other_home.path())
            .env("XDG_RUNTIME_DIR", &runtime),
    );
    a_job_runs(&mut agent, "in-runtime-dir");
    let socket = PathBuf::from(
        other_home.daemon_info().unwrap()["socket"]
            .as_str()
            .unwrap(),
    );
    assert!(socket.starts_with(&runtime), "{}", socket.display());
}

#[test]
fn a_deep_state_dir_gets_a_short_private_socket_directory() {
    let home = Home::new("socket-deep");
    let deep = home.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&deep).unwrap();
    let agent_in = |deep: &Path| {
        Agent::start_with(
            Command::new(BIN)
                .env("HOME", deep)
                .env_remove("XDG_RUNTIME_DIR"),
        )
    };
    let mut agent = agent_in(&deep);
    a_job_runs(&mut agent, "deep");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(deep.join(".outpost/run/daemon.json")).unwrap())
            .unwrap();
    let socket = PathBuf::from(info["socket"].as_str().unwrap());
    let dir = socket.parent().unwrap().to_path_buf();
    assert!(socket.as_os_str().len() < 108, "{}", socket.display());
    assert!(
        dir.to_string_lossy().starts_with("/tmp/outpost-"),
        "{}",
        dir.display()
    );
    assert_ne!(dir, old_socket_dir(&deep.join(".outpost")));
    let recorded = std::fs::read(deep.join(".outpost/run/socket-dir")).unwrap();
    assert_eq!(recorded, dir.as_os_str().as_encoded_bytes());
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    // SAFETY: getuid cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });
    assert_eq!(meta.mode() & 0o777, 0o700);

    // Another serve finds the same daemon there.
    let daemon = info["process"]["pid"].as_i64().unwrap();
    let mut second = agent_in(&deep);
    a_job_runs(&mut second, "deep-again");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(deep.join(".outpost/run/daemon.json")).unwrap())
            .unwrap();
    assert_eq!(info["process"]["pid"].as_i64().unwrap(), daemon);
    drop(home);
    let _ = std::fs::remove_dir_all(&dir);
}
