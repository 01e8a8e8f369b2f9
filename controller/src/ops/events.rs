//! Job events on this machine: followers that poll each sandbox's job events,
//! hooks that run for them, and alerts when a host stops answering.
//!
//! One follower per sandbox polls `JobEvents` after the last sequence number it
//! saw, about every 1.5 s. Each new event goes to a sink (stderr for
//! `outpost watch`, MCP logging notifications for `outpost mcp`) and to the
//! hooks of the config file's `[hooks]` section: `webhook_url` (the event POSTed
//! as JSON) and `event_command` (run with the event in its environment).
//!
//! Hooks run at least once per event, and in one process only: the follower
//! that holds `$OUTPOST_HOME/events-<sandbox>.lock` runs them and records the
//! last event it handled in `events-<sandbox>.seq`, so a restart resumes there
//! instead of replaying the host's history (with no record yet, hooks start
//! at the end of what the host holds at first contact), and an `outpost watch` beside an
//! `outpost mcp` does not fire every hook twice. The others only feed their
//! sink, and take the lock over when its holder exits.
//!
//! A poll that cannot reach the host is a failed reachability check; after
//! `[hooks] alert_after_failures` of them in a row (default 2) the follower
//! raises `host_unreachable`, once per outage, and `host_reachable` when the
//! host answers again.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{Hooks, HttpUrl};
use crate::fleet::Fleet;
use crate::ops::jobs;
use crate::session::Session;

