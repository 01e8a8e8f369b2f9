//! Background jobs: thin calls over a [`Session`], one per job request, and the
//! shaping their results share between the MCP tools and the CLI.
//!
//! Jobs run under a per-user daemon on the host, not under the connection's
//! agent, so they survive disconnects and controller restarts; every call here
//! only asks the host about them. A `JobWait` may last as long as its timeout:
//! the connection's heartbeat keeps flowing meanwhile, and dropping the future
//! cancels the wait on the host (never the job).
//!
//! Also the plain helpers the job tools build on: log cursors, finding a job
//! by its log file, the cwd a job records in its metadata, and the command
//! that reads a job's checkpoint.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use outpost_protocol::{
    ExecRequest, ExecResult, JobCollect, JobEvent, JobInfo, JobLog, JobRead, JobSpec, JobState,
    JobWait, JobWaited, Request, Response, WatchSpec,
};

use crate::session::{CallError, Session};

/// Longest `JobWait` the tools accept.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
/// Most log bytes one answer may carry; larger asks are clamped (a frame is at
/// most 8 MiB).
pub const MAX_LOG_BYTES: u64 = 4 << 20;
/// Grace past a wait's own timeout before the controller gives the agent up
/// (the heartbeat normally notices a dead host much sooner).
const WAIT_SLACK: Duration = Duration::from_secs(15);

/// Sends `request` and returns its final answer, an agent error as
/// [`CallError::Agent`].
pub(super) async fn ask(session: &Session, request: Request) -> Result<Response, CallError> {
    let mut call = session.start(request).await?;
    loop {
        let response = call.next().await?;
        if let Response::Error(e) = response {
            return Err(CallError::Agent(e));
        }
        if response.is_final() {
            return Ok(response);
        }
    }
}

pub(super) fn unexpected(what: &str, response: Response) -> CallError {
    // The variant is what matters; a payload may be a whole log.
    let mut shown = format!("{response:?}");
    if let Some((i, _)) = shown.char_indices().nth(120) {
        shown.truncate(i);
        shown.push('…');
    }
    CallError::Protocol(format!("unexpected answer to {what}: {shown}"))
}

/// A job to start, as plain data: a front end fills it from its arguments
/// (strings that were left empty as `None`); [`job_spec`] checks it.
#[derive(Debug, Default)]
pub struct StartRequest {
    pub command: String,
    pub name: Option<String>,
    /// Relative paths are taken from `cwd`.
    pub log_file: Option<String>,
    pub cwd: Option<String>,
    pub run_id: Option<String>,
    pub watch_name: Option<String>,
    pub resume_command: Option<String>,
    pub resume_plan_json: Option<String>,
    pub checkpoint_path: Option<String>,
    /// "text" (the default) or "json".
    pub checkpoint_format: Option<String>,
    pub checkpoint_command: Option<String>,
    pub interval_s: Option<f64>,
    pub alert_after_failures: Option<u32>,
    pub resume_delay_s: Option<f64>,
    pub auto_resume: Option<bool>,
    pub max_resume_attempts: Option<u32>,
    pub metadata_json: Option<String>,
}

/// The agent's request for `r`, or what is wrong with it.
pub fn job_spec(r: &StartRequest) -> Result<JobSpec, String> {
    if r.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    let checkpoint_format = r.checkpoint_format.clone().unwrap_or_else(|| "text".into());
    if checkpoint_format != "text" && checkpoint_format != "json" {
        return Err(format!(
            "checkpoint_format must be \"text\" or \"json\", got {checkpoint_format:?}"
        ));
    }
    let day = 86_400.0;
    let watch = WatchSpec {
        run_id: r.run_id.clone(),
        watch_name: r.watch_name.clone(),
        resume_command: r.resume_command.clone(),
        resume_plan_json: valid_json("resume_plan_json", &r.resume_plan_json)?,
        checkpoint_path: r.checkpoint_path.clone(),
        checkpoint_format: Some(checkpoint_format),
        checkpoint_command: r.checkpoint_command.clone(),
        auto_resume: r.auto_resume.unwrap_or(false),
        max_resume_attempts: r.max_resume_attempts.unwrap_or(1),
        resume_delay_s: seconds("resume_delay_s", r.resume_delay_s, 300.0, day)?.as_secs(),
        alert_after_failures: r.alert_after_failures.unwrap_or(2),
        interval_s: seconds("interval_s", r.interval_s, 300.0, day)?.as_secs(),
        metadata_json: with_cwd(
            valid_json("metadata_json", &r.metadata_json)?,
            r.cwd.as_deref(),
        ),
    };
    if watch.auto_resume && watch.resume_command.is_none() && watch.resume_plan_json.is_none() {
        return Err("auto_resume needs resume_command (or resume_plan_json)".into());
    }
    Ok(JobSpec {
        name: r.name.clone(),
        command: r.command.clone(),
        env: Vec::new(),
        log_file: r
            .log_file
            .clone()
            .map(|log| relative_to(r.cwd.as_deref(), log)),
        cwd: r.cwd.clone(),
        watch,
        timeout_ms: None,
        split_streams: false,
        stdin: None,
        // Set by the agent from the `InSandbox` a sandbox's request comes in.
        sandbox: None,
    })
}

