//! Sandboxes end to end: `serve` on pipes, the daemon, the keepers it
//! starts, real bubblewrap, Landlock, cgroups, and real faults (SIGKILLed
//! daemon and keeper). Every test gets its own home and so its own state
//! dir, daemon and sandboxes.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, BIN, TempDir, json, kill, procs_with_env, skip, test_account};
use outpost_protocol::{
    ErrorKind, ExecRequest, ExecResult, Isolation, JobSpec, ReadFiles, ReadSpec, Request, Response,
    SandboxInfo, SandboxLimits, SandboxSpec, SandboxState, ScanRequest,
};

struct Host {
    home: TempDir,
    agent: Agent,
    next_id: u64,
}

impl Host {
    fn new(label: &str) -> Host {
        Host::new_as(label, None)
    }

    /// A host whose agent runs as a regular user, as isolation needs: the
    /// test account when this runs as root. None (the test is skipped)
    /// when there is no such account.
    fn unprivileged(label: &str) -> Option<Host> {
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } != 0 {
            return Some(Host::new(label));
        }
        match test_account() {
            Some(user) => Some(Host::new_as(label, Some(user))),
            None => {
                skip("needs the outpost-test account (scripts/setup-test-env)");
                None
            }
        }
    }

    /// With `user` (uid, gid), the agent runs as that user: no cgroup of
    /// its own, bwrap unprivileged.
    fn new_as(label: &str, user: Option<(u32, u32)>) -> Host {
        let home = TempDir::new(label);
        // A secret the sandbox must not see.
        std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
        std::fs::write(home.path().join(".ssh/id_ed25519"), "SECRET KEY\n").unwrap();
        let mut cmd = Command::new(BIN);
        cmd.env("HOME", home.path()).env_remove("XDG_RUNTIME_DIR");
        if let Some((uid, gid)) = user {
            for path in [
                home.path(),
                &home.path().join(".ssh"),
                &home.path().join(".ssh/id_ed25519"),
            ] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        let agent = Agent::start_with(&mut cmd);
        Host {
            home,
            agent,
            next_id: 0,
        }
    }

    fn call(&mut self, body: Request) -> Response {
        self.next_id += 1;
        let id = self.next_id;
        self.agent.request(id, body);
        self.agent.last(id, Duration::from_secs(60))
    }

    fn create(&mut self, spec: SandboxSpec) -> SandboxInfo {
        match self.call(Request::SandboxCreate(spec)) {
            Response::Sandbox(info) => info,
            other => panic!("expected Sandbox, got {other:?}"),
        }
    }

    fn create_err(&mut self, spec: SandboxSpec) -> String {
        match self.call(Request::SandboxCreate(spec)) {
            Response::Error(e) => e.message,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    fn inside(&mut self, id: &str, request: Request) -> Response {
        self.call(Request::InSandbox {
            id: id.into(),
            request: Box::new(request),
        })
    }

    fn sh(&mut self, id: &str, command: &str) -> ExecResult {
        match self.inside(id, Request::Exec(exec(command))) {
            Response::ExecDone(r) => r,
            other => panic!("expected ExecDone, got {other:?}"),
        }
    }

    fn status(&mut self, id: &str) -> SandboxInfo {
        match self.call(Request::SandboxList) {
            Response::Sandboxes(all) => all
                .into_iter()
                .find(|s| s.id == id)
                .unwrap_or_else(|| panic!("{id} not listed")),
            other => panic!("expected Sandboxes, got {other:?}"),
        }
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.home.path().join(".outpost/sandboxes")
    }

    fn daemon_pid(&self) -> Option<i32> {
        let info = json(&self.home.path().join(".outpost/run/daemon.json"))?;
        Some(info["process"]["pid"].as_i64()? as i32)
    }

    fn keeper_pid(&self, id: &str) -> i32 {
        json(&self.sandboxes_dir().join(id).join("meta/keeper.json")).unwrap()["pid"]
            .as_i64()
            .unwrap() as i32
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Keepers and daemons inherited this home; commands carry their
        // sandbox's marker.
        let home = format!("HOME={}", self.home.path().display());
        let ids: Vec<String> = std::fs::read_dir(self.sandboxes_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        for _ in 0..3 {
            let mut pids = procs_with_env(&home);
            for id in &ids {
                pids.extend(procs_with_env(&format!("OUTPOST_SANDBOX={id}")));
            }
            for pid in pids {
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn exec(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: Some(30_000),
        output_limit: 64 * 1024,
        stream: false,
        progress_ms: None,
        hand_over: None,
    }
}

fn spec(isolation: Isolation, network: bool) -> SandboxSpec {
    SandboxSpec {
        ttl_ms: 600_000,
        isolation,
        network,
        ..SandboxSpec::default()
    }
}

fn out(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout.head).into_owned()
}

fn err(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stderr.head).into_owned()
}

fn bwrap_usable() -> bool {
    Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-user",
            "--unshare-pid",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// A listener outside every sandbox, accepting in the background.
fn listener() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"hello\n");
        }
    });
    port
}

fn connect(port: u16) -> String {
    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED")
}

