//! Session, fleet and sync over an in-process agent: real commands and real
//! files, no sshd, no agent binary.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_protocol::{ErrorKind, ExecRequest, OutputStream, Request, Response};

use super::{MemoryHost, context};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::session::{Call, CallError, Session};
use crate::sync::{Progress, SyncOptions, pull, push};

/// A session named `name` on `host`, built as production code builds one.
fn session_on(host: &Arc<MemoryHost>, name: &str) -> Session {
    Session::new(host.sandbox(name), Arc::new(context()))
}

fn exec(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some(10_000),
        output_limit: 64 * 1024,
        stream: false,
        progress_ms: None,
        hand_over: None,
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "outpost-memory-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until `check` holds, for at most 3 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let began = Instant::now();
    while !check() {
        assert!(began.elapsed() < Duration::from_secs(3), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `pid` is gone (or a zombie not yet reaped).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Starts `echo $$; exec sleep 30` streamed and returns the call with the
/// shell's pid, read from its first output.
async fn start_sleeper(call: &mut Call) -> i32 {
    let mut out = Vec::new();
    while !out.ends_with(b"\n") {
        match call.next().await.unwrap() {
            Response::Output {
                stream: OutputStream::Stdout,
                data,
            } => out.extend_from_slice(&data),
            other => panic!("unexpected {other:?}"),
        }
    }
    String::from_utf8(out).unwrap().trim().parse().unwrap()
}

fn sleeper() -> Request {
    Request::Exec(ExecRequest {
        stream: true,
        progress_ms: None,
        hand_over: None,
        ..exec("echo $$; exec sleep 30")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_round_trip() {
    let host = MemoryHost::new();
    let session = session_on(&host, "mem");
    let result = session
        .exec(exec("printf out; printf err >&2; exit 3"), |_, _| {})
        .await
        .unwrap();
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(result.stdout.head, b"out");
    assert_eq!(result.stderr.head, b"err");
    assert!(!result.timed_out);

    // Streamed output arrives through the callback.
    let mut streamed = Vec::new();
    let result = session
        .exec(
            ExecRequest {
                stream: true,
                progress_ms: None,
                hand_over: None,
                ..exec("echo one; echo two")
            },
            |stream, data| {
                assert_eq!(stream, OutputStream::Stdout);
                streamed.extend_from_slice(data);
            },
        )
        .await
        .unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(streamed, b"one\ntwo\n");

    let conn = session.current().expect("connected");
    assert_eq!(
        conn.hello.build_hash,
        outpost_agent::serve::IN_PROCESS_BUILD_HASH
    );
    assert_eq!(host.opened(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_timeout_is_timed_out() {
    let session = session_on(&MemoryHost::new(), "mem");
    let began = Instant::now();
    let result = session
        .exec(
            ExecRequest {
                timeout_ms: Some(100),
                ..exec("echo started; sleep 30")
            },
            |_, _| {},
        )
        .await
        .unwrap();
    assert!(result.timed_out);
    assert_eq!(result.exit_code, None);
    assert_eq!(result.stdout.head, b"started\n");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_share_one_connection() {
    let host = MemoryHost::new();
    let session = session_on(&host, "mem");
    let calls = (0..64).map(|i| {
        let session = &session;
        async move {
            let result = session
                .exec(exec(&format!("sleep 0.0$(({i} % 5)); echo {i}")), |_, _| {})
                .await
                .unwrap();
            assert_eq!(result.stdout.head, format!("{i}\n").into_bytes());
        }
    });
    futures::future::join_all(calls).await;
    assert_eq!(host.opened(), 1);
    assert_eq!(host.agents_running(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_cancelled_on_the_agent() {
    let session = session_on(&MemoryHost::new(), "mem");
    let mut call = session.start(sleeper()).await.unwrap();
    let pid = start_sleeper(&mut call).await;
    assert!(!gone(pid));
    drop(call);
    eventually("the command is killed", || gone(pid)).await;
    // The connection stays up and answers.
    let result = session.exec(exec("echo still"), |_, _| {}).await.unwrap();
    assert_eq!(result.stdout.head, b"still\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_fails_calls_in_flight_and_the_next_reconnects() {
    let host = MemoryHost::new();
    let session = session_on(&host, "mem");
    let mut call = session.start(sleeper()).await.unwrap();
    let pid = start_sleeper(&mut call).await;
    let mut other = session.start(sleeper()).await.unwrap();
    let other_pid = start_sleeper(&mut other).await;

    host.sever();
    for call in [&mut call, &mut other] {
        match call.next().await {
            Err(CallError::ConnectionLost(reason)) => assert!(reason.contains("cut"), "{reason}"),
            other => panic!("expected a lost connection, got {other:?}"),
        }
    }
    // The agent saw its input end and stopped what it ran.
    eventually("the commands are killed", || gone(pid) && gone(other_pid)).await;
    eventually("the agent ends", || host.agents_running() == 0).await;

    let result = session.exec(exec("echo again"), |_, _| {}).await.unwrap();
    assert_eq!(result.stdout.head, b"again\n");
    assert_eq!(host.opened(), 2);
    assert_eq!(host.agents_running(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_ends_the_agent() {
    let host = MemoryHost::new();
    let session = session_on(&host, "mem");
    session.exec(exec("true"), |_, _| {}).await.unwrap();
    session.disconnect().await;
    eventually("the agent ends", || host.agents_running() == 0).await;
    session.exec(exec("true"), |_, _| {}).await.unwrap();
    assert_eq!(host.opened(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_refused_in_process() {
    let session = session_on(&MemoryHost::new(), "mem");
    let mut call = session
        .start(Request::JobList {
            state: None,
            limit: 10,
        })
        .await
        .unwrap();
    match call.next().await.unwrap() {
        Response::Error(e) => {
            assert_eq!(e.kind, ErrorKind::Unsupported);
            assert!(e.message.contains("outpost-agent executable"), "{e:?}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_fans_out_and_measures() {
    let (a, b) = (MemoryHost::new(), MemoryHost::new());
    let home = TempDir::new("fleet");
    let config = Config::new(
        vec![a.sandbox("a"), b.sandbox("b")],
        home.path().join("known_hosts"),
    );
    let fleet = Fleet::new(config);
    assert_eq!(fleet.active_name(), "a");

    let names = ["a".to_string(), "b".to_string(), "nope".to_string()];
    let results = fleet.exec_many(&names, &exec("echo hi")).await;
    assert_eq!(results.len(), 3);
    for (name, result) in &results[..2] {
        let result = result.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(result.stdout.head, b"hi\n");
    }
    assert!(matches!(&results[2].1, Err(CallError::Connect(e)) if e.contains("unknown sandbox")));

    let rows = fleet.list(true, Duration::from_secs(5)).await;
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert!(row.connection_alive, "{row:?}");
        let resources = row.resources.expect("resources");
        let json = serde_json::to_value(&resources).unwrap();
        assert!(json.is_object());
    }
    assert_eq!((a.opened(), b.opened()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_sandbox_is_a_view_of_its_hosts_connection() {
    let host = MemoryHost::new();
    let home = TempDir::new("isolated");
    let config = Config::new(vec![host.sandbox("mem")], home.path().join("known_hosts"));
    let fleet = Fleet::new(config);
    let sbx = fleet.get(Some("mem/sbx-1")).unwrap();
    assert_eq!(sbx.name(), "mem/sbx-1");
    assert!(Arc::ptr_eq(&sbx, &fleet.get(Some("mem/sbx-1")).unwrap()));
    let (on, id) = sbx.isolated_in().unwrap();
    assert_eq!((on.name(), id), ("mem", "sbx-1"));
    assert_eq!(fleet.isolated("mem/sbx-1").unwrap().1, "sbx-1");
    let err = |name: &str| fleet.get(Some(name)).err().unwrap();
    assert!(fleet.isolated("mem").err().unwrap().contains("HOST/ID"));
    let err_bad = err("mem/Bad_Id");
    assert!(err_bad.contains("bad sandbox id"), "{err_bad}");
    let err = err("nope/sbx-1");
    assert!(
        err.contains("unknown sandbox") && err.contains("available: mem"),
        "{err}"
    );

    // A command for the sandbox goes inside it: this in-process agent has
    // no sandboxes, so it refuses it rather than running it on the host.
    let result = sbx.exec(exec("echo on-the-host"), |_, _| {}).await;
    assert!(matches!(&result, Err(CallError::Agent(_))), "{result:?}");
    let conn = sbx.connection().await.unwrap();
    assert_eq!(conn.sandbox(), Some("sbx-1"));
    assert_eq!(
        fleet
            .get(Some("mem"))
            .unwrap()
            .connection()
            .await
            .unwrap()
            .sandbox(),
        None
    );
    // A sandbox's GPUs come with it; the fleet takes no lease for one.
    let refused = fleet
        .reserve_gpus(
            Some("mem/sbx-1"),
            outpost_protocol::GpuLeaseRequest {
                count: 1,
                min_free_mem_bytes: 0,
            },
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("create_sandbox"), "{refused}");
    // A session's GPU leases are its host's: sent as they are.
    let lease = sbx
        .lease(outpost_protocol::GpuLeaseRequest {
            count: 1,
            min_free_mem_bytes: 0,
        })
        .await;
    if let Err(e) = &lease {
        assert!(!e.to_string().contains("sandbox"), "{e}");
    }
    // One connection, the host's, which the sandbox's disconnect leaves be.
    sbx.disconnect().await;
    let on_host = fleet.get(Some("mem")).unwrap();
    assert_eq!(on_host.state(), crate::session::SessionState::Connected);
    on_host.exec(exec("true"), |_, _| {}).await.unwrap();
    assert_eq!(host.opened(), 1);
}

/// Every path under `root` with what it is: file content and mode, link
/// target, or directory.
fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push((rel, format!("link {}", target.display())));
            } else if meta.is_dir() {
                out.push((rel, "dir".into()));
                walk(root, &path, out);
            } else {
                let content = std::fs::read(&path).unwrap();
                let mode = meta.permissions().mode() & 0o777;
                out.push((rel, format!("file {mode:o} {content:?}")));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_and_pull_a_small_tree() {
    let scratch = TempDir::new("sync");
    let src = scratch.path().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(src.join("sub/b.bin"), vec![7u8; 100_000]).unwrap();
    std::fs::write(src.join("sub/deeper/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(
        src.join("sub/deeper/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    let remote = scratch.path().join("remote");
    let remote_str = remote.to_str().unwrap();

    let session = session_on(&MemoryHost::new(), "mem");
    let options = SyncOptions::default();
    let report = push(
        &session,
        &src,
        remote_str,
        &options,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(report.files_sent, 3, "{report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert_eq!(tree(&remote), tree(&src));

    // Nothing changed: nothing is sent again.
    let again = push(
        &session,
        &src,
        remote_str,
        &options,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(again.files_sent, 0, "{again:?}");

    // A change made on the host comes back with a pull.
    let result = session
        .exec(
            exec(&format!("echo changed > '{remote_str}/sub/new.txt'")),
            |_, _| {},
        )
        .await
        .unwrap();
    assert_eq!(result.exit_code, Some(0));
    let back = scratch.path().join("back");
    let report = pull(
        &session,
        remote_str,
        &back,
        &options,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(report.files_sent, 4, "{report:?}");
    assert_eq!(tree(&back), tree(&remote));
    assert_eq!(
        std::fs::read_to_string(back.join("sub/new.txt")).unwrap(),
        "changed\n"
    );
}

/// A sync's rescan of a tree the host still has as it was comes back as a
/// digest, and the entries kept from before, which are what a full scan
/// gives; a change brings only what changed, and a digest the host did not
/// keep brings the whole list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescan_of_an_unchanged_tree_sends_only_its_digest() {
    use outpost_protocol::{ScanRequest, TreeEntry};
    let scratch = TempDir::new("rescan");
    let root = scratch.path().join("tree");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("sub/f{i}")), format!("{i}\n")).unwrap();
    }
    let session = session_on(&MemoryHost::new(), "mem");
    let request = ScanRequest {
        root: root.to_str().unwrap().to_string(),
        hashes: true,
        recursive: true,
        ..ScanRequest::default()
    };
    let scan = || crate::sync::scan_remote(&session, request.clone());
    let (first, summary) = scan().await.unwrap();
    assert_eq!(first.len(), 51);
    assert!(
        summary.digest.is_some() && !summary.unchanged,
        "{summary:?}"
    );
    let (again, summary2) = scan().await.unwrap();
    assert!(summary2.unchanged, "{summary2:?}");
    assert_eq!((again, summary2.digest), (first.clone(), summary.digest));

    // The agent itself sends the list to a caller that names another digest.
    let conn = session.connection().await.unwrap();
    let raw = |known: Option<[u8; 32]>| {
        let mut call = conn
            .start(Request::Scan(ScanRequest {
                known,
                ..request.clone()
            }))
            .unwrap();
        async move {
            let mut entries: Vec<TreeEntry> = Vec::new();
            loop {
                match call.next().await.unwrap() {
                    Response::Entries(batch) => entries.extend(batch),
                    Response::ScanDone(summary) => return (entries, summary),
                    other => panic!("{other:?}"),
                }
            }
        }
    };
    let (sent, done) = raw(Some([0; 32])).await;
    assert!(!done.unchanged && sent == first, "{done:?}");
    let (sent, done) = raw(summary.digest).await;
    assert!(done.unchanged && sent.is_empty(), "{done:?}");

    // One byte more in one file: that entry alone comes, and what the
    // controller makes of it is the whole new scan, with a new digest.
    std::fs::write(root.join("sub/f7"), "77\n").unwrap();
    let (changed, summary3) = scan().await.unwrap();
    assert!(
        summary3.delta && summary3.digest != summary.digest,
        "{summary3:?}"
    );
    assert_eq!(changed.len(), 51);
    assert_ne!(changed, first);
    let (sent, done) = raw(None).await;
    assert!(!done.delta && sent == changed, "{done:?}");
    let (sent, done) = raw(summary.digest).await;
    assert!(
        !done.delta && sent == changed,
        "a digest the host no longer keeps: {done:?}"
    );

    // A file gone and one new: the host sends the new one and its
    // directory (whose mtime moved) and names the gone one.
    std::fs::remove_file(root.join("sub/f3")).unwrap();
    std::fs::write(root.join("sub/g"), "g\n").unwrap();
    let (sent, done) = raw(summary3.digest).await;
    assert!(done.delta, "{done:?}");
    let mut names: Vec<&[u8]> = sent.iter().map(|e| e.path.as_slice()).collect();
    names.sort();
    assert_eq!(names, [b"sub".as_slice(), b"sub/g"]);
    assert_eq!(done.removed, [b"sub/f3".to_vec()]);
    // The controller's kept scan is a step behind the host's now: it gets
    // the whole list, and it is the tree as it is.
    let (again, summary4) = scan().await.unwrap();
    assert!(!summary4.delta && !summary4.unchanged, "{summary4:?}");
    assert_eq!(again.len(), 51);
    assert!(again.iter().any(|e| e.path == b"sub/g") && !again.iter().any(|e| e.path == b"sub/f3"));
}

/// Counts the opens of one file from its creation on (inotify), to tell a
/// scan that took a hash from its stat cache from one that read the file.
struct OpenWatch(std::os::fd::OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> OpenWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify: {}", std::io::Error::last_os_error());
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let wd = unsafe { libc::inotify_add_watch(fd_of(&fd), c.as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0, "inotify: {}", std::io::Error::last_os_error());
        OpenWatch(fd)
    }

    fn opens(&self) -> usize {
        // A watch on a file names nothing: every event is the bare struct.
        let mut buf = [0u8; 4096];
        let mut events = 0;
        loop {
            let n = unsafe { libc::read(fd_of(&self.0), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return events;
            }
            events += n as usize / std::mem::size_of::<libc::inotify_event>();
        }
    }
}

fn fd_of(fd: &std::os::fd::OwnedFd) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(fd)
}

/// A large file a sync wrote serves the next sync's scan of that side from
/// the stat cache, unread, on the host (a push) and here (a pull); and when
/// it changes at the source, a pull still sends only a delta, the local
/// copy's chunk list read then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_files_a_sync_wrote_are_not_read_again() {
    let scratch = TempDir::new("written");
    let src = scratch.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut big: Vec<u8> = (0..3 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(src.join("big.bin"), &big).unwrap();
    std::fs::write(src.join("small.txt"), "one\n").unwrap();
    // Older than the stat cache's racy window, as most files are.
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    for name in ["big.bin", "small.txt"] {
        let file = std::fs::File::options().write(true).open(src.join(name));
        file.unwrap().set_modified(an_hour_ago).unwrap();
    }
    let remote = scratch.path().join("remote");
    let remote_str = remote.to_str().unwrap();
    let back = scratch.path().join("back");
    let session = session_on(&MemoryHost::new(), "mem");
    let options = SyncOptions::default();
    let progress = || Arc::new(Progress::default());

    let report = push(&session, &src, remote_str, &options, progress()).await;
    assert_eq!(report.unwrap().files_sent, 2);
    let watch = OpenWatch::new(&remote.join("big.bin"));
    std::fs::write(src.join("small.txt"), "two\n").unwrap();
    let report = push(&session, &src, remote_str, &options, progress()).await;
    assert_eq!(report.unwrap().files_sent, 1);
    assert_eq!(
        watch.opens(),
        0,
        "the host's scan read the large file again"
    );

    let report = pull(&session, remote_str, &back, &options, progress()).await;
    assert_eq!(report.unwrap().files_sent, 2);
    let watch = OpenWatch::new(&back.join("big.bin"));
    std::fs::write(remote.join("small.txt"), "three\n").unwrap();
    let report = pull(&session, remote_str, &back, &options, progress()).await;
    assert_eq!(report.unwrap().files_sent, 1);
    assert_eq!(watch.opens(), 0, "the local scan read the large file again");

    big[1 << 20..(1 << 20) + 4096].fill(0xab);
    std::fs::write(remote.join("big.bin"), &big).unwrap();
    let report = pull(&session, remote_str, &back, &options, progress())
        .await
        .unwrap();
    assert_eq!(report.files_sent, 1, "{report:?}");
    assert!(report.bytes_sent < 256 * 1024, "not a delta: {report:?}");
    assert_eq!(std::fs::read(back.join("big.bin")).unwrap(), big);
    assert!(watch.opens() > 0, "the local copy was never read");
}
