//! `outpost-agent daemon`: the per-user launcher and watcher of jobs.
//!
//! Jobs must outlive the SSH connection, so they cannot be children of
//! `serve`. The daemon starts them (one [shim](super::shim) each), notices
//! jobs whose shim died without an exit record (lost: a SIGKILL, an OOM kill,
//! a reboot), ends whatever of such a job still runs (nothing may run that
//! no shim will record), records the loss once, and resumes them when their
//! watch settings ask for it. It holds no state the files do not: a killed daemon loses
//! nothing, and the next one re-adopts every job from the job dirs.
//!
//! One daemon per state dir, by an exclusive `flock` on `run/daemon.lock`. It
//! listens on a unix socket in a private (0700, owned, not a symlink)
//! directory with a short path (see [`socket_path`]), speaks the agent's framing (no preamble, no
//! hello) and answers `JobStart` and `Ping`. `run/daemon.json` says where the
//! socket is and how the daemon was started. With no running job, no pending
//! resume and no client for [`IDLE_EXIT`], it exits; `serve` starts it again
//! on demand (see [`super::client`]).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentMessage, ClientMessage, DecodeEvent, ErrorKind, FrameDecoder, JobSpec, JobState,
    PROTOCOL_VERSION, Request, Response, decode, encode_frame,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::socket_dir::{SOCKET_NAME, prepare_socket_dir, private_dir, run_dir};
pub use super::socket_dir::{info_path, socket_path};
use super::store::{self, ProcId, ResumeRecord, Snapshot, error};
use crate::sandbox;
use crate::{code, flock, paths, proctree};

/// How long an idle daemon stays.
const IDLE_EXIT: Duration = Duration::from_secs(600);
/// How often running jobs are checked, and how often an idle daemon looks
/// at its clock.
const TICK_BUSY: Duration = Duration::from_millis(100);
const TICK_IDLE: Duration = Duration::from_secs(1);
/// How long `JobStart` waits for the shim to report the job's pid.
const READY_WAIT: Duration = Duration::from_secs(2);
/// How long an exiting daemon waits for its last clients.
const ANSWER_WAIT: Duration = Duration::from_secs(15);
/// A starting daemon waits this long for the previous one to let go of the
/// lock (it may be exiting right now).
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Grace between TERM and KILL for leftovers of a lost job.
const LEFTOVER_GRACE: Duration = Duration::from_millis(500);
/// The daemon log is rotated at start once it is this big.
const LOG_MAX: u64 = 1024 * 1024;

/// In a cluster allocation's state dir: the pid of the allocation's holder
/// (the batch script the controller submits writes it). What this daemon
/// runs lives no longer than that process: once it is gone (the allocation
/// cancelled, past its time limit, or past its TTL) every job and code
/// context of the state dir is ended and the dir removed, also where the
/// scheduler's process tracking misses processes that left the job's
/// process tree (a daemon, a job's shim).
pub const OWNER_FILE: &str = "owner.pid";

/// The holder named by [`OWNER_FILE`]: None without that file (a plain
/// host); Some(None) when the holder is gone already.
fn owner(state: &Path) -> Option<Option<ProcId>> {
    let text = fs::read_to_string(state.join(OWNER_FILE)).ok()?;
    Some(text.trim().parse::<i32>().ok().and_then(ProcId::of))
}

/// `run/daemon.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub process: ProcId,
    pub socket: PathBuf,
    pub protocol_version: u32,
    pub started_by: String,
}

