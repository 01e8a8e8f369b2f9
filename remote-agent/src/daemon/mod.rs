//! `outpost-agent daemon`: the per-user process that holds what must outlive
//! any SSH session's `serve`. It has three services:
//!
//! * jobs ([`jobs`]): it starts each job's shim, so jobs are not children of
//!   `serve`, notices jobs whose shim died without an exit record (lost: a
//!   SIGKILL, an OOM kill, a reboot), ends what such a job left running,
//!   records the loss once and resumes the job when its watch settings ask;
//! * sandboxes: it creates them (`SandboxCreate`), so their keepers are its
//!   children, and watches the keepers while any sandbox lives;
//! * code contexts and terminals: their processes live as long as the
//!   daemon.
//!
//! It holds no state the files do not: a killed daemon loses nothing, and
//! the next one re-adopts every job from the job dirs.
//!
//! One daemon per state dir, by an exclusive `flock` on `run/daemon.lock`. It
//! listens on a unix socket in a private (0700, owned, not a symlink)
//! directory with a short path (see [`socket_path`]) and speaks the agent's
//! framing (no preamble, no hello). `run/daemon.json` says where the socket
//! is and how the daemon was started. With nothing to watch and no client
//! for [`IDLE_EXIT`], it exits; `serve` starts it again on demand (see
//! [`client`]).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentMessage, ClientMessage, DecodeEvent, ErrorKind, FrameDecoder, PROTOCOL_VERSION, Request,
    Response, decode, encode_frame,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

pub mod client;
mod jobs;

pub use self::jobs::needed;
use self::jobs::{Watched, end_all_jobs};
use crate::socket_dir::{SOCKET_NAME, prepare_socket_dir, private_dir, run_dir};
pub use crate::socket_dir::{info_path, socket_path};
use crate::statefile::{self, ProcId, error};
use crate::{code, flock, paths, sandbox, terminals};

/// How long an idle daemon stays.
const IDLE_EXIT: Duration = Duration::from_secs(600);
/// How often running jobs are checked, and how often an idle daemon looks
/// at its clock.
const TICK_BUSY: Duration = Duration::from_millis(100);
const TICK_IDLE: Duration = Duration::from_secs(1);
/// How long an exiting daemon waits for its last clients.
const ANSWER_WAIT: Duration = Duration::from_secs(15);
/// A starting daemon waits this long for the previous one to let go of the
/// lock (it may be exiting right now).
const LOCK_WAIT: Duration = Duration::from_secs(2);
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
    if let Err(e) = statefile::make_dir_all(&run) {
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
    if let Err(e) = statefile::write_json(&info_path(&state), &info, false) {
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
        let root = match tokio::task::spawn_blocking(crate::jobs::store::root).await {
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
    /// Terminals, likewise.
    terminals: Arc<terminals::Terminals>,
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
            terminals: Arc::default(),
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
        !self.watched().is_empty()
            || !self.pending().is_empty()
            || !self.contexts.is_empty()
            || self.terminals.any_running()
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
        if statefile::read_json::<DaemonInfo>(&info_path(state))
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
            Request::Terminal(request) => {
                let terminals = Arc::clone(&self.terminals);
                blocking(move || terminals.answer(sandbox, request)).await
            }
            _ => Response::Error(error(
                ErrorKind::Unsupported,
                "the job daemon only starts jobs, sandboxes and code contexts",
            )),
        }
    }
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

async fn blocking(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|_| Response::Error(error(ErrorKind::Internal, "worker panicked")))
}
