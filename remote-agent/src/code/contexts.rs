//! The job daemon's code contexts: one interpreter process per context
//! (`worker.py` under the host's `python3`, or `worker.sh` under bash),
//! started on first use inside the scope's isolation and kept between runs.
//!
//! A run writes its request on the worker's fd 3 and reads the answer from
//! fd 4; the worker's stdout and stderr are pipes read all the time, and a
//! run's output is what came before the worker's end-of-run marker on each.
//! Runs of one context queue on its `worker` lock; a run's caller may stop
//! waiting (`wait_ms`), and the run's result then waits in `pending` for a
//! later call with empty code.
//!
//! A timeout sends SIGINT (Python raises `KeyboardInterrupt` in the user's
//! code; the state stays); a run still going [`GRACE`] later, or a worker
//! that dies, restarts the context: the next run starts a fresh worker.
//!
//! Architecture invariant: no worker outlives its context. Contexts of a
//! sandbox end with it, idle host contexts after [`HOST_IDLE`], all of them
//! with the daemon; a worker whose daemon was killed outright sees fd 3 close
//! and exits once its current run ends.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outpost_protocol::limits::{MAX_CODE_OUTPUT_LIMIT, MAX_CODE_RESULTS_LEN};
use outpost_protocol::{
    AgentError, CodeAction, CodeContextInfo, CodeError, CodeExecution, CodeLanguage, CodeResult,
    CodeRun, ErrorKind, Response,
};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};

use super::{BASH_WORKER, PYTHON_BOOT, PYTHON_WORKER, error, sh_quote, validate_context};
use crate::capture::Capture;
use crate::proctree::{self, TOKEN_VAR};
use crate::sandbox::{self, Scope};
use crate::{exec, paths};

/// How long a run may go on after its interrupt before the context restarts.
pub const GRACE: Duration = Duration::from_secs(2);
/// How long a new worker may take to say it is ready.
pub const START_WAIT: Duration = Duration::from_secs(30);
/// Idle host contexts end after this long (a sandbox's live as long as it).
const HOST_IDLE: Duration = Duration::from_secs(3600);
/// Contexts one host or sandbox may hold.
const MAX_CONTEXTS: usize = 32;
/// How long a run's output may lag its answer (a C library's buffer being
/// flushed, a child still writing) before it is taken as it is.
const OUTPUT_LAG: Duration = Duration::from_secs(1);
/// Longest answer line a worker may send.
const MAX_REPLY: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    sandbox: Option<String>,
    name: String,
}

/// Every context this daemon holds.
#[derive(Default)]
pub struct Contexts {
    map: Mutex<HashMap<Key, Arc<Context>>>,
}

struct Context {
    key: Key,
    language: CodeLanguage,
    /// Held by the run in progress: runs of a context never overlap.
    worker: tokio::sync::Mutex<Option<Worker>>,
    status: Mutex<Status>,
}

type Outcome = Result<CodeExecution, AgentError>;

#[derive(Default)]
struct Status {
    running: bool,
    execution_count: u32,
    /// The worker's main process and the token its tree carries, so it can
    /// be signalled while a run holds the worker.
    pid: Option<i32>,
    token: String,
    last_used: Option<Instant>,
    last_used_ms: u64,
    /// The latest run's result, until someone collects it.
    pending: Option<watch::Receiver<Option<Outcome>>>,
}

impl Contexts {
    fn map(&self) -> MutexGuard<'_, HashMap<Key, Arc<Context>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// `CodeRun` in `sandbox` (None: the host).
    pub async fn run(&self, sandbox: Option<String>, req: CodeRun) -> Response {
        if let Err(e) = validate_context(&req.context) {
            return Response::Error(e);
        }
        let key = Key {
            sandbox,
            name: req.context.clone(),
        };
        let wait = (req.wait_ms > 0).then(|| Duration::from_millis(req.wait_ms));
        if req.code.is_empty() {
            let Some(ctx) = self.map().get(&key).cloned() else {
                return no_context(&key.name);
            };
            let pending = ctx.status().pending.clone();
            return match pending {
                Some(rx) => ctx.collect(rx, wait).await,
                None => Response::Error(error(
                    ErrorKind::BadRequest,
                    format!("context {:?} has no run to collect", key.name),
                )),
            };
        }
        if req.language == CodeLanguage::Bash && req.code.contains('\0') {
            return Response::Error(error(ErrorKind::BadRequest, "bash code cannot contain NUL"));
        }
        if let Some((k, _)) = req.env.iter().find(|(k, _)| !valid_env_name(k)) {
            return Response::Error(error(
                ErrorKind::BadRequest,
                format!("env: {k:?} is not a variable name"),
            ));
        }
        let ctx = match self.get_or_make(&key, req.language) {
            Ok(ctx) => ctx,
            Err(e) => return Response::Error(e),
        };
        let rx = {
            let mut status = ctx.status();
            if status.running {
                return Response::Error(error(
                    ErrorKind::BadRequest,
                    format!(
                        "context {:?} is still running run {}: collect it (empty code) or interrupt it first",
                        key.name, status.execution_count
                    ),
                ));
            }
            status.running = true;
            status.touch();
            let (tx, rx) = watch::channel(None);
            status.pending = Some(rx.clone());
            let me = Arc::clone(&ctx);
            tokio::spawn(async move {
                let outcome = me.execute(req).await;
                let mut status = me.status();
                status.running = false;
                status.touch();
                let _ = tx.send(Some(outcome));
            });
            rx
        };
        ctx.collect(rx, wait).await
    }

