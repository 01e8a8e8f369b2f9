//! The MCP server: remote-sandbox-mcp's tools, names, parameters and result
//! fields, served over stdio.
//!
//! Each tool is thin: it validates its parameters, calls into [`Fleet`] /
//! [`crate::session::Session`], and shapes a compact result (no echo of inputs).
//! Bad parameters and unknown sandboxes come back as `isError` results with a
//! message that says what to do.
//!
//! Every call goes through the hand-written `call_tool`, which records it in
//! the audit log ([`crate::ops::audit`]); the exec tools ask the config file's
//! command policy ([`crate::policy`]) before anything runs, and ask the person
//! through elicitation where a confirm rule says so.
//!
//! Background jobs: the job tools follow remote-sandbox-mcp (`tmux_session` is
//! the job name, `watch_id` the same name); its watch tools are listed only
//! with `REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`. The first job tool used on a
//! sandbox starts its event follower ([`crate::ops::events`]), whose events reach the
//! client as MCP logging notifications.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outpost_protocol::{
    ExecRequest, GpuLeaseRequest, JobInfo, JobRead, JobSpec, JobState, JobWait, WaitReason,
    WatchSpec,
};
use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, Role, ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{
    ErrorData as McpError, Json, RoleServer, ServerHandler, ServiceExt, prompt, prompt_handler,
    prompt_router, tool, tool_router,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ops::files::{
    self, ListParams as FileListParams, ReadParams, SyncParams, TaskParams, WriteParams,
};
use crate::fleet::{Fleet, SandboxStatus};
use crate::ops::exec;
use crate::ops::jobs;
use crate::linelimit::{LineLimit, OVERSIZED_METHOD, oversized_error};
use crate::ops::localpath::Roots;
use crate::policy::Planned;
use crate::resources::Requirements;
use crate::session::{CallError, Session};
use crate::ops::transfers::Transfers;
use crate::ops::events::{HookEvent, Watcher};

/// Per-host deadline for `list_sandboxes(check_resources=true)`, on top of the
/// connect timeout a fresh connection may need.
const RESOURCE_DEADLINE_EXTRA: Duration = Duration::from_secs(5);

/// Longest MCP message read from stdin (rmcp's own default is 16 MiB).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// How long a `roots/list` request may take.
const ROOTS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct OutpostServer {
    fleet: Arc<Fleet>,
    transfers: Arc<Transfers>,
    watcher: Arc<Watcher>,
    cursors: Arc<Cursors>,
    events: Arc<EventQueue>,
    /// The MCP client's roots, asked once and again after it says they
    /// changed; `None` until then.
    client_roots: Arc<tokio::sync::Mutex<Option<Roots>>>,
    /// Every tool call is recorded here (`$OUTPOST_HOME/audit.jsonl`).
    audit: crate::ops::audit::AuditLog,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
}

/// Job events on their way to the client, in order, as logging notifications.
pub struct EventQueue {
    tx: tokio::sync::mpsc::UnboundedSender<HookEvent>,
    rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<HookEvent>>>,
    /// The client's `logging/setLevel`, as a rank (debug 0 … emergency 7).
    min_level: AtomicU8,
}

impl EventQueue {
    fn new() -> EventQueue {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        EventQueue {
            tx,
            rx: Mutex::new(Some(rx)),
            min_level: AtomicU8::new(0),
        }
    }

    /// Sends the queued events to `peer` for as long as it listens.
    #[allow(deprecated)] // MCP logging: the only way to tell a client unprompted
    fn forward(self: &Arc<Self>, peer: rmcp::Peer<RoleServer>) {
        let Some(mut rx) = self.rx.lock().unwrap().take() else {
            return;
        };
        let queue = self.clone();
        tokio::spawn(async move {
            use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
            while let Some(event) = rx.recv().await {
                let level = if event.is_alarm() {
                    LoggingLevel::Warning
                } else {
                    LoggingLevel::Info
                };
                if (level as u8) < queue.min_level.load(Ordering::Relaxed) {
                    continue;
                }
                let data = serde_json::to_value(&event).unwrap_or_default();
                let param =
                    LoggingMessageNotificationParam::new(level, data).with_logger("outpost.jobs");
                if peer.notify_logging_message(param).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TaskPrompt {
    /// What to run, test or debug.
    pub task: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListParams {
    /// Also report CPU, memory, GPU use and idle_score (connects to every host).
    #[serde(default)]
    pub check_resources: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub active_sandbox: String,
    pub sandboxes: Vec<SandboxStatus>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectParams {
    /// A sandbox name, or "auto": the idlest sandbox meeting the requirements.
    pub sandbox_name: String,
    #[serde(flatten)]
    pub requirements: Requirements,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SelectResult {
    pub active_sandbox: String,
    pub status: String,
    /// With "auto": the chosen sandbox's idle_score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_score: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ActiveResult {
    pub active_sandbox: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub connection_alive: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_error: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// Bash command line.
    pub command: String,
    /// Working directory (~ is the remote home). Default: home.
    pub cwd: Option<String>,
    /// Kill the whole process tree after this many seconds. Default 120.
    pub timeout_s: Option<f64>,
    /// Output kept per stream (first and last halves). Default 20000.
    pub max_output_chars: Option<i64>,
    /// Run here instead of the active sandbox.
    pub sandbox_name: Option<String>,
    /// Run on several sandboxes in parallel (["all"] for every one); results are
    /// grouped by identical output.
    pub sandboxes: Option<Vec<String>>,
    /// A reserve_gpus lease: sets CUDA_VISIBLE_DEVICES to its GPUs.
    pub gpu_lease: Option<String>,
}

#[derive(Debug, PartialEq, Serialize, JsonSchema)]
pub struct ExecOutput {
    /// Exit status; 124 on timeout, 128+N when killed by signal N, -1 when the
    /// connection failed.
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Set when the host could not be reached or the connection dropped; the
    /// command may not have run. Not retried automatically.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub connection_error: bool,
}

/// exec_bash's result: the single-sandbox fields, or with `sandboxes`, one
/// group per distinct outcome.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecReply {
    #[serde(flatten)]
    pub single: Option<ExecOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<ExecGroup>>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecGroup {
    pub sandboxes: Vec<String>,
    #[serde(flatten)]
    pub output: ExecOutput,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReserveParams {
    /// Number of GPUs. Default 1.
    pub count: Option<u32>,
    /// Free memory each GPU must have, MiB.
    pub min_free_mb: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReserveResult {
    pub lease_id: String,
    pub sandbox: String,
    pub gpus: Vec<u32>,
    pub cuda_visible_devices: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReleaseParams {
    pub lease_id: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusResult {
    pub status: String,
}

// ---------------------------------------------------------------------------
// Background jobs

/// What the hook parameters of remote-sandbox-mcp get instead of running.
const HOOKS_REFUSED: &str = "webhook_url/event_command are not accepted from tool calls (they would let a caller run commands on this machine); configure hooks in the Outpost config file: [hooks] webhook_url = …, event_command = …";

/// Default and largest log bytes one job tool answer carries.
const DEFAULT_LOG_BYTES: u64 = 20_000;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct BackgroundParams {
    /// Bash command line.
    pub command: String,
    /// Job name, unique on the host. Default: generated.
    pub session_name: Option<String>,
    /// Output file (relative: to cwd). Default: in the job's own directory.
    pub log_file: Option<String>,
    /// Working directory (~ is the remote home). Default: home.
    pub cwd: Option<String>,
    pub sandbox_name: Option<String>,
    /// Return a watch_id (every job is supervised either way). Default true.
    pub watch: Option<bool>,
    pub run_id: Option<String>,
    pub watch_name: Option<String>,
    /// Run when the job is found lost (host reboot), with auto_resume.
    pub resume_command: Option<String>,
    pub resume_plan_json: Option<String>,
    /// Progress file (relative: to cwd), shown by the watch tools.
    pub checkpoint_path: Option<String>,
    /// "text" (default) or "json".
    pub checkpoint_format: Option<String>,
    /// Prints the checkpoint instead of checkpoint_path.
    pub checkpoint_command: Option<String>,
    pub interval_s: Option<f64>,
    pub alert_after_failures: Option<u32>,
    pub resume_delay_s: Option<f64>,
    /// Resume a lost job with resume_command. Default false.
    pub auto_resume: Option<bool>,
    pub max_resume_attempts: Option<u32>,
    /// Refused: set [hooks] in the config file.
    pub webhook_url: Option<String>,
    /// Refused: set [hooks] in the config file.
    pub event_command: Option<String>,
    pub metadata_json: Option<String>,
    pub notify_local: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct BackgroundStarted {
    pub status: String,
    /// The job name: pass it as tmux_session or name to the other job tools.
    pub tmux_session: String,
    pub log_file: String,
    pub sandbox: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CheckParams {
    /// The job name.
    pub tmux_session: Option<String>,
    /// Finds the job writing this log.
    pub log_file: Option<String>,
    pub watch_id: Option<String>,
    /// Default 50.
    pub last_n_lines: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckResult {
    pub tmux_session: String,
    pub running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Set (and exit_code absent) when signal N killed the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// running, exited, cancelled or lost.
    pub state: String,
    pub log_tail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListTasksParams {
    /// running, exited, cancelled or lost. Default: all.
    pub state: Option<String>,
    /// Newest jobs to list. Default 50.
    pub limit: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListTasksResult {
    pub tasks: Vec<TaskRow>,
    /// Older jobs that matched but were not listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub older_omitted: u64,
}

/// Jobs a list tool shows unless asked for more.
const LIST_DEFAULT: u32 = 50;

#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskRow {
    pub name: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// UTC.
    pub started: String,
    pub command: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelParams {
    pub name: String,
    /// Seconds between TERM and KILL. Default 3.
    pub grace_s: Option<f64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CancelResult {
    pub name: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitParams {
    pub name: String,
    /// 0 to 3600. Default 60.
    pub timeout_s: Option<f64>,
    /// Return when new output matches this regex.
    pub pattern: Option<String>,
    /// Return after this many seconds without new output.
    pub silence_s: Option<f64>,
    /// Log offset to read from (a previous result's cursor). Default: where
    /// this server's last wait or read of the job stopped, else the start.
    pub cursor: Option<u64>,
    /// Output kept (its end). Default 20000.
    pub max_bytes: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitResult {
    pub name: String,
    /// ended, matched, silent or timed_out.
    pub reason: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// New output since the cursor.
    pub output: String,
    /// Pass as cursor next time.
    pub cursor: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadLogParams {
    pub name: String,
    /// Byte offset. Default 0 (unless tail_lines).
    pub offset: Option<u64>,
    /// The last N lines.
    pub tail_lines: Option<u32>,
    /// Only lines matching this regex.
    pub grep: Option<String>,
    /// Default 20000.
    pub max_bytes: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadLogResult {
    pub content: String,
    pub offset: u64,
    pub next_offset: u64,
    pub size: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchIdParams {
    pub watch_id: String,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchRegisterParams {
    /// The job name (or watch_id).
    pub tmux_session: Option<String>,
    pub watch_id: Option<String>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchListParams {
    /// A job state. Default: all.
    pub status: Option<String>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchProgressParams {
    pub watch_id: String,
    /// Default 80.
    pub log_lines: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchLogParams {
    pub watch_id: String,
    /// Default 200.
    pub last_n_lines: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchCheckpointParams {
    pub watch_id: String,
    /// Default 20000.
    pub max_bytes: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchEventsParams {
    /// Default: every job's.
    pub watch_id: Option<String>,
    /// The most recent N. Default 50.
    pub limit: Option<u32>,
    pub sandbox_name: Option<String>,
}

/// A job as the watch tools show it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchView {
    pub watch_id: String,
    pub sandbox: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub command: String,
    pub log_file: String,
    pub started: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_command: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_resume: bool,
    #[serde(skip_serializing_if = "is_zero")]
    pub resume_attempts: u32,
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchResult {
    pub watch: WatchView,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchesResult {
    pub watches: Vec<WatchView>,
    /// Older watches that matched but were not listed (the newest 50 are).
    #[serde(skip_serializing_if = "is_zero")]
    pub older_omitted: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchLogResult {
    pub state: String,
    pub log_tail: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckpointView {
    /// "command" or "file".
    pub source: String,
    pub content: String,
    /// The content parsed, with checkpoint_format "json".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Why the command or read failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ProgressResult {
    pub watch: WatchView,
    pub log_tail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointView>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct EventsResult {
    pub events: Vec<EventRow>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct EventRow {
    pub seq: u64,
    pub watch_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// UTC.
    pub at: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchdogStatus {
    /// Sandboxes whose job events this server follows.
    pub followers: Vec<crate::ops::events::FollowerView>,
    /// Configured hooks: "webhook_url", "event_command".
    pub hooks: Vec<String>,
    pub alert_after_failures: u32,
}

/// The key of a job in this server's cursor memory.
type JobKey = (String, String);

/// Where each job's log was last read up to by this server.
#[derive(Default)]
pub struct Cursors(Mutex<HashMap<JobKey, u64>>);

impl Cursors {
    fn get(&self, sandbox: &str, job: &str) -> u64 {
        let map = self.0.lock().unwrap();
        map.get(&(sandbox.to_string(), job.to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn set(&self, sandbox: &str, job: &str, at: u64) {
        self.0
            .lock()
            .unwrap()
            .insert((sandbox.to_string(), job.to_string()), at);
    }
}

/// A non-empty trimmed string, or None (remote-sandbox-mcp sends "" for unset).
fn given(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn seconds(name: &str, value: Option<f64>, default: f64, max: f64) -> Result<Duration, String> {
    let v = value.unwrap_or(default);
    if !(v >= 0.0 && v <= max) {
        return Err(format!(
            "{name} must be between 0 and {max} seconds, got {v}"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

fn log_bytes(value: Option<u64>) -> Result<u64, String> {
    match value.unwrap_or(DEFAULT_LOG_BYTES) {
        0 => Err("max_bytes must be 1 or more".into()),
        n => Ok(n.min(jobs::MAX_LOG_BYTES)),
    }
}

fn valid_json(name: &str, value: &Option<String>) -> Result<Option<String>, String> {
    let Some(text) = given(value) else {
        return Ok(None);
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| format!("{name} is not valid JSON: {e}"))?;
    Ok(Some(text))
}

/// The job request for `exec_bash_background`, or what is wrong with the call.
pub fn job_spec(p: &BackgroundParams) -> Result<JobSpec, String> {
    if given(&p.webhook_url).is_some() || given(&p.event_command).is_some() {
        return Err(HOOKS_REFUSED.into());
    }
    if p.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    let checkpoint_format = given(&p.checkpoint_format).unwrap_or_else(|| "text".into());
    if checkpoint_format != "text" && checkpoint_format != "json" {
        return Err(format!(
            "checkpoint_format must be \"text\" or \"json\", got {checkpoint_format:?}"
        ));
    }
    let cwd = given(&p.cwd);
    let day = 86_400.0;
    let watch = WatchSpec {
        run_id: given(&p.run_id),
        watch_name: given(&p.watch_name),
        resume_command: given(&p.resume_command),
        resume_plan_json: valid_json("resume_plan_json", &p.resume_plan_json)?,
        checkpoint_path: given(&p.checkpoint_path),
        checkpoint_format: Some(checkpoint_format),
        checkpoint_command: given(&p.checkpoint_command),
        auto_resume: p.auto_resume.unwrap_or(false),
        max_resume_attempts: p.max_resume_attempts.unwrap_or(1),
        resume_delay_s: seconds("resume_delay_s", p.resume_delay_s, 300.0, day)?.as_secs(),
        alert_after_failures: p.alert_after_failures.unwrap_or(2),
        interval_s: seconds("interval_s", p.interval_s, 300.0, day)?.as_secs(),
        metadata_json: with_cwd(
            valid_json("metadata_json", &p.metadata_json)?,
            cwd.as_deref(),
        ),
    };
    if watch.auto_resume && watch.resume_command.is_none() && watch.resume_plan_json.is_none() {
        return Err("auto_resume needs resume_command (or resume_plan_json)".into());
    }
    Ok(JobSpec {
        name: given(&p.session_name),
        command: p.command.clone(),
        env: Vec::new(),
        log_file: given(&p.log_file).map(|log| relative_to(cwd.as_deref(), log)),
        cwd,
        watch,
    })
}

/// A relative remote `path` resolved against `cwd`, as remote-sandbox-mcp
/// resolves log files (the host resolves relative paths against the home).
fn relative_to(cwd: Option<&str>, path: String) -> String {
    match cwd {
        Some(cwd) if !path.starts_with('/') && !path.starts_with('~') => {
            format!(
                "{}/{}",
                cwd.trim_end_matches('/'),
                path.trim_start_matches("./")
            )
        }
        _ => path,
    }
}

/// Records the job's cwd in its metadata (a JSON object) under `cwd`, so the
/// watch tools can resolve a relative checkpoint later: the host reports a
/// job's metadata but not its cwd.
fn with_cwd(metadata: Option<String>, cwd: Option<&str>) -> Option<String> {
    let Some(cwd) = cwd else { return metadata };
    let mut object = match metadata
        .as_deref()
        .map(serde_json::from_str::<serde_json::Value>)
    {
        None => serde_json::Map::new(),
        Some(Ok(serde_json::Value::Object(o))) => o,
        Some(_) => return metadata,
    };
    object
        .entry("cwd")
        .or_insert_with(|| serde_json::Value::String(cwd.to_string()));
    Some(serde_json::Value::Object(object).to_string())
}

/// The cwd a job was started in, if recorded.
fn job_cwd(job: &JobInfo) -> Option<String> {
    let meta: serde_json::Value = serde_json::from_str(job.watch.metadata_json.as_deref()?).ok()?;
    meta.get("cwd")?.as_str().map(str::to_string)
}

fn watch_view(sandbox: &str, job: &JobInfo) -> WatchView {
    let w = &job.watch;
    WatchView {
        watch_id: job.name.clone(),
        sandbox: sandbox.to_string(),
        state: jobs::state_name(job.state).into(),
        exit_code: job.exit_code,
        signal: job.signal,
        command: jobs::short_command(&job.command, 200),
        log_file: job.log_file.clone(),
        started: jobs::utc_time(job.started_unix),
        ended: job.ended_unix.map(jobs::utc_time),
        run_id: w.run_id.clone(),
        watch_name: w.watch_name.clone(),
        checkpoint_path: w.checkpoint_path.clone(),
        checkpoint_command: w.checkpoint_command.clone(),
        resume_command: w.resume_command.clone(),
        auto_resume: w.auto_resume,
        resume_attempts: job.resume_attempts,
    }
}

/// Whether a job writes to `log_file` as a caller named it (the host reports
/// the resolved path; a relative name matches its tail).
fn log_matches(job_log: &str, wanted: &str) -> bool {
    let wanted = wanted.trim_start_matches("./");
    job_log == wanted
        || (!wanted.starts_with('/')
            && job_log.ends_with(&format!("/{}", wanted.trim_start_matches("~/"))))
}

/// Builds the agent request for an `exec_bash` call, or says what is wrong.
fn exec_request(p: &ExecParams, stream: bool) -> Result<ExecRequest, String> {
    exec::request(&exec::Command {
        command: &p.command,
        cwd: p.cwd.as_deref(),
        timeout_s: Some(p.timeout_s.unwrap_or(exec::DEFAULT_TIMEOUT_S)),
        max_output: p.max_output_chars.unwrap_or(exec::DEFAULT_MAX_OUTPUT),
        stream,
    })
}

/// Shapes an agent exec result for the `exec_bash` tool.
fn exec_output(
    result: Result<outpost_protocol::ExecResult, CallError>,
) -> Result<ExecOutput, String> {
    match result {
        Ok(r) => Ok(ExecOutput {
            exit_code: exec::shell_status(&r),
            stdout: r.stdout.to_text(),
            stderr: r.stderr.to_text(),
            timed_out: r.timed_out,
            signal: if r.timed_out { None } else { r.signal },
            connection_error: false,
        }),
        Err(e) if e.is_connection() => Ok(ExecOutput {
            exit_code: -1,
            stdout: String::new(),
            stderr: e.to_string(),
            timed_out: false,
            signal: None,
            connection_error: true,
        }),
        Err(e) => Err(e.to_string()),
    }
}

#[tool_router(router = tool_router)]
impl OutpostServer {
    pub fn new(fleet: Arc<Fleet>) -> Self {
        let events = Arc::new(EventQueue::new());
        let since = crate::ops::events::now_unix();
        let tx = events.tx.clone();
        // Clients hear what happens while they are connected; a follower's
        // catch-up on older events only runs the hooks.
        let sink: crate::ops::events::Sink = Arc::new(move |event: &HookEvent| {
            tracing::info!("job event: {}", event.summary());
            if event.at_unix + 5 >= since {
                let _ = tx.send(event.clone());
            }
        });
        let mut tool_router = Self::tool_router();
        if fleet.config.expose_advanced_tools {
            tool_router.merge(Self::advanced_router());
        }
        let audit = crate::ops::audit::AuditLog::new(&fleet.config.home);
        OutpostServer {
            watcher: Watcher::new(fleet.clone(), sink),
            fleet,
            transfers: Arc::new(Transfers::default()),
            cursors: Arc::new(Cursors::default()),
            events,
            client_roots: Arc::default(),
            audit,
            tool_router,
            prompt_router: Self::prompt_router(),
        }
    }

    #[tool(
        description = "List sandboxes (SSH hosts and `local`) with connection state; check_resources adds CPU/memory/GPU load and idle_score (0 busy … 1 idle)."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(p): Parameters<ListParams>,
    ) -> Result<Json<ListResult>, String> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let sandboxes = self.fleet.list(p.check_resources, deadline).await;
        Ok(Json(ListResult {
            active_sandbox: self.fleet.active_name(),
            sandboxes,
        }))
    }

    #[tool(
        description = "Make a sandbox the default for later calls. sandbox_name \"auto\" picks the idlest one meeting min_gpus, min_gpu_free_mb, min_free_mem_mb, max_load_per_cpu."
    )]
    async fn select_sandbox(
        &self,
        Parameters(p): Parameters<SelectParams>,
    ) -> Result<Json<SelectResult>, String> {
        let mut idle_score = None;
        if p.sandbox_name == "auto" && self.fleet.get(Some("auto")).is_err() {
            let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
            let (_, r) = self.fleet.select_auto(&p.requirements, deadline).await?;
            idle_score = Some(r.idle_score);
        } else {
            self.fleet.select(&p.sandbox_name)?;
        }
        Ok(Json(SelectResult {
            active_sandbox: self.fleet.active_name(),
            status: "selected".into(),
            idle_score,
        }))
    }

    #[tool(description = "The active sandbox and whether it is reachable.")]
    async fn get_active_sandbox(&self) -> Result<Json<ActiveResult>, String> {
        let (session, err) = self.fleet.check(None).await?;
        let (host, port, user) = session.config.address();
        Ok(Json(ActiveResult {
            active_sandbox: session.name().to_string(),
            host,
            port,
            user,
            connection_alive: err.is_none(),
            connection_error: err.map(|e| e.to_string()),
        }))
    }

    #[tool(
        description = "Run a bash command in a sandbox and return exit_code, stdout, stderr. The timeout kills the whole process tree. For long jobs use a background task."
    )]
    async fn exec_bash(
        &self,
        Parameters(p): Parameters<ExecParams>,
        peer: rmcp::Peer<RoleServer>,
    ) -> Result<Json<ExecReply>, String> {
        let mut req = exec_request(&p, false)?;
        let mut target = p.sandbox_name.clone();
        if let Some(id) = &p.gpu_lease {
            let (sandbox, devices) = self
                .fleet
                .with_lease(id, |h| (h.sandbox.clone(), h.cuda_visible_devices()))?;
            if target.as_ref().is_some_and(|t| *t != sandbox) || p.sandboxes.is_some() {
                return Err(format!("GPU lease {id} belongs to sandbox {sandbox}"));
            }
            target = Some(sandbox);
            req.env
                .push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            req.env.push(("CUDA_VISIBLE_DEVICES".into(), devices));
        }
        Ok(Json(match &p.sandboxes {
            Some(names) => {
                let names = self.fan_out_names(names)?;
                let planned: Vec<Planned> = names
                    .iter()
                    .map(|sandbox| Planned {
                        sandbox,
                        field: "command",
                        command: &req.command,
                    })
                    .collect();
                self.permit(&peer, &planned).await?;
                ExecReply {
                    single: None,
                    groups: Some(self.fan_out(&names, &req).await?),
                }
            }
            None => {
                let session = self.fleet.get(target.as_deref())?;
                self.permit(
                    &peer,
                    &[Planned {
                        sandbox: session.name(),
                        field: "command",
                        command: &req.command,
                    }],
                )
                .await?;
                ExecReply {
                    single: Some(exec_output(session.exec(req, |_, _| {}).await)?),
                    groups: None,
                }
            }
        }))
    }

    #[tool(
        description = "Reserve GPUs on a sandbox for exec_bash(gpu_lease=...). The lease is recorded on the host; it ends on release_gpus or when this server's connection ends."
    )]
    async fn reserve_gpus(
        &self,
        Parameters(p): Parameters<ReserveParams>,
    ) -> Result<Json<ReserveResult>, String> {
        let request = GpuLeaseRequest {
            count: p.count.unwrap_or(1),
            min_free_mem_bytes: p.min_free_mb.unwrap_or(0) * 1024 * 1024,
        };
        let id = self
            .fleet
            .reserve_gpus(p.sandbox_name.as_deref(), request)
            .await
            .map_err(|e| e.to_string())?;
        self.fleet
            .with_lease(&id, |h| ReserveResult {
                lease_id: id.clone(),
                sandbox: h.sandbox.clone(),
                gpus: h.lease.indices.clone(),
                cuda_visible_devices: h.cuda_visible_devices(),
            })
            .map(Json)
    }

    #[tool(description = "End a GPU lease.")]
    async fn release_gpus(
        &self,
        Parameters(p): Parameters<ReleaseParams>,
    ) -> Result<Json<StatusResult>, String> {
        self.fleet.release_gpus(&p.lease_id).await?;
        Ok(Json(StatusResult {
            status: "released".into(),
        }))
    }

    #[tool(
        description = "Sync a local file or directory to a sandbox (delta, compressed). Small transfers run inline; past REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES/_BYTES they continue in the background (mode=background, task_id)."
    )]
    async fn sync_local_to_remote(
        &self,
        Parameters(p): Parameters<SyncParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        let roots = self.local_roots(&peer).await;
        files::sync_maybe_inline(&self.fleet, &self.transfers, &roots, p)
            .await
            .map(Json)
    }

    #[tool(
        description = "Start a local-to-sandbox sync in the background; poll with check_file_transfer_task."
    )]
    async fn sync_local_to_remote_background(
        &self,
        Parameters(p): Parameters<SyncParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        let roots = self.local_roots(&peer).await;
        files::sync_background(&self.fleet, &self.transfers, &roots, p).map(Json)
    }

    #[tool(
        description = "Status, progress (files/bytes done and total, rate), result or error, and log tail of a background transfer."
    )]
    async fn check_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::ops::transfers::TransferView>, String> {
        let task = self.transfers.get(&p.task_id)?;
        Ok(Json(task.view(p.last_n_lines.unwrap_or(50))))
    }

    #[tool(
        description = "Cancel a background transfer; files already committed stay, nothing half-written remains."
    )]
    async fn cancel_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::ops::transfers::TransferView>, String> {
        let task = self.transfers.get(&p.task_id)?;
        task.cancel();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), task.finished()).await;
        Ok(Json(task.view(p.last_n_lines.unwrap_or(10))))
    }

    #[tool(
        description = "Sync a sandbox file or directory to a local path (delta, compressed, atomic writes)."
    )]
    async fn sync_remote_to_local(
        &self,
        Parameters(p): Parameters<SyncParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<crate::sync::SyncReport>, String> {
        let roots = self.local_roots(&peer).await;
        files::pull(&self.fleet, &roots, p).await.map(Json)
    }

    #[tool(
        description = "List a sandbox directory: entries[{path, is_dir, size, mtime}], truncated."
    )]
    async fn list_remote_files(
        &self,
        Parameters(p): Parameters<FileListParams>,
    ) -> Result<Json<files::ListResult>, String> {
        files::list(&self.fleet, p).await.map(Json)
    }

    #[tool(
        description = "Read a sandbox file from offset, up to max_bytes (default 200000). Binary files are reported as binary, not dumped."
    )]
    async fn read_remote_file(
        &self,
        Parameters(p): Parameters<ReadParams>,
    ) -> Result<Json<files::ReadResult>, String> {
        files::read(&self.fleet, p).await.map(Json)
    }

    #[tool(description = "Write a sandbox file atomically (parents created by default).")]
    async fn write_remote_file(
        &self,
        Parameters(p): Parameters<WriteParams>,
    ) -> Result<Json<files::WriteResult>, String> {
        files::write(&self.fleet, p).await.map(Json)
    }

    #[tool(
        description = "Start a long-running command on a sandbox; it survives disconnects and restarts. Returns tmux_session (the job name) for check/wait/read/cancel_background_task."
    )]
    async fn exec_bash_background(
        &self,
        Parameters(p): Parameters<BackgroundParams>,
        peer: rmcp::Peer<RoleServer>,
    ) -> Result<Json<BackgroundStarted>, String> {
        let spec = job_spec(&p)?;
        let sandbox = self
            .fleet
            .get(p.sandbox_name.as_deref())?
            .name()
            .to_string();
        let commands = crate::policy::job_commands(&spec);
        let planned: Vec<Planned> = commands
            .iter()
            .map(|(field, command)| Planned {
                sandbox: &sandbox,
                field,
                command,
            })
            .collect();
        self.permit(&peer, &planned).await?;
        let session = self.job_session(Some(&sandbox))?;
        let job = jobs::start(&session, spec)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Json(BackgroundStarted {
            status: "started".into(),
            watch_id: p.watch.unwrap_or(true).then(|| job.name.clone()),
            tmux_session: job.name,
            log_file: job.log_file,
            sandbox: session.name().to_string(),
        }))
    }

    #[tool(
        description = "State, exact exit_code (or signal) and log tail of a background job, by tmux_session, watch_id or log_file."
    )]
    async fn check_background_task(
        &self,
        Parameters(p): Parameters<CheckParams>,
    ) -> Result<Json<CheckResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let by_watch = given(&p.watch_id);
        let name = match (given(&p.tmux_session), &by_watch, given(&p.log_file)) {
            (Some(name), _, _) => name,
            (None, Some(id), _) => id.clone(),
            (None, None, Some(log)) => job_by_log(&session, &log).await?,
            (None, None, None) => {
                return Err("pass tmux_session (the job name exec_bash_background returned), watch_id, or log_file".into());
            }
        };
        let lines = p.last_n_lines.unwrap_or(50);
        let (job, tail) = futures::join!(jobs::status(&session, &name), async {
            if lines == 0 {
                Ok(String::new())
            } else {
                jobs::tail(&session, &name, lines, DEFAULT_LOG_BYTES).await
            }
        });
        let job = job.map_err(|e| e.to_string())?;
        Ok(Json(CheckResult {
            running: job.state == JobState::Running,
            exit_code: job.exit_code,
            signal: job.signal,
            state: jobs::state_name(job.state).into(),
            log_tail: tail.unwrap_or_else(|e| format!("[log unavailable: {e}]")),
            watch_id: by_watch.map(|_| job.name.clone()),
            tmux_session: job.name,
        }))
    }

    #[tool(description = "Background jobs on a sandbox: the newest `limit`, oldest first.")]
    async fn list_background_tasks(
        &self,
        Parameters(p): Parameters<ListTasksParams>,
    ) -> Result<Json<ListTasksResult>, String> {
        let state = given(&p.state).map(|s| jobs::parse_state(&s)).transpose()?;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let limit = p.limit.unwrap_or(LIST_DEFAULT).max(1);
        let (list, older_omitted) = jobs::list(&session, state, limit)
            .await
            .map_err(|e| e.to_string())?;
        let tasks = list
            .into_iter()
            .map(|j| TaskRow {
                state: jobs::state_name(j.state).into(),
                exit_code: j.exit_code,
                signal: j.signal,
                started: jobs::utc_time(j.started_unix),
                command: jobs::short_command(&j.command, 80),
                name: j.name,
            })
            .collect();
        Ok(Json(ListTasksResult {
            tasks,
            older_omitted,
        }))
    }

    #[tool(
        description = "Stop a background job: TERM to its whole process tree, KILL after grace_s."
    )]
    async fn cancel_background_task(
        &self,
        Parameters(p): Parameters<CancelParams>,
    ) -> Result<Json<CancelResult>, String> {
        let grace = seconds("grace_s", p.grace_s, 3.0, 600.0)?;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let job = jobs::cancel(&session, &p.name, grace)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Json(CancelResult {
            state: jobs::state_name(job.state).into(),
            exit_code: job.exit_code,
            signal: job.signal,
            name: job.name,
        }))
    }

    #[tool(
        description = "Block until a background job ends, its new output matches pattern, it is silent for silence_s, or timeout_s passes. Returns the new output and a cursor for the next call."
    )]
    async fn wait_background_task(
        &self,
        Parameters(p): Parameters<WaitParams>,
    ) -> Result<Json<WaitResult>, String> {
        let timeout = seconds("timeout_s", p.timeout_s, 60.0, jobs::MAX_WAIT.as_secs_f64())?;
        let silence = match p.silence_s {
            Some(s) if s > 0.0 && s.is_finite() => Some(Duration::from_secs_f64(s)),
            Some(s) => {
                return Err(format!(
                    "silence_s must be a positive number of seconds, got {s}"
                ));
            }
            None => None,
        };
        let max_bytes = log_bytes(p.max_bytes)?;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let cursor = p
            .cursor
            .unwrap_or_else(|| self.cursors.get(session.name(), &p.name));
        let waited = jobs::wait(
            &session,
            JobWait {
                name: p.name.clone(),
                cursor,
                timeout_ms: timeout.as_millis() as u64,
                pattern: given(&p.pattern),
                silence_ms: silence.map(|d| d.as_millis() as u64),
                max_bytes,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        self.cursors
            .set(session.name(), &waited.job.name, waited.cursor_after);
        let job = &waited.job;
        Ok(Json(WaitResult {
            name: job.name.clone(),
            reason: match waited.reason {
                WaitReason::Ended => "ended",
                WaitReason::Matched => "matched",
                WaitReason::Silent => "silent",
                WaitReason::TimedOut => "timed_out",
            }
            .into(),
            state: jobs::state_name(job.state).into(),
            exit_code: job.exit_code,
            signal: job.signal,
            output: jobs::output_text(&waited.output, waited.omitted),
            cursor: waited.cursor_after,
        }))
    }

    #[tool(
        description = "Read a background job's log: a page from offset, the last tail_lines, or the lines matching grep. Page on with next_offset."
    )]
    async fn read_background_log(
        &self,
        Parameters(p): Parameters<ReadLogParams>,
    ) -> Result<Json<ReadLogResult>, String> {
        let max_bytes = log_bytes(p.max_bytes)?;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let offset = p.offset.or(if p.tail_lines.is_none() {
            Some(0)
        } else {
            None
        });
        let log = jobs::read(
            &session,
            JobRead {
                name: p.name.clone(),
                offset,
                tail_lines: p.tail_lines,
                grep: given(&p.grep),
                max_bytes,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        self.cursors.set(session.name(), &p.name, log.next_offset);
        Ok(Json(ReadLogResult {
            content: String::from_utf8_lossy(&log.data).into_owned(),
            offset: log.offset,
            next_offset: log.next_offset,
            size: log.log_size,
        }))
    }
}

impl OutpostServer {
    /// The sandboxes a fan-out names (`["all"]`: every one).
    fn fan_out_names(&self, names: &[String]) -> Result<Vec<String>, String> {
        let names: Vec<String> = if names.iter().any(|n| n == "all") {
            self.fleet.names()
        } else {
            for n in names {
                self.fleet.get(Some(n))?;
            }
            names.to_vec()
        };
        if names.is_empty() {
            return Err("sandboxes is empty; name sandboxes or use [\"all\"]".into());
        }
        Ok(names)
    }

    /// Runs on several sandboxes and groups identical outcomes.
    async fn fan_out(&self, names: &[String], req: &ExecRequest) -> Result<Vec<ExecGroup>, String> {
        let mut groups: Vec<ExecGroup> = Vec::new();
        for (name, result) in self.fleet.exec_many(names, req).await {
            let output = exec_output(result)?;
            match groups.iter_mut().find(|g| g.output == output) {
                Some(g) => g.sandboxes.push(name),
                None => groups.push(ExecGroup {
                    sandboxes: vec![name],
                    output,
                }),
            }
        }
        Ok(groups)
    }

    /// Whether the config file's policy lets these commands run: refused
    /// outright by a deny rule or a missing allow rule; with a confirm rule,
    /// only once the person says yes through MCP elicitation. A client that
    /// cannot ask its user gets a refusal; nothing a tool call passes can
    /// approve a command.
    async fn permit(
        &self,
        peer: &rmcp::Peer<RoleServer>,
        planned: &[Planned<'_>],
    ) -> Result<(), String> {
        use rmcp::service::{ElicitationError, ElicitationMode, ServiceError};
        let policy = &self.fleet.policy;
        let pending = policy
            .review(planned)
            .map_err(|refusal| refusal.to_string())?;
        if pending.is_empty() {
            return Ok(());
        }
        let refuse = |why: &str| Err(crate::policy::not_confirmed(&pending, why));
        if !peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return refuse(
                "this MCP client cannot ask the user (it does not support elicitation); the user can run it with `outpost exec`",
            );
        }
        let question = crate::policy::confirm_question(&pending, policy, "An agent");
        let timeout = policy.confirm_timeout;
        match peer
            .elicit_with_timeout::<Approval>(question, Some(timeout))
            .await
        {
            Ok(Some(Approval { approve: true })) => {
                let rules: Vec<&str> = pending.iter().map(|p| p.rule.as_str()).collect();
                crate::ops::audit::note(
                    "confirmed",
                    serde_json::json!({"by": "elicitation", "rules": rules}),
                );
                Ok(())
            }
            Ok(_) | Err(ElicitationError::UserDeclined) => refuse("the user declined"),
            Err(ElicitationError::UserCancelled) => refuse("the user dismissed the question"),
            Err(ElicitationError::Service(ServiceError::Timeout { .. })) => {
                refuse(&format!("no answer came within {} s", timeout.as_secs()))
            }
            Err(ElicitationError::CapabilityNotSupported) => {
                refuse("this MCP client cannot ask the user (it does not support elicitation)")
            }
            Err(e) => refuse(&format!("asking the user failed: {e}")),
        }
    }
}

/// The person's answer to a confirm rule's question.
#[derive(Debug, Deserialize, JsonSchema)]
struct Approval {
    /// Run the command(s) shown.
    approve: bool,
}

rmcp::elicit_safe!(Approval);

/// remote-sandbox-mcp's watch tools, listed only with
/// `REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`. Every job is supervised by the
/// host's job daemon, so a watch is just a view of a job (`watch_id` = its
/// name).
impl OutpostServer {
    /// Where the file tools may touch local paths: `local_roots` from the
    /// config, else the client's declared roots, else the start directory.
    // Roots are deprecated for a later protocol revision; clients send them
    // today, and they are the best signal of the project directory there is.
    #[allow(deprecated)]
    async fn local_roots(&self, peer: &Peer<RoleServer>) -> Roots {
        if let Some(paths) = &self.fleet.config.local_roots {
            return Roots::configured(paths);
        }
        let mut cached = self.client_roots.lock().await;
        if let Some(roots) = cached.as_ref() {
            return roots.clone();
        }
        let declared = peer
            .peer_info()
            .is_some_and(|info| info.capabilities.roots.is_some());
        if !declared {
            return Roots::start_dir();
        }
        match tokio::time::timeout(ROOTS_WAIT, peer.list_roots()).await {
            Ok(Ok(list)) => {
                let uris: Vec<String> = list.roots.into_iter().map(|r| r.uri).collect();
                let roots = Roots::from_client(&uris);
                *cached = Some(roots.clone());
                roots
            }
            Ok(Err(e)) => {
                tracing::warn!("the client's roots/list failed ({e}); using the start directory");
                Roots::start_dir()
            }
            Err(_) => {
                tracing::warn!("the client did not answer roots/list; using the start directory");
                Roots::start_dir()
            }
        }
    }
}

#[tool_router(router = advanced_router)]
impl OutpostServer {
    #[tool(
        description = "Watch an existing background job (every job is supervised already): returns it."
    )]
    async fn watch_background_task(
        &self,
        Parameters(p): Parameters<WatchRegisterParams>,
    ) -> Result<Json<WatchResult>, String> {
        let name = given(&p.tmux_session)
            .or_else(|| given(&p.watch_id))
            .ok_or("pass tmux_session (the job name)")?;
        self.watch_of(p.sandbox_name.as_deref(), &name)
            .await
            .map(Json)
    }

    #[tool(description = "Watches (background jobs), optionally only those in one state.")]
    async fn list_background_watches(
        &self,
        Parameters(p): Parameters<WatchListParams>,
    ) -> Result<Json<WatchesResult>, String> {
        let state = match given(&p.status).as_deref() {
            None => None,
            Some("active") => Some(JobState::Running),
            Some(s) => Some(jobs::parse_state(s)?),
        };
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let (list, older_omitted) = jobs::list(&session, state, LIST_DEFAULT)
            .await
            .map_err(|e| e.to_string())?;
        let watches = list.iter().map(|j| watch_view(session.name(), j)).collect();
        Ok(Json(WatchesResult {
            watches,
            older_omitted,
        }))
    }

    #[tool(description = "One watch (background job) by watch_id.")]
    async fn get_background_watch(
        &self,
        Parameters(p): Parameters<WatchIdParams>,
    ) -> Result<Json<WatchResult>, String> {
        self.watch_of(p.sandbox_name.as_deref(), &p.watch_id)
            .await
            .map(Json)
    }

    #[tool(description = "A watch's state, log tail and checkpoint snapshot.")]
    async fn get_background_watch_progress(
        &self,
        Parameters(p): Parameters<WatchProgressParams>,
    ) -> Result<Json<ProgressResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let job = jobs::status(&session, &p.watch_id)
            .await
            .map_err(|e| e.to_string())?;
        let lines = p.log_lines.unwrap_or(80);
        let (tail, checkpoint) = futures::join!(
            jobs::tail(&session, &job.name, lines, DEFAULT_LOG_BYTES),
            checkpoint(&session, &job, DEFAULT_LOG_BYTES)
        );
        Ok(Json(ProgressResult {
            watch: watch_view(session.name(), &job),
            log_tail: tail.unwrap_or_else(|e| format!("[log unavailable: {e}]")),
            checkpoint,
        }))
    }

    #[tool(description = "The last lines of a watch's log.")]
    async fn read_background_watch_log(
        &self,
        Parameters(p): Parameters<WatchLogParams>,
    ) -> Result<Json<WatchLogResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let lines = p.last_n_lines.unwrap_or(200);
        let (job, tail) = futures::join!(
            jobs::status(&session, &p.watch_id),
            jobs::tail(&session, &p.watch_id, lines, DEFAULT_LOG_BYTES)
        );
        let job = job.map_err(|e| e.to_string())?;
        Ok(Json(WatchLogResult {
            state: jobs::state_name(job.state).into(),
            log_tail: tail.map_err(|e| e.to_string())?,
        }))
    }

    #[tool(
        description = "A watch's checkpoint: checkpoint_command's output, else checkpoint_path's content."
    )]
    async fn read_background_watch_checkpoint(
        &self,
        Parameters(p): Parameters<WatchCheckpointParams>,
    ) -> Result<Json<CheckpointView>, String> {
        let max_bytes = log_bytes(p.max_bytes)?;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let job = jobs::status(&session, &p.watch_id)
            .await
            .map_err(|e| e.to_string())?;
        checkpoint(&session, &job, max_bytes)
            .await
            .map(Json)
            .ok_or_else(|| {
                format!(
                    "watch {} has no checkpoint_path or checkpoint_command",
                    job.name
                )
            })
    }

    #[tool(description = "Cancel a watch: stops its background job.")]
    async fn cancel_background_watch(
        &self,
        Parameters(p): Parameters<WatchIdParams>,
    ) -> Result<Json<WatchResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let job = jobs::cancel(&session, &p.watch_id, Duration::from_secs(3))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Json(WatchResult {
            watch: watch_view(session.name(), &job),
        }))
    }

    #[tool(description = "The most recent job events, of one watch or all.")]
    async fn list_background_watch_events(
        &self,
        Parameters(p): Parameters<WatchEventsParams>,
    ) -> Result<Json<EventsResult>, String> {
        let limit = p.limit.unwrap_or(50).clamp(1, 1000) as usize;
        let session = self.job_session(p.sandbox_name.as_deref())?;
        let name = given(&p.watch_id);
        // Events come oldest first after a sequence number; keep the last
        // `limit` of them all.
        const PAGE: u32 = 1000;
        let mut last = VecDeque::with_capacity(limit + 1);
        let mut after = 0;
        loop {
            let page = jobs::events(&session, name.as_deref(), after, PAGE)
                .await
                .map_err(|e| e.to_string())?;
            let Some(end) = page.last().map(|e| e.seq) else {
                break;
            };
            after = end;
            let full = page.len() as u32 >= PAGE;
            for e in page {
                last.push_back(e);
                if last.len() > limit {
                    last.pop_front();
                }
            }
            if !full {
                break;
            }
        }
        let events = last
            .into_iter()
            .map(|e| EventRow {
                seq: e.seq,
                watch_id: e.job,
                kind: e.kind,
                at: jobs::utc_time(e.at_unix),
                detail: e.detail,
            })
            .collect();
        Ok(Json(EventsResult { events }))
    }

    #[tool(
        description = "Whether this server follows job events (per sandbox), which hooks are configured, and if another Outpost process (outpost watch) runs them."
    )]
    async fn get_watchdog_status(&self) -> Result<Json<WatchdogStatus>, String> {
        let hooks = &self.fleet.config.hooks;
        Ok(Json(WatchdogStatus {
            followers: self.watcher.status(),
            hooks: [
                hooks.webhook_url.as_ref().map(|_| "webhook_url"),
                hooks.event_command.as_ref().map(|_| "event_command"),
            ]
            .into_iter()
            .flatten()
            .map(str::to_string)
            .collect(),
            alert_after_failures: hooks.alert_after_failures,
        }))
    }
}

impl OutpostServer {
    /// The named (or active) sandbox for a job tool; its event follower starts
    /// with the first such call.
    fn job_session(&self, sandbox: Option<&str>) -> Result<Arc<Session>, String> {
        let session = self.fleet.get(sandbox)?;
        self.watcher.follow(session.name());
        Ok(session)
    }

    async fn watch_of(&self, sandbox: Option<&str>, name: &str) -> Result<WatchResult, String> {
        let session = self.job_session(sandbox)?;
        let job = jobs::status(&session, name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(WatchResult {
            watch: watch_view(session.name(), &job),
        })
    }
}

/// The job writing `log_file` (the latest, if several did).
async fn job_by_log(session: &Session, log_file: &str) -> Result<String, String> {
    // As many as fit an answer: the job may be an old one.
    let (list, _) = jobs::list(session, None, 0)
        .await
        .map_err(|e| e.to_string())?;
    list.into_iter()
        .filter(|j| log_matches(&j.log_file, log_file))
        .max_by_key(|j| j.started_unix)
        .map(|j| j.name)
        .ok_or_else(|| format!("no job writes to {log_file}; list_background_tasks shows the jobs"))
}

/// A job's checkpoint, read on the host in the job's cwd; None when the job
/// defines none.
async fn checkpoint(session: &Session, job: &JobInfo, max_bytes: u64) -> Option<CheckpointView> {
    let w = &job.watch;
    let (source, command, limit) = match (&w.checkpoint_command, &w.checkpoint_path) {
        (Some(c), _) => ("command", c.clone(), max_bytes),
        (None, Some(path)) => (
            "file",
            format!("head -c {} -- {}", max_bytes + 1, remote_path_arg(path)),
            max_bytes + 1,
        ),
        (None, None) => return None,
    };
    let req = ExecRequest {
        command,
        cwd: job_cwd(job),
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some(30_000),
        output_limit: limit,
        stream: false,
    };
    let mut view = CheckpointView {
        source: source.into(),
        content: String::new(),
        json: None,
        truncated: false,
        error: None,
    };
    match session.exec(req, |_, _| {}).await {
        Ok(r) => {
            if source == "file" {
                let mut data = r.stdout.head.clone();
                data.extend_from_slice(&r.stdout.tail);
                view.truncated = data.len() as u64 > max_bytes;
                data.truncate(max_bytes as usize);
                view.content = String::from_utf8_lossy(&data).into_owned();
            } else {
                view.truncated = r.stdout.omitted > 0;
                view.content = r.stdout.to_text();
            }
            if r.exit_code != Some(0) {
                let stderr = r.stderr.to_text();
                let why = stderr.trim().lines().last().unwrap_or("").to_string();
                view.error = Some(match (r.timed_out, r.exit_code, r.signal) {
                    (true, _, _) => "timed out after 30 s".into(),
                    (_, Some(code), _) => format!("exit {code}: {why}"),
                    (_, None, Some(sig)) => format!("signal {sig}"),
                    _ => why,
                });
            }
            if w.checkpoint_format.as_deref() == Some("json") && !view.truncated {
                view.json = serde_json::from_str(&view.content).ok();
            }
        }
        Err(e) => view.error = Some(e.to_string()),
    }
    Some(view)
}

/// A remote path as one shell word, `~/` still expanded by the shell.
fn remote_path_arg(path: &str) -> String {
    use crate::host::bootstrap::shell_quote;
    match path.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
        None if path == "~" => "\"$HOME\"".into(),
        None => shell_quote(path),
    }
}

#[prompt_router]
impl OutpostServer {
    #[prompt(description = "Run a task on the idlest sandbox with a free GPU.")]
    async fn run_on_idlest_gpu(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Run this on the idlest sandbox that has a free GPU: {}\n\
                 1. select_sandbox(sandbox_name=\"auto\", min_gpus=1) picks it (or explains why none fits).\n\
                 2. reserve_gpus(count=1) and pass its lease_id as gpu_lease to exec_bash, so the GPU is yours alone.\n\
                 3. release_gpus when done.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Test code in a sandbox: set up, run the tests, report.")]
    async fn test_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Test this in a sandbox: {}\n\
                 Use list_sandboxes to see what is available and exec_bash to install dependencies and run \
                 the tests (set timeout_s to fit). Report the failing tests with the relevant output only.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Debug a problem in a sandbox by reproducing it first.")]
    async fn debug_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Debug this in a sandbox: {}\n\
                 Reproduce it with exec_bash first, then narrow it down step by step (logs, versions, \
                 a minimal case). Change one thing at a time and show the evidence for the cause you find.",
                p.task
            ),
        )]
    }
}

