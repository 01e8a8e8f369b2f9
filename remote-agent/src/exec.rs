//! Running one command: spawn, capture or stream its output, enforce the
//! timeout, honour cancellation, and report how it ended.
//!
//! The command runs as `bash -c` in its own session, marked with a random
//! `OUTPOST_EXEC_TOKEN` so that [`crate::proctree`] can find every process it
//! started when it has to be stopped. A command that ends on its own is never
//! cleaned up after: `cmd &` is how people start daemons. One still running
//! when `serve` dies, however it dies, is killed by the [guard](crate::guard).

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use outpost_protocol::limits::{
    MAX_EXEC_OUTPUT_LIMIT, MAX_STDIN_LEN, MIN_PROGRESS_MS, OUTPUT_CHUNK_LEN, PROGRESS_LINE_LEN,
};
use outpost_protocol::{
    AgentError, CapturedOutput, ErrorKind, ExecProgress, ExecRequest, ExecResult, HandOver,
    OutputStream, RequestId, Response,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::watch;

use crate::capture::Capture;
use crate::outbox::Outbox;
use crate::proctree::{self, TOKEN_VAR};
use crate::running::{Process, Running};
use crate::sandbox::Scope;
use crate::{guard, paths, supervisor};

/// After the main process exits, how long leftover background processes may
/// hold the pipes open before the result goes out without waiting for EOF.
const EOF_GRACE: Duration = Duration::from_millis(250);
/// Once we stop waiting for EOF, at most this much more is drained per stream,
/// so a leftover `yes &` cannot keep the request open.
const DRAIN_CAP: usize = 1024 * 1024;
/// Upper bound on waits that only a wedged kernel or controller could exceed.
const STUCK: Duration = Duration::from_secs(2);

/// Why the wait for the main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exited,
    TimedOut,
    Cancelled,
    /// Still running at its `hand_over` time.
    HandedOver,
}

/// A validated request, ready to spawn.
struct Plan {
    command: String,
    /// As the command sees it (inside its sandbox, if any).
    cwd: PathBuf,
    sandbox: Option<Scope>,
    env: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
    limit: usize,
    stream: bool,
    progress: Option<Duration>,
    /// When it becomes a job, and under which name (see [`crate::supervisor`]).
    hand_over: Option<HandOver>,
}

fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError {
        kind,
        message: message.into(),
    }
}

/// Checks everything that can be checked before spawning, so that bad input
/// gets a precise error instead of a confusing spawn failure.
fn plan(req: ExecRequest, sandbox: Option<Scope>) -> Result<Plan, AgentError> {
    let bad = |m: String| error(ErrorKind::BadRequest, m);
    if let Some(stdin) = &req.stdin
        && stdin.len() > MAX_STDIN_LEN
    {
        return Err(bad(format!(
            "stdin of {} bytes exceeds the {MAX_STDIN_LEN}-byte limit",
            stdin.len()
        )));
    }
    if req.command.contains('\0') {
        return Err(bad("command contains a NUL byte".into()));
    }
    if sandbox.is_some() {
        crate::sandbox::check_env(&req.env)?;
    }
    for (name, value) in &req.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(bad(format!("invalid environment variable name {name:?}")));
        }
        if value.contains('\0') {
            return Err(bad(format!(
                "environment variable {name} contains a NUL byte"
            )));
        }
    }
    if req.cwd.as_deref().is_some_and(|c| c.contains('\0')) {
        return Err(bad("cwd contains a NUL byte".into()));
    }
    if let Some(h) = &req.hand_over {
        if req.stream {
            return Err(bad("hand_over cannot be combined with stream".into()));
        }
        if !crate::statefile::valid_name(&h.job) {
            return Err(bad(format!("invalid job name {:?}", h.job)));
        }
    }
    let cwd = match &sandbox {
        Some(scope) => scope.cwd(req.cwd.as_deref())?,
        None => paths::resolve_cwd(req.cwd.as_deref()),
    };
    // Inside bwrap, a path such as /tmp is not the host's: `enter` checks it.
    let checkable = sandbox.as_ref().is_none_or(|s| s.same_inside(&cwd));
    match std::fs::metadata(&cwd) {
        _ if !checkable => {}
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(error(
                ErrorKind::SpawnFailed,
                format!("cwd is not a directory: {}", cwd.display()),
            ));
        }
        Err(_) => {
            return Err(error(
                ErrorKind::SpawnFailed,
                format!("cwd not found: {}", cwd.display()),
            ));
        }
    }
    Ok(Plan {
        command: req.command,
        cwd,
        sandbox,
        env: req.env,
        stdin: req.stdin,
        timeout: req.timeout_ms.map(Duration::from_millis),
        limit: req.output_limit.min(MAX_EXEC_OUTPUT_LIMIT) as usize,
        stream: req.stream,
        progress: req
            .progress_ms
            .map(|ms| Duration::from_millis(ms.max(MIN_PROGRESS_MS).into())),
        hand_over: req.hand_over,
    })
}

