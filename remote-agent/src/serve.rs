//! `outpost-agent serve`: the protocol session on stdin/stdout.
//!
//! The input carries [`ClientMessage`] frames; each request runs on its own
//! task and answers through the `Outbox`, the only writer of the output.
//! The session ends on end of input or SIGTERM/SIGHUP/SIGINT: running
//! commands are cancelled (their trees killed), their results flushed, this
//! agent's GPU leases released, staging files of uncommitted transfers
//! removed, and the agent exits 0. A frame that cannot be decoded leaves the
//! stream unusable: same teardown, exit 1.
//!
//! [`run`] is the `serve` command: stdin and stdout, a process of its own.
//! [`serve_on`] runs the same session on any reader and writer inside
//! another program ([`ServeOptions::in_process`]): no guard process, no
//! signal handling, no job daemon, nothing done to the process as a whole.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outpost_protocol::{
    AgentError, ClientMessage, DecodeEvent, ErrorKind, ExecRequest, FrameDecoder, PathProblem,
    ProtocolError, Request, RequestId, Response, ScanSummary, decode, encode_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::files::Appliers;
use crate::metrics::Monitor;
use crate::outbox::{self, Outbox};
use crate::{
    cleanup, code, daemon, exec, files, gpu, guard, handover, heap, identity, jobs, leases, sandbox,
};

/// How long shutdown waits for cancelled commands to report.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// How long a session that moved file content stays quiet before the
/// memory its transfer freed goes back: a push's requests follow each other
/// within milliseconds.
const QUIET_BEFORE_GIVING_BACK: Duration = Duration::from_secs(2);

/// The build hash an in-process agent reports: the executable it runs in is
/// not an agent build.
pub const IN_PROCESS_BUILD_HASH: &str = "in-process";

/// What a session may do beyond answering requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Start the guard, a re-exec of this executable that kills the
    /// commands still running if the process dies. Needs `own_process`.
    pub guard: bool,
    /// End the session on SIGTERM, SIGHUP and SIGINT.
    pub signals: bool,
    /// The process is the agent executable and this session its purpose:
    /// start the job daemon from it (job requests fail without), report its
    /// hash in the hello, remove stale agent versions beside it, and end the
    /// process's GPU leases and `nvidia-smi` runs at the end.
    pub own_process: bool,
}

impl ServeOptions {
    /// `outpost-agent serve`: everything on.
    pub fn process() -> ServeOptions {
        ServeOptions {
            guard: true,
            signals: true,
            own_process: true,
        }
    }

    /// An agent inside another program: only the session itself. Commands
    /// still run with timeouts and are killed on cancel and at the end of
    /// the session; GPU leases it took end with it.
    pub fn in_process() -> ServeOptions {
        ServeOptions {
            guard: false,
            signals: false,
            own_process: false,
        }
    }
}

/// Runs the session on stdin and stdout to its end and returns the process
/// exit code.
pub fn run() -> i32 {
    widen_pipes();
    heap::keep_freed_memory();
    // Sandbox roots a connection writes stay open for its life.
    outpost_treesync::apply::raise_open_files();
    // One thread for the session: its tasks mostly wait on pipes, and what
    // takes CPU or may block (hashing, file IO, /proc) runs on the blocking
    // pool. A second worker would be woken to steal every request's task, and
    // that doubled the thread switches per answer, a good part of the CPU.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outpost-agent: cannot start runtime: {e}");
            return 1;
        }
    };
    // A task, so that a panic in it ends the session with 1.
    let session = runtime.spawn(async {
        let (input, output) = outpost_stdio::streams();
        serve_on(input, output, ServeOptions::process()).await
    });
    let code = runtime.block_on(session).unwrap_or(1);
    // Dropping the runtime would wait for the blocking stdin read forever;
    // the caller exits the process instead.
    std::mem::forget(runtime);
    code
}

/// Pipe capacity asked for on stdin and stdout.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// sshd talks to us through pipes of 64 KiB: at bulk rates that is a wake-up
/// of each side every 64 KiB. A larger pipe lets both move more per wake-up.
/// Best effort: not a pipe, or over the user's pipe allowance, changes nothing.
fn widen_pipes() {
    for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO] {
        // SAFETY: F_SETPIPE_SZ only resizes a pipe's buffer; other kinds of
        // descriptor answer with an error, which is ignored.
        unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES) };
    }
}