/// What every rung must contain: the secret, writes outside, the network.
fn contained(host: &mut Host, info: &SandboxInfo) {
    let id = info.id.clone();
    let secret = host.home.path().join(".ssh/id_ed25519");
    let r = host.sh(&id, &format!("cat {}", secret.display()));
    assert_ne!(r.exit_code, Some(0), "secret readable: {}", out(&r));
    assert!(!out(&r).contains("SECRET"));

    // Under bwrap the home is an empty tmpfs: a write there lands nowhere.
    let outside = host.home.path().join("planted");
    host.sh(&id, &format!("echo x > {}", outside.display()));
    assert!(!outside.exists(), "wrote outside its dirs");
    let r = host.sh(&id, "echo x > /usr/outpost-planted");
    assert_ne!(r.exit_code, Some(0));
    assert!(!Path::new("/usr/outpost-planted").exists());

    let port = listener();
    // The host itself can connect.
    let r = Command::new("bash")
        .arg("-c")
        .arg(connect(port))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&r.stdout).contains("CONNECTED"));
    let r = host.sh(&id, &connect(port));
    assert_ne!(r.exit_code, Some(0), "connected from inside: {}", out(&r));

    // Inside, everything works in its own dirs.
    let r = host.sh(&id, "pwd; echo data > made; cat made; echo $HOME");
    assert_eq!(r.exit_code, Some(0), "{}", err(&r));
    let lines: Vec<String> = out(&r).lines().map(String::from).collect();
    assert_eq!(lines[0], info.work_dir);
    assert_eq!(lines[1], "data");
    assert!(lines[2].ends_with(&format!("{id}/home")), "{lines:?}");
    let made = Path::new(&info.work_dir).join("made");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "data\n");
}

#[test]
fn bwrap_sandbox_contains_and_works() {
    if !bwrap_usable() {
        skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    let Some(host) = Host::unprivileged("sbx-bwrap") else {
        return;
    };
    bwrap_contains_and_works(host);
}

/// A root login reaches bwrap too: the sandbox runs as a uid of its own,
/// owner of its dirs and of what file requests write there, and nothing of
/// root's is its.
#[test]
fn a_root_agents_bwrap_sandbox_runs_as_a_uid_of_its_own() {
    if !bwrap_usable() {
        skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        skip("needs root");
        return;
    }
    let mut host = Host::new("sbx-root");
    let info = host.create(spec(Isolation::Auto, false));
    assert_eq!(info.isolation, Isolation::Bwrap, "{info:?}");
    let id = info.id.clone();
    let r = host.sh(&id, "id -u; id -g; id -G");
    let ids: Vec<u32> = out(&r)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let uid = ids[0];
    assert!((1_900_000_000..=1_900_065_535).contains(&uid), "{ids:?}");
    assert_eq!(ids, vec![uid, uid, uid], "no group of root's kept");
    // A root-only file the sandbox can see the path of stays unread.
    let secret = PathBuf::from(format!("/var/tmp/outpost-root-only-{}", std::process::id()));
    std::fs::write(&secret, "ROOTS").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = host.sh(&id, &format!("cat {}", secret.display()));
    let _ = std::fs::remove_file(&secret);
    assert!(
        !out(&r).contains("ROOTS") && r.exit_code != Some(0),
        "{r:?}"
    );
    // What a file request writes is the sandbox's: its commands can change it.
    let content = b"from a file request\n";
    let put = Request::PutFiles(outpost_protocol::PutFiles {
        root: "sub".into(),
        create_parents: true,
        files: vec![outpost_protocol::FilePut {
            path: b"dir/put.txt".to_vec(),
            mode: 0o644,
            mtime_ns: 0,
            size: content.len() as u64,
            hash: *blake3::hash(content).as_bytes(),
            expect: outpost_protocol::Expect::Any,
            content: outpost_protocol::FileContent::Inline(outpost_treesync::codec::compress(
                content,
            )),
        }],
    });
    let applied = host.inside(&id, put);
    assert!(
        matches!(applied, Response::Applied(ref a) if a.problems.is_empty()),
        "{applied:?}"
    );
    use std::os::unix::fs::MetadataExt;
    let work = Path::new(&info.work_dir);
    for made in ["sub", "sub/dir", "sub/dir/put.txt"] {
        assert_eq!(
            std::fs::metadata(work.join(made)).unwrap().uid(),
            uid,
            "{made}"
        );
    }
    let r = host.sh(&id, "echo more >> sub/dir/put.txt && cat sub/dir/put.txt");
    assert_eq!(out(&r), "from a file request\nmore\n", "{r:?}");
    // And what only root may read inside it is refused to a file request.
    std::fs::write(work.join("roots.txt"), "ROOTS").unwrap();
    std::fs::set_permissions(
        work.join("roots.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let read = Request::ReadFiles(ReadFiles {
        root: ".".into(),
        reads: vec![ReadSpec {
            path: b"roots.txt".to_vec(),
            ranges: None,
        }],
    });
    match host.inside(&id, read) {
        Response::ReadDone { problems } => {
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].message.contains("denied"), "{problems:?}");
        }
        other => panic!("read root's file: {other:?}"),
    }
    // Every process of it runs as that uid, a job's too.
    let Response::Job(_) = host.inside(
        &id,
        Request::JobStart(JobSpec {
            command: "id -u > job-uid".into(),
            ..JobSpec::default()
        }),
    ) else {
        panic!("job did not start");
    };
    let job_uid = work.join("job-uid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&job_uid).map_or(true, |t| t.is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&job_uid).unwrap().trim(),
        uid.to_string()
    );
    // An exec handed over as a job at its budget goes on inside, as that
    // uid, and its job records every byte and its exit code.
    let handing = ExecRequest {
        timeout_ms: Some(30_000),
        hand_over: Some(outpost_protocol::HandOver {
            after_ms: 300,
            job: "handed".into(),
        }),
        ..exec("echo a; sleep 1; id -u; exit 4")
    };
    match host.inside(&id, Request::Exec(handing)) {
        Response::ExecHandedOver { job, so_far } => {
            assert_eq!((job.as_str(), out(&so_far).as_str()), ("handed", "a\n"));
        }
        other => panic!("expected ExecHandedOver, got {other:?}"),
    }
    let wait = outpost_protocol::JobWait {
        name: "handed".into(),
        cursor: 0,
        timeout_ms: 10_000,
        pattern: None,
        silence_ms: None,
        max_bytes: 0,
    };
    host.inside(&id, Request::JobWait(wait));
    let collect = outpost_protocol::JobCollect {
        name: "handed".into(),
        output_limit: 1000,
        remove_if_ended: false,
        detach: false,
    };
    match host.inside(&id, Request::JobCollect(collect)) {
        Response::JobCollected { result, .. } => {
            assert_eq!(result.exit_code, Some(4), "{result:?}");
            assert_eq!(out(&result), format!("a\n{uid}\n"));
        }
        other => panic!("expected JobCollected, got {other:?}"),
    }
    // Another sandbox gets another uid: from the host config's range when
    // it names one; a range that is no range is refused.
    let other = host.create(SandboxSpec {
        sandbox_uids: Some((2_000_000_000, 2_000_000_009)),
        ..spec(Isolation::Bwrap, false)
    });
    let r = host.sh(&other.id, "id -u");
    assert_eq!(out(&r).trim(), "2000000000", "{r:?}");
    host.call(Request::SandboxDelete { id: other.id });
    let said = host.create_err(SandboxSpec {
        sandbox_uids: Some((5, 3)),
        ..spec(Isolation::Bwrap, false)
    });
    assert!(said.contains("FIRST-LAST"), "{said}");
    host.call(Request::SandboxDelete { id: id.clone() });
    bwrap_contains_and_works(Host::new("sbx-root-all"));
}