/// A token naming one exec's process tree. It must be unique among the
/// processes on the host, not secret: agent pid + per-agent counter + clock.
/// (No getrandom: the portable build links against glibc 2.17, which lacks it.)
pub fn new_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn spawn(plan: &Plan, token: &str) -> Result<Running, AgentError> {
    let shell = paths::shell();
    let failed = |e: io::Error| {
        let message = if e.kind() == io::ErrorKind::NotFound && !shell.exists() {
            format!("shell not found: {}", shell.display())
        } else {
            format!(
                "cannot start {} in {}: {e}",
                shell.display(),
                plan.cwd.display()
            )
        };
        error(ErrorKind::SpawnFailed, message)
    };
    let spawn_failed = |e: String| error(ErrorKind::SpawnFailed, e);
    let mut cmd = match &plan.sandbox {
        Some(scope) => match scope.entry().map_err(spawn_failed)? {
            // Straight in, under a supervisor, with no `enter` in between.
            Some(entry) => {
                let program = supervisor::Program {
                    path: shell.into(),
                    args: vec!["-c".into(), plan.command.clone().into()],
                    env: scope.entry_env(&plan.env, (TOKEN_VAR, token)),
                    cwd: plan.cwd.clone().into(),
                };
                return supervisor::start(&program, plan.stdin.is_some(), Some(&entry))
                    .and_then(Running::supervised)
                    .map_err(failed);
            }
            None => scope
                .command(shell, &plan.command, &plan.cwd, &plan.env)
                .map_err(spawn_failed)?,
        },
        None => {
            let mut cmd = std::process::Command::new(shell);
            cmd.arg("-c")
                .arg(&plan.command)
                .current_dir(&plan.cwd)
                .envs(plan.env.iter().map(|(k, v)| (k, v)));
            cmd
        }
    };
    cmd.env(TOKEN_VAR, token);
    if plan.hand_over.is_some() {
        // A sandbox's command starts from the environment it was given.
        let program = supervisor::Program::of(&cmd, plan.sandbox.is_none());
        return supervisor::start(&program, plan.stdin.is_some(), None)
            .and_then(Running::supervised)
            .map_err(failed);
    }
    let mut cmd = Command::from(cmd);
    cmd.stdin(if plan.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // Last resort if this task is ever dropped mid-flight.
    .kill_on_drop(true);
    let agent = std::process::id() as libc::pid_t;
    // SAFETY: child_setup and getppid only make async-signal-safe calls,
    // and the error is built without allocating.
    unsafe {
        cmd.pre_exec(move || {
            supervisor::child_setup()?;
            // Run after the chdir: a start stuck on a hung filesystem may
            // outlive the session (which then no longer waits for it), and
            // a command whose agent is gone would run unsupervised.
            if libc::getppid() != agent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(failed)?;
    Running::direct(child)
        .ok_or_else(|| error(ErrorKind::Internal, "spawned child lacks its pipes"))
}

/// Resolves when a command that is still starting reaches its deadline or
/// is cancelled.
async fn stalled(
    started: Instant,
    timeout: Option<Duration>,
    cancel: &mut watch::Receiver<bool>,
) -> Ending {
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep_until((started + t).into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => Ending::TimedOut,
        // A dropped sender means nobody can cancel any more.
        Ok(_) = cancel.wait_for(|c| *c) => Ending::Cancelled,
    }
}

/// What progress reports are made of: counted as output passes, whatever
/// is kept of it.
#[derive(Default)]
struct Tally {
    bytes: [AtomicU64; 2],
    lines: AtomicU64,
    text: Mutex<LastLine>,
}

#[derive(Default)]
struct LastLine {
    /// The last non-empty line either stream completed.
    done: Vec<u8>,
    /// The stream written to last: its partial line is the newest text.
    latest: usize,
    /// Each stream's line in progress (after its last `\r`, so a progress
    /// bar shows its latest state), at most [`PROGRESS_LINE_LEN`] bytes.
    partial: [Vec<u8>; 2],
}

impl Tally {
    fn push(&self, stream: OutputStream, data: &[u8]) {
        let which = stream as usize;
        self.bytes[which].fetch_add(data.len() as u64, Ordering::Relaxed);
        let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
        self.lines.fetch_add(newlines, Ordering::Relaxed);
        let mut text = self.text.lock().unwrap_or_else(|p| p.into_inner());
        text.latest = which;
        let Some(last_nl) = data.iter().rposition(|&b| b == b'\n') else {
            append_line(&mut text.partial[which], data);
            return;
        };
        let complete = &data[..last_nl];
        // The first line of the chunk finishes the stream's partial line.
        let first_end = complete
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(complete.len());
        let later = complete[first_end..]
            .rsplit(|&b| b == b'\n')
            .map(after_cr)
            .find(|l| !l.trim_ascii().is_empty());
        let line = match later {
            Some(l) => l[..l.len().min(PROGRESS_LINE_LEN)].to_vec(),
            None => {
                let mut first = std::mem::take(&mut text.partial[which]);
                append_line(&mut first, &complete[..first_end]);
                if first.last() == Some(&b'\r') {
                    first.pop();
                }
                first
            }
        };
        if !line.trim_ascii().is_empty() {
            text.done = line;
        }
        text.partial[which].clear();
        append_line(&mut text.partial[which], &data[last_nl + 1..]);
    }

    fn snapshot(&self, started: Instant) -> ExecProgress {
        let text = self.text.lock().unwrap_or_else(|p| p.into_inner());
        // A line still being written (a prompt, a progress bar) on the
        // stream written to last is newer than the last finished one.
        let partial = &text.partial[text.latest];
        let line = if partial.trim_ascii().is_empty() {
            &text.done
        } else {
            partial
        };
        ExecProgress {
            stdout_bytes: self.bytes[0].load(Ordering::Relaxed),
            stderr_bytes: self.bytes[1].load(Ordering::Relaxed),
            lines: self.lines.load(Ordering::Relaxed),
            last_line: String::from_utf8_lossy(line.trim_ascii()).into_owned(),
            elapsed_ms: started.elapsed().as_millis() as u64,
        }
    }
}

/// The text after a line's last carriage return (a `\r\n` ending is not
/// one).
fn after_cr(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match line.iter().rposition(|&b| b == b'\r') {
        Some(i) => &line[i + 1..],
        None => line,
    }
}

/// Continues a partial line with `data` (no newline in it): a `\r` starts
/// it over; past [`PROGRESS_LINE_LEN`] bytes the rest is dropped.
fn append_line(line: &mut Vec<u8>, data: &[u8]) {
    let data = match data.iter().rposition(|&b| b == b'\r') {
        Some(i) => {
            line.clear();
            &data[i + 1..]
        }
        None => data,
    };
    let room = PROGRESS_LINE_LEN.saturating_sub(line.len());
    line.extend_from_slice(&data[..data.len().min(room)]);
}

/// Where a stream's bytes go.
struct Sink<'a> {
    capture: Capture,
    /// Set when streaming: chunks go to the controller as they arrive.
    stream: Option<(&'a Outbox, RequestId, OutputStream)>,
    /// Set when progress is reported.
    tally: Option<(&'a Tally, OutputStream)>,
}

impl Sink<'_> {
    async fn deliver(&mut self, data: &[u8]) {
        if let Some((tally, stream)) = self.tally {
            tally.push(stream, data);
        }
        match self.stream {
            Some((outbox, id, stream)) => {
                // A gone controller is handled by the serve loop; keep reading
                // so the command is never blocked on a full pipe.
                let _ = outbox
                    .send(
                        id,
                        Response::Output {
                            stream,
                            data: data.to_vec(),
                        },
                    )
                    .await;
            }
            None => self.capture.push(data),
        }
    }

    fn finish(self) -> CapturedOutput {
        match self.stream {
            Some(_) => CapturedOutput::default(),
            None => self.capture.finish(),
        }
    }
}

/// Polls `fut` once: its output if ready now, else None.
async fn ready_now<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Copies one pipe into `sink` until EOF, or, once `stop` is set, until the
/// pipe has nothing ready (bounded by [`DRAIN_CAP`]).
async fn pump<R: AsyncRead + Unpin>(
    mut pipe: R,
    sink: &mut Sink<'_>,
    stop: &watch::Receiver<bool>,
) {
    let mut stop = stop.clone();
    let mut buf = vec![0u8; OUTPUT_CHUNK_LEN];
    let mut stopping = false;
    let mut drained = 0usize;
    loop {
        let read = if stopping {
            match ready_now(pipe.read(&mut buf)).await {
                Some(r) => r,
                None => return,
            }
        } else {
            tokio::select! {
                biased;
                r = pipe.read(&mut buf) => r,
                _ = stop.wait_for(|s| *s) => {
                    stopping = true;
                    continue;
                }
            }
        };
        let n = match read {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        sink.deliver(&buf[..n]).await;
        if stopping {
            drained += n;
            if drained >= DRAIN_CAP {
                return;
            }
        }
    }
}

/// A command still running at its `hand_over` time, and what the job
/// needs to know of it.
pub struct Handing {
    pub job: String,
    pub command: String,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    pub sandbox: Option<Scope>,
    pub token: String,
    pub pid: i32,
    pub process: Process,
    pub guarded: guard::Supervised,
    pub so_far: ExecResult,
    pub started: Instant,
    pub cancel: watch::Receiver<bool>,
}

/// How [`run_or_hand_over`] ended: its final response, or a command still
/// running at its `hand_over` time, for [`crate::handover`] to make a job.
#[allow(clippy::large_enum_variant)] // the answer is the common case: no box for it
pub enum Ran {
    Answer(Response),
    HandOver(Box<Handing>),
}

/// Runs one exec request, which has no `hand_over`, to its final response.
pub async fn run(
    id: RequestId,
    req: ExecRequest,
    outbox: &Outbox,
    cancel: watch::Receiver<bool>,
    sandbox: Option<Scope>,
) -> Response {
    let req = ExecRequest {
        hand_over: None,
        ..req
    };
    match run_or_hand_over(id, req, outbox, cancel, sandbox).await {
        Ran::Answer(response) => response,
        Ran::HandOver(_) => Response::Error(error(
            ErrorKind::Internal,
            "an exec without hand_over reached a hand-over",
        )),
    }
}

/// Runs one exec request to its final response, or to its hand-over.
pub async fn run_or_hand_over(
    id: RequestId,
    req: ExecRequest,
    outbox: &Outbox,
    mut cancel: watch::Receiver<bool>,
    sandbox: Option<Scope>,
) -> Ran {
    let started = Instant::now();
    let timeout = req.timeout_ms.map(Duration::from_millis);
    // The cwd check and the fork (which waits for the child's chdir and
    // exec) wait on the filesystem, a hung NFS home included: off the
    // session's one thread, which must go on reading frames.
    let mut launching = tokio::task::spawn_blocking(move || {
        let plan = plan(req, sandbox)?;
        // Before the command can ask for anything.
        let egress = plan.sandbox.as_ref().and_then(Scope::egress_watermark);
        let listen = plan.sandbox.as_ref().and_then(Scope::listening);
        let token = new_token();
        // Under the guard from before the spawn until the command ended (or
        // was killed, or became a job), so that a dying serve never leaves
        // it running.
        let supervised = guard::watch(&token);
        let running = match spawn(&plan, &token) {
            Ok(running) => running,
            Err(e) => {
                supervised.ended();
                return Err(e);
            }
        };
        supervised.rooted(running.pid);
        Ok((plan, token, supervised, running, (egress, listen)))
    });
    let launched = tokio::select! {
        launched = &mut launching => launched,
        ending = stalled(started, timeout, &mut cancel) => {
            // Still starting at its deadline or cancel: answer now, and end
            // whatever the start gives once it returns.
            tokio::spawn(async move {
                if let Ok(Ok((_, token, supervised, running, _))) = launching.await {
                    let Running { pid, mut process, .. } = running;
                    let _ = tokio::task::spawn_blocking(move || proctree::terminate(pid, &token)).await;
                    let _ = tokio::time::timeout(STUCK, process.wait()).await;
                    process.release().await;
                    supervised.ended();
                }
            });
            return Ran::Answer(Response::ExecDone(ExecResult {
                exit_code: None,
                signal: None,
                timed_out: ending == Ending::TimedOut,
                cancelled: ending == Ending::Cancelled,
                stdout: CapturedOutput::default(),
                stderr: CapturedOutput::default(),
                duration_ms: started.elapsed().as_millis() as u64,
                egress_denied: Vec::new(),
                listening: Vec::new(),
            }));
        }
    };
    let (plan, token, guarded, running, (egress, listen)) = match launched {
        Ok(Ok(launched)) => launched,
        Ok(Err(e)) => return Ran::Answer(Response::Error(e)),
        Err(_) => {
            return Ran::Answer(Response::Error(error(
                ErrorKind::Internal,
                "the spawn panicked",
            )));
        }
    };
    let Running {
        pid,
        stdin,
        stdout,
        stderr,
        mut process,
    } = running;

    // Stdin is fed by its own task so a command that never reads it cannot
    // stall output capture; EPIPE from a command that exits early is normal.
    let feeder = match (stdin, &plan.stdin) {
        (Some(mut pipe), Some(data)) => {
            let data = data.clone();
            Some(tokio::spawn(async move {
                let _ = pipe.write_all(&data).await;
                let _ = pipe.shutdown().await;
            }))
        }
        _ => None,
    };

    let tally = Tally::default();
    let sink = |stream| Sink {
        capture: Capture::new(if plan.stream { 0 } else { plan.limit }),
        stream: plan.stream.then_some((outbox, id, stream)),
        tally: plan.progress.is_some().then_some((&tally, stream)),
    };
    // The first report comes one period in: a command that ends sooner costs
    // nothing (the controller tells its client at once that it started).
    let period = plan.progress.unwrap_or(Duration::from_secs(3600));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut out_sink = sink(OutputStream::Stdout);
    let mut err_sink = sink(OutputStream::Stderr);
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut guarded = Some(guarded);
    let mut status: Option<ExitStatus> = None;
    let ending = {
        let mut pumps = pin!(async {
            tokio::join!(
                pump(stdout, &mut out_sink, &stop_rx),
                pump(stderr, &mut err_sink, &stop_rx)
            )
        });
        let mut pumps_done = false;
        let at = |after: Option<Duration>| async move {
            match after {
                Some(t) => tokio::time::sleep_until((started + t).into()).await,
                None => std::future::pending().await,
            }
        };
        let mut deadline = pin!(at(plan.timeout));
        let mut hand_over = pin!(at(plan
            .hand_over
            .as_ref()
            .map(|h| Duration::from_millis(h.after_ms))));
        let mut cancelled = pin!(async {
            // A dropped sender means nobody can cancel any more.
            if cancel.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        });

        let mut ending = loop {
            tokio::select! {
                st = process.wait() => {
                    status = st;
                    break Ending::Exited;
                }
                _ = &mut pumps, if !pumps_done => pumps_done = true,
                _ = &mut deadline => break Ending::TimedOut,
                _ = &mut cancelled => break Ending::Cancelled,
                _ = &mut hand_over => break Ending::HandedOver,
                _ = ticker.tick(), if plan.progress.is_some() => {
                    // Never waits: a full queue skips this report, so the
                    // deadline and a cancel are always heard.
                    outbox.offer(id, Response::ExecProgress(tally.snapshot(started)));
                }
            }
        };

        // The command may have finished just as the deadline or the cancel
        // came; then it ended on its own and its leftovers are not ours to kill.
        if ending != Ending::Exited
            && let Some(st) = process.try_wait().await
        {
            status = Some(st);
            ending = Ending::Exited;
        }

        if ending == Ending::HandedOver {
            // The pipes go with the pumps, unread past this point: the job's
            // shim reads on from here.
        } else {
            if ending != Ending::Exited {
                // The child is not reaped yet, so its pid still names its
                // process group and session while the tree is being killed.
                let token = token.clone();
                let mut kill = pin!(tokio::task::spawn_blocking(move || {
                    proctree::terminate(pid, &token)
                }));
                // Keep reading meanwhile: a dying process may print, and must
                // not block on a full pipe.
                loop {
                    tokio::select! {
                        _ = &mut kill => break,
                        _ = &mut pumps, if !pumps_done => pumps_done = true,
                    }
                }
                status = tokio::time::timeout(STUCK, process.wait())
                    .await
                    .ok()
                    .flatten();
            }
            // Ended on its own or killed: what is left (`cmd &`) is not the
            // guard's to kill, even while the output is still drained.
            if let Some(guarded) = guarded.take() {
                guarded.ended();
            }

            if !pumps_done {
                let grace = tokio::time::sleep(EOF_GRACE);
                tokio::select! {
                    _ = &mut pumps => pumps_done = true,
                    _ = grace => {}
                }
            }
            if !pumps_done {
                let _ = stop_tx.send(true);
                let _ = tokio::time::timeout(STUCK, &mut pumps).await;
            }
        }
        ending
    };
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    let result =
        |status: Option<ExitStatus>, ending: Ending, out: CapturedOutput, err| ExecResult {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            timed_out: ending == Ending::TimedOut,
            cancelled: ending == Ending::Cancelled,
            stdout: out,
            stderr: err,
            duration_ms: started.elapsed().as_millis() as u64,
            egress_denied: egress.as_ref().map(|w| w.since()).unwrap_or_default(),
            listening: listen.as_ref().map(|l| l.opened()).unwrap_or_default(),
        };
    let Some(guarded) = guarded.filter(|_| ending == Ending::HandedOver) else {
        process.release().await;
        return Ran::Answer(Response::ExecDone(result(
            status,
            ending,
            out_sink.finish(),
            err_sink.finish(),
        )));
    };
    let so_far = result(None, ending, out_sink.finish(), err_sink.finish());
    Ran::HandOver(Box::new(Handing {
        job: plan.hand_over.map(|h| h.job).unwrap_or_default(),
        command: plan.command,
        cwd: plan.cwd,
        env: plan.env,
        timeout_ms: plan.timeout.map(|t| t.as_millis() as u64),
        sandbox: plan.sandbox,
        token,
        pid,
        process,
        guarded,
        so_far,
        started,
        cancel,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stuck_start_ends_at_its_deadline_or_cancel() {
        let (tx, mut rx) = watch::channel(false);
        let timeout = Some(Duration::from_millis(50));
        let ending = stalled(Instant::now(), timeout, &mut rx).await;
        assert!(ending == Ending::TimedOut);
        tx.send(true).unwrap();
        let ending = stalled(Instant::now(), None, &mut rx).await;
        assert!(ending == Ending::Cancelled);
        // Nobody left to cancel and no deadline: it waits for the start.
        let (tx, mut rx) = watch::channel(false);
        drop(tx);
        let stuck = stalled(Instant::now(), None, &mut rx);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), stuck)
                .await
                .is_err()
        );
    }

    #[test]
    fn tokens_are_unique_and_environ_safe() {
        let a = new_token();
        let b = new_token();
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-'), "{a}");
        assert!(a.starts_with(&format!("{}-", std::process::id())));
        assert_ne!(a, b);
    }

    fn req(command: &str) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms: None,
            output_limit: 100,
            stream: false,
            progress_ms: None,
            hand_over: None,
        }
    }

    #[test]
    fn bad_requests_are_rejected_before_spawn() {
        let mut r = req("true");
        r.stdin = Some(vec![0; MAX_STDIN_LEN + 1]);
        assert_eq!(plan(r, None).err().unwrap().kind, ErrorKind::BadRequest);
        let mut r = req("true");
        r.env = vec![("A=B".into(), "x".into())];
        assert_eq!(plan(r, None).err().unwrap().kind, ErrorKind::BadRequest);
        assert_eq!(
            plan(req("a\0b"), None).err().unwrap().kind,
            ErrorKind::BadRequest
        );
        let mut r = req("true");
        r.cwd = Some("/no/such/dir/xyz".into());
        let e = plan(r, None).err().unwrap();
        assert_eq!(e.kind, ErrorKind::SpawnFailed);
        assert_eq!(e.message, "cwd not found: /no/such/dir/xyz");
    }

    #[test]
    fn progress_keeps_the_newest_line() {
        let tally = Tally::default();
        let line = |t: &Tally| t.snapshot(Instant::now()).last_line;
        tally.push(OutputStream::Stdout, b"one\r\ntwo\r\n\r\n");
        assert_eq!(line(&tally), "two");
        tally.push(OutputStream::Stderr, b"bar 10%\rbar 50%");
        assert_eq!(line(&tally), "bar 50%");
        // A half-line on stdout is older than stderr's newer lines.
        tally.push(OutputStream::Stdout, b"half");
        tally.push(OutputStream::Stderr, b"\rbar 90%\nlogged\n");
        assert_eq!(line(&tally), "logged");
        tally.push(OutputStream::Stdout, b" done\n");
        assert_eq!(line(&tally), "half done");
        let p = tally.snapshot(Instant::now());
        assert_eq!((p.lines, p.stdout_bytes), (6, 22));
    }

    #[test]
    fn output_limit_is_clamped() {
        let mut r = req("true");
        r.output_limit = u64::MAX;
        assert_eq!(
            plan(r, None).ok().unwrap().limit as u64,
            MAX_EXEC_OUTPUT_LIMIT
        );
    }
}