fn valid_json(name: &str, value: &Option<String>) -> Result<Option<String>, String> {
    if let Some(text) = value {
        serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| format!("{name} is not valid JSON: {e}"))?;
    }
    Ok(value.clone())
}

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

/// `value` seconds (else `default`), checked to lie in 0..=`max`.
pub fn seconds(name: &str, value: Option<f64>, default: f64, max: f64) -> Result<Duration, String> {
    let v = value.unwrap_or(default);
    if !(v >= 0.0 && v <= max) {
        return Err(format!(
            "{name} must be between 0 and {max} seconds, got {v}"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Starts a job; the answer describes it (its name, when the agent chose it).
pub async fn start(session: &Session, spec: JobSpec) -> Result<JobInfo, CallError> {
    match ask(session, Request::JobStart(spec)).await? {
        Response::Job(info) => Ok(info),
        other => Err(unexpected("a job start", other)),
    }
}

pub async fn status(session: &Session, name: &str) -> Result<JobInfo, CallError> {
    let request = Request::JobStatus {
        name: name.to_string(),
    };
    match ask(session, request).await? {
        Response::Job(info) => Ok(info),
        other => Err(unexpected("a job status", other)),
    }
}

/// The newest `limit` jobs (0: as many as fit an answer), oldest first, and
/// how many older ones were left out.
pub async fn list(
    session: &Session,
    state: Option<JobState>,
    limit: u32,
) -> Result<(Vec<JobInfo>, u64), CallError> {
    match ask(session, Request::JobList { state, limit }).await? {
        Response::Jobs { mut jobs, omitted } => {
            // Newest first from the host, in start order to the nanosecond.
            jobs.reverse();
            Ok((jobs, omitted))
        }
        other => Err(unexpected("a job list", other)),
    }
}

/// TERM to the job's whole tree, KILL after `grace`.
pub async fn cancel(session: &Session, name: &str, grace: Duration) -> Result<JobInfo, CallError> {
    let request = Request::JobCancel {
        name: name.to_string(),
        grace_ms: grace.as_millis() as u64,
    };
    match ask(session, request).await? {
        Response::Job(info) => Ok(info),
        other => Err(unexpected("a job cancel", other)),
    }
}

/// Blocks until the job ends, its new output matches, it is silent, or the
/// wait's timeout passes.
pub async fn wait(session: &Session, wait: JobWait) -> Result<JobWaited, CallError> {
    let deadline = Duration::from_millis(wait.timeout_ms) + WAIT_SLACK;
    let answer = tokio::time::timeout(deadline, ask(session, Request::JobWait(wait)))
        .await
        .map_err(|_| {
            CallError::ConnectionLost(format!(
                "the host did not answer a job wait within {} s",
                deadline.as_secs()
            ))
        })??;
    match answer {
        Response::JobWaited(waited) => Ok(waited),
        other => Err(unexpected("a job wait", other)),
    }
}

/// A split job's result shaped like an exec's (the output so far while it
/// runs); an ended one is removed, and with `detach` a running one becomes
/// a background job.
pub async fn collect(
    session: &Session,
    name: &str,
    output_limit: u64,
    detach: bool,
) -> Result<(JobInfo, ExecResult), CallError> {
    let request = Request::JobCollect(JobCollect {
        name: name.to_string(),
        output_limit,
        remove_if_ended: true,
        detach,
    });
    match ask(session, request).await? {
        Response::JobCollected { job, result } => Ok((job, result)),
        other => Err(unexpected("a job collect", other)),
    }
}

pub async fn read(session: &Session, read: JobRead) -> Result<JobLog, CallError> {
    match ask(session, Request::JobRead(read)).await? {
        Response::JobLog(log) => Ok(log),
        other => Err(unexpected("a job log read", other)),
    }
}

/// Events after `after_seq` (of one job, or all), at most `limit`.
pub async fn events(
    session: &Session,
    name: Option<&str>,
    after_seq: u64,
    limit: u32,
) -> Result<Vec<JobEvent>, CallError> {
    let request = Request::JobEvents {
        name: name.map(str::to_string),
        after_seq,
        limit,
    };
    match ask(session, request).await? {
        Response::JobEvents(events) => Ok(events),
        other => Err(unexpected("job events", other)),
    }
}

/// The last `lines` lines of a job's log (at most `max_bytes`), as text.
pub async fn tail(
    session: &Session,
    name: &str,
    lines: u32,
    max_bytes: u64,
) -> Result<String, CallError> {
    let log = read(
        session,
        JobRead {
            name: name.to_string(),
            offset: None,
            tail_lines: Some(lines),
            grep: None,
            max_bytes,
        },
    )
    .await?;
    Ok(String::from_utf8_lossy(&log.data).into_owned())
}

/// A job state as tools and the CLI spell it.
pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Exited => "exited",
        JobState::Cancelled => "cancelled",
        JobState::Lost => "lost",
    }
}

pub fn parse_state(s: &str) -> Result<JobState, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "running" => Ok(JobState::Running),
        "exited" => Ok(JobState::Exited),
        "cancelled" | "canceled" => Ok(JobState::Cancelled),
        "lost" => Ok(JobState::Lost),
        other => Err(format!(
            "unknown state {other:?}; use running, exited, cancelled or lost"
        )),
    }
}

