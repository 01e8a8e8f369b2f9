//! One code context's interpreter process (`worker.py` or `worker.sh`):
//! started inside the scope's isolation, its requests on fd 3 and answers on
//! fd 4, its stdout and stderr read all the time and cut into runs at the
//! worker's end-of-run markers.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use outpost_protocol::limits::{MAX_CODE_OUTPUT_LIMIT, MAX_CODE_RESULTS_LEN};
use outpost_protocol::{
    AgentError, CodeError, CodeExecution, CodeLanguage, CodeResult, CodeRun, ErrorKind,
};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// How long a run may go on after its interrupt before the context restarts.
pub const GRACE: Duration = Duration::from_secs(2);
/// How long a new worker may take to say it is ready.
pub const START_WAIT: Duration = Duration::from_secs(30);
use super::{BASH_WORKER, PYTHON_BOOT, PYTHON_WORKER, error, sh_quote};
use crate::capture::Capture;
use crate::proctree::{self, TOKEN_VAR};
use crate::sandbox::Scope;
use crate::{exec, paths};

/// How long a run's output may lag its answer (a C library's buffer being
/// flushed, a child still writing) before it is taken as it is.
const OUTPUT_LAG: Duration = Duration::from_secs(1);
/// How long a worker found dead may still take to hand over an answer it
/// wrote before it ended (its pipe is closed at once unless a child of it
/// holds the write end).
const LAST_ANSWER_WAIT: Duration = Duration::from_millis(200);
/// Longest answer line a worker may send (it caps its own results well
/// below this).
const MAX_REPLY: usize = 64 << 20;
/// Most bytes of an error's value and traceback an answer carries.
const MAX_ERROR_TEXT: usize = 64 << 10;

/// The interrupt a run gets: Python's interpreter alone (a second SIGINT
/// could land in its exception handling), bash's whole process group (the
/// foreground command must stop; the shell traps it).
pub(super) fn signal_run(pid: i32, language: CodeLanguage) {
    // SAFETY: plain signals to our own child or its group.
    unsafe {
        match language {
            CodeLanguage::Python => libc::kill(pid, libc::SIGINT),
            CodeLanguage::Bash => libc::killpg(pid, libc::SIGINT),
        };
    }
}

/// One interpreter process and its pipes.
pub(super) struct Worker {
    child: Child,
    /// Its pid until it is reaped, then 0 (see `Status::pid`).
    pub(super) pid: Arc<AtomicI32>,
    pub(super) token: String,
    /// Runs sent so far: run N's output ends at the marker with N.
    runs: u64,
    requests: pipe::Sender,
    replies: Replies,
    streams: Arc<Streams>,
}

/// Reaps the worker and forgets its pid, so nothing signals it again.
pub(super) async fn reap(
    child: &mut Child,
    pid: &AtomicI32,
) -> std::io::Result<std::process::ExitStatus> {
    let status = child.wait().await;
    pid.store(0, Ordering::SeqCst);
    status
}

/// A worker dropped without [`Worker::kill`] (its context stopped or
/// removed) still leaves nothing behind.
impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let token = std::mem::take(&mut self.token);
        if !token.is_empty() {
            std::thread::spawn(move || proctree::terminate_tree(None, &token, Duration::ZERO));
        }
    }
}

/// The worker's fd 4: JSON lines.
pub(super) struct Replies {
    pipe: pipe::Receiver,
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
}