/// Between polls of a reachable host.
const POLL: Duration = Duration::from_millis(1500);
/// Between polls of a host that did not answer (each may cost a connect timeout).
const RETRY: Duration = Duration::from_secs(5);
/// Between polls of a host whose agent refuses the request.
const REFUSED: Duration = Duration::from_secs(60);
/// Events per poll; a full page is followed by another poll at once.
const PAGE: u32 = 500;
/// Events this much older than the follower are history: they are not shown
/// to a client that was not there, nor hooked when no position was recorded.
const FRESH_SLACK_S: u64 = 5;
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A job event, or a reachability alert, as hooks and clients see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookEvent {
    /// started, completed, failed, cancelled, interrupted, resume_started,
    /// resume_failed; host_unreachable, host_reachable.
    #[serde(rename = "type")]
    pub kind: String,
    pub sandbox: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub at_unix: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl HookEvent {
    pub fn from_job(sandbox: &str, e: &outpost_protocol::JobEvent) -> HookEvent {
        HookEvent {
            kind: e.kind.clone(),
            sandbox: sandbox.to_string(),
            job: Some(e.job.clone()),
            seq: Some(e.seq),
            at_unix: e.at_unix,
            detail: e.detail.clone(),
        }
    }

    fn host(kind: &str, sandbox: &str, detail: String) -> HookEvent {
        HookEvent {
            kind: kind.into(),
            sandbox: sandbox.to_string(),
            job: None,
            seq: None,
            at_unix: now_unix(),
            detail,
        }
    }

    /// One line for people: `gpu1: train completed (exit 0)`.
    pub fn summary(&self) -> String {
        let mut s = format!("{}: ", self.sandbox);
        if let Some(job) = &self.job {
            s.push_str(job);
            s.push(' ');
        }
        s.push_str(&self.kind);
        if !self.detail.is_empty() {
            s.push_str(&format!(" ({})", self.detail));
        }
        s
    }

    /// Whether the event is bad news (for log levels).
    pub fn is_alarm(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "failed" | "interrupted" | "resume_failed" | "host_unreachable"
        )
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What an `event_command` learns besides the event itself, as
/// remote-sandbox-mcp's hooks had it.
#[derive(Debug, Default, Clone)]
pub struct HookExtras {
    /// A file holding the event's JSON.
    pub event_file: Option<PathBuf>,
    /// The job's log on its host.
    pub log_file: Option<String>,
}

/// The environment `event_command` runs with: Outpost's names and
/// remote-sandbox-mcp's, so its hook scripts keep working.
pub fn hook_env(event: &HookEvent, json: &str, extras: &HookExtras) -> Vec<(&'static str, String)> {
    let job = event.job.clone().unwrap_or_default();
    // A log path a tool call chose: one line, bounded, or nothing.
    let log_file = extras
        .log_file
        .clone()
        .filter(|l| l.len() <= 4096 && !l.chars().any(char::is_control))
        .unwrap_or_default();
    let event_file = extras
        .event_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    vec![
        ("OUTPOST_EVENT_JSON", json.to_string()),
        ("OUTPOST_EVENT_TYPE", event.kind.clone()),
        ("OUTPOST_JOB", job.clone()),
        ("OUTPOST_SANDBOX", event.sandbox.clone()),
        ("OUTPOST_EVENT_FILE", event_file.clone()),
        ("OUTPOST_LOG_FILE", log_file.clone()),
        ("OUTPOST_SUGGESTED_PROMPT", suggested_prompt(event)),
        ("RSMCP_EVENT_JSON", json.to_string()),
        ("RSMCP_EVENT_TYPE", event.kind.clone()),
        ("RSMCP_SANDBOX_NAME", event.sandbox.clone()),
        ("RSMCP_TMUX_SESSION", job.clone()),
        ("RSMCP_WATCH_ID", job),
        ("RSMCP_EVENT_FILE", event_file),
        ("RSMCP_LOG_FILE", log_file),
        ("RSMCP_SUGGESTED_PROMPT", suggested_prompt(event)),
    ]
}

/// What to ask an agent to do about `event`: a hook can hand it to one
/// (`codex exec "$RSMCP_SUGGESTED_PROMPT"`).
pub fn suggested_prompt(event: &HookEvent) -> String {
    let sandbox = &event.sandbox;
    // Only names and words the agent and the config chose: paths and
    // commands a tool call set never reach a prompt another agent reads.
    let detail: String = event
        .detail
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    };
    let Some(job) = &event.job else {
        return format!(
            "Sandbox {sandbox}: {}{detail}. Check it with list_sandboxes(check_resources=true) before you run more work there.",
            event.kind.replace('_', " ")
        );
    };
    let next = match event.kind.as_str() {
        "completed" => "Read its results",
        "started" | "resume_started" => "Follow it",
        _ => "Find out why, then fix and restart or resume it",
    };
    format!(
        "Background job {job} on sandbox {sandbox}: {}{detail}. {next}: check_background_task(tmux_session=\"{job}\", last_n_lines=50, sandbox_name=\"{sandbox}\").",
        event.kind.replace('_', " ")
    )
}

/// The HTTP/1.1 request that POSTs `body` as JSON.
pub fn http_post_request(url: &HttpUrl, body: &str) -> String {
    format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: outpost/{}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        url.path,
        url.host_header(),
        env!("CARGO_PKG_VERSION"),
        body.len()
    )
}

/// The status code of an HTTP response's first line.
pub fn http_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

/// POSTs `body`; Ok when the server answers 2xx.
pub async fn post_json(url: &HttpUrl, body: &str) -> Result<(), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        stream
            .write_all(http_post_request(url, body).as_bytes())
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.contains(&b'\n') && head.len() < 4096 {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("no answer: {e}"))?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        match http_status(&head) {
            Some(code) if (200..300).contains(&code) => Ok(()),
            Some(code) => Err(format!("answered HTTP {code}")),
            None => Err("no HTTP answer".to_string()),
        }
    };
    tokio::time::timeout(WEBHOOK_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", WEBHOOK_TIMEOUT.as_secs()))?
}