/// Entry point of `outpost-agent daemon`: detaches, takes the lock, serves
/// until idle. The starting process returns at once.
pub fn main(started_by: &str) -> i32 {
    let Some(state) = paths::state_dir() else {
        eprintln!("outpost-agent daemon: no state directory");
        return 1;
    };
    let run = run_dir(&state);
    if let Err(e) = store::make_dir_all(&run) {
        eprintln!("outpost-agent daemon: cannot create {}: {e}", run.display());
        return 1;
    }
    // Double fork, half of it here: the starter (serve, or systemd-run that
    // exec'd us) gets its child back at once, and the daemon is adopted by
    // init (or a subreaper) instead of lingering as serve's child.
    // SAFETY: no threads exist yet, so fork is safe; the parent only exits.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("outpost-agent daemon: fork: {}", io::Error::last_os_error());
            return 1;
        }
        0 => {}
        _ => return 0,
    }
    // SAFETY: plain syscalls in a single-threaded process.
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    detach_stdio(&run);
    let _ = std::env::set_current_dir("/");

    let lock = match flock::open_private(&run.join("daemon.lock")) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("outpost-agent daemon: cannot open the lock: {e}");
            return 1;
        }
    };
    match flock::lock_within(&lock, LOCK_WAIT) {
        Ok(true) => {}
        // Another daemon serves this state dir: nothing to do.
        Ok(false) => return 0,
        Err(e) => {
            eprintln!("outpost-agent daemon: cannot take the lock: {e}");
            return 1;
        }
    }

    let socket = match prepare_socket_dir(&state) {
        Ok(dir) => dir.join(SOCKET_NAME),
        Err(e) => {
            eprintln!("outpost-agent daemon: {e}");
            return 1;
        }
    };
    let listener = match bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("outpost-agent daemon: {e}");
            return 1;
        }
    };
    let owner = owner(&state);
    let Some(me) = ProcId::of(std::process::id() as i32) else {
        eprintln!("outpost-agent daemon: cannot read /proc/self/stat");
        return 1;
    };
    let info = DaemonInfo {
        process: me,
        socket: socket.clone(),
        protocol_version: PROTOCOL_VERSION,
        started_by: started_by.to_string(),
    };
    if let Err(e) = store::write_json(&info_path(&state), &info, false) {
        eprintln!("outpost-agent daemon: cannot write daemon.json: {e}");
    }
    eprintln!(
        "outpost-agent daemon: pid {} listening on {} (started by {started_by})",
        std::process::id(),
        socket.display()
    );

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outpost-agent daemon: cannot start runtime: {e}");
            return 1;
        }
    };
    let code = runtime.block_on(async {
        let root = match tokio::task::spawn_blocking(store::root).await {
            Ok(Ok(root)) => root,
            Ok(Err(e)) => {
                eprintln!("outpost-agent daemon: {}", e.message);
                return 1;
            }
            Err(_) => return 1,
        };
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| UnixListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                eprintln!("outpost-agent daemon: cannot listen: {e}");
                return 1;
            }
        };
        let daemon = Arc::new(Daemon::new(root));
        daemon.serve(listener, &socket, &state, owner).await;
        0
    });
    drop(lock);
    code
}

/// stdin and stdout to /dev/null, stderr to `run/daemon.log` (rotated once
/// it is large), so no terminal or pipe of the starter is held.
fn detach_stdio(run: &Path) {
    let log_path = run.join("daemon.log");
    if fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_MAX) {
        let _ = fs::rename(&log_path, run.join("daemon.log.1"));
    }
    let null = OpenOptions::new().read(true).write(true).open("/dev/null");
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&log_path);
    // SAFETY: dup2 onto the standard descriptors of this single-threaded
    // process; the originals are closed by it.
    unsafe {
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
        match (&log, &null) {
            (Ok(log), _) => libc::dup2(log.as_raw_fd(), 2),
            (Err(_), Ok(null)) => libc::dup2(null.as_raw_fd(), 2),
            _ => 0,
        };
    }
}

fn bind(socket: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    let dir = socket.parent().ok_or("socket path without a directory")?;
    private_dir(dir)?;
    // We hold the lock, so a socket file left here is a dead daemon's.
    match fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot remove {}: {e}", socket.display())),
    }
    std::os::unix::net::UnixListener::bind(socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))
}

/// A running job as the daemon watches it.
#[derive(Clone)]
struct Watched {
    dir: PathBuf,
    shim: Option<ProcId>,
}