impl Replies {
    /// The next line; cancel-safe (what was read stays in `buf`).
    pub(super) async fn next(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(end) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + end;
                self.scanned = 0;
                return Ok(self.buf.drain(..=end).collect());
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_REPLY {
                return Err("the worker's answer is too long".into());
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.pipe.read(&mut chunk).await {
                Ok(0) => return Err("the worker closed its answers".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("reading the worker's answer: {e}")),
            }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Reply {
    #[serde(default)]
    results: Vec<ReplyResult>,
    error: Option<ReplyError>,
    #[serde(default)]
    lost: Vec<String>,
    exit_code: Option<i32>,
    /// The shell is exiting (`exit`, `set -e`): its state goes with it.
    #[serde(default)]
    exited: bool,
}

#[derive(Deserialize)]
pub(super) struct ReplyResult {
    data: BTreeMap<String, String>,
    #[serde(default)]
    is_main_result: bool,
}

#[derive(Deserialize)]
pub(super) struct ReplyError {
    name: String,
    value: String,
    traceback: String,
}

#[derive(Deserialize)]
pub(super) struct Ready {
    ready: bool,
}

/// How a run's wait ended.
pub(super) enum End {
    Answered(Reply),
    /// Answered, and found dead before its answer was read.
    AnsweredThenDied(Reply, std::process::ExitStatus),
    Died(std::process::ExitStatus),
    /// The answer could not be read or made no sense.
    Broken(String),
    /// An answer line that does not parse.
    Unreadable(String),
    /// Still going [`GRACE`] after its interrupt.
    Stuck,
}

impl Worker {
    pub(super) async fn start(
        sandbox: Option<&str>,
        language: CodeLanguage,
    ) -> Result<Worker, AgentError> {
        let mark = new_mark()?;
        let token = format!("code-{}", exec::new_token());
        let spawn_failed = |m: String| error(ErrorKind::SpawnFailed, m);
        let (program, args): (&str, Vec<&str>) = match language {
            CodeLanguage::Python => ("python3", vec!["-u", "-c", PYTHON_BOOT]),
            CodeLanguage::Bash => ("bash", vec!["--noprofile", "--norc", "-c", BASH_WORKER]),
        };
        let mut env = vec![
            (
                "OUTPOST_WORKER_MARK".to_string(),
                String::from_utf8_lossy(&mark).into_owned(),
            ),
            ("MPLBACKEND".to_string(), "Agg".to_string()),
            ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
        ];
        let mut cmd = match sandbox {
            Some(id) => {
                let scope = Scope::of(id)?;
                env.push((
                    "OUTPOST_VENV".into(),
                    super::venv(Some(&scope))?.display().to_string(),
                ));
                let work = scope.dirs.work();
                Command::from(
                    scope
                        .program(program, &args, &work, &env)
                        .map_err(spawn_failed)?,
                )
            }
            None => {
                env.push((
                    "OUTPOST_VENV".into(),
                    super::venv(None)?.display().to_string(),
                ));
                let mut cmd = Command::new(program);
                cmd.args(&args).envs(env.iter().map(|(k, v)| (k, v)));
                if let Some(home) = paths::home_dir() {
                    cmd.current_dir(home);
                }
                cmd
            }
        };
        let (to_worker, worker_in) = pipe_pair()?;
        let (worker_out, from_worker) = pipe_pair()?;
        let (child_in, child_out) = (worker_in.as_raw_fd(), worker_out.as_raw_fd());
        cmd.env(TOKEN_VAR, &token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls (fcntl, dup2, setsid, signal).
        unsafe {
            cmd.pre_exec(move || {
                crate::supervisor::child_setup()?;
                place_fds(child_in, child_out)
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            spawn_failed(if e.kind() == std::io::ErrorKind::NotFound {
                format!("{program} not found on this host's PATH")
            } else {
                format!("cannot start {program}: {e}")
            })
        })?;
        drop((worker_in, worker_out));
        let pid = Arc::new(AtomicI32::new(child.id().map_or(0, |p| p as i32)));
        let streams = Arc::new(Streams::new(mark.clone()));
        streams.begin_start(64 * 1024);
        for (i, out) in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(out) = out {
                tokio::spawn(Arc::clone(&streams).pump(i, out));
            }
        }
        let requests = pipe::Sender::from_owned_fd(to_worker)
            .map_err(|e| error(ErrorKind::Internal, format!("worker pipe: {e}")))?;
        let replies = pipe::Receiver::from_owned_fd(from_worker)
            .map_err(|e| error(ErrorKind::Internal, format!("worker pipe: {e}")))?;
        let mut worker = Worker {
            child,
            pid,
            token,
            runs: 0,
            requests,
            replies: Replies {
                pipe: replies,
                buf: Vec::new(),
                scanned: 0,
            },
            streams,
        };
        if language == CodeLanguage::Python {
            let mut source = serde_json::to_vec(PYTHON_WORKER).unwrap_or_default();
            source.push(b'\n');
            if worker.requests.write_all(&source).await.is_err() {
                return Err(worker.failed_start(program).await);
            }
        }
        let ready = tokio::time::timeout(START_WAIT, worker.replies.next()).await;
        match ready {
            Ok(Ok(line)) if serde_json::from_slice::<Ready>(&line).is_ok_and(|r| r.ready) => {
                worker.streams.take(Duration::ZERO).await;
                Ok(worker)
            }
            _ => Err(worker.failed_start(program).await),
        }
    }

    /// Why a worker did not start: what it said on stderr.
    pub(super) async fn failed_start(mut self, program: &str) -> AgentError {
        let _ = self.child.start_kill();
        let status = tokio::time::timeout(Duration::from_secs(2), self.wait()).await;
        let (_, stderr) = self.streams.take(OUTPUT_LAG).await;
        let said = String::from_utf8_lossy(&stderr.tail)
            .trim()
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        let said = format!("{}{said}", String::from_utf8_lossy(&stderr.head).trim());
        let how = match status {
            Ok(Ok(s)) if s.code() == Some(127) => format!("{program} not found"),
            Ok(Ok(s)) => format!("{program} exited ({s})"),
            _ => format!("{program} did not answer within {}s", START_WAIT.as_secs()),
        };
        error(
            ErrorKind::SpawnFailed,
            if said.is_empty() {
                format!("the {program} worker did not start: {how}")
            } else {
                format!("the {program} worker did not start: {how}: {said}")
            },
        )
    }

    pub(super) fn exited(&mut self) -> bool {
        let exited = !matches!(self.child.try_wait(), Ok(None));
        if exited {
            self.pid.store(0, Ordering::SeqCst);
        }
        exited
    }

    pub(super) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        reap(&mut self.child, &self.pid).await
    }

    pub(super) async fn kill(mut self) {
        let _ = self.child.start_kill();
        let token = std::mem::take(&mut self.token);
        let _ = tokio::task::spawn_blocking(move || {
            proctree::terminate_tree(None, &token, Duration::ZERO)
        })
        .await;
        let _ = self.wait().await;
    }

    pub(super) async fn run(&mut self, req: &CodeRun, language: CodeLanguage) -> CodeExecution {
        let limit = req.output_limit.clamp(1, MAX_CODE_OUTPUT_LIMIT) as usize;
        self.runs += 1;
        self.streams.begin(limit, self.runs);
        let message = match language {
            CodeLanguage::Python => {
                let env: BTreeMap<&str, &str> = req
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let mut line =
                    serde_json::to_vec(&serde_json::json!({"code": req.code, "env": env}))
                        .unwrap_or_default();
                line.push(b'\n');
                line
            }
            CodeLanguage::Bash => {
                // The run's variables last for the run only: each one's
                // previous state is kept and put back after it.
                let (mut setup, mut restore) = (String::new(), String::new());
                for (k, v) in &req.env {
                    setup.push_str(&format!(
                        "__outpost_saved_{k}=$(declare -p {k} 2>/dev/null); export {k}={}\n",
                        sh_quote(v)
                    ));
                    restore.push_str(&format!(
                        "if [ -n \"$__outpost_saved_{k}\" ]; then eval \"$__outpost_saved_{k}\"; else unset {k}; fi; unset __outpost_saved_{k}\n"
                    ));
                }
                format!("{setup}\0{}\0{restore}\0", req.code).into_bytes()
            }
        };
        let mut timed_out = false;
        let mut deadline = (req.timeout_ms > 0)
            .then(|| tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms));
        // A worker that does not read (stopped, or busy in a thread) must
        // not hold the run past its deadline.
        let written = match deadline {
            Some(at) => tokio::time::timeout_at(at, self.requests.write_all(&message))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
            None => self.requests.write_all(&message).await,
        };
        let end = if let Err(e) = written {
            if e.kind() == std::io::ErrorKind::TimedOut {
                timed_out = true;
                End::Broken("the interpreter did not take the code before its timeout".into())
            } else {
                match self.wait().await {
                    Ok(status) => End::Died(status),
                    Err(e) => End::Broken(e.to_string()),
                }
            }
        } else {
            loop {
                let sleep = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    line = self.replies.next() => break match line {
                        Ok(line) => match serde_json::from_slice::<Reply>(&line) {
                            Ok(reply) => End::Answered(reply),
                            // A whole line that does not parse: this run's
                            // answer is lost, the worker is still in step.
                            Err(e) => End::Unreadable(e.to_string()),
                        },
                        // Closed: it died (or closed fd 4); its status says which.
                        Err(why) => match tokio::time::timeout(GRACE, self.wait()).await {
                            Ok(Ok(status)) => End::Died(status),
                            _ => End::Broken(why),
                        },
                    },
                    status = reap(&mut self.child, &self.pid) => break match status {
                        // A worker that answered and then ended (bash's
                        // `exit`) can be reaped before its answer is read:
                        // the line is in the pipe already, so read it.
                        Ok(status) => match tokio::time::timeout(LAST_ANSWER_WAIT, self.replies.next()).await {
                            Ok(Ok(line)) => match serde_json::from_slice::<Reply>(&line) {
                                Ok(reply) => End::AnsweredThenDied(reply, status),
                                Err(_) => End::Died(status),
                            },
                            _ => End::Died(status),
                        },
                        Err(e) => End::Broken(e.to_string()),
                    },
                    _ = sleep => {
                        if timed_out {
                            break End::Stuck;
                        }
                        timed_out = true;
                        signal_run(self.pid.load(Ordering::SeqCst), language);
                        deadline = Some(tokio::time::Instant::now() + GRACE);
                    }
                }
            }
        };
        // An answer from a worker that then died: the run's result stands,
        // and the state's loss is said (unless the answer says it exited).
        let died_after = match &end {
            End::AnsweredThenDied(_, status) => Some(*status),
            _ => None,
        };
        let lag = match &end {
            End::Answered(reply) | End::AnsweredThenDied(reply, _) if reply.lost.is_empty() => {
                OUTPUT_LAG
            }
            _ => Duration::from_millis(100),
        };
        let (stdout, stderr) = self.streams.take(lag).await;
        let mut execution = CodeExecution {
            stdout,
            stderr,
            timed_out,
            ..CodeExecution::default()
        };
        match end {
            End::Answered(reply) | End::AnsweredThenDied(reply, _) => {
                execution.results = cap_results(reply.results);
                execution.error = reply.error.map(|e| CodeError {
                    name: e.name,
                    value: cut(e.value, MAX_ERROR_TEXT),
                    traceback: cut(e.traceback, MAX_ERROR_TEXT),
                });
                if let Some(code) = reply.exit_code.filter(|&c| c != 0) {
                    execution.error = Some(CodeError {
                        name: "ExitStatus".into(),
                        value: code.to_string(),
                        traceback: String::new(),
                    });
                }
                if reply.exited {
                    execution.restarted = Some(format!(
                        "the shell exited (status {}); its state is lost and the next run starts a fresh one",
                        reply.exit_code.unwrap_or(0)
                    ));
                }
            }
            End::Unreadable(why) => {
                execution.error = Some(CodeError {
                    name: "UnreadableResult".into(),
                    value: format!("the run's result could not be read: {why}"),
                    traceback: String::new(),
                });
            }
            End::Died(status) => {
                let how = died_how(status);
                execution.error = Some(CodeError {
                    name: "InterpreterDied".into(),
                    value: how.clone(),
                    traceback: String::new(),
                });
                execution.restarted = Some(format!(
                    "the interpreter {how}; its state is lost and the next run starts a fresh one"
                ));
            }
            End::Broken(why) => {
                execution.error = Some(CodeError {
                    name: "InterpreterLost".into(),
                    value: why.clone(),
                    traceback: String::new(),
                });
                execution.restarted = Some(format!(
                    "{why}; the interpreter was restarted and its state is lost"
                ));
            }
            End::Stuck => {
                execution.error = Some(CodeError {
                    name: "TimeoutError".into(),
                    value: format!("still running {}s after the interrupt", GRACE.as_secs()),
                    traceback: String::new(),
                });
                execution.restarted = Some(format!(
                    "the code ignored the interrupt for {}s, so the interpreter was restarted; its state is lost",
                    GRACE.as_secs()
                ));
            }
        }
        if let Some(status) = died_after
            && execution.restarted.is_none()
        {
            execution.restarted = Some(format!(
                "the interpreter {} after answering; its state is lost and the next run starts a fresh one",
                died_how(status)
            ));
        }
        execution
    }
}

pub(super) fn died_how(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(sig), _) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        // Under bwrap, `enter` passes a child's death by signal as 128+N.
        (None, Some(code)) if code > 128 && code < 160 => {
            format!(
                "was killed by signal {} ({})",
                code - 128,
                signal_name(code - 128)
            )
        }
        (None, Some(code)) => format!("exited with status {code}"),
        _ => "ended".to_string(),
    }
}

