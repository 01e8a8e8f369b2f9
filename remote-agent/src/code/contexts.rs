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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outpost_protocol::{
    AgentError, CodeAction, CodeContextInfo, CodeExecution, CodeLanguage, CodeRun, ErrorKind,
    Response,
};
use tokio::sync::watch;

pub use super::worker::{GRACE, START_WAIT};
use super::worker::{Worker, signal_run};
use super::{error, validate_context};
use crate::proctree;
use crate::sandbox;

/// Idle host contexts end after this long (a sandbox's live as long as it).
const HOST_IDLE: Duration = Duration::from_secs(3600);
/// Contexts one host or sandbox may hold.
const MAX_CONTEXTS: usize = 32;

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
    /// Taken out of the map: a run that still holds it starts nothing.
    removed: AtomicBool,
}

type Outcome = Result<CodeExecution, AgentError>;

#[derive(Default)]
struct Status {
    running: bool,
    execution_count: u32,
    /// The worker's main process while it is unreaped (0: none), shared
    /// with the worker, which clears it the moment it reaps: a signal never
    /// reaches a pid that was reused.
    pid: Arc<AtomicI32>,
    /// The token the worker's whole tree carries.
    token: String,
    /// Bumped by every stop: a worker started before one is not used.
    generation: u64,
    last_used: Option<Instant>,
    last_used_ms: u64,
    /// The latest run's result; collecting it does not remove it, so a
    /// caller that went away before the answer reached it can ask again.
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
        if let Some((k, _)) = req.env.iter().find(|(_, v)| v.contains('\0')) {
            return Response::Error(error(
                ErrorKind::BadRequest,
                format!("env: {k}'s value contains NUL"),
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
                let mut done = RunDone {
                    ctx: Arc::clone(&me),
                    tx: Some(tx),
                };
                let outcome = me.execute(req).await;
                done.finish(outcome);
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
            removed: AtomicBool::new(false),
        });
        map.insert(key.clone(), Arc::clone(&ctx));
        Ok(ctx)
    }

    /// `CodeContexts` of `sandbox` (None: the host).
    pub fn list(&self, sandbox: Option<&str>) -> Response {
        // No lock is held while /proc is read.
        let contexts: Vec<Arc<Context>> = self
            .map()
            .values()
            .filter(|c| c.key.sandbox.as_deref() == sandbox)
            .cloned()
            .collect();
        let mut rows: Vec<CodeContextInfo> = contexts.iter().map(|c| c.info()).collect();
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
            CodeAction::Remove => self.remove(&ctx),
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
                self.remove(&ctx);
            }
        }
    }

    /// Ends every worker (the daemon is leaving).
    pub fn shutdown(&self) {
        let contexts: Vec<Arc<Context>> = self.map().drain().map(|(_, c)| c).collect();
        for ctx in contexts {
            ctx.removed.store(true, Ordering::SeqCst);
            ctx.stop();
        }
    }

    /// Out of the map first, so no new run finds it; then its worker ends.
    fn remove(&self, ctx: &Arc<Context>) {
        {
            let mut map = self.map();
            if map.get(&ctx.key).is_some_and(|c| Arc::ptr_eq(c, ctx)) {
                map.remove(&ctx.key);
            }
        }
        ctx.removed.store(true, Ordering::SeqCst);
        ctx.stop();
    }
}

/// Ends a run's bookkeeping whatever becomes of it: the context stops
/// being busy and its caller gets an answer, also if the run panicked.
struct RunDone {
    ctx: Arc<Context>,
    tx: Option<watch::Sender<Option<Outcome>>>,
}

impl RunDone {
    fn finish(&mut self, outcome: Outcome) {
        let mut status = self.ctx.status();
        status.running = false;
        status.touch();
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Some(outcome));
        }
    }
}

impl Drop for RunDone {
    fn drop(&mut self) {
        if self.tx.is_some() {
            self.finish(Err(error(
                ErrorKind::Internal,
                "the run failed unexpectedly",
            )));
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
        let (pid, token, running, execution_count, last_used_ms) = {
            let status = self.status();
            (
                status.pid.load(Ordering::SeqCst),
                status.token.clone(),
                status.running,
                status.execution_count,
                status.last_used_ms,
            )
        };
        let (state, rss_bytes) = if pid > 0 {
            let rss = proctree::collect_tree(None, &token)
                .into_iter()
                .map(sandbox::limits::rss_bytes)
                .sum();
            (if running { "running" } else { "idle" }, rss)
        } else {
            ("stopped", 0)
        };
        CodeContextInfo {
            name: self.key.name.clone(),
            language: self.language,
            state: state.to_string(),
            execution_count,
            pid: (pid > 0).then_some(pid),
            rss_bytes,
            last_used_ms,
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
        match outcome {
            Some(Ok(execution)) => Response::CodeRan(execution),
            Some(Err(e)) => Response::Error(e),
            None => Response::Error(error(ErrorKind::Internal, "the run ended unanswered")),
        }
    }

    async fn execute(&self, req: CodeRun) -> Outcome {
        let started = Instant::now();
        let removed = || {
            error(
                ErrorKind::BadRequest,
                format!("context {:?} was removed", self.key.name),
            )
        };
        if self.removed.load(Ordering::SeqCst) {
            return Err(removed());
        }
        let mut slot = self.worker.lock().await;
        if slot.as_mut().is_some_and(|w| w.exited()) {
            // Dropping it sweeps whatever its tree left behind.
            slot.take();
        }
        if slot.is_none() {
            let generation = self.status().generation;
            let worker = Worker::start(self.key.sandbox.as_deref(), self.language).await?;
            let stale = {
                let mut status = self.status();
                let stale = status.generation != generation || self.removed.load(Ordering::SeqCst);
                if !stale {
                    status.pid = Arc::clone(&worker.pid);
                    status.token = worker.token.clone();
                    status.execution_count = 0;
                }
                stale
            };
            if stale {
                worker.kill().await;
                return Err(if self.removed.load(Ordering::SeqCst) {
                    removed()
                } else {
                    error(
                        ErrorKind::Unavailable,
                        format!(
                            "context {:?} was restarted as it started; run again",
                            self.key.name
                        ),
                    )
                });
            }
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
            self.status().execution_count = 0;
        }
        Ok(execution)
    }

    /// SIGINT to the running code.
    fn interrupt(&self) {
        let status = self.status();
        let pid = status.pid.load(Ordering::SeqCst);
        if status.running && pid > 0 {
            signal_run(pid, self.language);
        }
    }

    /// Ends the worker; the next run starts a fresh one. A run in progress
    /// sees its worker die and says the context restarted. Blocks (a
    /// process sweep): not on the daemon's runtime thread.
    fn stop(&self) {
        let token = {
            let mut status = self.status();
            status.execution_count = 0;
            status.generation += 1;
            status.pid = Arc::default();
            std::mem::take(&mut status.token)
        };
        // By token, never by pid: the pid may have been reaped already.
        if !token.is_empty() {
            proctree::terminate_tree(None, &token, Duration::ZERO);
        }
        if let Ok(mut slot) = self.worker.try_lock() {
            slot.take();
        }
    }
}