impl Watched {
    fn of(dir: &Path) -> Watched {
        Watched {
            dir: dir.to_path_buf(),
            shim: store::read_json(&dir.join(store::SHIM)),
        }
    }

    /// The cheap check, one stat and one `/proc` read: no exit record yet
    /// and the shim alive. Anything else gets a full look.
    fn unchanged(&self) -> bool {
        self.shim.as_ref().is_some_and(ProcId::alive) && !self.dir.join(store::EXIT).exists()
    }
}

/// The daemon's memory: which jobs to watch and which to resume when. All of
/// it can be rebuilt from the job dirs.
struct Daemon {
    root: PathBuf,
    /// Running jobs: name → dir and shim (once known).
    watched: Mutex<HashMap<String, Watched>>,
    /// Lost jobs to resume: name → when.
    pending: Mutex<HashMap<String, Instant>>,
    clients: AtomicUsize,
    last_activity: Mutex<Instant>,
    /// Whether a sandbox was live at the last check: its keeper is watched.
    sandboxes: AtomicBool,
    /// Code contexts: their interpreters live as long as this daemon.
    contexts: Arc<code::contexts::Contexts>,
}

impl Daemon {
    fn new(root: PathBuf) -> Daemon {
        Daemon {
            root,
            watched: Mutex::default(),
            pending: Mutex::default(),
            clients: AtomicUsize::new(0),
            last_activity: Mutex::new(Instant::now()),
            sandboxes: AtomicBool::new(false),
            contexts: Arc::default(),
        }
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn busy(&self) -> bool {
        !self.watched().is_empty() || !self.pending().is_empty() || !self.contexts.is_empty()
    }

    async fn serve(
        self: Arc<Self>,
        listener: UnixListener,
        socket: &Path,
        state: &Path,
        owner: Option<Option<ProcId>>,
    ) {
        let owner_gone = || {
            owner
                .as_ref()
                .is_some_and(|o| !o.as_ref().is_some_and(ProcId::alive))
        };
        let mut term = Signal::new(tokio::signal::unix::SignalKind::terminate());
        let mut int = Signal::new(tokio::signal::unix::SignalKind::interrupt());
        // Re-adopt what a previous daemon (or a reboot) left behind, while
        // already answering: killing leftovers of lost jobs takes time.
        let me = Arc::clone(&self);
        tokio::task::spawn_blocking(move || me.adopt());
        // Ticks are kept apart from accepts: a steady stream of clients
        // must not postpone the checks.
        let mut last_tick = Instant::now();
        while !owner_gone() {
            let tick = if self.busy() { TICK_BUSY } else { TICK_IDLE };
            let due = tokio::time::Instant::from_std(last_tick + tick);
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => self.accept(stream),
                    Err(e) => {
                        eprintln!("outpost-agent daemon: accept: {e}");
                        tokio::time::sleep(TICK_BUSY).await;
                    }
                },
                _ = tokio::time::sleep_until(due) => {
                    last_tick = Instant::now();
                    let me = Arc::clone(&self);
                    let _ = tokio::task::spawn_blocking(move || me.check()).await;
                    self.resume_due().await;
                    // An allocation's daemon lives as long as its holder: one
                    // started later by a `serve` would live in that serve's
                    // job step, and end with it.
                    if owner.is_none() && self.idle() {
                        break;
                    }
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        // No interpreter outlives the daemon that holds its context.
        let contexts = Arc::clone(&self.contexts);
        let _ = tokio::task::spawn_blocking(move || contexts.shutdown()).await;
        let ended_with_owner = owner_gone();
        if ended_with_owner {
            let root = self.root.clone();
            let _ = tokio::task::spawn_blocking(move || end_all_jobs(&root)).await;
        }
        // Stop being findable first, then answer whoever connected in the
        // meantime, so no request is dropped unanswered.
        let _ = fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            // Only succeeds while empty: never takes anything else along.
            let _ = fs::remove_dir(dir);
        }
        if store::read_json::<DaemonInfo>(&info_path(state))
            .is_some_and(|i| i.process.pid == std::process::id() as i32)
        {
            let _ = fs::remove_file(info_path(state));
        }
        while let Ok(Ok((stream, _))) =
            tokio::time::timeout(Duration::from_millis(10), listener.accept()).await
        {
            self.accept(stream);
        }
        let deadline = Instant::now() + ANSWER_WAIT;
        while self.clients.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if ended_with_owner {
            eprintln!(
                "outpost-agent daemon: the allocation's holder is gone; jobs ended, removing {}",
                state.display()
            );
            let _ = fs::remove_dir_all(state);
        }
        eprintln!("outpost-agent daemon: pid {} exits", std::process::id());
    }

    fn idle(&self) -> bool {
        let last = *self.last_activity.lock().unwrap_or_else(|p| p.into_inner());
        !self.busy()
            && !self.sandboxes.load(Ordering::SeqCst)
            && self.clients.load(Ordering::SeqCst) == 0
            && last.elapsed() >= IDLE_EXIT
    }

    fn accept(self: &Arc<Self>, stream: UnixStream) {
        // The socket's directory already keeps others out; the peer's
        // credentials make sure.
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        if !stream
            .peer_cred()
            .is_ok_and(|c| c.uid() == uid || c.uid() == 0)
        {
            return;
        }
        self.clients.fetch_add(1, Ordering::SeqCst);
        self.touch();
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = me.connection(stream).await {
                eprintln!("outpost-agent daemon: client: {e}");
            }
            me.touch();
            me.clients.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Answers requests on one connection until the client closes it.
    async fn connection(self: &Arc<Self>, mut stream: UnixStream) -> io::Result<()> {
        let mut decoder = FrameDecoder::framed();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            decoder.push(&buf[..n]);
            while let Some(event) = decoder.next_event().map_err(io::Error::other)? {
                let DecodeEvent::Frame(payload) = event else {
                    continue;
                };
                let Ok(ClientMessage::Request { id, body }) = decode::<ClientMessage>(&payload)
                else {
                    continue;
                };
                // A sandbox made for a client that is gone (it gave up
                // waiting, or its call was cancelled) is deleted: nobody
                // would know its name.
                let mut made = None;
                let body = match body {
                    Request::JobStart(spec) => self.start(spec).await,
                    Request::SandboxCreate(spec) => {
                        let created =
                            tokio::task::spawn_blocking(move || sandbox::create_in_daemon(spec))
                                .await;
                        match created {
                            Ok(Ok(info)) => {
                                made = Some(info.id.clone());
                                Response::Sandbox(info)
                            }
                            Ok(Err(e)) => Response::Error(e),
                            Err(_) => {
                                Response::Error(error(ErrorKind::Internal, "worker panicked"))
                            }
                        }
                    }
                    Request::Ping => Response::Pong,
                    Request::InSandbox {
                        id: sandbox,
                        request,
                    } => self.code(Some(sandbox), *request).await,
                    request => self.code(None, request).await,
                };
                // An answer too large for a frame still gets an answer.
                let frame = encode_frame(&AgentMessage::Response { id, body }).or_else(|e| {
                    let body = Response::Error(error(
                        ErrorKind::Internal,
                        format!("the answer could not be sent: {e}"),
                    ));
                    encode_frame(&AgentMessage::Response { id, body })
                });
                let sent = stream.write_all(&frame.map_err(io::Error::other)?).await;
                if let (Err(e), Some(id)) = (&sent, made) {
                    eprintln!(
                        "outpost-agent daemon: sandbox {id} made for a client that left ({e}): deleting it"
                    );
                    let _ = tokio::task::spawn_blocking(move || sandbox::delete(&id)).await;
                }
                sent?;
            }
        }
    }

    /// A code context request, in `sandbox` (None: the host).
    async fn code(&self, sandbox: Option<String>, request: Request) -> Response {
        match request {
            Request::CodeRun(run) => self.contexts.run(sandbox, run).await,
            // Both look through /proc (sizes, trees to end): off the runtime.
            Request::CodeContexts => {
                let contexts = Arc::clone(&self.contexts);
                blocking(move || contexts.list(sandbox.as_deref())).await
            }
            Request::CodeControl { context, action } => {
                let contexts = Arc::clone(&self.contexts);
                blocking(move || contexts.control(sandbox, &context, action)).await
            }
            _ => Response::Error(error(
                ErrorKind::Unsupported,
                "the job daemon only starts jobs, sandboxes and code contexts",
            )),
        }
    }

    /// `JobStart`: validates, creates the job dir, starts its shim and
    /// answers once the job's main process exists.
    async fn start(self: &Arc<Self>, spec: JobSpec) -> Response {
        let root = self.root.clone();
        let created =
            tokio::task::spawn_blocking(move || super::create::create(&root, spec, None)).await;
        let (name, dir) = match created {
            Ok(Ok(created)) => created,
            Ok(Err(e)) => return Response::Error(e),
            Err(_) => return Response::Error(error(ErrorKind::Internal, "worker panicked")),
        };
        if let Err(message) = launch(&dir, false).await {
            let _ = fs::remove_dir_all(&dir);
            return Response::Error(error(ErrorKind::SpawnFailed, message));
        }
        self.watched().insert(name, Watched::of(&dir));
        match tokio::task::spawn_blocking(move || Snapshot::read(&dir)).await {
            Ok(Ok(snap)) => Response::Job(snap.info()),
            Ok(Err(e)) => Response::Error(e),
            Err(_) => Response::Error(error(ErrorKind::Internal, "worker panicked")),
        }
    }

    /// At start: watch running jobs, report endings and losses nobody
    /// recorded, schedule resumes.
    fn adopt(&self) {
        for snap in store::all(&self.root) {
            self.consider(snap);
        }
    }

    /// One look at every watched job and live sandbox.
    fn check(&self) {
        self.sandboxes.store(sandbox::supervise(), Ordering::SeqCst);
        self.contexts.prune();
        let jobs: Vec<(String, Watched)> = self
            .watched()
            .iter()
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect();
        for (name, watched) in jobs {
            if watched.unchanged() {
                continue;
            }
            match Snapshot::read(&watched.dir) {
                Ok(snap) => {
                    if snap.state != JobState::Running {
                        self.watched().remove(&name);
                    }
                    self.consider(snap);
                }
                // Removed by hand: nothing left to watch.
                Err(_) => {
                    self.watched().remove(&name);
                }
            }
        }
    }

    fn consider(&self, snap: Snapshot) {
        if snap.unsupervised {
            self.watched().remove(&snap.name);
            self.lost(&snap);
            return;
        }
        match snap.state {
            JobState::Running => {
                let watched = Watched {
                    dir: snap.dir.clone(),
                    shim: snap.shim.clone(),
                };
                self.watched().insert(snap.name.clone(), watched);
            }
            JobState::Exited | JobState::Cancelled => {
                // The shim records the end; stand in only if it died first.
                if let Some(exit) = &snap.exit
                    && !snap.shim.as_ref().is_some_and(ProcId::alive)
                {
                    store::report_end(&self.root, &snap.dir, exit);
                }
            }
            JobState::Lost => self.lost(&snap),
        }
    }

    /// A job without exit record and without its shim: end what still runs
    /// of it, record the loss once, and schedule a resume if its watch
    /// settings ask for one.
    fn lost(&self, snap: &Snapshot) {
        let dir = &snap.dir;
        // Nobody would record how these end, and a resume must never run
        // beside them: they are ended before the loss is recorded, so a job
        // reported lost never still runs.
        let ended = if snap.unsupervised {
            let root = snap.live_child();
            let found = proctree::collect_tree(root, &snap.record.token).len();
            proctree::terminate_tree(root, &snap.record.token, LEFTOVER_GRACE);
            found
        } else {
            0
        };
        if store::claim(dir, store::LOST_REPORTED) {
            let mut detail = match &snap.shim {
                Some(shim) if !shim.boot_id.is_empty() && shim.boot_id != proctree::boot_id() => {
                    "the host rebooted".to_string()
                }
                Some(shim) => format!(
                    "its supervisor (pid {}) died without recording an exit",
                    shim.pid
                ),
                None => "its supervisor never started".to_string(),
            };
            if ended > 0 {
                detail.push_str(&match ended {
                    1 => "; its remaining process was ended".to_string(),
                    n => format!("; its {n} remaining processes were ended"),
                });
            }
            if let Some(why) = no_resume_reason(snap) {
                detail.push_str(&format!("; {why}"));
            }
            // An exec call's own job is reported by that call.
            if store::is_background(dir)
                && let Err(e) = store::emit(&self.root, &snap.name, "interrupted", &detail)
            {
                eprintln!("outpost-agent daemon: cannot record event: {e}");
            }
        }
        if resumable(snap) && !self.pending().contains_key(&snap.name) {
            let delay = Duration::from_secs(snap.record.spec.watch.resume_delay_s);
            self.pending()
                .insert(snap.name.clone(), Instant::now() + delay);
        }
    }

    /// Starts the resumes whose delay has passed.
    async fn resume_due(self: &Arc<Self>) {
        let now = Instant::now();
        let due: Vec<String> = {
            let mut pending = self.pending();
            let due: Vec<String> = pending
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in &due {
                pending.remove(name);
            }
            due
        };
        for name in due {
            let dir = self.root.join(&name);
            let prepared = {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || prepare_resume(&dir)).await
            };
            if !matches!(prepared, Ok(true)) {
                continue;
            }
            match launch(&dir, true).await {
                Ok(()) => {
                    self.watched().insert(name, Watched::of(&dir));
                }
                Err(message) => {
                    let root = self.root.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        // Lost again, and already said so.
                        store::claim(&dir, store::LOST_REPORTED);
                        if let Err(e) = store::emit(&root, &name, "resume_failed", &message) {
                            eprintln!("outpost-agent daemon: cannot record event: {e}");
                        }
                    })
                    .await;
                }
            }
        }
    }
}