pub(super) fn signal_name(sig: i32) -> String {
    // SAFETY: strsignal returns a static or thread-local string.
    unsafe {
        let s = libc::strsignal(sig);
        if s.is_null() {
            return format!("signal {sig}");
        }
        std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// Keeps results within [`MAX_CODE_RESULTS_LEN`]: the first that would
/// pass it, and all after it, give way to one note.
pub(super) fn cap_results(results: Vec<ReplyResult>) -> Vec<CodeResult> {
    let mut used = 0usize;
    let mut kept = Vec::new();
    let mut left_out = (0usize, 0usize);
    for r in results {
        let size: usize = r.data.iter().map(|(k, v)| k.len() + v.len()).sum();
        if left_out.0 == 0 && used + size <= MAX_CODE_RESULTS_LEN {
            used += size;
            kept.push(CodeResult {
                data: r.data.into_iter().collect(),
                is_main_result: r.is_main_result,
            });
        } else {
            left_out.0 += 1;
            left_out.1 += size;
        }
    }
    if left_out.0 > 0 {
        kept.push(CodeResult {
            data: vec![(
                "text/plain".to_string(),
                format!(
                    "[{} more result(s), {}, left out: a run returns at most {} MiB]",
                    left_out.0,
                    human_size(left_out.1),
                    MAX_CODE_RESULTS_LEN >> 20
                ),
            )],
            is_main_result: false,
        });
    }
    kept
}

/// `text` cut to at most `max` bytes, head and tail, on char boundaries.
pub(super) fn cut(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut head = max / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - max / 2;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} bytes omitted ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

pub(super) fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// 32 random hex bytes behind a prefix no program prints by chance.
pub(super) fn new_mark() -> Result<Vec<u8>, AgentError> {
    let mut random = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
        .map_err(|e| error(ErrorKind::Internal, format!("/dev/urandom: {e}")))?;
    let mut mark = b"\x1eOUTPOST-END-".to_vec();
    for b in random {
        mark.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    Ok(mark)
}

/// A pipe whose parent end (first for writing, second for reading as the
/// pair says) is non-blocking and close-on-exec, and whose child end stays
/// blocking: (write end, read end).
pub(super) fn pipe_pair() -> Result<(OwnedFd, OwnedFd), AgentError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two fds it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(error(
            ErrorKind::Internal,
            format!("pipe: {}", std::io::Error::last_os_error()),
        ));
    }
    // SAFETY: both fds were just made and are owned here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((write, read))
}

/// In the child: the request pipe's read end as fd 3, the answer pipe's
/// write end as fd 4 (both inheritable; everything else stays close-on-exec).
pub(super) fn place_fds(read_end: RawFd, write_end: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl and dup2 on fds this child holds.
    unsafe {
        // Moved above 10 first so neither dup2 overwrites the other's source.
        let r = libc::fcntl(read_end, libc::F_DUPFD_CLOEXEC, 10);
        let w = libc::fcntl(write_end, libc::F_DUPFD_CLOEXEC, 10);
        if r == -1 || w == -1 || libc::dup2(r, 3) == -1 || libc::dup2(w, 4) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        // Dies with the daemon, even one killed outright. The daemon forks
        // from its one runtime thread, which lives as long as it does (the
        // signal follows the forking thread, not the process).
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 || libc::getppid() == 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The worker's stdout and stderr, read all the time: while a run is on,
/// into its captures up to that run's end marker; otherwise dropped.
pub(super) struct Streams {
    /// The markers' common start (each run's adds its number).
    base: Vec<u8>,
    state: Mutex<[StreamState; 2]>,
    changed: Notify,
}

#[derive(Default)]
pub(super) struct StreamState {
    capture: Option<Capture>,
    /// The marker that ends the current (or last) run's output; empty while
    /// the worker starts.
    marker: Vec<u8>,
    /// The last run's marker, not seen by the time its output was taken:
    /// what comes before it is that run's, and is dropped.
    skip: Option<Vec<u8>>,
    /// Bytes that may be the start of a marker.
    held: Vec<u8>,
    marked: bool,
    eof: bool,
}

impl Streams {
    pub(super) fn new(base: Vec<u8>) -> Streams {
        Streams {
            base,
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, [StreamState; 2]> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Capture without a marker (what a starting worker says).
    pub(super) fn begin_start(&self, limit: usize) {
        for s in self.state().iter_mut() {
            s.capture = Some(Capture::new(limit));
        }
    }

    /// Capture run `seq`'s output.
    pub(super) fn begin(&self, limit: usize, seq: u64) {
        let marker = marker(&self.base, seq);
        for s in self.state().iter_mut() {
            if !s.marker.is_empty() && !s.marked && !s.eof {
                s.skip = Some(std::mem::take(&mut s.marker));
            }
            s.capture = Some(Capture::new(limit));
            s.marker = marker.clone();
            s.held.clear();
            s.marked = false;
        }
    }

    pub(super) async fn pump(
        self: Arc<Self>,
        index: usize,
        mut from: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            {
                let mut state = self.state();
                let s = &mut state[index];
                if n == 0 {
                    s.eof = true;
                } else {
                    s.feed(&buf[..n]);
                }
            }
            self.changed.notify_waiters();
            if n == 0 {
                return;
            }
        }
    }

    /// The run's output: each stream up to its marker, or as it is once
    /// `lag` passed.
    pub(super) async fn take(
        &self,
        lag: Duration,
    ) -> (
        outpost_protocol::CapturedOutput,
        outpost_protocol::CapturedOutput,
    ) {
        let until = Instant::now() + lag;
        loop {
            let notified = self.changed.notified();
            if self.state().iter().all(|s| s.marked || s.eof) {
                break;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                break;
            }
        }
        let mut state = self.state();
        let [out, err] = &mut *state;
        (out.finish(), err.finish())
    }
}

/// Run `seq`'s end marker: the worker writes the same.
pub(super) fn marker(base: &[u8], seq: u64) -> Vec<u8> {
    let mut marker = base.to_vec();
    marker.extend_from_slice(format!("{seq}.").as_bytes());
    marker
}

impl StreamState {
    pub(super) fn feed(&mut self, data: &[u8]) {
        if self.marker.is_empty() {
            if let Some(capture) = self.capture.as_mut() {
                capture.push(data);
            }
            return;
        }
        self.held.extend_from_slice(data);
        if let Some(old) = &self.skip {
            if let Some(at) = find(&self.held, old) {
                self.held.drain(..at + old.len());
                self.skip = None;
            } else if let Some(at) = find(&self.held, &self.marker) {
                // The old marker never came; this run's output is lost,
                // the stream is in step again.
                self.held.drain(..at + self.marker.len());
                self.skip = None;
                self.marked = true;
                self.held.clear();
                return;
            } else {
                let keep = self.marker.len().max(old.len()) - 1;
                let n = self.held.len().saturating_sub(keep);
                self.held.drain(..n);
                return;
            }
        }
        if self.marked {
            // After the marker: no run's output.
            self.held.clear();
            return;
        }
        if let Some(at) = find(&self.held, &self.marker) {
            if let Some(capture) = self.capture.as_mut() {
                capture.push(&self.held[..at]);
            }
            self.held.clear();
            self.marked = true;
            return;
        }
        let n = self.held.len().saturating_sub(self.marker.len() - 1);
        if let Some(capture) = self.capture.as_mut() {
            capture.push(&self.held[..n]);
        }
        self.held.drain(..n);
    }

    pub(super) fn finish(&mut self) -> outpost_protocol::CapturedOutput {
        let mut capture = self.capture.take().unwrap_or_else(|| Capture::new(0));
        if !self.marked && self.skip.is_none() {
            capture.push(&self.held);
            self.held.clear();
        }
        capture.finish()
    }
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