/// Landlock for a root login, where the agent's state dir is one other
/// uids may pass (0711 all the way): its commands run as a uid of their
/// own, the home stays unread, and what they write is theirs.
#[test]
fn a_root_agents_landlock_sandbox_runs_as_a_uid_of_its_own() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        skip("needs root");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut host = Host::new("sbx-root-ll");
    let state = host.home.path().join(".outpost");
    std::fs::create_dir_all(&state).unwrap();
    for dir in [host.home.path(), state.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let info = match host.call(Request::SandboxCreate(spec(Isolation::Landlock, true))) {
        Response::Sandbox(info) => info,
        Response::Error(e) if e.message.contains("Landlock") && !e.message.contains("as root") => {
            skip(&format!("no Landlock here: {}", e.message));
            return;
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(info.isolation, Isolation::Landlock);
    let r = host.sh(&info.id, "id -u; echo mine > made");
    assert_eq!(r.exit_code, Some(0), "{}", err(&r));
    let uid: u32 = out(&r).trim().parse().unwrap();
    assert!(uid >= 1_900_000_000, "{uid}");
    let made = Path::new(&info.work_dir).join("made");
    assert_eq!(std::fs::metadata(&made).unwrap().uid(), uid);
    let secret = host.home.path().join(".ssh/id_ed25519");
    let r = host.sh(&info.id, &format!("cat {}", secret.display()));
    assert!(
        !out(&r).contains("SECRET") && r.exit_code != Some(0),
        "{r:?}"
    );
    let r = host.sh(&info.id, "cat /etc/shadow");
    assert_ne!(r.exit_code, Some(0), "{r:?}");
}

fn bwrap_contains_and_works(mut host: Host) {
    let info = host.create(spec(Isolation::Auto, false));
    assert_eq!(info.isolation, Isolation::Bwrap, "{info:?}");
    assert_eq!(info.state, SandboxState::Running);
    assert!(info.id.starts_with("sbx-"));
    contained(&mut host, &info);
    let id = info.id.clone();

    // Own pid namespace: only its own processes are visible.
    let r = host.sh(&id, "ls /proc | grep -c '^[0-9]'");
    let visible: u32 = out(&r).trim().parse().unwrap();
    assert!(visible < 10, "sees {visible} processes");
    // /tmp is its own, and the agent's state is hidden.
    let r = host.sh(&id, "echo t > /tmp/t && ls -A ~/../../ | head");
    assert_eq!(r.exit_code, Some(0), "{}", err(&r));
    assert!(Path::new(&host.sandboxes_dir().join(&id).join("tmp/t")).exists());
    let other = host.create(spec(Isolation::None, true));
    let r = host.sh(&id, &format!("ls {}", host.sandboxes_dir().display()));
    assert_eq!(out(&r).trim(), id, "other sandboxes visible: {}", out(&r));
    host.call(Request::SandboxDelete { id: other.id });
    // Privileges are gone: the home's tmpfs cannot be lifted.
    let home = host.home.path().display().to_string();
    let r = host.sh(
        &id,
        &format!("umount {home} 2>&1; cat {home}/.ssh/id_ed25519"),
    );
    assert!(!out(&r).contains("SECRET"), "{}", out(&r));

    // A background job runs inside too.
    let spec = JobSpec {
        command: "echo job-ran > from-job; hostname".into(),
        ..JobSpec::default()
    };
    let Response::Job(job) = host.inside(&id, Request::JobStart(spec)) else {
        panic!("job did not start");
    };
    let made = Path::new(&info.work_dir).join("from-job");
    // The shell makes the file before `echo` writes to it: wait for both.
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = || std::fs::read_to_string(&made).unwrap_or_default();
    while read() != "job-ran\n" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read(), "job-ran\n");
    let log = std::fs::read_to_string(&job.log_file).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut log = log;
    while !log.contains("sandbox") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        log = std::fs::read_to_string(&job.log_file).unwrap_or_default();
    }
    assert!(log.contains("sandbox"), "job's hostname: {log:?}");

    files_are_confined(&mut host, &info);
    environment_reaches_only_the_command(&mut host, &id);

    // Delete: processes end, files go.
    host.sh(&id, "sleep 1000 >/dev/null 2>&1 &");
    let marker = format!("OUTPOST_SANDBOX={id}");
    assert!(!procs_with_env(&marker).is_empty());
    let Response::Sandbox(gone) = host.call(Request::SandboxDelete { id: id.clone() }) else {
        panic!("delete failed");
    };
    assert_eq!(gone.state, SandboxState::Deleted);
    assert!(procs_with_env(&marker).is_empty());
    assert!(!Path::new(&info.work_dir).exists());
    let Response::Error(e) = host.inside(&id, Request::Exec(exec("true"))) else {
        panic!("ran in a deleted sandbox");
    };
    assert!(e.message.contains("was deleted"), "{}", e.message);
}