/// Whether a lost job is to be resumed now or after its delay.
/// Cancels every running job under `root` (their whole trees), as
/// `JobCancel` would, so none outlives the allocation that ran it.
fn end_all_jobs(root: &Path) {
    for snap in store::all(root) {
        if snap.state == JobState::Running
            && let Err(e) = super::cancel(&snap.name, 0)
        {
            eprintln!("outpost-agent daemon: ending {}: {}", snap.name, e.message);
        }
    }
}

fn resumable(snap: &Snapshot) -> bool {
    let watch = &snap.record.spec.watch;
    watch.auto_resume
        && super::resume_command(watch).is_some()
        && snap.attempts < max_attempts(snap)
        && !snap.dir.join(store::CANCELLED).exists()
}

fn max_attempts(snap: &Snapshot) -> u32 {
    snap.record.spec.watch.max_resume_attempts.max(1)
}

/// For the `interrupted` event: why a job with auto-resume is not resumed.
fn no_resume_reason(snap: &Snapshot) -> Option<String> {
    let watch = &snap.record.spec.watch;
    if !watch.auto_resume || resumable(snap) {
        return None;
    }
    Some(if super::resume_command(watch).is_none() {
        "no resume: no resume command".to_string()
    } else if snap.attempts >= max_attempts(snap) {
        format!(
            "no resume: {} of {} attempts used",
            snap.attempts,
            max_attempts(snap)
        )
    } else {
        "no resume: cancelled".to_string()
    })
}

