//! remote-sandbox-mcp's watch tools, listed only with
//! `REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`. A watch is a view of a job
//! (`watch_view`), its checkpoint read on the host (`checkpoint`), and the
//! job events and follower status of this server.

use std::collections::VecDeque;
use std::time::Duration;

use outpost_protocol::{JobInfo, JobState};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use super::ids::Id;
use super::jobs::{
    BackgroundParams, BackgroundStarted, DEFAULT_LOG_BYTES, LIST_DEFAULT, given, is_zero, log_bytes,
};
use crate::ops::jobs;
use crate::session::Session;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchIdParams {
    pub watch_id: Id,
    pub sandbox_name: Option<String>,
}

/// remote-sandbox-mcp's `watch_background_task`: watch a running job, or
/// with `launch_command` start one and watch it.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchRegisterParams {
    /// The job name.
    pub tmux_session: Option<String>,
    /// Finds the job by its log; with launch_command, where output goes.
    pub log_file: Option<String>,
    pub watch_id: Option<Id>,
    pub sandbox_name: Option<String>,
    /// Start this command as job tmux_session, then watch it.
    pub launch_command: Option<String>,
    /// Watch settings, fixed when the job starts (with launch_command).
    pub cwd: Option<String>,
    pub run_id: Option<String>,
    pub name: Option<String>,
    pub resume_command: Option<String>,
    pub resume_plan_json: Option<String>,
    pub checkpoint_path: Option<String>,
    pub checkpoint_format: Option<String>,
    pub checkpoint_command: Option<String>,
    pub interval_s: Option<f64>,
    pub alert_after_failures: Option<u32>,
    pub resume_delay_s: Option<f64>,
    pub auto_resume: Option<bool>,
    pub max_resume_attempts: Option<u32>,
    pub metadata_json: Option<String>,
    /// Refused: set [hooks] in the config file.
    pub webhook_url: Option<String>,
    /// Refused: set [hooks] in the config file.
    pub event_command: Option<String>,
    pub notify_local: Option<bool>,
    pub ensure_watchdog: Option<bool>,
    pub max_log_lines: Option<u32>,
}

