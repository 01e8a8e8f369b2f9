//! The controller against a real OpenSSH sshd on 127.0.0.1: exec, bootstrap,
//! host keys, authentication errors, multiplexing, and real faults.

// Tests run on a multi-threaded runtime: the harness blocks (sshd, /proc
// scans) while the controller's background tasks must keep running.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use outpost::config::SshTarget;
use outpost::fleet::Fleet;
use outpost_e2e::Sshd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_exec_behaviour() {
    let sshd = Sshd::start();
    let state = scratch("exec");
    let fleet = fleet(&sshd, state.path());
    let session = fleet.get(Some(BOX)).unwrap();
    exec_suite(&session).await;
    // The command runs as the SSH user in its home by default.
    let r = run(&session, "id -un; pwd").await.unwrap();
    assert_eq!(stdout(&r), format!("{0}\n/home/{0}\n", sshd.user()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_timeouts_kill_the_whole_tree() {
    let sshd = Sshd::start();
    let state = scratch("timeout");
    let fleet = fleet(&sshd, state.path());
    timeout_suite(&fleet.get(Some(BOX)).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_is_uploaded_once_reused_and_replaced_when_corrupt() {
    let sshd = Sshd::start();
    let state = scratch("bootstrap");
    let first = fleet(&sshd, state.path());
    let conn = first.get(Some(BOX)).unwrap().connection().await.unwrap();
    assert!(conn.uploaded, "first use must upload the agent");
    let path = conn.agent_path.clone();
    assert!(path.starts_with(&sshd.remote_dir().display().to_string()));
    let mode = std::fs::metadata(&path).unwrap();
    // Runnable by a root login's sandbox uids; its directories stay 0700.
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o755
    );

    // A second controller finds it installed.
    let second = fleet(&sshd, state.path());
    let conn2 = second.get(Some(BOX)).unwrap().connection().await.unwrap();
    assert!(!conn2.uploaded, "second controller must reuse the agent");
    assert_eq!(conn2.agent_path, path);
    drop(conn);
    drop(conn2);
    for f in [&first, &second] {
        f.get(Some(BOX)).unwrap().disconnect().await;
    }
    // Wait for the agents to exit, then corrupt the installed file.
    assert!(outpost_e2e::wait_until(Duration::from_secs(5), || {
        outpost_e2e::pids_with_cmdline(&format!("{path} serve")).is_empty()
    }));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid..mid + 64].fill(0xA5);
    std::fs::write(&path, &bytes).unwrap();

    let third = fleet(&sshd, state.path());
    let session = third.get(Some(BOX)).unwrap();
    let conn3 = session.connection().await.unwrap();
    assert!(conn3.uploaded, "a corrupt agent must be replaced");
    assert_eq!(stdout(&run(&session, "echo fine").await.unwrap()), "fine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_host_key_is_recorded_and_a_changed_one_refused() {
    let mut sshd = Sshd::start();
    let state = scratch("hostkey");
    {
        let fleet = fleet(&sshd, state.path());
        run(&fleet.get(Some(BOX)).unwrap(), "true").await.unwrap();
    }
    let known = std::fs::read_to_string(state.path().join("known_hosts")).unwrap();
    let offered = sshd.known_hosts_line();
    let key_b64 = offered.split_whitespace().nth(2).unwrap();
    assert!(
        known.contains(&format!("[127.0.0.1]:{}", sshd.port())),
        "{known}"
    );
    assert!(known.contains(key_b64), "{known}");

    sshd.regenerate_host_key();
    let fleet = fleet(&sshd, state.path());
    let err = run(&fleet.get(Some(BOX)).unwrap(), "true")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("HOST KEY CHANGED"), "{err}");
    assert_eq!(
        err.matches("SHA256:").count(),
        2,
        "both fingerprints: {err}"
    );
    assert!(err.contains("ssh-keygen -R"), "{err}");

    // strict_host_keys refuses a key it has never seen.
    let fresh = scratch("strict");
    let mut t = target(&sshd);
    t.strict_host_keys = true;
    let fleet = Fleet::new(config(t, fresh.path()));
    let err = run(&fleet.get(Some(BOX)).unwrap(), "true")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not known") && err.contains("strict_host_keys"),
        "{err}"
    );
    assert!(!fresh.path().join("known_hosts").exists());
}

async fn connect_error(t: SshTarget) -> (String, Duration) {
    let state = scratch("autherr");
    let fleet = Fleet::new(config(t, state.path()));
    let started = Instant::now();
    let err = run(&fleet.get(Some(BOX)).unwrap(), "true")
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    (err.to_string(), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_methods_and_clear_errors() {
    let sshd = Sshd::start();
    // Password.
    let mut t = target(&sshd);
    t.key_file = None;
    t.password = Some(sshd.password().into());
    let state = scratch("password");
    let fleet = Fleet::new(config(t.clone(), state.path()));
    assert_eq!(
        stdout(
            &run(&fleet.get(Some(BOX)).unwrap(), "echo pw")
                .await
                .unwrap()
        ),
        "pw\n"
    );
    // Key with passphrase.
    let mut k = target(&sshd);
    k.key_file = Some(sshd.client_key_with_passphrase().to_path_buf());
    k.key_passphrase = Some("secret-pass".into());
    let fleet = Fleet::new(config(k.clone(), state.path()));
    run(&fleet.get(Some(BOX)).unwrap(), "true").await.unwrap();

    let limit = Duration::from_secs(6);
    let mut wrong = t.clone();
    wrong.password = Some("not-the-password".into());
    let (err, took) = connect_error(wrong).await;
    assert!(
        err.contains("authentication failed") && err.contains("password"),
        "{err}"
    );
    assert!(took < limit);

    let mut other = target(&sshd);
    other.key_file = Some(sshd.other_key().to_path_buf());
    let (err, took) = connect_error(other).await;
    assert!(
        err.contains("authentication failed") && err.contains("refused"),
        "{err}"
    );
    assert!(took < limit);

    k.key_passphrase = Some("wrong".into());
    let (err, _) = connect_error(k.clone()).await;
    assert!(err.contains("passphrase"), "{err}");
    k.key_passphrase = None;
    let (err, _) = connect_error(k).await;
    assert!(err.contains("key_passphrase"), "{err}");

    let mut closed = target(&sshd);
    closed.port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (err, took) = connect_error(closed).await;
    assert!(err.contains("refused"), "{err}");
    assert!(took < limit);

    let mut nowhere = target(&sshd);
    nowhere.hostname = "no-such-host.invalid".into();
    let (err, took) = connect_error(nowhere).await;
    assert!(
        err.contains("resolve") || err.contains("timed out"),
        "{err}"
    );
    assert!(took < limit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_multiplexed_on_one_connection() {
    let sshd = Sshd::start();
    let state = scratch("mux");
    let fleet = Arc::new(fleet(&sshd, state.path()));
    let session = fleet.get(Some(BOX)).unwrap();
    session.connection().await.unwrap();
    let connections_before = sshd.connection_pids().len();

    let calls = (0..50).map(|i| {
        let session = session.clone();
        async move {
            let r = run(&session, &format!("echo {i}; sleep 0.2"))
                .await
                .unwrap();
            assert_eq!(stdout(&r), format!("{i}\n"));
        }
    });
    futures::future::join_all(calls).await;
    assert_eq!(sshd.connection_pids().len(), connections_before);

    // A cheap call does not wait behind a slow one.
    let slow = {
        let session = session.clone();
        tokio::spawn(async move { run(&session, "sleep 3").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    run(&session, "true").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    slow.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_sshd_connection_reconnects_on_the_next_call() {
    let sshd = Sshd::start();
    let state = scratch("kill");
    let fleet = fleet(&sshd, state.path());
    let session = fleet.get(Some(BOX)).unwrap();
    run(&session, "true").await.unwrap();
    sshd.kill_connections();
    // The call in flight, if any, fails; the next one reconnects.
    let mut ok = false;
    for _ in 0..3 {
        if let Ok(r) = run(&session, "echo back").await {
            assert_eq!(stdout(&r), "back\n");
            ok = true;
            break;
        }
    }
    assert!(ok, "no reconnect after the sshd process was killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_peer_fails_the_call_in_flight_within_seconds() {
    let sshd = Sshd::start();
    let state = scratch("freeze");
    let fleet = fleet(&sshd, state.path());
    let session = fleet.get(Some(BOX)).unwrap();
    run(&session, "true").await.unwrap();

    let in_flight = {
        let session = session.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (run(&session, "sleep 20").await, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = sshd.stop_connections();
    assert!(!stopped.is_empty());
    let (result, took) = in_flight.await.unwrap();
    let err = result.unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    assert!(took < Duration::from_secs(7), "took {took:?}");

    sshd.continue_pids(&stopped);
    sshd.kill_connections();
    let r = run(&session, "echo thawed").await.unwrap();
    assert_eq!(stdout(&r), "thawed\n");
}

/// ProxyJump: a sandbox reached through a jump host. Its connection rides
/// on the jump host's (cutting that one ends it), each host's key is checked
/// against its own name, and a jump host that is down fails clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_behind_a_jump_host() {
    use outpost::session::SessionState;
    let jump = Sshd::start();
    let inner = Sshd::start();
    let state = scratch("jump");
    let mut t = target(&inner);
    t.jump = vec![target(&jump)];
    let fleet = Fleet::new(config(t.clone(), state.path()));
    let session = fleet.get(Some(BOX)).unwrap();
    let r = run(&session, "echo through").await.unwrap();
    assert_eq!(stdout(&r), "through\n");
    let known = std::fs::read_to_string(state.path().join("known_hosts")).unwrap();
    for port in [jump.port(), inner.port()] {
        assert!(known.contains(&format!("[127.0.0.1]:{port}")), "{known}");
    }

    // Only the jump host's connections are cut: the sandbox's goes with them.
    jump.kill_connections();
    let deadline = Instant::now() + Duration::from_secs(10);
    while session.state() == SessionState::Connected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(session.state(), SessionState::Connected);
    // It comes back through the jump host on the next call.
    let r = run(&session, "echo again").await.unwrap();
    assert_eq!(stdout(&r), "again\n");

    // The sandbox's own key is what is checked under its name.
    let keys = scratch("jump-keys");
    let jump_line = jump.known_hosts_line();
    let jump_key: Vec<&str> = jump_line.split_whitespace().skip(1).take(2).collect();
    std::fs::write(
        keys.path().join("known_hosts"),
        format!(
            "[127.0.0.1]:{} {} {}\n",
            inner.port(),
            jump_key[0],
            jump_key[1]
        ),
    )
    .unwrap();
    let err = run(
        &Fleet::new(config(t.clone(), keys.path()))
            .get(Some(BOX))
            .unwrap(),
        "true",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!(
            "HOST KEY CHANGED for [127.0.0.1]:{}",
            inner.port()
        )),
        "{err}"
    );

    // A jump host that is down: an error that names it.
    let jump_port = jump.port();
    drop(jump);
    let err = run(
        &Fleet::new(config(t, state.path())).get(Some(BOX)).unwrap(),
        "true",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!("through jump host 127.0.0.1:{jump_port}"))
            && err.contains("refused"),
        "{err}"
    );
}