/// Re-checks a job due for resume and records the attempt; false when it
/// must not be resumed after all (cancelled, ended, running again).
fn prepare_resume(dir: &Path) -> bool {
    let Ok(snap) = Snapshot::read(dir) else {
        return false;
    };
    if snap.state != JobState::Lost || !resumable(&snap) {
        return false;
    }
    // A resume must never run beside what is left of the old run.
    proctree::terminate_tree(snap.live_child(), &snap.record.token, LEFTOVER_GRACE);
    let record = ResumeRecord {
        attempts: snap.attempts + 1,
    };
    if store::write_json(&dir.join(store::RESUME), &record, true).is_err() {
        return false;
    }
    // A new run may be lost (and reported) again.
    let _ = fs::remove_file(dir.join(store::LOST_REPORTED));
    let _ = fs::remove_file(dir.join(store::CHILD));
    true
}

/// Starts the shim of the job in `dir` and waits until the job's main
/// process exists (or the shim says why it could not start it).
async fn launch(dir: &Path, resume: bool) -> Result<(), String> {
    let exe = paths::running_exe()
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let mut cmd = tokio::process::Command::new(&exe);
    cmd.arg("shim").arg(dir);
    if resume {
        cmd.arg("--resume");
    }
    // stderr stays the daemon log; stdout says when the job runs.
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut shim = cmd
        .spawn()
        .map_err(|e| format!("cannot start the job's shim {}: {e}", exe.display()))?;
    let deadline = Instant::now() + READY_WAIT;
    // The shim writes one byte once the job's main process is recorded; an
    // answer at that moment, not at the next poll, is what lets an exec run
    // as a job cost only a few milliseconds more than inline.
    if let Some(mut said) = shim.stdout.take() {
        let mut byte = [0u8; 1];
        if let Ok(Ok(1)) = tokio::time::timeout(READY_WAIT, said.read(&mut byte)).await {
            tokio::spawn(async move {
                let _ = shim.wait().await;
            });
            return Ok(());
        }
    }
    // It ended or closed its stdout without a word: find out why.
    let mut poll = Duration::from_millis(1);
    let ready = loop {
        if dir.join(store::CHILD).exists() || dir.join(store::EXIT).exists() {
            break Ok(());
        }
        if let Ok(message) = fs::read_to_string(dir.join(store::SPAWN_ERROR)) {
            break Err(message);
        }
        if let Ok(Some(status)) = shim.try_wait() {
            if dir.join(store::CHILD).exists() {
                return Ok(());
            }
            return Err(fs::read_to_string(dir.join(store::SPAWN_ERROR))
                .unwrap_or_else(|_| format!("the job's shim ended at once ({status})")));
        }
        if Instant::now() >= deadline {
            // Slow, not failed: the shim is alive and will carry on.
            break Ok(());
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(Duration::from_millis(20));
    };
    // Reap the shim as soon as it ends, so a dead shim is never mistaken
    // for a live one and no zombies pile up. (If this daemon dies first,
    // the shim is adopted by init like any orphan.)
    tokio::spawn(async move {
        let _ = shim.wait().await;
    });
    ready
}

/// A signal stream that never fires if it could not be registered.
struct Signal(Option<tokio::signal::unix::Signal>);

impl Signal {
    fn new(kind: tokio::signal::unix::SignalKind) -> Signal {
        Signal(tokio::signal::unix::signal(kind).ok())
    }

    async fn recv(&mut self) {
        match &mut self.0 {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Whether a daemon is needed: a live sandbox (its keeper is watched), or
/// a job in `root` running (to notice its loss), or lost and not yet
/// reported or still to be resumed.
pub fn needed(root: &Path) -> bool {
    if sandbox::any_live() {
        return true;
    }
    let Ok(entries) = fs::read_dir(root) else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        // Ended jobs are the common case: one stat each.
        .filter(|e| !e.path().join(store::EXIT).exists())
        .filter_map(|e| Snapshot::read(&e.path()).ok())
        .any(|snap| match snap.state {
            JobState::Running => true,
            JobState::Lost => !snap.dir.join(store::LOST_REPORTED).exists() || resumable(&snap),
            JobState::Exited | JobState::Cancelled => false,
        })
}

async fn blocking(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|_| Response::Error(error(ErrorKind::Internal, "worker panicked")))
}
