//! The background-job tools, after remote-sandbox-mcp's (`tmux_session` is
//! the job name): start, check, list, cancel, wait for, and read the log of a
//! job. `start_request` turns `exec_bash_background`'s parameters into a
//! job request; checking it and the calls themselves are [`crate::ops::jobs`]. The first job tool
//! used on a sandbox starts its event follower (`job_session`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{JobRead, JobSpec, JobState, JobWait, WaitReason};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::RequestMetaObject;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use super::ids::Id;
use super::progress::{Progress, Report};
use crate::ops::jobs::{self, StartRequest, seconds};
use crate::ops::slurm_jobs::{self, BatchStatus, SubmitRequest};
use crate::policy::Planned;
use crate::session::Session;

/// What the hook parameters of remote-sandbox-mcp get instead of running.
pub(super) const HOOKS_REFUSED: &str = "webhook_url, event_command and codex_command/codex_wakeup are not accepted from tool calls (they would let a caller run commands on this machine); configure hooks in the Outpost config file: [hooks] webhook_url = …, event_command = …";

/// Default and largest log bytes one job tool answer carries.
pub(super) const DEFAULT_LOG_BYTES: u64 = 20_000;
/// Most log bytes a progress notification reads for its last line.
const PROGRESS_TAIL_BYTES: u64 = 400;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct BackgroundParams {
    pub command: String,
    /// Job name.
    pub session_name: Option<String>,
    /// Relative to cwd.
    pub log_file: Option<String>,
    #[schemars(extend("default" = "~"))]
    pub cwd: Option<String>,
    pub sandbox_name: Option<String>,
    #[schemars(extend("default" = true))]
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
    /// Refused: set [hooks] event_command in the config file.
    pub codex_command: Option<String>,
    /// Refused unless false: set [hooks] event_command in the config file.
    pub codex_wakeup: Option<bool>,
    // remote-sandbox-mcp's, with nothing left to do: every job is supervised
    // by the host's daemon, keeps its whole log, and its events reach this
    // server's client as notifications.
    #[allow(dead_code)]
    pub notify_local: Option<bool>,
    #[allow(dead_code)]
    pub ensure_watchdog: Option<bool>,
    #[allow(dead_code)]
    pub max_log_lines: Option<u32>,
    pub env: Option<BTreeMap<String, String>>,
    /// "slurm": submit with sbatch.
    pub scheduler: Option<String>,
    pub gpus: Option<u32>,
    pub time: Option<String>,
    pub partition: Option<String>,
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
    /// Or the job writing this log.
    pub log_file: Option<String>,
    pub watch_id: Option<Id>,
    #[schemars(extend("default" = 50))]
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
    /// Slurm: why it pends, or what ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListTasksParams {
    /// running, exited, cancelled or lost. Default: all.
    pub state: Option<String>,
    #[schemars(extend("default" = 50))]
    pub limit: Option<u32>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListTasksResult {
    pub tasks: Vec<TaskRow>,
    /// Older jobs that matched but were not listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub older_omitted: u64,
    /// Set when the host's Slurm jobs could not be listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_error: Option<String>,
}

/// Jobs a list tool shows unless asked for more.
pub(super) const LIST_DEFAULT: u32 = 50;

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelParams {
    pub name: String,
    #[schemars(extend("default" = 3))]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitParams {
    pub name: String,
    #[schemars(extend("default" = 60))]
    pub timeout_s: Option<f64>,
    /// A regex.
    pub pattern: Option<String>,
    pub silence_s: Option<f64>,
    /// Default: where the last wait stopped.
    pub cursor: Option<u64>,
    /// Output kept: its end.
    #[schemars(extend("default" = 20000))]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadLogParams {
    pub name: String,
    /// Byte offset.
    pub offset: Option<u64>,
    pub tail_lines: Option<u32>,
    /// A regex: only the lines matching it.
    pub grep: Option<String>,
    #[schemars(extend("default" = 20000))]
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

pub(super) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// A non-empty trimmed string, or None (remote-sandbox-mcp sends "" for unset).
pub(super) fn given(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

pub(super) fn log_bytes(value: Option<u64>) -> Result<u64, String> {
    match value.unwrap_or(DEFAULT_LOG_BYTES) {
        0 => Err("max_bytes must be 1 or more".into()),
        n => Ok(n.min(jobs::MAX_LOG_BYTES)),
    }
}

/// A progress notification while waiting for a job: its state and the last
/// line of its log.
async fn wait_report(session: &Session, name: &str, started: Instant, timeout_s: f64) -> Report {
    let elapsed = started.elapsed().as_secs_f64();
    let message = match jobs::status(session, name).await {
        Ok(job) => {
            let tail = jobs::tail(session, name, 1, PROGRESS_TAIL_BYTES)
                .await
                .unwrap_or_default();
            let line = tail.trim();
            let state = jobs::state_name(job.state);
            if line.is_empty() {
                format!("{state}, waited {elapsed:.0} s")
            } else {
                format!("{state}, waited {elapsed:.0} s: {line}")
            }
        }
        Err(e) => format!("waited {elapsed:.0} s (job status unavailable: {e})"),
    };
    Report {
        done: elapsed,
        total: Some(timeout_s),
        message,
    }
}

/// `exec_bash_background`'s arguments as a job request. Hooks are refused
/// here: they come from the config file only, never from a tool call.
fn start_request(p: &BackgroundParams) -> Result<StartRequest, String> {
    if given(&p.webhook_url).is_some()
        || given(&p.event_command).is_some()
        || given(&p.codex_command).is_some()
        || p.codex_wakeup == Some(true)
    {
        return Err(HOOKS_REFUSED.into());
    }
    let name = given(&p.session_name);
    if name.as_deref().and_then(slurm_jobs::job_id).is_some() {
        return Err("names slurm-<id> are Slurm batch jobs'; choose another session_name".into());
    }
    Ok(StartRequest {
        command: p.command.clone(),
        name,
        log_file: given(&p.log_file),
        cwd: given(&p.cwd),
        run_id: given(&p.run_id),
        watch_name: given(&p.watch_name),
        resume_command: given(&p.resume_command),
        resume_plan_json: given(&p.resume_plan_json),
        checkpoint_path: given(&p.checkpoint_path),
        checkpoint_format: given(&p.checkpoint_format),
        checkpoint_command: given(&p.checkpoint_command),
        interval_s: p.interval_s,
        alert_after_failures: p.alert_after_failures,
        resume_delay_s: p.resume_delay_s,
        auto_resume: p.auto_resume,
        max_resume_attempts: p.max_resume_attempts,
        metadata_json: given(&p.metadata_json),
    })
}

pub fn job_spec(p: &BackgroundParams) -> Result<JobSpec, String> {
    let mut spec = jobs::job_spec(&start_request(p)?)?;
    spec.env = env_pairs(p)?;
    Ok(spec)
}

/// The call's `env`, names checked as `exec_bash` checks them.
fn env_pairs(p: &BackgroundParams) -> Result<Vec<(String, String)>, String> {
    let env = p.env.iter().flatten();
    env.map(|(k, v)| {
        crate::ops::exec::check_env_name(k)?;
        Ok((k.clone(), v.clone()))
    })
    .collect()
}

/// The text the policy checks for the job's command: the caller's `env`
/// first, as `exec_bash`'s.
fn command_policy_text(p: &BackgroundParams) -> String {
    let env = p.env.iter().flatten();
    crate::policy::policy_text(env.map(|(k, v)| (k.as_str(), v.as_str())), &p.command)
}

/// With `scheduler="slurm"`, the batch job `p` describes; None for a job of
/// the host's daemon. The Slurm settings need the scheduler, and the
/// daemon's settings are refused for a batch job.
fn slurm_request(p: &BackgroundParams) -> Result<Option<SubmitRequest>, String> {
    let slurm_settings: Vec<&str> = [
        ("gpus", p.gpus.is_some()),
        ("time", given(&p.time).is_some()),
        ("partition", given(&p.partition).is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    match given(&p.scheduler)
        .map(|s| s.to_ascii_lowercase())
        .as_deref()
    {
        None if slurm_settings.is_empty() => return Ok(None),
        None => {
            return Err(format!(
                "{} only go with scheduler=\"slurm\"",
                slurm_settings.join(", ")
            ));
        }
        Some("slurm") => {}
        Some(other) => {
            return Err(format!(
                "scheduler must be \"slurm\" (or left out for a job of the host), got {other:?}"
            ));
        }
    }
    if given(&p.webhook_url).is_some()
        || given(&p.event_command).is_some()
        || given(&p.codex_command).is_some()
        || p.codex_wakeup == Some(true)
    {
        return Err(HOOKS_REFUSED.into());
    }
    let daemon_only: Vec<&str> = [
        ("session_name", given(&p.session_name).is_some()),
        ("log_file", given(&p.log_file).is_some()),
        ("run_id", given(&p.run_id).is_some()),
        ("watch_name", given(&p.watch_name).is_some()),
        ("resume_command", given(&p.resume_command).is_some()),
        ("resume_plan_json", given(&p.resume_plan_json).is_some()),
        ("checkpoint_path", given(&p.checkpoint_path).is_some()),
        ("checkpoint_format", given(&p.checkpoint_format).is_some()),
        ("checkpoint_command", given(&p.checkpoint_command).is_some()),
        ("metadata_json", given(&p.metadata_json).is_some()),
        ("interval_s", p.interval_s.is_some()),
        ("alert_after_failures", p.alert_after_failures.is_some()),
        ("resume_delay_s", p.resume_delay_s.is_some()),
        ("auto_resume", p.auto_resume == Some(true)),
        ("max_resume_attempts", p.max_resume_attempts.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if !daemon_only.is_empty() {
        return Err(format!(
            "{} not with scheduler=\"slurm\": the job is named slurm-<jobid> and Slurm keeps its log",
            daemon_only.join(", ")
        ));
    }
    let req = SubmitRequest {
        command: p.command.clone(),
        cwd: given(&p.cwd),
        env: env_pairs(p)?,
        gpus: p.gpus,
        time: given(&p.time),
        partition: given(&p.partition),
    };
    // Checked here, before the policy is asked about the command.
    slurm_jobs::batch_body(&req)?;
    Ok(Some(req))
}

/// A Slurm job's state, exit code and signal as the tools report them.
fn batch_fields(b: &BatchStatus) -> (String, Option<i32>, Option<i32>, Option<String>) {
    (
        b.state.name().to_string(),
        b.exit_code,
        b.signal,
        b.detail.clone(),
    )
}

#[tool_router(router = jobs_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Start a job that survives disconnects; tmux_session names it.")]
    async fn exec_bash_background(
        &self,
        Parameters(p): Parameters<BackgroundParams>,
    ) -> Result<Json<BackgroundStarted>, String> {
        self.background_started(&p).await.map(Json)
    }

    #[tool(description = "A job's state, exact exit code and log tail.")]
    async fn check_background_task(
        &self,
        Parameters(p): Parameters<CheckParams>,
    ) -> Result<Json<CheckResult>, String> {
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let by_watch = p.watch_id.as_ref().and_then(Id::given).map(str::to_string);
        let name = match (given(&p.tmux_session), &by_watch, given(&p.log_file)) {
            (Some(name), _, _) => name,
            (None, Some(id), _) => id.clone(),
            (None, None, Some(log)) => jobs::job_by_log(&session, &log).await?,
            (None, None, None) => {
                return Err("pass tmux_session (the job name exec_bash_background returned), watch_id, or log_file".into());
            }
        };
        let lines = p.last_n_lines.unwrap_or(50);
        if let Some(id) = slurm_jobs::job_id(&name) {
            let (job, tail) = futures::join!(slurm_jobs::status(&session, id), async {
                if lines == 0 {
                    Ok(Vec::new())
                } else {
                    slurm_jobs::read_log(&session, id, None, Some(lines), None, DEFAULT_LOG_BYTES)
                        .await
                        .map(|page| page.data)
                }
            });
            let job = job?;
            let (state, exit_code, signal, detail) = batch_fields(&job);
            return Ok(Json(CheckResult {
                tmux_session: job.name(),
                running: !job.state.ended(),
                exit_code,
                signal,
                state,
                log_tail: tail.map_or_else(
                    |e| format!("[log unavailable: {e}]"),
                    |data| String::from_utf8_lossy(&data).into_owned(),
                ),
                watch_id: None,
                detail,
            }));
        }
        let (job, tail) = futures::join!(jobs::status(&session, &name), async {
            if lines == 0 {
                Ok(String::new())
            } else {
                jobs::tail(&session, &name, lines, DEFAULT_LOG_BYTES).await
            }
        });
        let job = job.map_err(|e| e.to_string())?;
        let (exit_code, signal) = jobs::exit_fields(&job);
        Ok(Json(CheckResult {
            running: job.state == JobState::Running,
            exit_code,
            signal,
            state: jobs::state_name(job.state).into(),
            log_tail: tail.unwrap_or_else(|e| format!("[log unavailable: {e}]")),
            watch_id: by_watch.map(|_| job.name.clone()),
            tmux_session: job.name,
            detail: None,
        }))
    }

    #[tool(description = "A sandbox's newest jobs, oldest first.")]
    async fn list_background_tasks(
        &self,
        Parameters(p): Parameters<ListTasksParams>,
    ) -> Result<Json<ListTasksResult>, String> {
        // A state only Slurm batch jobs have lists those alone.
        let wanted = given(&p.state).map(|s| s.to_ascii_lowercase());
        let batch_only = wanted.as_deref().and_then(slurm_jobs::batch_only_state);
        let state = match (&wanted, batch_only) {
            (Some(s), None) => Some(jobs::parse_state(s)?),
            _ => None,
        };
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let limit = p.limit.unwrap_or(LIST_DEFAULT).max(1);
        let (agent, batch) = futures::join!(
            async {
                if batch_only.is_some() {
                    Ok((Vec::new(), 0))
                } else {
                    jobs::list(&session, state, limit).await
                }
            },
            slurm_jobs::list(&session, limit)
        );
        let (list, mut older_omitted) = agent.map_err(|e| e.to_string())?;
        let mut rows: Vec<(u64, TaskRow)> = list
            .into_iter()
            .map(|j| {
                let (exit_code, signal) = jobs::exit_fields(&j);
                let row = TaskRow {
                    state: jobs::state_name(j.state).into(),
                    exit_code,
                    signal,
                    started: jobs::utc_time(j.started_unix),
                    command: jobs::short_command(&j.command, 80),
                    name: j.name,
                    detail: None,
                };
                (j.started_unix, row)
            })
            .collect();
        let slurm_error = match batch {
            Ok((batch, omitted)) => {
                let wanted = batch_only.or(state.map(jobs::state_name));
                let before = rows.len();
                rows.extend(
                    batch
                        .into_iter()
                        .filter(|b| wanted.is_none_or(|w| w == b.state.name()))
                        .map(|b| {
                            let (state, exit_code, signal, detail) = batch_fields(&b);
                            let at = b.submitted_unix.unwrap_or(u64::MAX);
                            let row = TaskRow {
                                name: b.name(),
                                state,
                                exit_code,
                                signal,
                                started: b.submitted_unix.map(jobs::utc_time).unwrap_or_default(),
                                command: b.command.clone().unwrap_or_default(),
                                detail,
                            };
                            (at, row)
                        }),
                );
                if rows.len() > before {
                    older_omitted += omitted;
                }
                None
            }
            Err(e) => Some(e),
        };
        // Oldest first, the newest `limit` of both kinds.
        rows.sort_by_key(|(at, _)| *at);
        let extra = rows.len().saturating_sub(limit as usize);
        older_omitted += extra as u64;
        let tasks = rows.drain(extra..).map(|(_, row)| row).collect();
        Ok(Json(ListTasksResult {
            tasks,
            older_omitted,
            slurm_error,
        }))
    }

    #[tool(description = "TERM a job's process tree, KILL after grace_s.")]
    async fn cancel_background_task(
        &self,
        Parameters(p): Parameters<CancelParams>,
    ) -> Result<Json<CancelResult>, String> {
        let grace = seconds("grace_s", p.grace_s, 3.0, 600.0)?;
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        if let Some(id) = slurm_jobs::job_id(&p.name) {
            let job = slurm_jobs::cancel(&session, id, grace).await?;
            let (state, exit_code, signal, detail) = batch_fields(&job);
            return Ok(Json(CancelResult {
                name: job.name(),
                state,
                exit_code,
                signal,
                detail,
            }));
        }
        let job = jobs::cancel(&session, &p.name, grace)
            .await
            .map_err(|e| e.to_string())?;
        let (exit_code, signal) = jobs::exit_fields(&job);
        Ok(Json(CancelResult {
            state: jobs::state_name(job.state).into(),
            exit_code,
            signal,
            name: job.name,
            detail: None,
        }))
    }

    #[tool(
        description = "Wait until a job ends, prints pattern, is silent for silence_s or timeout_s passes."
    )]
    async fn wait_background_task(
        &self,
        Parameters(p): Parameters<WaitParams>,
        peer: rmcp::Peer<RoleServer>,
        meta: RequestMetaObject,
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
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let cursor = p
            .cursor
            .unwrap_or_else(|| self.cursors.get(session.name(), &p.name));
        if let Some(id) = slurm_jobs::job_id(&p.name) {
            let request = slurm_jobs::WaitRequest {
                cursor,
                timeout,
                pattern: given(&p.pattern),
                silence,
                max_bytes,
            };
            let seen: Arc<Mutex<String>> = Arc::default();
            let _ticker = Progress::of(&peer, &meta).every({
                let seen = seen.clone();
                let (started, timeout_s) = (Instant::now(), timeout.as_secs_f64());
                move || {
                    let elapsed = started.elapsed().as_secs_f64();
                    let state = seen.lock().unwrap().clone();
                    async move {
                        Report {
                            done: elapsed,
                            total: Some(timeout_s),
                            message: format!("{state}, waited {elapsed:.0} s"),
                        }
                    }
                }
            });
            let waited = slurm_jobs::wait(&session, id, &request, |b| {
                let mut text = b.state.name().to_string();
                if let Some(d) = &b.detail {
                    text.push_str(&format!(" ({d})"));
                }
                if let (Some(used), Some(limit)) = (&b.elapsed, &b.limit) {
                    text.push_str(&format!(", {used} of {limit}"));
                }
                *seen.lock().unwrap() = text;
            })
            .await?;
            self.cursors
                .set(session.name(), &p.name, waited.cursor_after);
            let (state, exit_code, signal, detail) = batch_fields(&waited.status);
            return Ok(Json(WaitResult {
                name: waited.status.name(),
                reason: waited.reason.into(),
                state,
                exit_code,
                signal,
                output: jobs::output_text(&waited.output, waited.omitted),
                cursor: waited.cursor_after,
                detail,
            }));
        }
        let _ticker = Progress::of(&peer, &meta).every({
            let (session, name) = (session.clone(), p.name.clone());
            let (started, timeout_s) = (Instant::now(), timeout.as_secs_f64());
            move || {
                let (session, name) = (session.clone(), name.clone());
                async move { wait_report(&session, &name, started, timeout_s).await }
            }
        });
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
        let (exit_code, signal) = jobs::exit_fields(job);
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
            exit_code,
            signal,
            output: jobs::output_text(&waited.output, waited.omitted),
            cursor: waited.cursor_after,
            detail: None,
        }))
    }
}

// Paging and grep through a log: listed with the watch tools, as the
// default set reads logs through check_background_task (the tail) and
// wait_background_task (from a cursor).
#[tool_router(router = job_log_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Read a job's log from offset, its last tail_lines, or the lines matching grep; page on with next_offset."
    )]
    async fn read_background_log(
        &self,
        Parameters(p): Parameters<ReadLogParams>,
    ) -> Result<Json<ReadLogResult>, String> {
        let max_bytes = log_bytes(p.max_bytes)?;
        let session = self.job_session(p.sandbox_name.as_deref()).await?;
        let offset = p.offset.or(if p.tail_lines.is_none() {
            Some(0)
        } else {
            None
        });
        if let Some(id) = slurm_jobs::job_id(&p.name) {
            let grep = given(&p.grep);
            let page = slurm_jobs::read_log(
                &session,
                id,
                offset,
                p.tail_lines,
                grep.as_deref(),
                max_bytes,
            )
            .await?;
            self.cursors.set(session.name(), &p.name, page.next_offset);
            return Ok(Json(ReadLogResult {
                content: String::from_utf8_lossy(&page.data).into_owned(),
                offset: page.offset,
                next_offset: page.next_offset,
                size: page.size,
            }));
        }
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
    /// `exec_bash_background`'s answer for the job `p` describes.
    pub(super) async fn background_started(
        &self,
        p: &BackgroundParams,
    ) -> Result<BackgroundStarted, String> {
        if let Some(request) = slurm_request(p)? {
            let sandbox = self
                .fleet
                .get(p.sandbox_name.as_deref())?
                .name()
                .to_string();
            let command = command_policy_text(p);
            let planned = [Planned::command(&sandbox, "command", &command)];
            self.permit(&planned).await?;
            let session = self.job_session(Some(&sandbox)).await?;
            let job = slurm_jobs::submit(&session, &request).await?;
            return Ok(BackgroundStarted {
                status: "submitted".into(),
                tmux_session: job.name,
                log_file: job.log_file,
                sandbox,
                watch_id: None,
            });
        }
        let (sandbox, job) = self.start_background(p).await?;
        Ok(BackgroundStarted {
            status: "started".into(),
            watch_id: p.watch.unwrap_or(true).then(|| job.name.clone()),
            tmux_session: job.name,
            log_file: job.log_file,
            sandbox,
        })
    }

    /// Starts the job `p` describes once the policy allows every command it
    /// carries; the sandbox it runs on and the job.
    pub(super) async fn start_background(
        &self,
        p: &BackgroundParams,
    ) -> Result<(String, outpost_protocol::JobInfo), String> {
        let spec = job_spec(p)?;
        let sandbox = self
            .fleet
            .get(p.sandbox_name.as_deref())?
            .name()
            .to_string();
        let mut commands = crate::policy::job_commands(&spec);
        // The command as it runs: with the caller's env.
        for (field, command) in &mut commands {
            if *field == "command" {
                *command = command_policy_text(p);
            }
        }
        let planned: Vec<Planned> = commands
            .iter()
            .map(|(field, command)| Planned::command(&sandbox, field, command))
            .collect();
        self.permit(&planned).await?;
        let session = self.job_session(Some(&sandbox)).await?;
        let job = jobs::start(&session, spec)
            .await
            .map_err(|e| e.to_string())?;
        Ok((sandbox, job))
    }
}

#[cfg(test)]
mod tests;