    fn get_or_make(&self, key: &Key, language: CodeLanguage) -> Result<Arc<Context>, AgentError> {
        let mut map = self.map();
        if let Some(ctx) = map.get(key) {
            if ctx.language != language {
                return Err(error(
                    ErrorKind::BadRequest,
                    format!(
                        "context {:?} runs {}; name another context for {}",
                        key.name,
                        ctx.language.name(),
                        language.name()
                    ),
                ));
            }
            return Ok(Arc::clone(ctx));
        }
        if map.keys().filter(|k| k.sandbox == key.sandbox).count() >= MAX_CONTEXTS {
            return Err(error(
                ErrorKind::Unavailable,
                format!("{MAX_CONTEXTS} contexts already; remove one first"),
            ));
        }
        let ctx = Arc::new(Context {
            key: key.clone(),
            language,
            worker: tokio::sync::Mutex::new(None),
            status: Mutex::default(),
        });
        map.insert(key.clone(), Arc::clone(&ctx));
        Ok(ctx)
    }

    /// `CodeContexts` of `sandbox` (None: the host).
    pub fn list(&self, sandbox: Option<&str>) -> Response {
        let mut rows: Vec<CodeContextInfo> = self
            .map()
            .values()
            .filter(|c| c.key.sandbox.as_deref() == sandbox)
            .map(|c| c.info())
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Response::CodeContexts(rows)
    }

    /// `CodeControl`: answers the contexts left.
    pub fn control(&self, sandbox: Option<String>, name: &str, action: CodeAction) -> Response {
        let key = Key {
            sandbox,
            name: name.to_string(),
        };
        let Some(ctx) = self.map().get(&key).cloned() else {
            return no_context(name);
        };
        match action {
            CodeAction::Interrupt => ctx.interrupt(),
            CodeAction::Restart => ctx.stop(),
            CodeAction::Remove => {
                ctx.stop();
                self.map().remove(&key);
            }
        }
        self.list(key.sandbox.as_deref())
    }

    /// Ends the contexts of sandboxes that ended and host contexts idle for
    /// [`HOST_IDLE`]. Called from the daemon's tick (a blocking thread).
    pub fn prune(&self) {
        let contexts: Vec<Arc<Context>> = self.map().values().cloned().collect();
        for ctx in contexts {
            let gone = match &ctx.key.sandbox {
                Some(id) => sandbox::has_ended(id),
                None => {
                    let status = ctx.status();
                    !status.running && status.last_used.is_some_and(|t| t.elapsed() >= HOST_IDLE)
                }
            };
            if gone {
                ctx.stop();
                self.map().remove(&ctx.key);
            }
        }
    }

    /// Ends every worker (the daemon is leaving).
    pub fn shutdown(&self) {
        let contexts: Vec<Arc<Context>> = self.map().drain().map(|(_, c)| c).collect();
        for ctx in contexts {
            ctx.stop();
        }
    }
}

