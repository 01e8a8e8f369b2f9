//! Tree sync against a real sshd, both ways: byte-exact trees (modes, mtimes,
//! symlinks, empty dirs, odd names), deltas, per-path problems, a full disk,
//! cancellation (and resuming after it), and delete_extras' limits.

// Tests run on a multi-threaded runtime: the harness blocks while the
// controller's background tasks must keep running.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use common::*;
use outpost::sync::{self, Progress, SyncOptions};
use outpost_e2e::{Sshd, TEST_USER, TempDir, noise};

fn write(root: &Path, rel: &[u8], content: &[u8], mode: u32) -> PathBuf {
    let path = root.join(OsStr::from_bytes(rel));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(when)
        .unwrap();
    path
}

/// A tree with everything that tends to go wrong.
fn sample_tree(root: &Path) {
    write(root, b"README.md", b"# hello\n", 0o644);
    write(root, b"bin/run.sh", b"#!/bin/sh\necho run\n", 0o755);
    write(root, b"secret/key", b"k", 0o600);
    write(root, b"empty-file", b"", 0o644);
    write(root, b"with space/and\nnewline", b"odd\n", 0o644);
    write(root, b"bad\xffbyte.txt", b"latin-1 name\n", 0o640);
    write(root, b"data/big.bin", &noise(5 << 20, 7), 0o644);
    std::fs::create_dir_all(root.join("empty/dir")).unwrap();
    std::os::unix::fs::symlink("README.md", root.join("link-to-readme")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link-outside")).unwrap();
    std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();
    // Excluded by default: never sent.
    write(root, b".git/HEAD", b"ref: main\n", 0o644);
    write(root, b"node_modules/x/index.js", b"x\n", 0o644);
}

fn without_default_excludes(
    snap: std::collections::BTreeMap<Vec<u8>, String>,
) -> std::collections::BTreeMap<Vec<u8>, String> {
    snap.into_iter()
        .filter(|(k, _)| !k.starts_with(b".git") && !k.starts_with(b"node_modules"))
        .collect()
}

/// Makes `path` (and its parents up to /tmp/outpost-e2e-*) the test user's.
fn give_to_test_user(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", &format!("{TEST_USER}:{TEST_USER}")])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

struct Setup {
    sshd: Sshd,
    _state: TempDir,
    fleet: outpost::fleet::Fleet,
}

fn setup(name: &str) -> Setup {
    setup_with(Sshd::start(), name)
}

/// A host behind a link slowed to `kbit` once connected (the agent goes up
/// at full speed), so a transfer takes seconds whatever the machine's load.
async fn setup_slow(name: &str, kbit: u32) -> Setup {
    let s = setup_with(Sshd::start_in_netns(), name);
    run(&s.session(), "true").await.unwrap();
    s.sshd.netns().unwrap().limit_uplink(kbit);
    s
}

fn setup_with(sshd: Sshd, name: &str) -> Setup {
    let state = scratch(name);
    let fleet = fleet(&sshd, state.path());
    Setup {
        sshd,
        _state: state,
        fleet,
    }
}

impl Setup {
    fn remote(&self, rel: &str) -> PathBuf {
        self.sshd.remote_dir().join(rel)
    }

    fn session(&self) -> Arc<outpost::session::Session> {
        self.fleet.get(Some(BOX)).unwrap()
    }

    async fn push(&self, local: &Path, rel: &str, options: &SyncOptions) -> sync::SyncReport {
        sync::push(
            &self.session(),
            local,
            &self.remote(rel).display().to_string(),
            options,
            Default::default(),
        )
        .await
        .unwrap()
    }

    /// Starts a push of `local` to `rel` on its own task; its progress is
    /// returned for the test to watch (and cancel).
    fn push_in_background(
        &self,
        local: &Path,
        rel: &str,
    ) -> (
        tokio::task::JoinHandle<Result<sync::SyncReport, sync::SyncError>>,
        Arc<Progress>,
    ) {
        let progress = Arc::new(Progress::default());
        let (session, watched) = (self.session(), progress.clone());
        let (local, remote) = (local.to_path_buf(), self.remote(rel).display().to_string());
        let push = tokio::spawn(async move {
            sync::push(&session, &local, &remote, &SyncOptions::default(), watched).await
        });
        (push, progress)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_round_trip_byte_exact_and_no_op_sends_nothing() {
    let s = setup("sync-roundtrip");
    let src = TempDir::new("sync-src");
    sample_tree(src.path());
    let options = SyncOptions::default();

    let report = s.push(src.path(), "tree", &options).await;
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let expected = without_default_excludes(snapshot(src.path()));
    assert_eq!(snapshot(&s.remote("tree")), expected);
    assert!(leftovers(&s.remote("tree")).is_empty());

    // Nothing changed: nothing is sent.
    let again = s.push(src.path(), "tree", &options).await;
    assert_eq!(again.files_sent, 0, "{again:?}");
    assert_eq!(again.bytes_sent, 0);
    assert!(again.files_unchanged > 0);
    // The host's stat cache holds the small files the push committed (a
    // scan alone would not store them: their ctimes, from the renames, are
    // too fresh to trust), so later scans do not read them again.
    let caches: Vec<_> = std::fs::read_dir(s.sshd.remote_dir().join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(caches.len(), 1, "{caches:?}");
    let cached = outpost_treesync::cache::StatCache::load(&caches[0]).len();
    assert!(cached >= 6, "{cached} files in the host's stat cache");

    // And back: a pull into an empty directory reproduces the same tree.
    let back = TempDir::new("sync-back");
    let report = sync::pull(
        &s.session(),
        &s.remote("tree").display().to_string(),
        back.path(),
        &options,
        Default::default(),
    )
    .await
    .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(snapshot(back.path()), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_edit_in_a_large_file_sends_only_its_chunks() {
    let s = setup("sync-delta");
    let src = TempDir::new("sync-delta-src");
    let mut content = noise(20 << 20, 11);
    write(src.path(), b"model.bin", &content, 0o644);
    s.push(src.path(), "d", &SyncOptions::default()).await;

    let mid = content.len() / 2;
    content[mid..mid + 4096].copy_from_slice(&noise(4096, 99));
    write(src.path(), b"model.bin", &content, 0o644);
    let report = s.push(src.path(), "d", &SyncOptions::default()).await;
    assert_eq!(report.files_sent, 1);
    assert!(
        report.bytes_sent < (20 << 20) / 100,
        "sent {} bytes for a 4 KiB edit",
        report.bytes_sent
    );
    assert_eq!(std::fs::read(s.remote("d/model.bin")).unwrap(), content);

    // The same delta works when pulling.
    let local = TempDir::new("sync-delta-pull");
    let mut stale = content.clone();
    stale[100..4196].copy_from_slice(&noise(4096, 5));
    write(local.path(), b"model.bin", &stale, 0o644);
    let report = sync::pull(
        &s.session(),
        &s.remote("d").display().to_string(),
        local.path(),
        &SyncOptions::default(),
        Default::default(),
    )
    .await
    .unwrap();
    assert!(report.bytes_sent < (20 << 20) / 100, "{report:?}");
    assert_eq!(
        std::fs::read(local.path().join("model.bin")).unwrap(),
        content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_is_one_problem_and_the_rest_syncs() {
    let s = setup("sync-perm");
    let src = TempDir::new("sync-perm-src");
    write(src.path(), b"ok/a.txt", b"a", 0o644);
    write(src.path(), b"locked/b.txt", b"b", 0o644);
    // On the host, `locked/` belongs to root: the SSH user cannot write in it.
    std::fs::create_dir_all(s.remote("p/locked")).unwrap();
    give_to_test_user(&s.remote("p"));
    let locked = s.remote("p/locked");
    Command::new("chown")
        .arg("root:root")
        .arg(&locked)
        .status()
        .unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();

    let report = s.push(src.path(), "p", &SyncOptions::default()).await;
    assert_eq!(std::fs::read(s.remote("p/ok/a.txt")).unwrap(), b"a");
    assert!(!s.remote("p/locked/b.txt").exists());
    // The file is a problem (and so is the root-owned directory's mode); the
    // rest arrived.
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("locked/b.txt") && p.contains("ermission")),
        "{:?}",
        report.problems
    );
    assert!(
        report.problems.iter().all(|p| p.starts_with("locked")),
        "{:?}",
        report.problems
    );

    // Pulling a file the SSH user cannot read: reported, the rest pulled.
    std::fs::write(s.remote("p/root-only"), b"secret").unwrap();
    std::fs::set_permissions(
        s.remote("p/root-only"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let local = TempDir::new("sync-perm-pull");
    let report = sync::pull(
        &s.session(),
        &s.remote("p").display().to_string(),
        local.path(),
        &SyncOptions::default(),
        Default::default(),
    )
    .await
    .unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("root-only")),
        "{:?}",
        report.problems
    );
    assert_eq!(std::fs::read(local.path().join("ok/a.txt")).unwrap(), b"a");
    assert!(!local.path().join("root-only").exists());

    // A source directory the scan cannot read is not an extra at the target:
    // delete_extras must leave the target's copy alone.
    let hidden = s.remote("p/hidden");
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
    write(local.path(), b"hidden/precious.txt", b"keep me", 0o644);
    let options = SyncOptions {
        delete_extras: true,
        ..Default::default()
    };
    let report = sync::pull(
        &s.session(),
        &s.remote("p").display().to_string(),
        local.path(),
        &options,
        Default::default(),
    )
    .await
    .unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("hidden")),
        "{:?}",
        report.problems
    );
    assert!(
        local.path().join("hidden/precious.txt").exists(),
        "deleted what the scan could not see"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_clear_problem_with_no_partial_file() {
    let s = setup("sync-full");
    let target = s.remote("small");
    std::fs::create_dir_all(&target).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&target)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs (needs root)");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(target.clone());
    give_to_test_user(&target);

    let src = TempDir::new("sync-full-src");
    write(src.path(), b"fits.txt", b"small\n", 0o644);
    write(src.path(), b"huge.bin", &noise(3 << 20, 3), 0o644);
    let report = s.push(src.path(), "small", &SyncOptions::default()).await;
    assert_eq!(std::fs::read(target.join("fits.txt")).unwrap(), b"small\n");
    assert!(
        !target.join("huge.bin").exists(),
        "a partial file reached its final path"
    );
    assert!(leftovers(&target).is_empty(), "{:?}", leftovers(&target));
    let problem = report.problems.join("\n");
    assert!(
        problem.contains("huge.bin") && problem.to_lowercase().contains("space"),
        "{problem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_leaves_nothing_half_written_and_a_rerun_finishes() {
    // 30 MiB over 16 Mbit/s takes 15 s: the cancel lands mid-push even
    // when a loaded machine is slow to notice the first files.
    let s = setup_slow("sync-cancel", 16_000).await;
    let src = TempDir::new("sync-cancel-src");
    for i in 0..120u64 {
        write(
            src.path(),
            format!("f{i:03}.bin").as_bytes(),
            &noise(256 << 10, i + 1),
            0o644,
        );
    }
    let (push, progress) = s.push_in_background(src.path(), "c");
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.files_done.load(Ordering::Relaxed) >= 5
    }));
    progress.cancelled.store(true, Ordering::Relaxed);
    let result = push.await.unwrap();
    assert!(
        matches!(result, Err(sync::SyncError::Cancelled)),
        "{result:?}"
    );

    // Whatever arrived is complete; nothing half-written anywhere.
    let target = s.remote("c");
    let arrived: Vec<_> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(leftovers(&target).is_empty(), "{:?}", leftovers(&target));
    for path in &arrived {
        let name = path.file_name().unwrap();
        assert_eq!(
            std::fs::read(path).unwrap(),
            std::fs::read(src.path().join(name)).unwrap()
        );
    }
    assert!(arrived.len() < 120, "cancel came too late to test anything");

    // The rerun sends only what is missing.
    s.sshd.netns().unwrap().unlimit_uplink();
    let report = s.push(src.path(), "c", &SyncOptions::default()).await;
    assert_eq!(report.files_sent as usize, 120 - arrived.len());
    assert_eq!(
        without_default_excludes(snapshot(&target)),
        without_default_excludes(snapshot(src.path()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_extras_stays_inside_the_target_and_spares_excluded_paths() {
    let s = setup("sync-delete");
    let src = TempDir::new("sync-delete-src");
    write(src.path(), b"keep.txt", b"keep", 0o644);
    std::fs::create_dir_all(s.remote("t/old/deep")).unwrap();
    std::fs::write(s.remote("t/old/deep/x"), b"x").unwrap();
    std::fs::write(s.remote("t/extra.txt"), b"extra").unwrap();
    std::fs::create_dir_all(s.remote("t/node_modules/pkg")).unwrap();
    std::fs::write(s.remote("t/node_modules/pkg/i.js"), b"i").unwrap();
    std::fs::create_dir_all(s.remote("t-sibling")).unwrap();
    std::fs::write(s.remote("t-sibling/y"), b"y").unwrap();
    give_to_test_user(&s.remote("t"));
    give_to_test_user(&s.remote("t-sibling"));

    let options = SyncOptions {
        delete_extras: true,
        ..Default::default()
    };
    let report = s.push(src.path(), "t", &options).await;
    assert_eq!(report.deleted, 2, "{report:?}");
    assert!(!s.remote("t/old").exists() && !s.remote("t/extra.txt").exists());
    assert!(
        s.remote("t/node_modules/pkg/i.js").exists(),
        "an excluded path was deleted"
    );
    assert!(
        s.remote("t-sibling/y").exists(),
        "a path outside the target was deleted"
    );

    // Emptying a non-trivial target needs force.
    for i in 0..20 {
        std::fs::write(s.remote(&format!("t/f{i}")), b"f").unwrap();
    }
    give_to_test_user(&s.remote("t"));
    let empty = TempDir::new("sync-empty");
    let err = sync::push(
        &s.session(),
        empty.path(),
        &s.remote("t").display().to_string(),
        &options,
        Default::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("force"), "{err}");
    assert!(s.remote("t/f0").exists());

    // dry_run plans without touching anything.
    let dry = SyncOptions {
        dry_run: true,
        delete_extras: true,
        force: true,
        ..Default::default()
    };
    let report = s.push(empty.path(), "t", &dry).await;
    assert!(report.dry_run && report.deleted >= 20, "{report:?}");
    assert!(report.would_delete.iter().any(|p| p == "f0"), "{report:?}");
    assert!(s.remote("t/f0").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_calls_stay_fast_during_a_large_push() {
    let s = setup("sync-busy");
    let src = TempDir::new("sync-busy-src");
    for i in 0..4u64 {
        write(
            src.path(),
            format!("big{i}.bin").as_bytes(),
            &noise(16 << 20, 40 + i),
            0o644,
        );
    }
    let session = s.session();
    run(&session, "true").await.unwrap();
    let push = {
        let session = session.clone();
        let (local, remote) = (
            src.path().to_path_buf(),
            s.remote("busy").display().to_string(),
        );
        tokio::spawn(async move {
            sync::push(
                &session,
                &local,
                &remote,
                &SyncOptions::default(),
                Default::default(),
            )
            .await
        })
    };
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while !push.is_finished() {
        let started = std::time::Instant::now();
        run(&session, "true").await.unwrap();
        slowest = slowest.max(started.elapsed());
        calls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = push.await.unwrap().unwrap();
    assert_eq!(report.files_sent, 4);
    assert!(calls > 0);
    // Generous: a call behind the whole 64 MiB push would take seconds.
    assert!(
        slowest < Duration::from_secs(2),
        "a call took {slowest:?} during the push"
    );
}

/// SIGKILLs the agents (`serve`) this sshd's connections run.
fn kill_agents(sshd: &Sshd) {
    let agents: Vec<i32> =
        outpost_e2e::pids_with_cmdline(&sshd.remote_dir().join("agents").display().to_string())
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.ends_with(b"serve\0"))
            })
            .collect();
    assert!(!agents.is_empty());
    for pid in agents {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn big_tree(name: &str, seed: u64) -> TempDir {
    let src = TempDir::new(name);
    for i in 0..2u64 {
        write(
            src.path(),
            format!("big{i}.bin").as_bytes(),
            &noise(32 << 20, seed + i),
            0o644,
        );
    }
    src
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_cut_short_by_a_killed_agent_resumes_where_it_stopped() {
    let s = setup("sync-killed");
    let src = big_tree("sync-killed-src", 60);
    let (push, progress) = s.push_in_background(src.path(), "k");
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 8 << 20
    }));
    kill_agents(&s.sshd);
    assert!(push.await.unwrap().is_err());

    // Only staging files are left, and no final path holds a partial file.
    let target = s.remote("k");
    assert!(
        !leftovers(&target).is_empty(),
        "killed too late to test anything"
    );
    for name in ["big0.bin", "big1.bin"] {
        if let Ok(content) = std::fs::read(target.join(name)) {
            assert_eq!(content, std::fs::read(src.path().join(name)).unwrap());
        }
    }
    // The next push takes what arrived from the partial file and sends the
    // rest; nothing is left behind.
    let report = s.push(src.path(), "k", &SyncOptions::default()).await;
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    // What was resumed is not sent again (a tag byte per part is all that
    // is added to incompressible data).
    assert!(
        report.bytes_sent + report.bytes_resumed <= (64 << 20) + (64 << 10),
        "{report:?}"
    );
    assert!(leftovers(&target).is_empty(), "{:?}", leftovers(&target));
    assert_eq!(
        without_default_excludes(snapshot(&target)),
        without_default_excludes(snapshot(src.path()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_cut_short_by_a_killed_agent_resumes_where_it_stopped() {
    let s = setup("sync-killed-pull");
    let src = big_tree("sync-killed-pull-src", 70);
    s.push(src.path(), "p", &SyncOptions::default()).await;
    let back = TempDir::new("sync-killed-pull-back");
    let progress = Arc::new(Progress::default());
    let pull = {
        let (session, progress) = (s.session(), progress.clone());
        let (remote, local) = (
            s.remote("p").display().to_string(),
            back.path().to_path_buf(),
        );
        tokio::spawn(async move {
            sync::pull(&session, &remote, &local, &SyncOptions::default(), progress).await
        })
    };
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 8 << 20
    }));
    kill_agents(&s.sshd);
    assert!(pull.await.unwrap().is_err());
    assert!(
        !leftovers(back.path()).is_empty(),
        "killed too late to test anything"
    );

    let report = sync::pull(
        &s.session(),
        &s.remote("p").display().to_string(),
        back.path(),
        &SyncOptions::default(),
        Default::default(),
    )
    .await
    .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    assert!(
        leftovers(back.path()).is_empty(),
        "{:?}",
        leftovers(back.path())
    );
    assert_eq!(
        without_default_excludes(snapshot(back.path())),
        without_default_excludes(snapshot(src.path()))
    );
}

/// Bytes of the files of `src` that are not yet at their final path in
/// `target` (with their full content).
fn missing_bytes(src: &Path, target: &Path) -> u64 {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| {
            let there = std::fs::read(target.join(path.file_name().unwrap()));
            there.ok() != Some(std::fs::read(path).unwrap())
        })
        .map(|path| std::fs::metadata(path).unwrap().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_push_resumes_where_it_stopped() {
    let s = setup("sync-cancel-big");
    let src = big_tree("sync-cancel-big-src", 80);
    let (push, progress) = s.push_in_background(src.path(), "cb");
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 8 << 20
    }));
    progress.cancelled.store(true, Ordering::Relaxed);
    let result = push.await.unwrap();
    assert!(
        matches!(result, Err(sync::SyncError::Cancelled)),
        "{result:?}"
    );

    // Like a transfer cut short: partial files beside their targets, never
    // at a final path.
    let target = s.remote("cb");
    assert!(
        !leftovers(&target).is_empty(),
        "cancelled too late to test anything"
    );
    for name in ["big0.bin", "big1.bin"] {
        if let Ok(content) = std::fs::read(target.join(name)) {
            assert_eq!(content, std::fs::read(src.path().join(name)).unwrap());
        }
    }
    // Running it again sends only what had not arrived.
    let missing = missing_bytes(src.path(), &target);
    let report = s.push(src.path(), "cb", &SyncOptions::default()).await;
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    let moved = report.bytes_sent + report.bytes_resumed;
    assert!(
        moved + (64 << 10) >= missing && moved <= missing + (64 << 10),
        "{missing} bytes missing: {report:?}"
    );
    assert!(leftovers(&target).is_empty(), "{:?}", leftovers(&target));
    assert_eq!(
        without_default_excludes(snapshot(&target)),
        without_default_excludes(snapshot(src.path()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_pull_resumes_where_it_stopped() {
    let s = setup("sync-cancel-pull");
    let src = big_tree("sync-cancel-pull-src", 90);
    s.push(src.path(), "cp", &SyncOptions::default()).await;
    let back = TempDir::new("sync-cancel-pull-back");
    let pull_in_background = |progress: Arc<Progress>| {
        let session = s.session();
        let (remote, local) = (
            s.remote("cp").display().to_string(),
            back.path().to_path_buf(),
        );
        tokio::spawn(async move {
            sync::pull(&session, &remote, &local, &SyncOptions::default(), progress).await
        })
    };
    let progress = Arc::new(Progress::default());
    let pull = pull_in_background(progress.clone());
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 8 << 20
    }));
    progress.cancelled.store(true, Ordering::Relaxed);
    let result = pull.await.unwrap();
    assert!(
        matches!(result, Err(sync::SyncError::Cancelled)),
        "{result:?}"
    );
    assert!(
        !leftovers(back.path()).is_empty(),
        "cancelled too late to test anything"
    );

    let missing = missing_bytes(src.path(), back.path());
    let report = pull_in_background(Default::default())
        .await
        .unwrap()
        .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.bytes_resumed >= 4 << 20, "{report:?}");
    let moved = report.bytes_sent + report.bytes_resumed;
    assert!(
        moved + (64 << 10) >= missing && moved <= missing + (64 << 10),
        "{missing} bytes missing: {report:?}"
    );
    assert!(
        leftovers(back.path()).is_empty(),
        "{:?}",
        leftovers(back.path())
    );
    assert_eq!(
        without_default_excludes(snapshot(back.path())),
        without_default_excludes(snapshot(src.path()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_survives_a_slow_uplink() {
    // At 2 Mbit/s a 2 MiB request takes over 8 s to cross, and the agent
    // answers it only then: the silence must not be taken for a dead host.
    let sshd = Sshd::start_in_netns();
    let state = scratch("sync-slow");
    let fleet = fleet(&sshd, state.path());
    let session = fleet.get(Some(BOX)).unwrap();
    // Connected (agent uploaded) at full speed first.
    run(&session, "true").await.unwrap();
    sshd.netns().unwrap().limit_uplink(2_000);
    let src = TempDir::new("sync-slow-src");
    write(src.path(), b"model.bin", &noise(2 << 20, 5), 0o644);
    let remote = sshd.remote_dir().join("slow");
    let report = sync::push(
        &session,
        src.path(),
        &remote.display().to_string(),
        &SyncOptions::default(),
        Default::default(),
    )
    .await
    .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        std::fs::read(remote.join("model.bin")).unwrap(),
        std::fs::read(src.path().join("model.bin")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_frozen_mid_push_is_given_up() {
    // While bulk data is going out the heartbeat waits longer (see the slow
    // uplink test), but a host that stops taking data is still given up.
    let s = setup("sync-frozen");
    let src = TempDir::new("sync-frozen-src");
    for i in 0..4u64 {
        write(
            src.path(),
            format!("big{i}.bin").as_bytes(),
            &noise(32 << 20, 80 + i),
            0o644,
        );
    }
    let (push, progress) = s.push_in_background(src.path(), "f");
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 4 << 20
    }));
    let frozen_at = std::time::Instant::now();
    let stopped = s.sshd.stop_connections();
    assert!(!stopped.is_empty());
    let result = push.await.unwrap();
    let given_up_after = frozen_at.elapsed();
    s.sshd.continue_pids(&stopped);
    match result {
        Err(sync::SyncError::Call(e)) => {
            assert!(e.is_connection(), "{e:?}");
            assert!(e.to_string().contains("no answer from the host"), "{e}");
        }
        other => panic!("expected a lost connection, got {other:?}"),
    }
    assert!(
        given_up_after < Duration::from_secs(20),
        "took {given_up_after:?}"
    );
    // The next call connects afresh.
    s.sshd.kill_connections();
    run(&s.session(), "true").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_do_not_queue_behind_a_push_on_a_slow_uplink() {
    // At 16 Mbit/s the push keeps 16 MiB of requests in flight, 8 s of
    // sending: a command sent meanwhile must not wait for all of it.
    let sshd = Sshd::start_in_netns();
    let state = scratch("sync-lanes");
    let fleet = fleet(&sshd, state.path());
    let session = fleet.get(Some(BOX)).unwrap();
    run(&session, "true").await.unwrap();
    sshd.netns().unwrap().limit_uplink(16_000);
    let src = TempDir::new("sync-lanes-src");
    for i in 0..4u64 {
        write(
            src.path(),
            format!("part{i}.bin").as_bytes(),
            &noise(4 << 20, 90 + i),
            0o644,
        );
    }
    let progress = Arc::new(Progress::default());
    let push = {
        let (session, progress) = (session.clone(), progress.clone());
        let remote = sshd.remote_dir().join("lanes").display().to_string();
        let local = src.path().to_path_buf();
        tokio::spawn(async move {
            sync::push(&session, &local, &remote, &SyncOptions::default(), progress).await
        })
    };
    // Once the first part is answered, the pipeline is full.
    assert!(outpost_e2e::wait_until(Duration::from_secs(30), || {
        progress.bytes_done.load(Ordering::Relaxed) >= 2 << 20
    }));
    let started = std::time::Instant::now();
    run(&session, "true").await.unwrap();
    let took = started.elapsed();
    let report = push.await.unwrap().unwrap();
    assert_eq!(report.files_sent, 4);
    assert!(
        took < Duration::from_millis(3500),
        "a command took {took:?}"
    );
}