impl WatchRegisterParams {
    /// The settings that only a job's start can fix, named, when given.
    fn start_settings(&self) -> Vec<&'static str> {
        let texts = [
            ("cwd", &self.cwd),
            ("run_id", &self.run_id),
            ("name", &self.name),
            ("resume_command", &self.resume_command),
            ("resume_plan_json", &self.resume_plan_json),
            ("checkpoint_path", &self.checkpoint_path),
            ("checkpoint_command", &self.checkpoint_command),
            ("metadata_json", &self.metadata_json),
        ];
        let mut given: Vec<&'static str> = texts
            .into_iter()
            .filter(|(_, v)| super::jobs::given(v).is_some())
            .map(|(k, _)| k)
            .collect();
        let numbers = [
            ("interval_s", self.interval_s.is_some()),
            ("alert_after_failures", self.alert_after_failures.is_some()),
            ("resume_delay_s", self.resume_delay_s.is_some()),
            ("max_resume_attempts", self.max_resume_attempts.is_some()),
            ("auto_resume", self.auto_resume == Some(true)),
            (
                "checkpoint_format",
                super::jobs::given(&self.checkpoint_format).is_some(),
            ),
        ];
        given.extend(numbers.into_iter().filter(|(_, set)| *set).map(|(k, _)| k));
        given
    }

    /// The job to start, as `exec_bash_background` takes it.
    fn launch(self, command: String) -> BackgroundParams {
        BackgroundParams {
            command,
            session_name: self.tmux_session,
            log_file: self.log_file,
            cwd: self.cwd,
            sandbox_name: self.sandbox_name,
            watch: Some(true),
            run_id: self.run_id,
            watch_name: self.name,
            resume_command: self.resume_command,
            resume_plan_json: self.resume_plan_json,
            checkpoint_path: self.checkpoint_path,
            checkpoint_format: self.checkpoint_format,
            checkpoint_command: self.checkpoint_command,
            interval_s: self.interval_s,
            alert_after_failures: self.alert_after_failures,
            resume_delay_s: self.resume_delay_s,
            auto_resume: self.auto_resume,
            max_resume_attempts: self.max_resume_attempts,
            webhook_url: self.webhook_url,
            event_command: self.event_command,
            metadata_json: self.metadata_json,
            codex_command: None,
            codex_wakeup: None,
            notify_local: self.notify_local,
            ensure_watchdog: self.ensure_watchdog,
            max_log_lines: self.max_log_lines,
            env: None,
            scheduler: None,
            gpus: None,
            time: None,
            partition: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct MacosWatchdogParams {
    #[allow(dead_code)]
    pub start_now: Option<bool>,
    #[allow(dead_code)]
    pub persist_current_sandboxes: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct NotNeeded {
    /// Always "not_needed".
    pub status: String,
    pub detail: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchListParams {
    /// A job state. Default: all.
    pub status: Option<String>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchProgressParams {
    pub watch_id: Id,
    /// Default 80.
    pub log_lines: Option<u32>,
    /// Default 20000.
    pub checkpoint_max_bytes: Option<u64>,
    /// Always live; accepted.
    #[allow(dead_code)]
    pub refresh_live: Option<bool>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchLogParams {
    pub watch_id: Id,
    /// Default 200.
    pub last_n_lines: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchCheckpointParams {
    pub watch_id: Id,
    /// Default 20000.
    pub max_bytes: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchEventsParams {
    /// Default: every job's.
    pub watch_id: Option<Id>,
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
    pub watch: WatchView,
    /// The log's last lines.
    pub log: String,
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
    #[schemars(with = "Vec<super::shape::FollowerShape>")]
    pub followers: Vec<crate::ops::events::FollowerView>,
    /// Configured hooks: "webhook_url", "event_command".
    pub hooks: Vec<String>,
    pub alert_after_failures: u32,
}

fn watch_view(sandbox: &str, job: &JobInfo) -> WatchView {
    let w = &job.watch;
    let (exit_code, signal) = jobs::exit_fields(job);
    WatchView {
        watch_id: job.name.clone(),
        sandbox: sandbox.to_string(),
        state: jobs::state_name(job.state).into(),
        exit_code,
        signal,
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

/// remote-sandbox-mcp's watch tools, listed only with
/// `REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`. Every job is supervised by the
/// host's job daemon, so a watch is just a view of a job (`watch_id` = its
/// name).
#[tool_router(router = watch_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Watch a background job (by tmux_session, watch_id or log_file), or start launch_command as one and watch it."
    )]
    async fn watch_background_task(
        &self,
        Parameters(p): Parameters<WatchRegisterParams>,
    ) -> Result<Json<WatchResult>, String> {
        if given(&p.webhook_url).is_some() || given(&p.event_command).is_some() {
            return Err(super::jobs::HOOKS_REFUSED.into());
        }
        // remote-sandbox-mcp watched a session that ran already and kept
        // launch_command for later: a job of that name is watched, never
        // started twice.
        let running = match given(&p.tmux_session) {
            Some(name) => {
                let session = self.job_session(p.sandbox_name.as_deref()).await?;
                jobs::status(&session, &name).await.is_ok()
            }
            None => false,
        };
        if !running && let Some(command) = given(&p.launch_command) {
            let (sandbox, job) = self.start_background(&p.launch(command)).await?;
            return self.watch_of(Some(&sandbox), &job.name).await.map(Json);
        }
        let start_only = p.start_settings();
        if !start_only.is_empty() {
            return Err(format!(
                "{} can only be set when the job starts: pass launch_command (or use exec_bash_background); an existing job keeps the settings it started with",
                start_only.join(", ")
            ));
        }
        let name = match (
            given(&p.tmux_session),
            p.watch_id.as_ref().and_then(Id::given),
            given(&p.log_file),
        ) {
            (Some(name), _, _) => name,
            (None, Some(id), _) => id.to_string(),
            (None, None, Some(log)) => {
                let session = self.job_session(p.sandbox_name.as_deref()).await?;
                jobs::job_by_log(&session, &log).await?
            }
            (None, None, None) => {
                return Err("pass tmux_session (the job name), watch_id or log_file, or launch_command to start one".into());
            }
        };
        self.watch_of(p.sandbox_name.as_deref(), &name)
            .await
            .map(Json)
    }

    #[tool(description = "exec_bash_background with a watch (every job is supervised).")]
    async fn exec_bash_background_watch(
        &self,
        Parameters(mut p): Parameters<BackgroundParams>,
    ) -> Result<Json<BackgroundStarted>, String> {
        p.watch = Some(true);
        self.background_started(&p).await.map(Json)
    }

    #[tool(description = "Not needed: jobs are supervised on each host. Changes nothing.")]
    async fn install_macos_watchdog(
        &self,
        Parameters(_): Parameters<MacosWatchdogParams>,
    ) -> Result<Json<NotNeeded>, String> {
        Ok(Json(not_needed()))
    }

    #[tool(description = "Not needed: jobs are supervised on each host. Changes nothing.")]
    async fn uninstall_macos_watchdog(&self) -> Result<Json<NotNeeded>, String> {
        Ok(Json(not_needed()))
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
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
        self.watch_of(p.sandbox_name.as_deref(), p.watch_id.as_str())
            .await
            .map(Json)
    }

    #[tool(description = "A watch's state, log tail and checkpoint snapshot.")]
    async fn get_background_watch_progress(
        &self,
        Parameters(p): Parameters<WatchProgressParams>,
    ) -> Result<Json<ProgressResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let job = jobs::status(&session, p.watch_id.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let lines = p.log_lines.unwrap_or(80);
        let (tail, checkpoint) = futures::join!(
            jobs::tail(&session, &job.name, lines, DEFAULT_LOG_BYTES),
            checkpoint(&session, &job, log_bytes(p.checkpoint_max_bytes)?)
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let lines = p.last_n_lines.unwrap_or(200);
        let (job, tail) = futures::join!(
            jobs::status(&session, p.watch_id.as_str()),
            jobs::tail(&session, p.watch_id.as_str(), lines, DEFAULT_LOG_BYTES)
        );
        let job = job.map_err(|e| e.to_string())?;
        Ok(Json(WatchLogResult {
            watch: watch_view(session.name(), &job),
            log: tail.map_err(|e| e.to_string())?,
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let job = jobs::status(&session, p.watch_id.as_str())
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let job = jobs::cancel(&session, p.watch_id.as_str(), Duration::from_secs(3))
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let name = p.watch_id.as_ref().and_then(Id::given).map(str::to_string);
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

/// What the macOS watchdog tools answer: Outpost has nothing to install.
fn not_needed() -> NotNeeded {
    NotNeeded {
        status: "not_needed".into(),
        detail: "every background job is supervised on its host by Outpost's job daemon, which survives disconnects and restarts and resumes lost jobs; job events reach this server's client and the [hooks] of the config file, so no watchdog runs on this machine".into(),
    }
}

impl OutpostServer {
    async fn watch_of(&self, sandbox: Option<&str>, name: &str) -> Result<WatchResult, String> {
        let session = self.job_session(sandbox).await?;
        let job = jobs::status(&session, name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(WatchResult {
            watch: watch_view(session.name(), &job),
        })
    }
}

/// A job's checkpoint, read on the host in the job's cwd; None when the job
/// defines none.
async fn checkpoint(session: &Session, job: &JobInfo, max_bytes: u64) -> Option<CheckpointView> {
    let (source, req) = jobs::checkpoint_request(job, max_bytes)?;
    let w = &job.watch;
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
