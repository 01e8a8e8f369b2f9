//! Checks the end-to-end harness itself against the real sshd, with the
//! stock OpenSSH client, so that failures in product tests can be trusted to
//! be product failures.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, pids_with_cmdline, target_bin, wait_until};

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run ssh")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn client_key_logs_in() {
    let sshd = Sshd::start();
    let mut cmd = sshd.ssh_command();
    cmd.arg("echo ok; id -un");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "ssh failed: {out:?}\nsshd log:\n{}",
        sshd.log()
    );
    assert_eq!(stdout(&out), "ok\noutpost-test");
}

#[test]
fn the_spelled_out_ssh_command_works() {
    // The exact invocation from the harness's documentation, without helpers.
    let sshd = Sshd::start();
    let out = run({
        let mut c = Command::new("ssh");
        c.arg("-i")
            .arg(sshd.client_key())
            .arg("-p")
            .arg(sshd.port().to_string())
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ])
            .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .arg(format!("{}@{}", sshd.user(), sshd.host()))
            .args(["echo", "ok"]);
        c
    });
    assert!(out.status.success(), "{out:?}\n{}", sshd.log());
    assert_eq!(stdout(&out), "ok");
}

#[test]
fn passphrase_key_is_encrypted_and_authorized() {
    let sshd = Sshd::start();
    let key = sshd.client_key_with_passphrase();
    assert!(key.is_file());
    // An empty passphrase must not open it; the right one must.
    let wrong = run({
        let mut c = Command::new("ssh-keygen");
        c.args(["-y", "-P", ""]).arg("-f").arg(key);
        c
    });
    assert!(!wrong.status.success(), "key opened without passphrase");
    let right = run({
        let mut c = Command::new("ssh-keygen");
        c.args(["-y", "-P", outpost_e2e::KEY_PASSPHRASE])
            .arg("-f")
            .arg(key);
        c
    });
    assert!(right.status.success(), "{right:?}");
    let public = stdout(&right);
    let authorized = fs::read_to_string(sshd.dir().join("authorized_keys")).unwrap();
    assert!(
        authorized.contains(&public),
        "passphrase key not in authorized_keys"
    );
}

#[test]
fn other_key_is_refused() {
    let sshd = Sshd::start();
    let mut cmd = sshd.ssh_command();
    // Later -i options add to the list; IdentitiesOnly plus a fresh command
    // keeps only other_key.
    let mut c = Command::new("ssh");
    c.arg("-i")
        .arg(sshd.other_key())
        .arg("-p")
        .arg(sshd.port().to_string())
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-F",
            "/dev/null",
        ])
        .arg(format!("{}@{}", sshd.user(), sshd.host()))
        .args(["echo", "ok"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    assert_eq!(stdout(&out), "");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Sanity: the same server accepts the right key.
    cmd.arg("true");
    assert!(run(cmd).status.success());
}

#[test]
fn connection_pids_and_kill_connections() {
    let sshd = Sshd::start();
    assert!(
        sshd.connection_pids().is_empty(),
        "leftover connections: {:?}",
        sshd.connection_pids()
    );
    let mut cmd = sshd.ssh_command();
    cmd.args(["sleep", "5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    // Wait for a logged-in session, not just a pre-auth process.
    assert!(
        wait_until(Duration::from_secs(5), || sshd
            .log()
            .contains("Accepted publickey")),
        "no login:\n{}",
        sshd.log()
    );
    assert!(!sshd.connection_pids().is_empty());
    sshd.kill_connections();
    let ended = wait_until(Duration::from_secs(3), || {
        child.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = child.kill();
    }
    let _ = child.wait();
    assert!(ended, "ssh survived kill_connections");
    assert!(
        started.elapsed() < Duration::from_millis(4500),
        "ssh ended only by itself"
    );
    assert!(wait_until(Duration::from_secs(2), || sshd
        .connection_pids()
        .is_empty()));
}

#[test]
fn stop_and_continue_connections() {
    let sshd = Sshd::start();
    let mut cmd = sshd.ssh_command();
    cmd.arg("sleep 1.0202; echo done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Freeze only once the session is fully up (the remote command runs):
    // stopping sshd mid-fork, right after authentication, races with the
    // privilege-separated child being created.
    assert!(wait_until(Duration::from_secs(5), || {
        // The local ssh (root) carries the same text; the remote side runs as
        // the test user.
        pids_with_cmdline("sleep 1.0202")
            .iter()
            .any(|pid| fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() != 0))
    }));
    let pids = sshd.stop_connections();
    assert!(!pids.is_empty());
    // With the server side frozen, the client cannot finish.
    std::thread::sleep(Duration::from_millis(2000));
    let pid = child.id() as i32;
    assert!(fs::metadata(format!("/proc/{pid}")).is_ok());
    sshd.continue_pids(&pids);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "stopped {pids:?}: {out:?}\nsshd log:\n{}",
        sshd.log()
    );
    assert_eq!(stdout(&out), "done");
}

#[test]
fn known_hosts_line_and_regenerated_host_key() {
    let mut sshd = Sshd::start();
    let port = sshd.port();
    let known_hosts = sshd.dir().join("known_hosts_test");
    let strict_ssh = |sshd: &Sshd| {
        let mut c = Command::new("ssh");
        c.arg("-i")
            .arg(sshd.client_key())
            .arg("-p")
            .arg(sshd.port().to_string())
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-F",
                "/dev/null",
            ])
            .arg(format!("{}@{}", sshd.user(), sshd.host()))
            .args(["echo", "ok"]);
        run(c)
    };
    assert!(
        sshd.known_hosts_line()
            .starts_with(&format!("[127.0.0.1]:{port} ssh-ed25519 AAAA"))
    );
    fs::write(&known_hosts, format!("{}\n", sshd.known_hosts_line())).unwrap();
    let out = strict_ssh(&sshd);
    assert!(out.status.success(), "{out:?}");

    let old = sshd.host_public_key_line();
    let old_listener = sshd.listener_pid();
    sshd.regenerate_host_key();
    assert_eq!(sshd.port(), port);
    assert_ne!(sshd.host_public_key_line(), old);
    assert_ne!(sshd.listener_pid(), old_listener);

    let out = strict_ssh(&sshd);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{out:?}"
    );
    fs::write(&known_hosts, format!("{}\n", sshd.known_hosts_line())).unwrap();
    assert!(strict_ssh(&sshd).status.success());
}