/// State shared by the read loop and request tasks.
struct Shared {
    /// Requests in flight, each with its cancel switch.
    inflight: Mutex<HashMap<RequestId, watch::Sender<bool>>>,
    /// Starts sampling on the first Metrics request.
    monitor: Arc<Monitor>,
    /// Sync roots written through this connection, with their staged parts.
    appliers: Arc<Appliers>,
    /// GPU leases taken through this connection.
    leased: Mutex<Vec<String>>,
    /// Sandbox roots opened by file requests on this connection.
    confined: sandbox::ConfinedRoots,
    /// Requests that move file content, in flight. Their buffers, freed,
    /// are kept by the allocator until none has run for a while.
    moving_content: AtomicUsize,
    /// Told when the last of them ends.
    content_moved: Notify,
    options: ServeOptions,
}

impl Shared {
    fn inflight(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, watch::Sender<bool>>> {
        // A panic while holding the lock leaves a usable map; keep going.
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one frame asked for.
enum Inbound {
    /// Boxed: a request (a job spec) is far larger than the other variants.
    Message(Box<ClientMessage>),
    /// A request of a kind this agent does not know.
    Unsupported(RequestId),
    /// A message kind this agent does not know and cannot answer.
    Ignored,
}

/// Runs one session: requests read from `input`, the preamble, hello and
/// responses written to `output`. Returns at the end of input (0), at an
/// undecodable frame (1), or, with [`ServeOptions::signals`], at SIGTERM,
/// SIGHUP or SIGINT (0), once the teardown is done. Must run inside a tokio
/// runtime with IO and timers enabled.
pub async fn serve_on<R, W>(input: R, output: W, options: ServeOptions) -> i32
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let hello = if options.own_process {
        identity::hello()
    } else {
        identity::hello_with(IN_PROCESS_BUILD_HASH)
    };
    let hello = match encode_frame(&hello) {
        Ok(frame) => frame,
        Err(e) => {
            eprintln!("outpost-agent: cannot encode hello: {e}");
            return 1;
        }
    };
    let (outbox, writer) = outbox::start(output, hello);
    if options.guard {
        // Commands must not outlive this process, even if it is SIGKILLed.
        guard::start();
    }

    let shared = Arc::new(Shared {
        inflight: Mutex::new(HashMap::new()),
        monitor: Arc::default(),
        appliers: Arc::default(),
        leased: Mutex::default(),
        confined: sandbox::ConfinedRoots::default(),
        moving_content: AtomicUsize::new(0),
        content_moved: Notify::new(),
        options,
    });
    let mut tasks = JoinSet::new();
    let code = read_loop(input, &shared, &outbox, &mut tasks).await;

    // Teardown: cancel everything, give results a bounded time to go out.
    for cancel in shared.inflight().values() {
        let _ = cancel.send(true);
    }
    let drained = tokio::time::timeout(SHUTDOWN_WAIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!("outpost-agent: some requests did not finish during shutdown");
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let appliers = Arc::clone(&shared.appliers);
    let leased = std::mem::take(&mut *shared.leased.lock().unwrap_or_else(|p| p.into_inner()));
    let released = tokio::task::spawn_blocking(move || {
        if options.own_process {
            leases::release_own();
            gpu::shutdown();
        } else {
            // Other sessions of this process may hold leases and run
            // nvidia-smi: end only what this one took.
            for id in leased {
                let _ = leases::release(&id);
            }
        }
        // Uncommitted staging files of this connection go with it.
        appliers.close();
    });
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, released).await;
    drop(outbox);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    code
}

/// Reads and dispatches frames until the session should end; returns the exit
/// code.
/// What an agent of its own process does once the controller first speaks
/// to it, not when it starts: a controller may start one beside its probe
/// and drop it unused (a guess that the probe proved wrong), and that one
/// must change nothing on the host.
fn first_words(shared: &Shared) {
    if shared.options.own_process {
        tokio::task::spawn_blocking(cleanup::remove_stale_versions);
        // Jobs left running or lost while no daemon watched get one again.
        daemon::client::nudge();
    }
}

async fn read_loop(
    mut input: impl AsyncRead + Unpin,
    shared: &Arc<Shared>,
    outbox: &Outbox,
    tasks: &mut JoinSet<()>,
) -> i32 {
    let mut decoder = FrameDecoder::framed();
    let signals = shared.options.signals;
    let mut term = Signal::new(SignalKind::terminate(), signals);
    let mut hup = Signal::new(SignalKind::hangup(), signals);
    let mut int = Signal::new(SignalKind::interrupt(), signals);
    let mut spoken_to = false;
    // Armed when the last transfer request ends; pushed back by each later
    // one, so that it fires once transfers have been quiet a while.
    let give_back = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(give_back);
    let mut give_back_armed = false;
    loop {
        tokio::select! {
            // Into the decoder's buffer: a large frame's content is read
            // where it stays until its request is parsed.
            read = input.read_buf(decoder.input()) => match read {
                Ok(0) => return 0,
                Ok(_) => {
                    if !spoken_to {
                        spoken_to = true;
                        first_words(shared);
                    }
                    if let Err(e) = dispatch_frames(&mut decoder, shared, outbox, tasks) {
                        eprintln!("outpost-agent: unusable input stream: {e}");
                        return 1;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("outpost-agent: cannot read the input: {e}");
                    return 0;
                }
            },
            _ = term.recv() => return 0,
            _ = hup.recv() => return 0,
            _ = int.recv() => return 0,
            // Reap finished tasks so the set does not grow over a long session.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = shared.content_moved.notified(), if shared.options.own_process => {
                give_back
                    .as_mut()
                    .reset(tokio::time::Instant::now() + QUIET_BEFORE_GIVING_BACK);
                give_back_armed = true;
            }
            () = &mut give_back, if give_back_armed => {
                give_back_armed = false;
                // A transfer that started meanwhile re-arms it as it ends.
                if shared.moving_content.load(Ordering::Relaxed) == 0 {
                    tokio::task::spawn_blocking(heap::give_back_freed_memory);
                }
            }
        }
    }
}

/// A signal stream that never fires if it is not wanted or could not be
/// registered.
struct Signal(Option<tokio::signal::unix::Signal>);

impl Signal {
    fn new(kind: SignalKind, wanted: bool) -> Signal {
        Signal(if wanted { signal(kind).ok() } else { None })
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

fn dispatch_frames(
    decoder: &mut FrameDecoder,
    shared: &Arc<Shared>,
    outbox: &Outbox,
    tasks: &mut JoinSet<()>,
) -> Result<(), ProtocolError> {
    while let Some(event) = decoder.next_event()? {
        let DecodeEvent::Frame(payload) = event else {
            continue;
        };
        match parse(&payload)? {
            Inbound::Message(msg) => match *msg {
                ClientMessage::Request { id, body } => {
                    start_request(id, body, shared, outbox, tasks)
                }
                ClientMessage::Cancel { id } => {
                    // Unknown ids are fine: the request may have just finished.
                    if let Some(cancel) = shared.inflight().get(&id) {
                        let _ = cancel.send(true);
                    }
                }
            },
            Inbound::Unsupported(id) => {
                let outbox = outbox.clone();
                tasks.spawn(async move {
                    let body = error(ErrorKind::Unsupported, "unsupported request");
                    outbox.send(id, body).await;
                });
            }
            Inbound::Ignored => {
                eprintln!("outpost-agent: ignoring a message of an unknown kind");
            }
        }
    }
    Ok(())
}

/// Decodes a frame. Messages from a newer controller that only add enum
/// variants are recognised by their leading variant indices (postcard writes
/// them as varints) and answered or skipped instead of ending the session.
fn parse(payload: &[u8]) -> Result<Inbound, ProtocolError> {
    let err = match decode::<ClientMessage>(payload) {
        Ok(msg) => return Ok(Inbound::Message(Box::new(msg))),
        Err(e) => e,
    };
    let mut rest = payload;
    match read_varint(&mut rest) {
        // ClientMessage::Request { id, body }: body's variant comes after id.
        Some(0) => {
            if let (Some(id), Some(variant)) = (read_varint(&mut rest), read_varint(&mut rest))
                && variant >= KNOWN_REQUESTS
            {
                return Ok(Inbound::Unsupported(id));
            }
            Err(err)
        }
        Some(v) if v >= KNOWN_CLIENT_MESSAGES => Ok(Inbound::Ignored),
        _ => Err(err),
    }
}

/// Variants of [`Request`] and [`ClientMessage`] this agent knows (a test
/// checks it against the last variant).
const KNOWN_REQUESTS: u64 = 28;
const KNOWN_CLIENT_MESSAGES: u64 = 2;

fn read_varint(data: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&byte, rest) = data.split_first()?;
        *data = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error(AgentError {
        kind,
        message: message.into(),
    })
}

/// Whether `body` moves file content, whose buffers leave the heap large.
fn moves_content(body: &Request) -> bool {
    match body {
        Request::PutFiles(_) | Request::PutPart(_) | Request::ReadFiles(_) | Request::Resume(_) => {
            true
        }
        Request::InSandbox { request, .. } => moves_content(request),
        _ => false,
    }
}

fn start_request(
    id: RequestId,
    body: Request,
    shared: &Arc<Shared>,
    outbox: &Outbox,
    tasks: &mut JoinSet<()>,
) {
    let outbox = outbox.clone();
    let cancel = {
        let mut inflight = shared.inflight();
        if inflight.contains_key(&id) {
            drop(inflight);
            tasks.spawn(async move {
                let body = error(
                    ErrorKind::BadRequest,
                    format!("request id {id} is already in flight"),
                );
                outbox.send(id, body).await;
            });
            return;
        }
        let (tx, rx) = watch::channel(false);
        inflight.insert(id, tx);
        rx
    };
    let moving = moves_content(&body);
    if moving {
        shared.moving_content.fetch_add(1, Ordering::Relaxed);
    }
    let shared = Arc::clone(shared);
    tasks.spawn(async move {
        let response = match body {
            Request::InSandbox {
                id: sandbox,
                request,
            } if shared.options.own_process => {
                let scope = tokio::task::spawn_blocking(move || sandbox::Scope::of(&sandbox)).await;
                match scope {
                    Ok(Ok(scope)) => {
                        answer(id, *request, Some(scope), &shared, &outbox, cancel).await
                    }
                    Ok(Err(e)) => Response::Error(e),
                    Err(_) => error(ErrorKind::Internal, "worker panicked"),
                }
            }
            body => answer(id, body, None, &shared, &outbox, cancel).await,
        };
        // Free the id before answering: the controller may reuse it as soon
        // as it sees the final response.
        shared.inflight().remove(&id);
        if moving && shared.moving_content.fetch_sub(1, Ordering::Relaxed) == 1 {
            shared.content_moved.notify_one();
        }
        outbox.send(id, response).await;
    });
}

/// The answer to one request, inside `scope` when it is a sandbox's.
///
/// What a fleet asks most (pings, metrics and the sandbox list of
/// `check_resources`) is answered here; every other kind in [`answer_boxed`],
/// whose future is kilobytes (it holds the largest of all theirs) and would
/// be copied several times into each request's task.
async fn answer(
    id: RequestId,
    body: Request,
    scope: Option<sandbox::Scope>,
    shared: &Arc<Shared>,
    outbox: &Outbox,
    cancel: watch::Receiver<bool>,
) -> Response {
    match body {
        Request::Ping => Response::Pong,
        Request::Metrics => metrics(shared).await,
        // Read on this thread: a directory and a few small files per
        // sandbox in the agent's own state dir, on the filesystem it runs
        // from. A worker thread cost more than the reading (two context
        // switches, and an answer apart from the metrics beside it: a
        // second packet through sshd).
        Request::SandboxList if scope.is_none() && shared.options.own_process => {
            sandbox::list().unwrap_or_else(Response::Error)
        }
        body => Box::pin(answer_boxed(id, body, scope, shared, outbox, cancel)).await,
    }
}

async fn answer_boxed(
    id: RequestId,
    body: Request,
    scope: Option<sandbox::Scope>,
    shared: &Arc<Shared>,
    outbox: &Outbox,
    cancel: watch::Receiver<bool>,
) -> Response {
    // A sandbox's file requests name paths inside it, opened there without
    // following a symlink; the engine gets the directory checked.
    // Ok(None): a root to read does not exist; the Some holds it open while
    // the request runs. Messages name the root as it was asked for.
    let root = |raw: &mut String,
                write: bool|
     -> Result<Option<Option<(sandbox::OpenedRoot, String)>>, AgentError> {
        let Some(scope) = &scope else {
            return Ok(Some(None));
        };
        match shared.confined.resolve(scope, raw, write, write)? {
            Some(opened) => {
                let asked = std::mem::replace(raw, opened.name.clone());
                Ok(Some(Some((opened, asked))))
            }
            None => Ok(None),
        }
    };
    let unmask = |response: Response, held: &Option<(sandbox::OpenedRoot, String)>| match held {
        Some((opened, asked)) => unmask_root(response, &opened.name, asked),
        None => response,
    };
    let outbox = outbox.clone();
    match body {
        // Inside another program there is no job to hand over to: it runs
        // to its end.
        Request::Exec(req) if !shared.options.own_process => {
            let req = ExecRequest {
                hand_over: None,
                ..req
            };
            exec::run(id, req, &outbox, cancel, scope).await
        }
        Request::Exec(req) => match exec::run_or_hand_over(id, req, &outbox, cancel, scope).await {
            exec::Ran::Answer(response) => response,
            exec::Ran::HandOver(handing) => handover::hand_over(*handing).await,
        },
        Request::Ping => Response::Pong,
        Request::Metrics => metrics(shared).await,
        Request::GpuLease(_) | Request::GpuRelease { .. } if scope.is_some() => error(
            ErrorKind::BadRequest,
            "a sandbox's GPUs are leased when it is created (gpus)",
        ),
        ref r
            if (r.is_sandbox_lifecycle() || matches!(r, Request::InSandbox { .. }))
                && scope.is_some() =>
        {
            error(ErrorKind::BadRequest, "sandboxes do not nest")
        }
        ref r
            if (r.is_sandbox_lifecycle() || matches!(r, Request::InSandbox { .. }))
                && !shared.options.own_process =>
        {
            error(
                ErrorKind::Unsupported,
                "sandboxes need the outpost-agent executable; this agent runs inside another program",
            )
        }
        // The daemon creates it (and starts its keeper). A caller that
        // gives up (cancels, or its connection ends) drops the daemon's
        // connection, and the daemon deletes what it makes for nobody.
        Request::SandboxCreate(spec) => {
            let mut cancel = cancel;
            let create =
                daemon::client::ask_daemon(Request::SandboxCreate(spec), sandbox::CREATE_WAIT);
            tokio::select! {
                response = create => response,
                Ok(_) = cancel.wait_for(|c| *c) => {
                    error(ErrorKind::Unavailable, "cancelled before the sandbox was made")
                }
            }
        }
        Request::SandboxFork { id } => daemon::client::fork_sandbox(id).await,
        r @ (Request::SandboxList
        | Request::SandboxRenew { .. }
        | Request::SandboxDelete { .. }
        | Request::SandboxPause { .. }
        | Request::SandboxResume { .. }
        | Request::SandboxCheckpoint { .. }
        | Request::SandboxCheckpoints { .. }
        | Request::SandboxRestore { .. }
        | Request::SandboxDiff { .. }
        | Request::SandboxExpose { .. }) => blocking(move || sandbox::lifecycle::answer(r)).await,
        Request::InSandbox { .. } => error(ErrorKind::Internal, "unreachable: scoped above"),
        Request::GpuLease(req) => {
            let response = blocking(move || leases::lease(&req).map(Response::GpuLease)).await;
            if let Response::GpuLease(lease) = &response {
                let mut leased = shared.leased.lock().unwrap_or_else(|p| p.into_inner());
                leased.push(lease.lease_id.clone());
            }
            response
        }
        Request::GpuRelease { lease_id } => {
            blocking(move || leases::release(&lease_id).map(|()| Response::Released)).await
        }
        Request::Scan(mut req) => match root(&mut req.root, false) {
            Ok(Some(held)) => unmask(
                files::scan(id, req, &shared.appliers, &outbox, cancel).await,
                &held,
            ),
            Ok(None) => Response::ScanDone(ScanSummary::default()),
            // What a scan says of a file given as its root (one file is
            // synced as its directory, limited to its name).
            Err(_) if scope.as_ref().is_some_and(|s| s.is_plain_file(&req.root)) => {
                Response::ScanDone(ScanSummary {
                    root_exists: true,
                    problems: vec![PathProblem {
                        path: Vec::new(),
                        message: "not a directory".into(),
                    }],
                    ..ScanSummary::default()
                })
            }
            Err(e) => Response::Error(e),
        },
        Request::DescribeFiles {
            root: mut raw,
            paths,
        } => match root(&mut raw, false) {
            Ok(Some(held)) => unmask(
                files::describe(id, &raw, paths, &shared.appliers, &outbox, cancel).await,
                &held,
            ),
            Ok(None) => Response::ScanDone(ScanSummary {
                problems: paths
                    .into_iter()
                    .map(|path| PathProblem {
                        path,
                        message: "does not exist".into(),
                    })
                    .collect(),
                ..ScanSummary::default()
            }),
            Err(e) => Response::Error(e),
        },
        Request::PutFiles(mut req) => match root(&mut req.root, true) {
            Ok(held) => unmask(
                files::put_files(req, &shared.appliers).await,
                &held.flatten(),
            ),
            Err(e) => Response::Error(e),
        },
        Request::PutPart(mut req) => match root(&mut req.root, true) {
            Ok(held) => unmask(
                files::put_part(req, &shared.appliers).await,
                &held.flatten(),
            ),
            Err(e) => Response::Error(e),
        },
        Request::ApplyMeta(mut req) => match root(&mut req.root, true) {
            Ok(held) => unmask(
                files::apply_meta(req, &shared.appliers).await,
                &held.flatten(),
            ),
            Err(e) => Response::Error(e),
        },
        Request::ReadFiles(mut req) => match root(&mut req.root, false) {
            Ok(Some(held)) => unmask(files::read_files(id, req, &outbox, cancel).await, &held),
            Ok(None) => Response::ReadDone {
                problems: req
                    .reads
                    .into_iter()
                    .map(|r| PathProblem {
                        path: r.path,
                        message: "does not exist".into(),
                    })
                    .collect(),
            },
            Err(e) => Response::Error(e),
        },
        Request::Resume(mut req) => match root(&mut req.root, true) {
            Ok(held) => unmask(files::resume(req, &shared.appliers).await, &held.flatten()),
            Err(e) => Response::Error(e),
        },
        Request::JobStart(_)
        | Request::JobStatus { .. }
        | Request::JobList { .. }
        | Request::JobCancel { .. }
        | Request::JobWait(_)
        | Request::JobRead(_)
        | Request::JobCollect(_)
        | Request::JobEvents { .. }
            if !shared.options.own_process =>
        {
            no_jobs()
        }
        Request::CodeRun(_)
        | Request::CodeContexts
        | Request::CodeControl { .. }
        | Request::Terminal(_)
            if !shared.options.own_process =>
        {
            no_jobs()
        }
        request @ (Request::CodeRun(_)
        | Request::CodeContexts
        | Request::CodeControl { .. }
        | Request::Terminal(_)) => daemon::client::ask_code(request, scope.as_ref(), cancel).await,
        Request::CodeInstall(req) => code::install(id, req, &outbox, cancel, scope).await,
        Request::JobStart(mut spec) => {
            if let Some(scope) = &scope {
                spec.sandbox = Some(scope.dirs.id.clone());
            }
            daemon::client::start_job(spec).await
        }
        request => {
            // In a sandbox, only its own jobs.
            let only = scope.map(|s| s.dirs.id);
            job_request(move || jobs::answer(request, only.as_deref(), &cancel)).await
        }
    }
}

/// A sandbox's root is opened as `/proc/self/fd/N`; its messages name it as
/// the caller did.
fn unmask_root(response: Response, opened: &str, asked: &str) -> Response {
    let fix = |m: String| m.replace(opened, asked);
    match response {
        Response::Error(mut e) => {
            e.message = fix(e.message);
            Response::Error(e)
        }
        Response::ScanDone(mut s) => {
            for p in &mut s.problems {
                p.message = fix(std::mem::take(&mut p.message));
            }
            Response::ScanDone(s)
        }
        Response::ReadDone { mut problems } => {
            for p in &mut problems {
                p.message = fix(std::mem::take(&mut p.message));
            }
            Response::ReadDone { problems }
        }
        Response::Applied(mut a) => {
            for p in &mut a.problems {
                p.message = fix(std::mem::take(&mut p.message));
            }
            Response::Applied(a)
        }
        other => other,
    }
}

async fn metrics(shared: &Arc<Shared>) -> Response {
    // Answered here when the sampler has a reading and there are no GPUs
    // whose leases need reading: the common case costs no thread hop.
    if let Some(m) = shared.monitor.latest()
        && m.gpu.gpus.is_empty()
    {
        return Response::Metrics(m);
    }
    let monitor = Arc::clone(&shared.monitor);
    blocking(move || {
        let mut m = monitor.current().map_err(|e| AgentError {
            kind: ErrorKind::Internal,
            message: e,
        })?;
        // Leases change between ticks; read them fresh (one small file).
        leases::annotate(&mut m.gpu.gpus, &leases::live());
        Ok(Response::Metrics(m))
    })
    .await
}

/// The answer to every job request of an in-process agent: the job daemon
/// and shims are started from the agent executable, which that process is
/// not.
fn no_jobs() -> Response {
    error(
        ErrorKind::Unsupported,
        "background jobs need the outpost-agent executable; this agent runs inside another program",
    )
}

/// A job request other than start: answered from the job files, with a
/// check that a daemon watches the jobs that need one.
async fn job_request(
    work: impl FnOnce() -> Result<Response, AgentError> + Send + 'static,
) -> Response {
    daemon::client::nudge();
    blocking(work).await
}

/// Runs blocking work (file locks, /proc, NVML) off the async workers.
async fn blocking(
    work: impl FnOnce() -> Result<Response, AgentError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => Response::Error(e),
        Err(_) => error(ErrorKind::Internal, "the request's worker panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_protocol::ExecRequest;

    #[test]
    fn known_messages_decode() {
        let frame = postcard_payload(&ClientMessage::Cancel { id: 5 });
        assert!(matches!(
            parse(&frame),
            Ok(Inbound::Message(m)) if *m == ClientMessage::Cancel { id: 5 }
        ));
    }

    #[test]
    fn unknown_request_variant_is_unsupported() {
        // Request { id: 300, body: <variant 40> }
        let payload = [0u8, 0xac, 0x02, 40];
        assert!(matches!(parse(&payload), Ok(Inbound::Unsupported(300))));
    }

    #[test]
    fn the_last_request_variant_is_known() {
        // Request { id: 1, body: CodeInstall { .. } }, the last variant.
        let payload = postcard_payload(&ClientMessage::Request {
            id: 1,
            body: Request::CodeInstall(outpost_protocol::CodeInstall::default()),
        });
        assert_eq!(u64::from(payload[2]), KNOWN_REQUESTS - 1);
        assert!(matches!(parse(&payload), Ok(Inbound::Message(_))));
    }

    #[test]
    fn unknown_message_variant_is_ignored() {
        assert!(matches!(parse(&[5u8, 1, 2]), Ok(Inbound::Ignored)));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(&[]).is_err());
        assert!(parse(&[0xff; 12]).is_err());
        // A known request with a truncated body.
        let mut p = postcard_payload(&ClientMessage::Request {
            id: 1,
            body: Request::Exec(ExecRequest {
                command: "true".into(),
                cwd: None,
                env: vec![],
                stdin: None,
                timeout_ms: None,
                output_limit: 10,
                stream: false,
                progress_ms: None,
                hand_over: None,
            }),
        });
        p.truncate(5);
        assert!(parse(&p).is_err());
    }

    fn postcard_payload(msg: &ClientMessage) -> Vec<u8> {
        encode_frame(msg).unwrap()[4..].to_vec()
    }
}
