//! Shared pieces for the controller's end-to-end tests: fleets pointed at a test
//! sshd, and exec shortcuts.

#![allow(dead_code)]

pub mod mcp_client;

use std::path::Path;
use std::time::Duration;

use outpost::config::{Config, HostConfig, SshTarget, Target};
use outpost::fleet::Fleet;
use outpost::session::{CallError, Session};
use outpost_e2e::{Sshd, TempDir, target_bin};
use outpost_protocol::{ExecRequest, ExecResult};

pub const BOX: &str = "box";

/// A scratch directory for one test's controller state, removed on drop.
pub fn scratch(name: &str) -> TempDir {
    TempDir::new(&format!("ctl-{name}"))
}

/// An SSH target for `sshd` authenticating with its authorized client key.
pub fn target(sshd: &Sshd) -> SshTarget {
    SshTarget {
        host: sshd.host().into(),
        hostname: sshd.host().into(),
        port: sshd.port(),
        user: sshd.user().into(),
        key_file: Some(sshd.client_key().to_path_buf()),
        key_passphrase: None,
        password: None,
        identity_files: vec![],
        identities_only: false,
        connect_timeout: None,
        strict_host_keys: false,
        remote_dir: sshd.remote_dir().display().to_string(),
        jump: Vec::new(),
        user_known_hosts: None,
        unusable: None,
    }
}

pub fn config(target: SshTarget, state: &Path) -> Config {
    let sandboxes = vec![
        HostConfig {
            name: BOX.into(),
            target: Target::Ssh(target),
            slurm: None,
            allow_hosts: Vec::new(),
            sandbox_uids: None,
        },
        HostConfig::local(),
    ];
    let mut config = Config::new(sandboxes, state.join("known_hosts"));
    config.connect_timeout = Duration::from_secs(5);
    config.agent_bin = Some(target_bin("outpost-agent"));
    config
}

pub fn fleet(sshd: &Sshd, state: &Path) -> Fleet {
    Fleet::new(config(target(sshd), state))
}

pub fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: Some(60_000),
        output_limit: 20_000,
        stream: false,
        progress_ms: None,
        hand_over: None,
    }
}

pub async fn run(session: &Session, command: &str) -> Result<ExecResult, CallError> {
    session.exec(req(command), |_, _| {}).await
}

pub fn stdout(r: &ExecResult) -> String {
    r.stdout.to_text()
}

/// The exec behaviours every transport must show: streams, exit codes, cwd,
/// stdin, env, capped and binary output, tree-killing timeouts.
pub async fn exec_suite(session: &Session) {
    let r = run(session, "echo out; echo err >&2; exit 3")
        .await
        .unwrap();
    assert_eq!(stdout(&r), "out\n");
    assert_eq!(r.stderr.to_text(), "err\n");
    assert_eq!(r.exit_code, Some(3));

    let mut q = req("pwd");
    q.cwd = Some("/tmp".into());
    assert_eq!(stdout(&session.exec(q, |_, _| {}).await.unwrap()), "/tmp\n");

    let mut q = req("cat; printf %s \"$GREETING\"");
    q.stdin = Some(b"from stdin\n".to_vec());
    q.env = vec![("GREETING".into(), "hi there".into())];
    assert_eq!(
        stdout(&session.exec(q, |_, _| {}).await.unwrap()),
        "from stdin\nhi there"
    );

    let mut q = req("cd");
    q.cwd = Some("/definitely/not/here".into());
    let err = session.exec(q, |_, _| {}).await.unwrap_err();
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");

    // 5 MiB comes back as head + tail with an explicit marker.
    let r = run(
        session,
        "head -c 5242880 /dev/zero | tr '\\0' a; echo; echo END",
    )
    .await
    .unwrap();
    assert_eq!(r.stdout.total_len(), 5 * 1024 * 1024 + 5);
    assert_eq!(r.stdout.head.len() + r.stdout.tail.len(), 20_000);
    let text = stdout(&r);
    assert!(text.contains("bytes omitted"), "no marker");
    assert!(text.ends_with("a\nEND\n"));

    // Binary bytes arrive untouched.
    let r = run(session, "printf '\\000\\377\\376abc\\200'")
        .await
        .unwrap();
    assert_eq!(r.stdout.head, b"\x00\xff\xfeabc\x80");

    let r = run(session, "kill -9 $$").await.unwrap();
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
}

/// `timeout_ms=2000` on a TERM-ignoring command and on a `setsid` escapee: both
/// return within ~3 s with timed_out, and nothing of either remains.
pub async fn timeout_suite(session: &Session) {
    for (marker, command) in [
        ("31.0101", "trap '' TERM; sleep 31.0101"),
        ("31.0202", "setsid sleep 31.0202 & sleep 31.0203"),
        ("31.0303", "bash -c 'trap \"\" TERM; sleep 31.0303' & wait"),
    ] {
        let mut q = req(command);
        q.timeout_ms = Some(2_000);
        let started = std::time::Instant::now();
        let r = session.exec(q, |_, _| {}).await.unwrap();
        let took = started.elapsed();
        assert!(r.timed_out, "{command}: not timed out: {r:?}");
        assert!(
            took < Duration::from_millis(3_500),
            "{command}: took {took:?}"
        );
        let gone = outpost_e2e::wait_until(Duration::from_secs(2), || {
            outpost_e2e::pids_with_cmdline(&format!("sleep {marker}")).is_empty()
        });
        assert!(gone, "{command}: processes survived the timeout");
    }
}

/// What a tree looks like, for byte-exact comparisons: per relative path, its
/// kind, permission bits, mtime and content (or symlink target).
pub fn snapshot(root: &Path) -> std::collections::BTreeMap<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                format!(
                    "link -> {}",
                    String::from_utf8_lossy(target.as_os_str().as_bytes())
                )
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o} {}", meta.mtime())
            } else {
                let content = std::fs::read(&path).unwrap();
                format!(
                    "file {mode:o} {}.{:09} {} {}",
                    meta.mtime(),
                    meta.mtime_nsec(),
                    content.len(),
                    blake3::hash(&content).to_hex()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// Outpost temporary files left anywhere under `root`.
pub fn leftovers(root: &Path) -> Vec<String> {
    snapshot(root)
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .filter(|k| k.rsplit('/').next().unwrap_or("").starts_with(".outpost-"))
        .collect()
}
