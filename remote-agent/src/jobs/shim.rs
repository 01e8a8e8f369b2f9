//! `outpost-agent shim <job dir> [--resume]`: the supervisor of one job.
//!
//! One small process per job, in the pattern of conmon: it owns nothing but
//! its job, so the job's exit status is known exactly whatever else dies. It
//! leaves the daemon's session, ignores the signals a dying session or
//! terminal sends, starts `bash -c <command>` (its own session and process
//! group, output appended to the log through one descriptor), waits for it
//! (terminating its whole tree at the spec's `timeout_ms`), and writes the
//! exit record durably before recording the end event.
//!
//! A job with `split_streams` (an `exec_bash` that may outlast its caller)
//! writes into two pipes instead, which the shim copies both to the merged
//! log and to a file per stream, so the caller gets stdout and stderr apart
//! as an inline exec would give them.
//!
//! A shim never talks to anyone: the daemon and `serve` learn everything from
//! the files it writes (see [`super::store`]).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::store::{self, ExitRecord, Record};
use crate::paths;
use crate::proctree::{self, TOKEN_VAR};
use crate::sandbox::Scope;
use crate::statefile::{self, ProcId};
use crate::supervisor;

/// Runs the shim to the job's end; the process exit code.
pub fn run(dir: &Path, resume: bool) -> i32 {
    detach();
    finish(dir, supervise(dir, resume))
}

/// `shim --adopt`: the supervisor of an exec handed over as a job (see
/// [`crate::supervisor`]), already the parent of `pid`, which has run for
/// `elapsed_ms`; its pipes and the control socket wait at fixed descriptors.
pub fn adopt(dir: &Path, pid: i32, elapsed_ms: u64) -> i32 {
    detach();
    finish(dir, supervise_adopted(dir, pid, elapsed_ms))
}

fn finish(dir: &Path, outcome: Result<(), String>) -> i32 {
    match outcome {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("outpost-agent shim {}: {message}", dir.display());
            let _ =
                statefile::write_atomic(&dir.join(store::SPAWN_ERROR), message.as_bytes(), false);
            1
        }
    }
}