fn no_context(name: &str) -> Response {
    Response::Error(error(
        ErrorKind::BadRequest,
        format!("no code context {name:?} here"),
    ))
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Status {
    fn touch(&mut self) {
        self.last_used = Some(Instant::now());
        self.last_used_ms = now_ms();
    }
}

impl Context {
    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn info(&self) -> CodeContextInfo {
        let status = self.status();
        let (state, rss_bytes) = match status.pid {
            Some(pid) => {
                let rss = proctree::collect_tree(Some(pid), &status.token)
                    .into_iter()
                    .map(sandbox::limits::rss_bytes)
                    .sum();
                (if status.running { "running" } else { "idle" }, rss)
            }
            None => ("stopped", 0),
        };
        CodeContextInfo {
            name: self.key.name.clone(),
            language: self.language,
            state: state.to_string(),
            execution_count: status.execution_count,
            pid: status.pid,
            rss_bytes,
            last_used_ms: status.last_used_ms,
        }
    }

    /// Waits for a run's outcome, up to `wait`; the run goes on regardless.
    async fn collect(
        &self,
        mut rx: watch::Receiver<Option<Outcome>>,
        wait: Option<Duration>,
    ) -> Response {
        let done = async {
            let _ = rx.wait_for(Option::is_some).await;
        };
        let finished = match wait {
            Some(wait) => tokio::time::timeout(wait, done).await.is_ok(),
            None => {
                done.await;
                true
            }
        };
        if !finished {
            return Response::CodeRan(CodeExecution {
                running: true,
                execution_count: self.status().execution_count,
                ..CodeExecution::default()
            });
        }
        let outcome = rx.borrow().clone();
        {
            // Collected: a later empty run finds nothing (unless a newer run
            // replaced it meanwhile).
            let mut status = self.status();
            if status.pending.as_ref().is_some_and(|p| p.same_channel(&rx)) {
                status.pending = None;
            }
        }
        match outcome {
            Some(Ok(execution)) => Response::CodeRan(execution),
            Some(Err(e)) => Response::Error(e),
            None => Response::Error(error(ErrorKind::Internal, "the run ended unanswered")),
        }
    }

    async fn execute(&self, req: CodeRun) -> Outcome {
        let started = Instant::now();
        let mut slot = self.worker.lock().await;
        if slot.as_mut().is_some_and(|w| w.exited()) {
            *slot = None;
        }
        if slot.is_none() {
            let worker = Worker::start(&self.key, self.language).await?;
            let mut status = self.status();
            status.pid = Some(worker.pid);
            status.token = worker.token.clone();
            status.execution_count = 0;
            *slot = Some(worker);
        }
        let count = {
            let mut status = self.status();
            status.execution_count += 1;
            status.execution_count
        };
        let Some(worker) = slot.as_mut() else {
            return Err(error(ErrorKind::Internal, "no worker"));
        };
        let mut execution = worker.run(&req, self.language).await;
        execution.execution_count = count;
        execution.duration_ms = started.elapsed().as_millis() as u64;
        if execution.restarted.is_some() {
            if let Some(worker) = slot.take() {
                worker.kill().await;
            }
            let mut status = self.status();
            status.pid = None;
            status.execution_count = 0;
        }
        Ok(execution)
    }

    /// SIGINT to the running code.
    fn interrupt(&self) {
        let status = self.status();
        if let (true, Some(pid)) = (status.running, status.pid) {
            signal_run(pid, self.language);
        }
    }

    /// Ends the worker; the next run starts a fresh one. A run in progress
    /// sees its worker die and says the context restarted.
    fn stop(&self) {
        let (pid, token) = {
            let mut status = self.status();
            status.execution_count = 0;
            (status.pid.take(), std::mem::take(&mut status.token))
        };
        if let Some(pid) = pid {
            // SAFETY: plain kill; the tree sweep below catches the rest.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            proctree::terminate_tree(Some(pid), &token, Duration::ZERO);
        }
        if let Ok(mut slot) = self.worker.try_lock() {
            slot.take();
        }
    }
}

/// The interrupt a run gets: Python's interpreter alone (a second SIGINT
/// could land in its exception handling), bash's whole process group (the
/// foreground command must stop; the shell traps it).
fn signal_run(pid: i32, language: CodeLanguage) {
    // SAFETY: plain signals to our own child or its group.
    unsafe {
        match language {
            CodeLanguage::Python => libc::kill(pid, libc::SIGINT),
            CodeLanguage::Bash => libc::killpg(pid, libc::SIGINT),
        };
    }
}

/// One interpreter process and its pipes.
struct Worker {
    child: Child,
    pid: i32,
    token: String,
    requests: pipe::Sender,
    replies: Replies,
    streams: Arc<Streams>,
}

/// The worker's fd 4: JSON lines.
struct Replies {
    pipe: pipe::Receiver,
    buf: Vec<u8>,
}

impl Replies {
    /// The next line; cancel-safe (what was read stays in `buf`).
    async fn next(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                return Ok(self.buf.drain(..=end).collect());
            }
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
struct Reply {
    #[serde(default)]
    results: Vec<ReplyResult>,
    error: Option<ReplyError>,
    #[serde(default)]
    lost: Vec<String>,
    exit_code: Option<i32>,
}

#[derive(Deserialize)]
struct ReplyResult {
    data: BTreeMap<String, String>,
    #[serde(default)]
    is_main_result: bool,
}

#[derive(Deserialize)]
struct ReplyError {
    name: String,
    value: String,
    traceback: String,
}

#[derive(Deserialize)]
struct Ready {
    ready: bool,
}

/// How a run's wait ended.
enum End {
    Answered(Reply),
    Died(std::process::ExitStatus),
    /// The answer could not be read or made no sense.
    Broken(String),
    /// Still going [`GRACE`] after its interrupt.
    Stuck,
}

impl Worker {
    async fn start(key: &Key, language: CodeLanguage) -> Result<Worker, AgentError> {
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
        let mut cmd = match &key.sandbox {
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
                exec::child_setup()?;
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
        let pid = child.id().map_or(0, |p| p as i32);
        let streams = Arc::new(Streams::default());
        streams.begin(64 * 1024);
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
                tokio::spawn(Arc::clone(&streams).pump(i, out, mark.clone()));
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
            requests,
            replies: Replies {
                pipe: replies,
                buf: Vec::new(),
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
    async fn failed_start(mut self, program: &str) -> AgentError {
        let _ = self.child.start_kill();
        let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
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

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    async fn kill(mut self) {
        let _ = self.child.start_kill();
        let (pid, token) = (self.pid, self.token.clone());
        let _ = tokio::task::spawn_blocking(move || {
            proctree::terminate_tree(Some(pid), &token, Duration::ZERO)
        })
        .await;
        let _ = self.child.wait().await;
    }

    async fn run(&mut self, req: &CodeRun, language: CodeLanguage) -> CodeExecution {
        let limit = req.output_limit.clamp(1, MAX_CODE_OUTPUT_LIMIT) as usize;
        self.streams.begin(limit);
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
                let mut text = String::new();
                for (k, v) in &req.env {
                    text.push_str(&format!("export {k}={}\n", sh_quote(v)));
                }
                text.push_str(&req.code);
                text.push('\0');
                text.into_bytes()
            }
        };
        let mut timed_out = false;
        let end = if self.requests.write_all(&message).await.is_err() {
            match self.child.wait().await {
                Ok(status) => End::Died(status),
                Err(e) => End::Broken(e.to_string()),
            }
        } else {
            let mut deadline = (req.timeout_ms > 0)
                .then(|| tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms));
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
                            Err(e) => End::Broken(format!("the worker's answer makes no sense: {e}")),
                        },
                        // Closed: it died (or closed fd 4); its status says which.
                        Err(why) => match tokio::time::timeout(GRACE, self.child.wait()).await {
                            Ok(Ok(status)) => End::Died(status),
                            _ => End::Broken(why),
                        },
                    },
                    status = self.child.wait() => break match status {
                        Ok(status) => End::Died(status),
                        Err(e) => End::Broken(e.to_string()),
                    },
                    _ = sleep => {
                        if timed_out {
                            break End::Stuck;
                        }
                        timed_out = true;
                        signal_run(self.pid, language);
                        deadline = Some(tokio::time::Instant::now() + GRACE);
                    }
                }
            }
        };
        let lag = match &end {
            End::Answered(reply) if reply.lost.is_empty() => OUTPUT_LAG,
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
            End::Answered(reply) => {
                execution.results = cap_results(reply.results);
                execution.error = reply.error.map(|e| CodeError {
                    name: e.name,
                    value: e.value,
                    traceback: e.traceback,
                });
                if let Some(code) = reply.exit_code.filter(|&c| c != 0) {
                    execution.error = Some(CodeError {
                        name: "ExitStatus".into(),
                        value: code.to_string(),
                        traceback: String::new(),
                    });
                }
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
        execution
    }
}

fn died_how(status: std::process::ExitStatus) -> String {
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

fn signal_name(sig: i32) -> String {
    // SAFETY: strsignal returns a static or thread-local string.
    unsafe {
        let s = libc::strsignal(sig);
        if s.is_null() {
            return format!("signal {sig}");
        }
        std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// Keeps results within [`MAX_CODE_RESULTS_LEN`]: a value past it keeps only
/// a note in place of its data.
fn cap_results(results: Vec<ReplyResult>) -> Vec<CodeResult> {
    let mut used = 0usize;
    results
        .into_iter()
        .map(|r| {
            let size: usize = r.data.iter().map(|(k, v)| k.len() + v.len()).sum();
            let data = if used + size <= MAX_CODE_RESULTS_LEN {
                used += size;
                r.data.into_iter().collect()
            } else {
                let note = format!(
                    "[{} of output left out: this run's results passed {} MiB]",
                    human_size(size),
                    MAX_CODE_RESULTS_LEN >> 20
                );
                used += note.len();
                vec![("text/plain".to_string(), note)]
            };
            CodeResult {
                data,
                is_main_result: r.is_main_result,
            }
        })
        .collect()
}

fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// 32 random hex bytes behind a prefix no program prints by chance.
fn new_mark() -> Result<Vec<u8>, AgentError> {
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
fn pipe_pair() -> Result<(OwnedFd, OwnedFd), AgentError> {
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
fn place_fds(read_end: RawFd, write_end: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl and dup2 on fds this child holds.
    unsafe {
        // Moved above 10 first so neither dup2 overwrites the other's source.
        let r = libc::fcntl(read_end, libc::F_DUPFD_CLOEXEC, 10);
        let w = libc::fcntl(write_end, libc::F_DUPFD_CLOEXEC, 10);
        if r == -1 || w == -1 || libc::dup2(r, 3) == -1 || libc::dup2(w, 4) == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The worker's stdout and stderr, read all the time: while a run is on,
/// into its captures up to the end-of-run marker; otherwise dropped.
#[derive(Default)]
struct Streams {
    state: Mutex<[StreamState; 2]>,
    changed: Notify,
}

#[derive(Default)]
struct StreamState {
    capture: Option<Capture>,
    /// Bytes that may be the start of a marker.
    held: Vec<u8>,
    marked: bool,
    eof: bool,
}

impl Streams {
    fn state(&self) -> MutexGuard<'_, [StreamState; 2]> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn begin(&self, limit: usize) {
        for s in self.state().iter_mut() {
            s.capture = Some(Capture::new(limit));
            s.held.clear();
            s.marked = false;
        }
    }

    async fn pump(
        self: Arc<Self>,
        index: usize,
        mut from: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        mark: Vec<u8>,
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
                    s.feed(&buf[..n], &mark);
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
    async fn take(
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

impl StreamState {
    fn feed(&mut self, data: &[u8], mark: &[u8]) {
        let Some(capture) = self.capture.as_mut().filter(|_| !self.marked) else {
            return;
        };
        self.held.extend_from_slice(data);
        if let Some(at) = find(&self.held, mark) {
            capture.push(&self.held[..at]);
            // What follows the marker is no run's output.
            self.held.clear();
            self.marked = true;
            return;
        }
        let keep = mark.len() - 1;
        if self.held.len() > keep {
            let n = self.held.len() - keep;
            capture.push(&self.held[..n]);
            self.held.drain(..n);
        }
    }

    fn finish(&mut self) -> outpost_protocol::CapturedOutput {
        let mut capture = self.capture.take().unwrap_or_else(|| Capture::new(0));
        if !self.marked {
            capture.push(&self.held);
        }
        self.held.clear();
        capture.finish()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_split_across_reads_ends_the_output() {
        let mark = b"\x1eEND-1234".to_vec();
        let mut s = StreamState {
            capture: Some(Capture::new(1024)),
            ..StreamState::default()
        };
        s.feed(b"hello\n\x1eEN", &mark);
        s.feed(b"D-12", &mark);
        assert!(!s.marked);
        s.feed(b"34after", &mark);
        assert!(s.marked);
        s.feed(b"more", &mark);
        assert_eq!(s.finish().head, b"hello\n");
    }

    #[test]
    fn output_without_a_marker_is_kept_whole() {
        let mark = b"\x1eEND-1234".to_vec();
        let mut s = StreamState {
            capture: Some(Capture::new(1024)),
            ..StreamState::default()
        };
        s.feed(b"partial \x1eEND", &mark);
        assert_eq!(s.finish().head, b"partial \x1eEND");
    }

    #[test]
    fn results_past_the_cap_keep_a_note() {
        let big = "x".repeat(MAX_CODE_RESULTS_LEN / 2 + 10);
        let results = (0..3)
            .map(|_| ReplyResult {
                data: BTreeMap::from([("image/png".to_string(), big.clone())]),
                is_main_result: false,
            })
            .collect();
        let capped = cap_results(results);
        assert_eq!(capped[0].data[0].1.len(), big.len());
        assert!(capped[1].data[0].1.contains("left out"));
        assert!(capped[2].data[0].1.contains("left out"));
    }
}