/// Output bytes as text: invalid UTF-8 replaced, and when bytes before them
/// were dropped, an explicit marker first. A character cut by the drop is
/// counted as omitted rather than shown as a replacement character.
pub fn output_text(data: &[u8], omitted: u64) -> String {
    let (data, omitted) = if omitted > 0 {
        let cut = data
            .iter()
            .take(3)
            .take_while(|b| (0x80..0xc0).contains(*b))
            .count();
        (&data[cut..], omitted + cut as u64)
    } else {
        (data, 0)
    };
    let text = String::from_utf8_lossy(data);
    if omitted == 0 {
        return text.into_owned();
    }
    format!("[… {omitted} bytes omitted …]\n{text}")
}

/// At most `max` characters of a command's first line, `…` marking a cut.
pub fn short_command(command: &str, max: usize) -> String {
    let line = command.trim();
    let first = line.lines().next().unwrap_or("");
    let cut = first.chars().count() > max || first.len() < line.len();
    if !cut {
        return first.to_string();
    }
    let mut s: String = first.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// `2025-01-31T08:15:00Z` for seconds since the epoch (UTC).
pub fn utc_time(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A shell exit status for an ended job: its exit code, or 128+N when signal N
/// killed it (as a shell reports it); None while it runs or when it was lost.
pub fn shell_status(job: &JobInfo) -> Option<i32> {
    if job.timed_out {
        return Some(124);
    }
    job.exit_code.or(job.signal.map(|s| 128 + s))
}

/// The exit_code and signal a tool reports for a job: as recorded, but 124
/// and no signal when its timeout ended it (as `exec_bash` and `timeout(1)`
/// report a timeout).
pub fn exit_fields(job: &JobInfo) -> (Option<i32>, Option<i32>) {
    if job.timed_out {
        (Some(124), None)
    } else {
        (job.exit_code, job.signal)
    }
}

/// How a job ended, in a few words: `exit 3`, `signal 9`, or empty.
pub fn exit_summary(job: &JobInfo) -> String {
    match (job.exit_code, job.signal) {
        _ if job.timed_out => "timed out".into(),
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => String::new(),
    }
}

/// The key of a job in this server's cursor memory.
type JobKey = (String, String);

/// Where each job's log was last read up to by this server (the MCP server's
/// default cursor for the next wait).
#[derive(Default)]
pub struct Cursors(Mutex<HashMap<JobKey, u64>>);

impl Cursors {
    pub fn get(&self, sandbox: &str, job: &str) -> u64 {
        let map = self.0.lock().unwrap();
        map.get(&(sandbox.to_string(), job.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub fn set(&self, sandbox: &str, job: &str, at: u64) {
        self.0
            .lock()
            .unwrap()
            .insert((sandbox.to_string(), job.to_string()), at);
    }
}

/// Records the job's cwd in its metadata (a JSON object) under `cwd`, so the
/// watch tools can resolve a relative checkpoint later: the host reports a
/// job's metadata but not its cwd.
pub fn with_cwd(metadata: Option<String>, cwd: Option<&str>) -> Option<String> {
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
pub fn job_cwd(job: &JobInfo) -> Option<String> {
    let meta: serde_json::Value = serde_json::from_str(job.watch.metadata_json.as_deref()?).ok()?;
    meta.get("cwd")?.as_str().map(str::to_string)
}

/// Whether a job writes to `log_file` as a caller named it (the host reports
/// the resolved path; a relative name matches its tail).
pub fn log_matches(job_log: &str, wanted: &str) -> bool {
    let wanted = wanted.trim_start_matches("./");
    job_log == wanted
        || (!wanted.starts_with('/')
            && job_log.ends_with(&format!("/{}", wanted.trim_start_matches("~/"))))
}

/// The job writing `log_file` (the latest, if several did).
pub async fn job_by_log(session: &Session, log_file: &str) -> Result<String, String> {
    // As many as fit an answer: the job may be an old one.
    let (all, _) = list(session, None, 0).await.map_err(|e| e.to_string())?;
    all.into_iter()
        .filter(|j| log_matches(&j.log_file, log_file))
        .max_by_key(|j| j.started_unix)
        .map(|j| j.name)
        .ok_or_else(|| format!("no job writes to {log_file}; list_background_tasks shows the jobs"))
}

/// How a job's checkpoint is read on the host, in the job's cwd: its source
/// ("command" or "file") and the request (a file is read up to one byte past
/// `max_bytes`, so a cut can be told); None when the job defines none.
pub fn checkpoint_request(job: &JobInfo, max_bytes: u64) -> Option<(&'static str, ExecRequest)> {
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
        progress_ms: None,
        hand_over: None,
    };
    Some((source, req))
}

/// A remote path as one shell word, `~/` still expanded by the shell.
pub fn remote_path_arg(path: &str) -> String {
    use crate::host::bootstrap::shell_quote;
    match path.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
        None if path == "~" => "\"$HOME\"".into(),
        None => shell_quote(path),
    }
}

#[cfg(test)]
mod tests {
    use outpost_protocol::WatchSpec;

    use super::*;

    #[test]
    fn output_text_marks_what_was_dropped() {
        assert_eq!(output_text(b"abc\n", 0), "abc\n");
        assert_eq!(output_text(b"tail\n", 10), "[… 10 bytes omitted …]\ntail\n");
        // "é" is c3 a9: a tail starting at a9 drops that byte too.
        assert_eq!(output_text(b"\xa9x", 5), "[… 6 bytes omitted …]\nx");
        assert_eq!(output_text(b"\xff", 0), "\u{fffd}");
    }

    #[test]
    fn short_command_cuts_long_and_multiline_commands() {
        assert_eq!(short_command("  make test ", 80), "make test");
        assert_eq!(short_command("abcdef", 4), "abc…");
        assert_eq!(short_command("abcd", 4), "abcd");
        assert_eq!(short_command("set -e\npython train.py", 80), "set -e…");
    }

    #[test]
    fn utc_time_formats_dates() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn states_round_trip() {
        for s in [
            JobState::Running,
            JobState::Exited,
            JobState::Cancelled,
            JobState::Lost,
        ] {
            assert_eq!(parse_state(state_name(s)), Ok(s));
        }
        assert!(parse_state("done").unwrap_err().contains("running"));
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
            timed_out: false,
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
    fn remote_paths_keep_the_home() {
        assert_eq!(remote_path_arg("~/a b"), "\"$HOME\"/'a b'");
        assert_eq!(remote_path_arg("x'y"), "'x'\\''y'");
    }
}