/// An exec starts inside with no `enter` process between (its supervisor's
/// forks take the steps in), and a job through `enter`, which runs on the
/// host before it isolates anything: what the caller sets for the command
/// (a loader path, say) must reach nothing but the command, and nothing may
/// unmark it.
fn environment_reaches_only_the_command(host: &mut Host, id: &str) {
    let marker = format!("OUTPOST_SANDBOX={id}");
    let environ = |p: &i32| std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
    let cmdline = |p: &i32| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
    let has_var = |p: &i32| {
        environ(p)
            .split(|&b| b == 0)
            .any(|v| v.starts_with(b"LD_LIBRARY_PATH="))
    };
    let is_enter = |p: &i32| cmdline(p).windows(7).any(|w| w == b"\0enter\0");
    let spec = JobSpec {
        command: "sleep 3.1".into(),
        env: vec![("LD_LIBRARY_PATH".into(), "/nowhere".into())],
        ..JobSpec::default()
    };
    let Response::Job(_) = host.inside(id, Request::JobStart(spec)) else {
        panic!("no job started");
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut enter = None;
    while enter.is_none() && Instant::now() < deadline {
        enter = procs_with_env(&marker).into_iter().find(is_enter);
        std::thread::sleep(Duration::from_millis(10));
    }
    let enter = enter.expect("the job's enter process");
    assert!(!has_var(&enter), "enter itself got the loader path");

    let mut req = exec("sleep 3.2 & echo $LD_LIBRARY_PATH; wait");
    req.env = vec![("LD_LIBRARY_PATH".into(), "/nowhere".into())];
    host.next_id += 1;
    let call = host.next_id;
    host.agent.request(
        call,
        Request::InSandbox {
            id: id.into(),
            request: Box::new(Request::Exec(req)),
        },
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sleeper = None;
    while sleeper.is_none() && Instant::now() < deadline {
        sleeper = procs_with_env(&marker)
            .into_iter()
            .find(|p| cmdline(p).starts_with(b"sleep\x003.2"));
        std::thread::sleep(Duration::from_millis(10));
    }
    let sleeper = sleeper.expect("the exec's command");
    assert!(has_var(&sleeper), "the command's child lost its variable");
    let exec_enters: Vec<i32> = procs_with_env(&marker)
        .into_iter()
        .filter(|p| is_enter(p) && *p != enter)
        .collect();
    assert!(
        exec_enters.is_empty(),
        "an exec started through enter: {exec_enters:?}"
    );
    let Response::ExecDone(r) = host.agent.last(call, Duration::from_secs(30)) else {
        panic!("no result");
    };
    assert_eq!(out(&r), "/nowhere\n", "the command lost its variable");
    let mut req = exec("true");
    req.env = vec![("OUTPOST_SANDBOX".into(), "other".into())];
    let Response::Error(e) = host.inside(id, Request::Exec(req)) else {
        panic!("the marker was overridden");
    };
    assert!(e.message.contains("OUTPOST_"), "{}", e.message);
    let spec = JobSpec {
        command: "true".into(),
        log_file: Some("job.log".into()),
        ..JobSpec::default()
    };
    let Response::Error(e) = host.inside(id, Request::JobStart(spec)) else {
        panic!("a sandbox job wrote its log where the sandbox chose");
    };
    assert!(e.message.contains("log_file"), "{}", e.message);
}

fn files_are_confined(host: &mut Host, info: &SandboxInfo) {
    let id = info.id.clone();
    let scan = |root: &str| {
        Request::Scan(ScanRequest {
            root: root.into(),
            recursive: true,
            ..ScanRequest::default()
        })
    };
    // Relative roots are the work dir.
    assert!(matches!(host.inside(&id, scan(".")), Response::ScanDone(_)));
    let home = host.home.path().display().to_string();
    std::os::unix::fs::symlink(
        host.home.path().join(".ssh"),
        Path::new(&info.work_dir).join("keys"),
    )
    .unwrap();
    for root in [
        format!("{home}/.ssh"),
        "/etc".into(),
        "../..".into(),
        "keys".into(),
    ] {
        let Response::Error(e) = host.inside(&id, scan(&root)) else {
            panic!("scanned {root} from a sandbox");
        };
        assert_eq!(e.kind, ErrorKind::BadRequest, "{root}: {e:?}");
    }
    let read = Request::ReadFiles(ReadFiles {
        root: "keys".into(),
        reads: vec![ReadSpec {
            path: b"id_ed25519".to_vec(),
            ranges: None,
        }],
    });
    assert!(matches!(host.inside(&id, read), Response::Error(_)));
}

#[test]
fn landlock_rung_contains_and_works() {
    let Some(mut host) = Host::unprivileged("sbx-landlock") else {
        return;
    };
    let created = host.call(Request::SandboxCreate(spec(Isolation::Landlock, false)));
    let info = match created {
        Response::Sandbox(info) => info,
        Response::Error(e) if e.message.contains("landlock") => {
            skip(&e.message);
            return;
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(info.isolation, Isolation::Landlock);
    assert!(info.note.is_some());
    contained(&mut host, &info);
    // Commands take the rules their keeper built once, from it alone: a
    // descriptor from anyone else at that socket is refused, and the rules
    // are built again (had it been taken, no command could run).
    let socket = Path::new(&info.work_dir)
        .with_file_name("meta")
        .join("landlock.sock");
    assert!(socket.exists(), "{}", socket.display());
    std::fs::remove_file(&socket).unwrap();
    let impostor = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = served.clone();
    std::thread::spawn(move || {
        let null = std::fs::File::open("/dev/null").unwrap();
        for stream in impostor.incoming().flatten() {
            send_fd(&stream, std::os::fd::AsRawFd::as_raw_fd(&null));
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    contained(&mut host, &info);
    assert!(served.load(std::sync::atomic::Ordering::SeqCst) > 0);
    // No named unix sockets where Landlock cannot fence them (ABI < 9);
    // socketpair still works.
    let r = host.sh(
        &info.id,
        "python3 -c 'import socket; socket.socketpair(); print(\"pair\"); socket.socket(socket.AF_UNIX)'",
    );
    assert!(out(&r).contains("pair"), "{}", err(&r));
    let abi: u32 = Command::new(BIN)
        .arg("diagnose")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("landlock:")?
                .trim()
                .strip_prefix("ABI ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    if abi < 9 {
        assert_ne!(
            r.exit_code,
            Some(0),
            "a unix socket on ABI {abi}: {}",
            out(&r)
        );
    }
    // Its tmp dir is its TMPDIR; the host's /tmp is read-only to it.
    let r = host.sh(
        &info.id,
        "echo x > $TMPDIR/ok && echo x > /tmp/outpost-landlock-escape",
    );
    assert_ne!(r.exit_code, Some(0));
    assert!(!Path::new("/tmp/outpost-landlock-escape").exists());
}

#[test]
fn workspace_rung_is_reported_as_not_isolated() {
    let mut host = Host::new("sbx-none");
    let info = host.create(spec(Isolation::None, true));
    assert_eq!(info.isolation, Isolation::None);
    assert!(
        info.note
            .as_deref()
            .is_some_and(|n| n.contains("not isolated")),
        "{info:?}"
    );
    let r = host.sh(
        &info.id,
        "pwd; echo $HOME; echo $TMPDIR; echo ${SSH_AUTH_SOCK:-none}",
    );
    let lines: Vec<String> = out(&r).lines().map(String::from).collect();
    assert_eq!(lines[0], info.work_dir);
    assert!(
        lines[1].ends_with("/home") && lines[2].ends_with("/tmp"),
        "{lines:?}"
    );
    assert_eq!(lines[3], "none");
}

#[test]
fn ttl_ends_every_process_without_controller_or_daemon() {
    if !bwrap_usable() {
        skip("bwrap cannot run here");
        return;
    }
    for (isolation, kill_daemon) in [(Isolation::Bwrap, false), (Isolation::None, true)] {
        let Some(mut host) = Host::unprivileged("sbx-ttl") else {
            return;
        };
        let info = host.create(SandboxSpec {
            ttl_ms: 3000,
            ..spec(isolation, true)
        });
        let id = info.id.clone();
        let started = Instant::now();
        let spec = JobSpec {
            command: "setsid sleep 1000 & sleep 1000".into(),
            ..JobSpec::default()
        };
        assert!(matches!(
            host.inside(&id, Request::JobStart(spec)),
            Response::Job(_)
        ));
        host.sh(&id, "nohup setsid sleep 1000 >/dev/null 2>&1 &");
        let marker = format!("OUTPOST_SANDBOX={id}");
        let sleeping = || {
            procs_with_env(&marker)
                .into_iter()
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|c| c.starts_with(b"sleep"))
                })
                .count()
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while sleeping() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(sleeping(), 3, "{isolation:?}");
        // The controller goes away; and, the second time, the daemon too.
        host.agent.close_stdin();
        host.agent.wait_exit(Duration::from_secs(5));
        if kill_daemon && let Some(pid) = host.daemon_pid() {
            kill(pid, libc::SIGKILL);
        }
        // Every process is gone within a second of the expiry.
        let deadline = Instant::now() + Duration::from_secs(8);
        while !procs_with_env(&marker).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let gone = started.elapsed();
        let left: Vec<String> = procs_with_env(&marker)
            .into_iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                format!(
                    "{p} {} [{stat}]",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                )
            })
            .collect();
        assert!(
            left.is_empty(),
            "{isolation:?}: processes outlived it: {left:?}"
        );
        assert!(
            gone < Duration::from_secs(4),
            "{isolation:?}: gone after {gone:?}"
        );
        assert!(
            gone > Duration::from_millis(2500),
            "{isolation:?}: gone early"
        );
        let dir = host.sandboxes_dir().join(&id);
        let deadline = Instant::now() + Duration::from_secs(5);
        while json(&dir.join("meta/end.json")).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let end = json(&dir.join("meta/end.json")).expect("it never ended");
        assert_eq!(end["state"], "Expired");
        assert!(!dir.join("work").exists());
    }
}

#[test]
fn a_killed_keeper_is_replaced_and_the_ttl_still_holds() {
    let mut host = Host::new("sbx-keeper");
    let info = host.create(SandboxSpec {
        ttl_ms: 4000,
        ..spec(Isolation::None, true)
    });
    let started = Instant::now();
    let id = info.id.clone();
    host.sh(&id, "nohup sleep 1000 >/dev/null 2>&1 &");
    let keeper = host.keeper_pid(&id);
    kill(keeper, libc::SIGKILL);
    // The daemon notices within its tick and starts another keeper, which
    // stops what the old one left and carries on.
    let deadline = Instant::now() + Duration::from_secs(3);
    while host.keeper_pid(&id) == keeper && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_ne!(host.keeper_pid(&id), keeper, "no new keeper");
    let marker = format!("OUTPOST_SANDBOX={id}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !procs_with_env(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        procs_with_env(&marker).is_empty(),
        "processes outlived their keeper"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    let restarted = |host: &mut Host| {
        host.status(&id)
            .note
            .is_some_and(|n| n.contains("restarted"))
    };
    while !restarted(&mut host) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(restarted(&mut host), "{:?}", host.status(&id));
    assert_eq!(host.status(&id).state, SandboxState::Running);
    let r = host.sh(&id, "echo still");
    assert_eq!(out(&r), "still\n");
    while host.status(&id).state == SandboxState::Running
        && started.elapsed() < Duration::from_secs(8)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(host.status(&id).state, SandboxState::Expired);
}

/// A checkpoint whose `serve` was killed mid-copy leaves its sandbox
/// frozen, the freeze recorded in the name of a process that is gone: the
/// keeper thaws it.
#[test]
fn a_freeze_whose_maker_died_is_thawed_by_the_keeper() {
    let mut host = Host::new("sbx-thaw");
    let info = host.create(spec(Isolation::None, true));
    host.sh(
        &info.id,
        "nohup setsid sh -c 'while :; do date +%s%N > tick; sleep 0.02; done' >/dev/null 2>&1 &",
    );
    let work = PathBuf::from(&info.work_dir);
    let tick = || std::fs::read_to_string(work.join("tick")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(3);
    while tick().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    // Frozen first, then recorded, as a checkpoint does: by its cgroup's
    // freezer where it has one, else by SIGSTOP.
    let meta = work.parent().unwrap().join("meta");
    let setup: serde_json::Value =
        serde_json::from_slice(&std::fs::read(meta.join("setup.json")).unwrap()).unwrap();
    let freezer = setup["cgroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .map(|c| Path::new(c).join("cgroup.freeze"))
        .find(|f| f.exists());
    match &freezer {
        Some(freeze) => std::fs::write(freeze, "1").unwrap(),
        None => {
            for pid in procs_with_env(&format!("OUTPOST_SANDBOX={}", info.id)) {
                kill(pid, libc::SIGSTOP);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    let stopped = tick();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(tick(), stopped, "not frozen to begin with");
    let frozen = meta.join("frozen");
    std::fs::write(
        &frozen,
        format!("{{\"pid\":{gone_pid},\"start_time\":1,\"boot_id\":\"\"}}"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while frozen.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!frozen.exists(), "the abandoned freeze is still recorded");
    let thawed = tick();
    std::thread::sleep(Duration::from_millis(300));
    assert_ne!(tick(), thawed, "its commands stay stopped");
    assert_eq!(out(&host.sh(&info.id, "echo runs")), "runs\n");
}

#[test]
fn renew_moves_the_expiry_from_now() {
    let mut host = Host::new("sbx-renew");
    let info = host.create(SandboxSpec {
        ttl_ms: 2000,
        ..spec(Isolation::None, true)
    });
    let Response::Sandbox(renewed) = host.call(Request::SandboxRenew {
        id: info.id.clone(),
        ttl_ms: 60_000,
    }) else {
        panic!("renew failed");
    };
    assert!(renewed.expires_unix >= info.expires_unix + 55);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(host.status(&info.id).state, SandboxState::Running);
}

#[test]
fn limits_stop_a_memory_hog_and_a_fork_bomb() {
    limits_hold(Host::new("sbx-limits"));
}

#[test]
fn limits_without_a_cgroup_hold_by_rlimit_and_watchdog() {
    let Some(user) = test_account() else {
        skip("needs root and the outpost-test account (scripts/setup-test-env)");
        return;
    };
    limits_hold(Host::new_as("sbx-limits-user", Some(user)));
}

fn limits_hold(mut host: Host) {
    // bwrap for a regular user where it works; as root, a workspace.
    let info = host.create(SandboxSpec {
        limits: SandboxLimits {
            memory_mb: Some(64),
            pids: Some(40),
            ..SandboxLimits::default()
        },
        ..spec(Isolation::Auto, true)
    });
    let isolation = info.isolation;
    let id = info.id.clone();
    eprintln!("enforcement: {}", info.enforcement);
    // 300 MB, touched page by page, and held.
    let r = host.sh(
        &id,
        "python3 -c 'import time; b = bytearray(300 << 20); time.sleep(3); print(len(b))'",
    );
    assert_eq!(r.signal, Some(libc::SIGKILL), "the hog: {r:?}");
    assert!(!out(&r).contains("314572800"));
    // A fork bomb hits the pids limit; the host is fine meanwhile.
    let started = Instant::now();
    let bomb = "import os, time\nn = 0\nfor i in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n    n += 1\nprint(n)";
    let r = host.sh(&id, &format!("python3 -c '{bomb}'"));
    assert!(started.elapsed() < Duration::from_secs(20));
    let r2 = Command::new("true").status().unwrap();
    assert!(r2.success());
    let forked: u32 = out(&r)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{:?} {} {}", r.exit_code, out(&r), err(&r)));
    assert!(forked < 40, "{forked} processes forked past a limit of 40");
    // Still usable afterwards.
    assert_eq!(out(&host.sh(&id, "echo fine")), "fine\n");
    if isolation == Isolation::Bwrap {
        // Files in its own tmpfs count as memory too.
        let r = host.sh(
            &id,
            "head -c 200M /dev/zero > /dev/shm/fill && sleep 3 && echo kept",
        );
        assert!(!out(&r).contains("kept"), "{r:?}");
    }
}

#[test]
fn bad_input_is_refused_and_creates_nothing() {
    let mut host = Host::new("sbx-bad");
    let huge = SandboxLimits {
        memory_mb: Some(1 << 40),
        ..SandboxLimits::default()
    };
    let cases: Vec<(SandboxSpec, &str)> = vec![
        (
            SandboxSpec {
                ttl_ms: 0,
                ..spec(Isolation::None, true)
            },
            "ttl",
        ),
        (
            SandboxSpec {
                ttl_ms: 30 * 24 * 3600 * 1000,
                ..spec(Isolation::None, true)
            },
            "ttl",
        ),
        (
            SandboxSpec {
                limits: huge,
                ..spec(Isolation::None, true)
            },
            "larger than this host",
        ),
        (
            SandboxSpec {
                id: Some("../escape".into()),
                ..spec(Isolation::None, true)
            },
            "invalid sandbox id",
        ),
        (
            SandboxSpec {
                limits: SandboxLimits {
                    pids: Some(0),
                    ..SandboxLimits::default()
                },
                ..spec(Isolation::None, true)
            },
            "more than 0",
        ),
    ];
    for (spec, says) in cases {
        let message = host.create_err(spec);
        assert!(message.contains(says), "{message}");
    }
    let made: Vec<_> = std::fs::read_dir(host.sandboxes_dir())
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(made.is_empty(), "{made:?}");
    assert!(!host.home.path().join("escape").exists());

    // As root, Landlock's commands (on a uid of their own) could not reach
    // a state dir only root may enter: refused, saying so.
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } == 0 {
        let message = host.create_err(spec(Isolation::Landlock, true));
        assert!(message.contains("as root"), "{message}");
    }

    // The cap counts live sandboxes.
    let capped = SandboxSpec {
        max_sandboxes: 1,
        ..spec(Isolation::None, true)
    };
    host.create(capped.clone());
    assert!(host.create_err(capped).contains("most allowed"));
    assert!(matches!(
        host.inside("sbx-none", Request::Exec(exec("true"))),
        Response::Error(_)
    ));
}

/// A web server for the egress test on this host's loopback, answering
/// every request with `body`; its port.
fn serve_http(body: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                let mut reader = std::io::BufReader::new(&conn);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = write!(
                    &conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// `network: false` with `allow_hosts`: the listed place answers through
/// the proxy, to curl and to Python; another port, the same place by
/// address, a raw socket and DNS do not, and refusals are recorded.
#[test]
fn egress_reaches_only_the_allowed_hosts() {
    if !bwrap_usable() {
        skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    let Some(mut host) = Host::unprivileged("sbx-egress") else {
        return;
    };
    let (allowed, other) = (serve_http("ALLOWED"), serve_http("OTHER"));
    let info = host.create(SandboxSpec {
        allow_hosts: vec![format!("localhost:{allowed}")],
        ..spec(Isolation::Bwrap, false)
    });
    let run = |host: &mut Host, command: &str| {
        let r = host.sh(&info.id, command);
        format!("{}{}", out(&r), err(&r))
    };
    assert_eq!(
        run(
            &mut host,
            &format!("curl -s -m 5 http://localhost:{allowed}/")
        ),
        "ALLOWED"
    );
    let python = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://localhost:{allowed}/').read().decode())\""
    );
    assert_eq!(run(&mut host, &python), "ALLOWED\n");
    for refused in [format!("localhost:{other}"), format!("127.0.0.1:{allowed}")] {
        let said = run(&mut host, &format!("curl -s -m 5 http://{refused}/"));
        assert!(
            said.contains("not in this sandbox's allow_hosts"),
            "{refused}: {said}"
        );
    }
    // The result names what was refused while it ran, each place once.
    let r = host.sh(
        &info.id,
        &format!("curl -s http://localhost:{other}/; curl -s http://localhost:{other}/x"),
    );
    assert_eq!(r.egress_denied, [format!("localhost:{other}")], "{r:?}");
    assert!(host.sh(&info.id, "true").egress_denied.is_empty());
    let said = run(&mut host, "curl -s -m 5 https://example.com/; echo rc=$?");
    assert!(
        said.contains("rc=56"),
        "CONNECT to an unlisted name: {said}"
    );
    let said = run(
        &mut host,
        &format!(
            "exec 3<>/dev/tcp/127.0.0.1/{allowed} && echo CONNECTED; getent hosts example.com || echo NO_DNS"
        ),
    );
    assert!(
        !said.contains("CONNECTED") && said.contains("NO_DNS"),
        "{said}"
    );
    let denied = host
        .sandboxes_dir()
        .join(&info.id)
        .join("meta/egress-denied");
    let denied = std::fs::read_to_string(&denied).unwrap();
    for refused in [format!("localhost:{other}"), "example.com:443".to_string()] {
        assert!(denied.lines().any(|l| l == refused), "{refused}: {denied}");
    }
    // Contradictions are refused, never half-held.
    let said = host.create_err(SandboxSpec {
        allow_hosts: vec!["pypi.org".into()],
        ..spec(Isolation::Bwrap, true)
    });
    assert!(said.contains("network: false"), "{said}");
    let said = host.create_err(SandboxSpec {
        allow_hosts: vec!["pypi.org".into()],
        ..spec(Isolation::Landlock, false)
    });
    assert!(said.contains("allow_hosts needs bwrap"), "{said}");
}

/// A package index on this host's loopback, serving one hand-made wheel
/// (`outpost-probe`, whose module says 42): the server and its port.
fn serve_index() -> (std::process::Child, u16) {
    const INDEX: &str = r#"
import base64, hashlib, http.server, io, os, sys, tempfile, zipfile
root = tempfile.mkdtemp()
files = {
    "outpost_probe/__init__.py": b"VALUE = 42\n",
    "outpost_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: outpost-probe\nVersion: 1.0\n",
    "outpost_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: outpost-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "outpost_probe-1.0.dist-info/RECORD,,\n"
wheel = "outpost_probe-1.0-py3-none-any.whl"
with zipfile.ZipFile(os.path.join(root, wheel), "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("outpost_probe-1.0.dist-info/RECORD", record)
os.makedirs(os.path.join(root, "simple", "outpost-probe"))
with open(os.path.join(root, "simple", "outpost-probe", "index.html"), "w") as f:
    f.write(f'<html><body><a href="/{wheel}">{wheel}</a></body></html>')
os.chdir(root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;
    let mut child = Command::new("python3")
        .args(["-c", INDEX])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().parse().expect("the index's port");
    (child, port)
}

/// `install_package` in a `network: false` sandbox reaches a package index
/// listed in its `allow_hosts`, through the proxy, and nothing else: here as
/// root, on the sandbox's own uid. Without `allow_hosts` it is refused with
/// the way out.
#[test]
fn install_package_fetches_from_an_allowed_index_only() {
    if !bwrap_usable() {
        skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    let mut host = Host::new("sbx-index");
    let (mut index, port) = serve_index();
    let info = host.create(SandboxSpec {
        allow_hosts: vec![format!("localhost:{port}")],
        env: vec![(
            "PIP_INDEX_URL".into(),
            format!("http://localhost:{port}/simple/"),
        )],
        ..spec(Isolation::Bwrap, false)
    });
    let install = |packages: &[&str]| {
        Request::CodeInstall(outpost_protocol::CodeInstall {
            packages: packages.iter().map(|p| p.to_string()).collect(),
            timeout_ms: Some(120_000),
            output_limit: 1 << 16,
            progress_ms: None,
        })
    };
    let installed = host.inside(&info.id, install(&["outpost-probe"]));
    let Response::ExecDone(r) = installed else {
        panic!("install: {installed:?}");
    };
    assert_eq!(r.exit_code, Some(0), "{}{}", out(&r), err(&r));
    let r = host.sh(
        &info.id,
        "$HOME/.venv/bin/python -c 'import outpost_probe; print(outpost_probe.VALUE)'",
    );
    assert_eq!(out(&r), "42\n", "{}", err(&r));
    // The index's own host by address is not what was listed.
    let r = host.sh(
        &info.id,
        &format!("$HOME/.venv/bin/python -m pip download -q --no-deps -d /tmp/x --index-url http://127.0.0.1:{port}/simple/ outpost-probe"),
    );
    assert_ne!(r.exit_code, Some(0), "{}", out(&r));
    assert!(
        r.egress_denied.contains(&format!("127.0.0.1:{port}")),
        "{r:?}"
    );
    let _ = index.kill();
    let _ = index.wait();

    let closed = host.create(spec(Isolation::Bwrap, false));
    let Response::Error(e) = host.inside(&closed.id, install(&["outpost-probe"])) else {
        panic!("installed without a network");
    };
    assert!(e.message.contains("allow_hosts"), "{}", e.message);
}

/// Sends `fd` over `stream` (SCM_RIGHTS), as a keeper hands its rules.
fn send_fd(stream: &std::os::unix::net::UnixStream, fd: i32) {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a msghdr over live buffers, one cmsg within `control`.
    unsafe {
        let space = libc::CMSG_SPACE(4) as usize;
        let mut control = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
    }
}