const LIST_URI: &str = "sandbox://list";

impl OutpostServer {
    async fn read(&self, uri: &str) -> Result<serde_json::Value, McpError> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let value = if uri == LIST_URI {
            serde_json::to_value(ListResult {
                active_sandbox: self.fleet.active_name(),
                sandboxes: self.fleet.list(false, deadline).await,
            })
        } else if let Some(name) = uri
            .strip_prefix("sandbox://")
            .and_then(|rest| rest.strip_suffix("/status"))
        {
            let session = self
                .fleet
                .get(Some(name))
                .map_err(|e| McpError::resource_not_found(e, None))?;
            let (host, port, user) = session.config.address();
            let status = match Fleet::resources(&session, deadline).await {
                Ok(r) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": true, "resources": r,
                }),
                Err(e) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": false, "connection_error": e,
                }),
            };
            Ok(status)
        } else {
            return Err(McpError::resource_not_found(
                format!("unknown resource {uri}; try {LIST_URI} or sandbox://NAME/status"),
                None,
            ));
        };
        value.map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}

#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for OutpostServer {
    /// The one way into every tool (the basic router, with the watch tools
    /// merged in when asked): each call is recorded in the audit log, also
    /// when it fails or is cancelled.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, McpError> {
        let client = context
            .client_info()
            .map(|info| crate::ops::audit::truncate(&info.name, 100))
            .unwrap_or_default();
        let args = request.arguments.as_ref();
        let call = crate::ops::audit::Call::begin(
            &self.audit,
            client,
            crate::ops::audit::truncate(&request.name, 100),
            crate::ops::audit::sandbox_of(args, || self.fleet.active_name()),
            crate::ops::audit::digest(args),
        );
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        call.run(self.tool_router.call(tcc)).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, McpError> {
        let cache_hints = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        let mut result = rmcp::model::ListToolsResult::with_all_items(self.tool_router.list_all());
        if cache_hints {
            result.ttl_ms = Some(0);
            result.cache_scope = Some(rmcp::model::CacheScope::Public);
        }
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut resources = vec![
            Resource::new(LIST_URI, "sandboxes")
                .with_description("Configured sandboxes and their connection state")
                .with_mime_type("application/json"),
        ];
        for name in self.fleet.names() {
            resources.push(
                Resource::new(format!("sandbox://{name}/status"), format!("{name} status"))
                    .with_description("Connection, CPU, memory, disks and GPUs of this sandbox")
                    .with_mime_type("application/json"),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("sandbox://{name}/status", "sandbox status")
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let value = self.read(&request.uri).await?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(
            value.to_string(),
            request.uri.clone(),
        )])
        .into())
    }

    #[allow(deprecated)] // MCP logging carries the job events
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.events
            .min_level
            .store(request.level as u8, Ordering::Relaxed);
        Ok(())
    }

    async fn on_roots_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        // Asked again on the next file tool call.
        *self.client_roots.lock().await = None;
    }

    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, McpError> {
        if request.method != OVERSIZED_METHOD {
            return Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        }
        let params = request.params.unwrap_or_default();
        let field = |name: &str| params.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
        Err(McpError::invalid_request(
            oversized_error(field("bytes"), field("limit")),
            None,
        ))
    }

    #[allow(deprecated)] // enable_logging: the job events
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("outpost", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Sandboxes are the user's own Linux machines reached over SSH (plus `local`). \
                 exec_bash runs on the active sandbox unless sandbox_name is given. \
                 Long commands: exec_bash_background, then wait_background_task.",
        )
    }
}