fn detach() {
    // SAFETY: setsid and signal are plain syscalls; the shim is single-threaded.
    unsafe {
        // Fails only if already a session leader, which is just as good.
        libc::setsid();
        // A closing SSH session or terminal must not take the job's record
        // keeper with it; the job itself gets default dispositions back.
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // Hold no directory (and so no mount) busy.
    let _ = std::env::set_current_dir("/");
}

fn supervise_adopted(dir: &Path, pid: i32, elapsed_ms: u64) -> Result<(), String> {
    let root = dir.parent().ok_or("the job dir has no parent")?;
    // SAFETY: the supervisor left these descriptors open at these numbers
    // for this process alone (see `crate::supervisor`).
    let (mut control, out, err) = unsafe {
        (
            File::from_raw_fd(supervisor::CONTROL_FD),
            OwnedFd::from_raw_fd(supervisor::STDOUT_FD),
            OwnedFd::from_raw_fd(supervisor::STDERR_FD),
        )
    };
    // `serve` read them without blocking; the pump blocks in poll and read.
    for fd in [&out, &err] {
        // SAFETY: fcntl on descriptors owned here.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    let record = take_charge(dir)?;
    let log = append_to(&record.log)?;
    let files = stream_files(dir)?;
    if let Some(id) = ProcId::of(pid) {
        statefile::write_json(&dir.join(store::CHILD), &id, true)
            .map_err(|e| format!("cannot write {}: {e}", store::CHILD))?;
    }
    let pump = Pump::start(out, err, log, files);
    // In charge from here on: `serve` answers its call.
    let _ = control.write_all(b"r\0\0\0\0");
    drop(control);
    let started = Instant::now();
    let timeout = record
        .spec
        .timeout_ms
        .map(|t| Duration::from_millis(t.saturating_sub(elapsed_ms)));
    let (status, timed_out) = wait_within(pid, timeout, &record.token);
    pump.finish();
    let duration_ms = elapsed_ms + started.elapsed().as_millis() as u64;
    record_exit(
        root,
        dir,
        record.spec.split_streams,
        status,
        timed_out,
        duration_ms,
    )
}

fn supervise(dir: &Path, resume: bool) -> Result<(), String> {
    let root = dir.parent().ok_or("the job dir has no parent")?;
    let _ = std::fs::remove_file(dir.join(store::SPAWN_ERROR));
    let record = take_charge(dir)?;
    let command = if resume {
        super::resume_command(&record.spec.watch).ok_or("the job has no resume command")?
    } else {
        record.spec.command.clone()
    };

    // One descriptor for both streams, opened O_APPEND: output lands in the
    // order a terminal would show, and a resumed run appends.
    let log = append_to(&record.log)?;
    let shell = paths::shell();
    let mut cmd = match &record.spec.sandbox {
        Some(id) => Scope::of(id).map_err(|e| e.message)?.command(
            shell,
            &command,
            &record.cwd,
            &record.spec.env,
        )?,
        None => {
            let mut cmd = Command::new(shell);
            cmd.arg("-c")
                .arg(&command)
                .current_dir(&record.cwd)
                .envs(record.spec.env.iter().map(|(k, v)| (k, v)));
            cmd
        }
    };
    cmd.env(TOKEN_VAR, &record.token)
        .stdin(match File::open(dir.join(store::STDIN)) {
            Ok(given) => Stdio::from(given),
            Err(_) => Stdio::null(),
        });
    let split = if record.spec.split_streams {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Some((log, stream_files(dir)?))
    } else {
        let log2 = log
            .try_clone()
            .map_err(|e| format!("cannot duplicate the log descriptor: {e}"))?;
        cmd.stdout(Stdio::from(log)).stderr(Stdio::from(log2));
        None
    };
    // SAFETY: child_setup only makes async-signal-safe calls.
    unsafe {
        cmd.pre_exec(supervisor::child_setup);
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start {} in {}: {e}",
            shell.display(),
            record.cwd.display()
        )
    })?;
    let started = Instant::now();
    let pump = match (split, child.stdout.take(), child.stderr.take()) {
        (Some((log, files)), Some(out), Some(err)) => {
            Some(Pump::start(out.into(), err.into(), log, files))
        }
        _ => None,
    };
    let pid = child.id() as i32;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let (kind, detail) = if resume {
        let attempts = statefile::read_json::<store::ResumeRecord>(&dir.join(store::RESUME))
            .map_or(0, |r| r.attempts);
        ("resume_started", format!("pid {pid}, attempt {attempts}"))
    } else {
        ("started", format!("pid {pid}"))
    };
    // A split job is its exec call's until detached (see `store`).
    if !record.spec.split_streams
        && let Err(e) = store::emit(root, &name, kind, &detail)
    {
        eprintln!("outpost-agent shim: cannot record event {kind} of job {name}: {e}");
    }
    // After the event: the daemon answers `JobStart` once this file exists,
    // and the event must already be there by then. The child is ours and
    // unreaped, so its stat is its own.
    if let Some(id) = ProcId::of(pid) {
        let _ = statefile::write_json(&dir.join(store::CHILD), &id, false);
    }
    // Tell the daemon, which waits for this before it answers (a daemon gone
    // meanwhile is no matter: SIGPIPE is ignored).
    let _ = std::io::stdout().write_all(b"r");
    let _ = std::io::stdout().flush();

    let timeout = record.spec.timeout_ms.map(Duration::from_millis);
    let (status, timed_out) = wait_within(pid, timeout, &record.token);
    let duration_ms = started.elapsed().as_millis() as u64;
    if let Some(pump) = pump {
        pump.finish();
    }
    drop(child);
    record_exit(
        root,
        dir,
        record.spec.split_streams,
        status,
        timed_out,
        duration_ms,
    )
}