/// Runs `command` with `sh -c` and the event in its environment.
async fn run_event_command(command: &str, env: &[(&'static str, String)]) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        // stdout may be the MCP channel: never let a hook write to it.
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("killed after {} s", COMMAND_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.trim().lines().last().unwrap_or("").to_string();
    Err(format!("{}: {last}", output.status))
}

/// Runs every configured hook for `event`; returns what failed.
pub async fn run_hooks(hooks: &Hooks, event: &HookEvent, extras: &HookExtras) -> Vec<String> {
    let json = serde_json::to_string(event).unwrap_or_default();
    let mut problems = Vec::new();
    if let Some(url) = &hooks.webhook_url
        && let Err(e) = post_json(url, &json).await
    {
        problems.push(format!("webhook {url}: {e}"));
    }
    if let Some(command) = &hooks.event_command
        && let Err(e) = run_event_command(command, &hook_env(event, &json, extras)).await
    {
        problems.push(format!("event_command: {e}"));
    }
    problems
}

/// Where events go besides the hooks.
pub type Sink = Arc<dyn Fn(&HookEvent) + Send + Sync>;

/// What one follower is doing, for `get_watchdog_status` and logs.
#[derive(Default)]
struct FollowerState {
    runs_hooks: AtomicBool,
    last_seq: AtomicU64,
    failures: AtomicU32,
    last_error: Mutex<Option<String>>,
    /// The follower stopped (a Slurm allocation out of reach: deleted,
    /// expired, or its login node down); the next job tool starts another.
    ended: AtomicBool,
}

#[derive(Debug, Serialize)]
pub struct FollowerView {
    pub sandbox: String,
    /// Whether this process runs the hooks for this sandbox (another Outpost
    /// process holding its events lock does otherwise).
    pub runs_hooks: bool,
    pub last_seq: u64,
    /// Failed reachability checks in a row.
    pub failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The followers of one process, at most one per sandbox.
pub struct Watcher {
    fleet: Arc<Fleet>,
    sink: Sink,
    followers: Mutex<HashMap<String, Arc<FollowerState>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Watcher {
    pub fn new(fleet: Arc<Fleet>, sink: Sink) -> Arc<Watcher> {
        Arc::new(Watcher {
            fleet,
            sink,
            followers: Mutex::new(HashMap::new()),
            tasks: Mutex::default(),
        })
    }

    /// Stops every follower (its client went away).
    pub fn stop(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
        self.followers.lock().unwrap().clear();
    }

    /// Starts following `sandbox` unless this process already does. Needs a
    /// tokio runtime; the follower lives as long as it.
    pub fn follow(&self, sandbox: &str) {
        let Ok(session) = self.fleet.get(Some(sandbox)) else {
            return;
        };
        let state = {
            let mut followers = self.followers.lock().unwrap();
            if followers
                .get(sandbox)
                .is_some_and(|s| !s.ended.load(Ordering::Relaxed))
            {
                return;
            }
            let state = Arc::new(FollowerState::default());
            followers.insert(sandbox.to_string(), state.clone());
            state
        };
        let follower = Follower {
            session,
            hooks: self.fleet.config.hooks.clone(),
            seq_path: self.fleet.config.events_path(sandbox, "seq"),
            lock_path: self.fleet.config.events_path(sandbox, "lock"),
            sink: self.sink.clone(),
            state,
            started_unix: now_unix(),
        };
        let task = tokio::spawn(follower.run());
        self.tasks.lock().unwrap().push(task);
    }

    pub fn status(&self) -> Vec<FollowerView> {
        let followers = self.followers.lock().unwrap();
        let mut views: Vec<FollowerView> = followers
            .iter()
            .map(|(name, s)| FollowerView {
                sandbox: name.clone(),
                runs_hooks: s.runs_hooks.load(Ordering::Relaxed),
                last_seq: s.last_seq.load(Ordering::Relaxed),
                failures: s.failures.load(Ordering::Relaxed),
                last_error: s.last_error.lock().unwrap().clone(),
            })
            .collect();
        views.sort_by(|a, b| a.sandbox.cmp(&b.sandbox));
        views
    }
}

struct Follower {
    session: Arc<Session>,
    hooks: Hooks,
    seq_path: PathBuf,
    lock_path: PathBuf,
    sink: Sink,
    state: Arc<FollowerState>,
    started_unix: u64,
}

/// The last event whose hooks ran, as recorded; None when never recorded.
pub fn read_seq(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes `data` to a new file `path` (0600), never through a symlink or
/// into a file that exists.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(data)
}

/// Records `seq` atomically (temp file, rename), so a crash leaves the old
/// value or the new one.
pub fn write_seq(path: &Path, seq: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("seq.tmp");
    {
        let mut f = File::create(&tmp)?;
        writeln!(f, "{seq}")?;
    }
    std::fs::rename(&tmp, path)
}

/// The events lock when no other process holds it.
fn try_lock(path: &Path) -> Option<File> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

impl Follower {
    async fn run(self) {
        let name = self.session.name().to_string();
        let alert_after = self.hooks.alert_after_failures.max(1);
        // The lock (held while this follower runs the hooks), the last event
        // given to the sink, and the last event hooked (None: no record yet).
        let mut lock: Option<File> = None;
        let mut hooked: Option<u64> = None;
        // Taken with no record (a fresh OUTPOST_HOME): what the host holds
        // until the first page that is not full is history, recorded but
        // not hooked, so hooks start from its end.
        let mut catching_up = false;
        let mut seen = read_seq(&self.seq_path).unwrap_or(0);
        let mut failures = 0u32;
        let mut alerted = false;
        let mut refused_logged = false;
        loop {
            if lock.is_none()
                && let Some(file) = try_lock(&self.lock_path)
            {
                lock = Some(file);
                hooked = read_seq(&self.seq_path);
                catching_up = hooked.is_none();
                tracing::debug!(sandbox = %name, ?hooked, "running the event hooks");
            }
            self.state
                .runs_hooks
                .store(lock.is_some(), Ordering::Relaxed);
            let after = match (lock.is_some(), hooked) {
                (true, Some(h)) => h.min(seen),
                _ => seen,
            };
            let pause = match jobs::events(&self.session, None, after, PAGE).await {
                Ok(events) => {
                    failures = 0;
                    self.state.failures.store(0, Ordering::Relaxed);
                    *self.state.last_error.lock().unwrap() = None;
                    if alerted {
                        alerted = false;
                        let event = HookEvent::host("host_reachable", &name, String::new());
                        self.deliver(&event, lock.is_some()).await;
                    }
                    let full = events.len() as u32 >= PAGE;
                    let mut unrecorded = false;
                    for e in &events {
                        let event = HookEvent::from_job(&name, e);
                        let due = lock.is_some() && hooked.is_none_or(|h| e.seq > h);
                        let hook_now = due && !catching_up;
                        if e.seq > seen {
                            if hook_now || self.fresh(e.at_unix) {
                                (self.sink)(&event);
                            }
                            seen = e.seq;
                        }
                        if due {
                            hooked = Some(e.seq);
                            unrecorded = true;
                            if hook_now {
                                self.hook(&event).await;
                                self.record(e.seq);
                                unrecorded = false;
                            }
                        }
                    }
                    if unrecorded && let Some(h) = hooked {
                        self.record(h);
                    }
                    catching_up &= full;
                    self.state.last_seq.store(seen, Ordering::Relaxed);
                    if full { Duration::ZERO } else { POLL }
                }
                // An allocation that cannot be reached has usually ended: no
                // endless retries (each a job step started on the login
                // node) and no alert for it.
                Err(e) if e.is_connection() && self.session.allocation_job().is_some() => {
                    tracing::debug!(sandbox = %name, "allocation out of reach, no longer followed: {e}");
                    self.state.ended.store(true, Ordering::Relaxed);
                    return;
                }
                Err(e) if e.is_connection() => {
                    failures += 1;
                    self.state.failures.store(failures, Ordering::Relaxed);
                    *self.state.last_error.lock().unwrap() = Some(e.to_string());
                    if failures >= alert_after && !alerted {
                        alerted = true;
                        let detail = format!("{failures} failed checks: {e}");
                        let event = HookEvent::host("host_unreachable", &name, detail);
                        self.deliver(&event, lock.is_some()).await;
                    }
                    RETRY
                }
                Err(e) => {
                    // The host answers but refuses (an agent without jobs):
                    // not an outage.
                    if !refused_logged {
                        tracing::warn!(sandbox = %name, "cannot follow job events: {e}");
                        refused_logged = true;
                    }
                    *self.state.last_error.lock().unwrap() = Some(e.to_string());
                    REFUSED
                }
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Whether an event happened since this follower started (less a little
    /// slack): clients see what happened while they were there, not history.
    fn fresh(&self, at_unix: u64) -> bool {
        at_unix + FRESH_SLACK_S >= self.started_unix
    }

    fn record(&self, seq: u64) {
        if let Err(err) = write_seq(&self.seq_path, seq) {
            tracing::warn!(
                "cannot record the event position in {}: {err}",
                self.seq_path.display()
            );
        }
    }

    async fn deliver(&self, event: &HookEvent, run_hooks: bool) {
        (self.sink)(event);
        if run_hooks {
            self.hook(event).await;
        }
    }

    async fn hook(&self, event: &HookEvent) {
        let mut extras = HookExtras::default();
        if self.hooks.event_command.is_some() {
            // One file per event, made only for this hook run.
            if let Some(events) = self.seq_path.with_extension("events").to_str() {
                let file = PathBuf::from(format!(
                    "{events}-{}.json",
                    event.seq.unwrap_or(event.at_unix)
                ));
                let json = serde_json::to_vec_pretty(event).unwrap_or_default();
                match write_private(&file, &json) {
                    Ok(()) => extras.event_file = Some(file),
                    Err(e) => tracing::warn!("cannot write {}: {e}", file.display()),
                }
            }
            if let Some(job) = &event.job {
                let status = jobs::status(&self.session, job);
                if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(5), status).await {
                    extras.log_file = Some(info.log_file);
                }
            }
        }
        for problem in run_hooks(&self.hooks, event, &extras).await {
            tracing::warn!(sandbox = %event.sandbox, "hook failed: {problem}");
        }
        if let Some(file) = &extras.event_file {
            let _ = std::fs::remove_file(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> HookEvent {
        HookEvent {
            kind: "completed".into(),
            sandbox: "gpu1".into(),
            job: Some("train".into()),
            seq: Some(7),
            at_unix: 1_700_000_000,
            detail: "exit 0".into(),
        }
    }

    #[test]
    fn event_json_is_compact() {
        let json = serde_json::to_string(&event()).unwrap();
        assert_eq!(
            json,
            r#"{"type":"completed","sandbox":"gpu1","job":"train","seq":7,"at_unix":1700000000,"detail":"exit 0"}"#
        );
        let host = HookEvent::host("host_unreachable", "gpu1", String::new());
        let json = serde_json::to_value(&host).unwrap();
        assert!(json.get("job").is_none() && json.get("detail").is_none());
        assert_eq!(event().summary(), "gpu1: train completed (exit 0)");
    }

    #[test]
    fn hook_env_has_both_spellings() {
        let extras = HookExtras {
            event_file: Some(PathBuf::from("/h/events-gpu1.events-7.json")),
            log_file: Some("/home/u/train.log".into()),
        };
        let env: HashMap<&str, String> = hook_env(&event(), "{}", &extras).into_iter().collect();
        assert_eq!(env["RSMCP_EVENT_FILE"], "/h/events-gpu1.events-7.json");
        assert_eq!(env["RSMCP_LOG_FILE"], "/home/u/train.log");
        assert!(
            env["RSMCP_SUGGESTED_PROMPT"].starts_with(
                "Background job train on sandbox gpu1: completed (exit 0). Read its results: check_background_task(tmux_session=\"train\""
            ),
            "{}",
            env["RSMCP_SUGGESTED_PROMPT"]
        );
        assert_eq!(env["OUTPOST_EVENT_TYPE"], "completed");
        assert_eq!(env["OUTPOST_JOB"], "train");
        assert_eq!(env["OUTPOST_SANDBOX"], "gpu1");
        assert_eq!(env["OUTPOST_EVENT_JSON"], "{}");
        assert_eq!(env["RSMCP_EVENT_JSON"], "{}");
        assert_eq!(env["RSMCP_EVENT_TYPE"], "completed");
        assert_eq!(env["RSMCP_SANDBOX_NAME"], "gpu1");
        assert_eq!(env["RSMCP_TMUX_SESSION"], "train");
    }

    #[test]
    fn urls_parse_and_https_is_refused() {
        let u = HttpUrl::parse("http://relay.lan:8080/hook?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("relay.lan", 8080, "/hook?x=1")
        );
        let u = HttpUrl::parse("http://h").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        let u = HttpUrl::parse("http://[::1]:9/a#frag").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("::1", 9, "/a"));
        assert_eq!(u.to_string(), "http://[::1]:9/a");
        let u = HttpUrl::parse("http://h?q").unwrap();
        assert_eq!(u.path, "/?q");
        assert!(HttpUrl::parse("https://x/").unwrap_err().contains("https"));
        assert!(HttpUrl::parse("ftp://x/").is_err());
        assert!(HttpUrl::parse("http://u:p@x/").is_err());
        assert!(HttpUrl::parse("http://x:99999/").is_err());
        assert!(HttpUrl::parse("http:///p").is_err());
    }

    #[test]
    fn http_request_and_status() {
        let u = HttpUrl::parse("http://h:81/p").unwrap();
        let req = http_post_request(&u, "{}");
        assert!(
            req.starts_with("POST /p HTTP/1.1\r\nHost: h:81\r\n"),
            "{req}"
        );
        assert!(
            req.ends_with("Content-Length: 2\r\nConnection: close\r\n\r\n{}"),
            "{req}"
        );
        assert_eq!(http_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(http_status(b"garbage\r\n"), None);
    }

    #[test]
    fn seq_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("outpost-seq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events-x.seq");
        assert_eq!(read_seq(&path), None);
        write_seq(&path, 42).unwrap();
        assert_eq!(read_seq(&path), Some(42));
        let lock = dir.join("events-x.lock");
        let held = try_lock(&lock).unwrap();
        assert!(try_lock(&lock).is_none(), "a second holder got the lock");
        drop(held);
        // A child another test forks meanwhile holds a copy of the
        // descriptor until it execs: the lock is free once no copy is left.
        let again = (0..200).find_map(|_| {
            try_lock(&lock).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            })
        });
        assert!(
            again.is_some(),
            "the lock stayed taken after its holder let go"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn webhook_posts_to_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.ends_with(b"}") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(got).unwrap()
        });
        let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/e")).unwrap();
        post_json(&url, r#"{"type":"x"}"#).await.unwrap();
        let got = server.await.unwrap();
        assert!(got.starts_with("POST /e HTTP/1.1\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\n{\"type\":\"x\"}"), "{got}");
    }

    #[tokio::test]
    async fn event_command_sees_the_event() {
        let dir = std::env::temp_dir().join(format!("outpost-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let hooks = Hooks {
            event_command: Some(format!(
                "printf '%s %s %s' \"$OUTPOST_EVENT_TYPE\" \"$RSMCP_TMUX_SESSION\" \"$OUTPOST_EVENT_JSON\" > {}",
                out.display()
            )),
            ..Hooks::default()
        };
        assert!(
            run_hooks(&hooks, &event(), &HookExtras::default())
                .await
                .is_empty()
        );
        let got = std::fs::read_to_string(&out).unwrap();
        assert!(
            got.starts_with("completed train {\"type\":\"completed\""),
            "{got}"
        );
        let failing = Hooks {
            event_command: Some("echo nope >&2; exit 3".into()),
            ..Hooks::default()
        };
        let problems = run_hooks(&failing, &event(), &HookExtras::default()).await;
        assert!(problems[0].contains("nope"), "{problems:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