/// Serves MCP on stdin/stdout until the client goes away or SIGTERM/SIGINT.
pub async fn serve_stdio(fleet: Arc<Fleet>) -> anyhow::Result<()> {
    let server = OutpostServer::new(fleet.clone());
    let events = server.events.clone();
    let (stdin, stdout) = rmcp::transport::stdio();
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new(
        LineLimit::new(stdin, MAX_MESSAGE_BYTES),
        stdout,
    )
    // LineLimit already cut longer lines to the limit plus two bytes.
    .with_max_line_length(MAX_MESSAGE_BYTES + 16);
    let service = server.serve(transport).await?;
    events.forward(service.peer().clone());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = service.waiting() => { r?; }
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
    }
    for session in fleet.sessions() {
        session.disconnect().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(extra: serde_json::Value) -> BackgroundParams {
        let mut args = serde_json::json!({"command": "python train.py"});
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        serde_json::from_value(args).unwrap()
    }

    #[test]
    fn hook_parameters_are_refused() {
        for key in ["webhook_url", "event_command"] {
            let err = job_spec(&params(serde_json::json!({key: "x"}))).unwrap_err();
            assert!(
                err.contains("[hooks]") && err.contains("config file"),
                "{err}"
            );
        }
        // remote-sandbox-mcp sends "" for unset.
        assert!(job_spec(&params(serde_json::json!({"webhook_url": ""}))).is_ok());
    }

    #[test]
    fn job_spec_maps_watch_parameters() {
        let spec = job_spec(&params(serde_json::json!({
            "session_name": "train", "cwd": "~/proj", "log_file": "",
            "checkpoint_path": "ckpt.json", "checkpoint_format": "json",
            "auto_resume": true, "resume_command": "python train.py --resume",
            "interval_s": 60, "metadata_json": "{\"owner\": \"me\"}",
        })))
        .unwrap();
        assert_eq!(spec.name.as_deref(), Some("train"));
        assert_eq!(spec.log_file, None);
        let w = &spec.watch;
        assert!(w.auto_resume);
        assert_eq!(
            (w.interval_s, w.resume_delay_s, w.max_resume_attempts),
            (60, 300, 1)
        );
        assert_eq!(w.checkpoint_format.as_deref(), Some("json"));
        let meta: serde_json::Value =
            serde_json::from_str(w.metadata_json.as_deref().unwrap()).unwrap();
        assert_eq!(meta, serde_json::json!({"owner": "me", "cwd": "~/proj"}));

        let spec = job_spec(&params(
            serde_json::json!({"cwd": "~/p/", "log_file": "./l/x.log"}),
        ));
        assert_eq!(spec.unwrap().log_file.as_deref(), Some("~/p/l/x.log"));
        let spec = job_spec(&params(
            serde_json::json!({"cwd": "/w", "log_file": "/tmp/x.log"}),
        ));
        assert_eq!(spec.unwrap().log_file.as_deref(), Some("/tmp/x.log"));
        let spec = job_spec(&params(serde_json::json!({"log_file": "x.log"})));
        assert_eq!(spec.unwrap().log_file.as_deref(), Some("x.log"));

        let spec = job_spec(&params(serde_json::json!({}))).unwrap();
        assert_eq!(spec.watch.checkpoint_format.as_deref(), Some("text"));
        assert_eq!(spec.watch.metadata_json, None);

        for (bad, word) in [
            (
                serde_json::json!({"checkpoint_format": "yaml"}),
                "checkpoint_format",
            ),
            (serde_json::json!({"auto_resume": true}), "resume_command"),
            (serde_json::json!({"metadata_json": "{"}), "metadata_json"),
            (serde_json::json!({"interval_s": -1}), "interval_s"),
            (serde_json::json!({"command": " "}), "empty"),
        ] {
            let err = job_spec(&params(bad)).unwrap_err();
            assert!(err.contains(word), "{err}");
        }
    }

    #[test]
    fn job_cwd_survives_in_metadata() {
        let mut job = JobInfo {
            name: "j".into(),
            command: "c".into(),
            state: JobState::Running,
            exit_code: None,
            signal: None,
            pid: None,
            started_unix: 0,
            ended_unix: None,
            log_file: "/home/u/proj/logs/j.log".into(),
            log_size: 0,
            resume_attempts: 0,
            watch: WatchSpec::default(),
        };
        assert_eq!(job_cwd(&job), None);
        job.watch.metadata_json = with_cwd(None, Some("/work"));
        assert_eq!(job_cwd(&job).as_deref(), Some("/work"));
        // Metadata that is not an object is left alone.
        assert_eq!(
            with_cwd(Some("[1]".into()), Some("/w")).as_deref(),
            Some("[1]")
        );
        assert!(log_matches(&job.log_file, "logs/j.log"));
        assert!(log_matches(&job.log_file, "./logs/j.log"));
        assert!(log_matches(&job.log_file, "/home/u/proj/logs/j.log"));
        assert!(!log_matches(&job.log_file, "j.lo"));
        assert!(!log_matches(&job.log_file, "/logs/j.log"));
    }

    #[test]
    fn limits_are_checked() {
        assert_eq!(
            seconds("t", None, 60.0, 3600.0),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(seconds("t", Some(0.0), 60.0, 3600.0), Ok(Duration::ZERO));
        assert!(
            seconds("timeout_s", Some(-1.0), 60.0, 3600.0)
                .unwrap_err()
                .contains("timeout_s")
        );
        assert!(seconds("t", Some(3601.0), 60.0, 3600.0).is_err());
        assert!(seconds("t", Some(f64::NAN), 60.0, 3600.0).is_err());
        assert_eq!(log_bytes(None), Ok(DEFAULT_LOG_BYTES));
        assert_eq!(log_bytes(Some(u64::MAX)), Ok(jobs::MAX_LOG_BYTES));
        assert!(log_bytes(Some(0)).is_err());
    }

    #[test]
    fn remote_paths_keep_the_home() {
        assert_eq!(remote_path_arg("~/a b"), "\"$HOME\"/'a b'");
        assert_eq!(remote_path_arg("x'y"), "'x'\\''y'");
    }

    #[test]
    fn advanced_tools_are_listed_only_when_asked() {
        let names = |advanced: bool| {
            let mut config = crate::config::Config::new(
                vec![crate::config::SandboxConfig::local()],
                std::env::temp_dir().join("outpost-mcp-test/known_hosts"),
            );
            config.expose_advanced_tools = advanced;
            let server = OutpostServer::new(Arc::new(Fleet::new(config)));
            let mut names: Vec<String> = server
                .tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            names.sort();
            names
        };
        let basic = names(false);
        for tool in [
            "exec_bash_background",
            "check_background_task",
            "list_background_tasks",
            "cancel_background_task",
            "wait_background_task",
            "read_background_log",
        ] {
            assert!(basic.contains(&tool.to_string()), "{tool} missing");
        }
        assert!(!basic.iter().any(|n| n.contains("watch")), "{basic:?}");
        let all = names(true);
        assert_eq!(all.len(), basic.len() + 9, "{all:?}");
        assert!(all.contains(&"get_watchdog_status".to_string()));
    }
}