#[test]
fn remote_dir_is_owned_by_test_user_and_drop_cleans_up() {
    let sshd = Sshd::start();
    let remote = sshd.remote_dir().to_path_buf();
    let dir = sshd.dir().to_path_buf();
    let listener = sshd.listener_pid();
    assert!(remote.starts_with("/tmp") && remote.ends_with("state"));
    let meta = fs::metadata(&remote).unwrap();
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    let uid: u32 = passwd
        .lines()
        .find(|l| l.starts_with("outpost-test:"))
        .and_then(|l| l.split(':').nth(2)?.parse().ok())
        .unwrap();
    assert_eq!(meta.uid(), uid);

    // The user can write there over SSH, and a process left running from it
    // (like a daemonized agent) is killed on drop.
    let mut cmd = sshd.ssh_command();
    cmd.arg(format!(
        "cp /bin/sleep {r}/fake-agent; cd /; setsid {r}/fake-agent 60 </dev/null >/dev/null 2>&1 & echo started",
        r = remote.display()
    ));
    let out = run(cmd);
    assert!(out.status.success(), "{out:?}");
    let needle = format!("{}/fake-agent", remote.display());
    assert!(wait_until(Duration::from_secs(5), || !pids_with_cmdline(
        &needle
    )
    .is_empty()));

    drop(sshd);
    assert!(!remote.parent().unwrap().exists());
    assert!(!dir.exists());
    assert!(fs::metadata(format!("/proc/{listener}")).is_err());
    assert!(wait_until(Duration::from_secs(2), || pids_with_cmdline(
        &needle
    )
    .is_empty()));
}

#[test]
fn many_servers_at_once() {
    let servers: Vec<Sshd> = (0..6).map(|_| Sshd::start()).collect();
    let mut ports: Vec<u16> = servers.iter().map(Sshd::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
}

#[test]
fn target_bin_finds_package_binary() {
    // Cargo builds the package's own binaries before its integration tests.
    let bench = target_bin("outpost-bench");
    assert!(bench.is_file());
}

#[test]
#[should_panic(expected = "build the workspace first")]
fn target_bin_explains_missing_binary() {
    target_bin("no-such-outpost-binary");
}

#[test]
fn temp_dir_is_removed_on_drop() {
    let t = outpost_e2e::TempDir::new("harness");
    fs::write(t.path().join("f"), "x").unwrap();
    let path = t.path().to_path_buf();
    assert!(path.starts_with("/tmp") && path.is_dir());
    drop(t);
    assert!(!path.exists());
}

/// The password field of the test account in /etc/shadow.
fn shadow_field() -> String {
    let text = fs::read_to_string("/etc/shadow").expect("read /etc/shadow (tests run as root)");
    text.lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            (fields.next() == Some(outpost_e2e::TEST_USER))
                .then(|| fields.next().unwrap_or("").to_string())
        })
        .expect("the test account is in /etc/shadow")
}

/// Run by [`the_test_account_has_a_password_only_while_a_test_needs_one`] in
/// a process of its own.
#[test]
#[ignore = "a helper, run in a child process"]
fn password_helper() {
    let sshd = Sshd::start();
    let password = sshd.password();
    assert!(password.len() >= 32);
    // The same one for the whole process.
    assert_eq!(sshd.password(), password);
    let field = shadow_field();
    assert!(field.starts_with('$'), "no password hash set");
    println!("hash-prefix={}", &field[..field.len().min(8)]);
}

#[test]
fn the_test_account_has_a_password_only_while_a_test_needs_one() {
    // Set up with no password at all: `*` allows no password login anywhere
    // (and, unlike `!`, still lets keys in where they are authorized).
    let hint = "run scripts/setup-test-env again";
    assert_eq!(shadow_field(), "*", "{hint}");
    let child = || {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["password_helper", "--exact", "--ignored", "--nocapture"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Taken back as the process ended.
        assert_eq!(shadow_field(), "*");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (first, second) = (child(), child());
    assert!(first.contains("hash-prefix=$"), "{first}");
    assert!(second.contains("hash-prefix=$"), "{second}");
}