/// Writes the exit record (durably once the job is a background job's) and
/// reports the end.
fn record_exit(
    root: &Path,
    dir: &Path,
    split: bool,
    status: Option<ExitStatus>,
    timed_out: bool,
    duration_ms: u64,
) -> Result<(), String> {
    let exit = ExitRecord {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        ended_unix: statefile::now_unix(),
        timed_out,
        duration_ms: Some(duration_ms),
    };
    // An exec call's job that its call is still waiting for need not
    // survive a crash (the call would not either): no flush for it.
    let durable = !split || dir.join(store::DETACHED).exists();
    statefile::write_json(&dir.join(store::EXIT), &exit, durable)
        .map_err(|e| format!("cannot write {}: {e}", store::EXIT))?;
    store::report_end(root, dir, &exit);
    if !durable && dir.join(store::DETACHED).exists() {
        // Detached while the record was being written: flush it now.
        let _ = File::open(dir.join(store::EXIT)).and_then(|f| f.sync_all());
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// Records this process as the job's shim; the job's record.
fn take_charge(dir: &Path) -> Result<Record, String> {
    let me = ProcId::of(std::process::id() as i32).ok_or("cannot read /proc/self/stat")?;
    statefile::write_json(&dir.join(store::SHIM), &me, false)
        .map_err(|e| format!("cannot write {}: {e}", store::SHIM))?;
    statefile::read_json(&dir.join(store::SPEC))
        .ok_or_else(|| format!("cannot read {}", store::SPEC))
}

/// A split job's stdout and stderr files, opened to append.
fn stream_files(dir: &Path) -> Result<[File; 2], String> {
    Ok([
        append_to(&dir.join(store::STDOUT))?,
        append_to(&dir.join(store::STDERR))?,
    ])
}

fn append_to(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

/// Reaps the job's main process; with a timeout, terminates the whole tree
/// first if the main process is still running then. Whether the timeout did.
fn wait_within(pid: i32, timeout: Option<Duration>, token: &str) -> (Option<ExitStatus>, bool) {
    let Some(timeout) = timeout else {
        return (reap(pid), false);
    };
    // The timer kills only while the main process is unreaped, so its pid
    // (and with it the job's process group and session) cannot be reused:
    // the main thread waits without reaping, then takes the lock.
    let exited = Arc::new(Mutex::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let (done, notice) = mpsc::channel::<()>();
    let timer = {
        let exited = Arc::clone(&exited);
        let timed_out = Arc::clone(&timed_out);
        let token = token.to_string();
        std::thread::spawn(move || {
            if notice.recv_timeout(timeout) == Err(RecvTimeoutError::Timeout) {
                let exited = exited.lock().unwrap_or_else(|p| p.into_inner());
                // Ended just now, on its own: not a timeout, and what it
                // left running is not the timeout's to kill.
                if !*exited && !proctree::has_exited(pid) {
                    timed_out.store(true, Ordering::SeqCst);
                    proctree::terminate(pid, &token);
                }
            }
        })
    };
    proctree::wait_unreaped(pid);
    *exited.lock().unwrap_or_else(|p| p.into_inner()) = true;
    drop(done);
    let status = reap(pid);
    let _ = timer.join();
    (status, timed_out.load(Ordering::SeqCst))
}

fn reap(pid: i32) -> Option<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child, into a local.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return Some(ExitStatus::from_raw(status));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            eprintln!("outpost-agent shim: cannot wait for pid {pid}: {e}");
            return None;
        }
    }
}

/// After the main process exits, how long leftover background processes may
/// hold the pipes open before the record is written without waiting for EOF,
/// and how much more is then drained per pipe (as an inline exec does).
const EOF_GRACE: Duration = Duration::from_millis(250);
const DRAIN_CAP: usize = 1024 * 1024;

/// Copies a split job's two pipes to the merged log and to one file each.
struct Pump {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    /// Disconnected when the pump returns.
    finished: mpsc::Receiver<()>,
}

impl Pump {
    fn start(out: OwnedFd, err: OwnedFd, log: File, files: [File; 2]) -> Pump {
        let stop = Arc::new(AtomicBool::new(false));
        let (done, finished) = mpsc::channel::<()>();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                pump(out, err, log, files, &stop);
                drop(done);
            })
        };
        Pump {
            stop,
            thread,
            finished,
        }
    }

    /// Waits for end of file on both pipes, up to [`EOF_GRACE`]; then copies
    /// what is ready (at most [`DRAIN_CAP`] per pipe) and stops.
    fn finish(self) {
        let _ = self.finished.recv_timeout(EOF_GRACE);
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

fn pump(out: OwnedFd, err: OwnedFd, mut log: File, files: [File; 2], stop: &AtomicBool) {
    let mut pipes: [Option<File>; 2] = [Some(File::from(out)), Some(File::from(err))];
    let mut files = files;
    let mut drained = [0usize; 2];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let mut polled: Vec<(usize, libc::pollfd)> = pipes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let fd = p.as_ref()?.as_raw_fd();
                Some((
                    i,
                    libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ))
            })
            .collect();
        if polled.is_empty() {
            return;
        }
        let mut fds: Vec<libc::pollfd> = polled.iter().map(|(_, p)| *p).collect();
        // Once stopping, only what is ready now is copied.
        let wait_ms = if stopping { 0 } else { 100 };
        // SAFETY: fds is a valid array of pollfd of the given length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if ready < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if ready == 0 {
            if stopping {
                return;
            }
            continue;
        }
        for ((i, _), fd) in polled.iter_mut().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            let Some(pipe) = pipes[*i].as_mut() else {
                continue;
            };
            match pipe.read(&mut buf) {
                Ok(0) => pipes[*i] = None,
                Ok(n) => {
                    // A full disk must not block the job: what cannot be
                    // written is dropped, and reading goes on.
                    let _ = log.write_all(&buf[..n]);
                    let _ = files[*i].write_all(&buf[..n]);
                    if stopping {
                        drained[*i] += n;
                        if drained[*i] >= DRAIN_CAP {
                            pipes[*i] = None;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => pipes[*i] = None,
            }
        }
    }
}
