//! Running a command on a sandbox, as both front ends do it: the request
//! from its parameters, the exit status a shell would report for the
//! result, and the outcomes of a fan-out grouped.
//!
//! Also [`run_within`]: a command that may outlast its caller's patience
//! runs under the host's job supervisor from the start, so that when the
//! caller must answer it can leave the command running as a background job,
//! with nothing to move and no byte of output lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_protocol::{
    ErrorKind, ExecRequest, ExecResult, JobSpec, JobState, JobWait, NO_ROOM_FOR_JOB, WatchSpec,
};

use super::jobs;
use crate::session::{CallError, Session};

/// `exec_bash`'s default timeout, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;
/// `exec_bash`'s default output cap per stream, in bytes.
pub const DEFAULT_MAX_OUTPUT: i64 = 20_000;

/// What a caller asks to run.
#[derive(Debug, Clone, Default)]
pub struct Command<'a> {
    pub command: &'a str,
    pub cwd: Option<&'a str>,
    /// Seconds; `None` means no limit.
    pub timeout_s: Option<f64>,
    /// Bytes kept per stream (head and tail); 0 keeps everything.
    pub max_output: i64,
    /// Send output as it comes rather than with the result.
    pub stream: bool,
}

/// The agent request for `cmd`, or what is wrong with it.
pub fn request(cmd: &Command<'_>) -> Result<ExecRequest, String> {
    let timeout_ms = match cmd.timeout_s {
        Some(t) if t > 0.0 && t.is_finite() => Some((t * 1000.0).min(u64::MAX as f64 / 2.0) as u64),
        Some(t) => {
            return Err(format!(
                "timeout_s must be a positive number of seconds, got {t}"
            ));
        }
        None => None,
    };
    if cmd.max_output < 0 {
        return Err(format!(
            "max_output_chars must be 0 or more, got {}",
            cmd.max_output
        ));
    }
    if cmd.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    Ok(ExecRequest {
        command: cmd.command.to_string(),
        cwd: cmd.cwd.filter(|c| !c.is_empty()).map(str::to_string),
        env: Vec::new(),
        stdin: None,
        timeout_ms,
        output_limit: cmd.max_output as u64,
        stream: cmd.stream,
        progress_ms: None,
    })
}

/// Variables that make bash (or the loader) run code of their own before
/// or around any command: a caller could run what the policy never saw.
const CODE_VARIABLES: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "LD_PRELOAD",
    "LD_AUDIT",
];

/// An `env` name must be a plain shell identifier (so no `BASH_FUNC_x%%`
/// function import) and none of [`CODE_VARIABLES`].
pub fn check_env_name(name: &str) -> Result<(), String> {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(format!(
            "env name {name:?} is not a shell identifier ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if CODE_VARIABLES.contains(&name) {
        return Err(format!(
            "env {name} is refused: it makes the shell or loader run code the policy never sees"
        ));
    }
    Ok(())
}

/// The status a shell reports for `result`: 124 on timeout (as `timeout(1)`),
/// 128+N when signal N killed it, else its exit code; -1 when there is none.
pub fn shell_status(result: &ExecResult) -> i32 {
    if result.timed_out {
        124
    } else {
        result
            .exit_code
            .or(result.signal.map(|s| 128 + s))
            .unwrap_or(-1)
    }
}

/// Outcomes of one command on several sandboxes, grouped: each distinct
/// outcome once, with the sandboxes that gave it, in the order first seen.
pub fn group_outcomes<T: PartialEq>(
    outcomes: impl IntoIterator<Item = (String, T)>,
) -> Vec<(Vec<String>, T)> {
    let mut groups: Vec<(Vec<String>, T)> = Vec::new();
    for (name, outcome) in outcomes {
        match groups.iter_mut().find(|(_, o)| *o == outcome) {
            Some((names, _)) => names.push(name),
            None => groups.push((vec![name], outcome)),
        }
    }
    groups
}

/// How a [`run_within`] ended.
#[derive(Debug)]
pub enum Outcome {
    /// The command ended within the budget (or ran inline): the result an
    /// inline exec gives.
    Done(ExecResult),
    /// The host had no room to record a job, so it ran inline, as a call
    /// that cannot outlive its budget (why: the agent's words).
    Inline { result: ExecResult, why: String },
    /// Still running when the budget was spent: from now on the background
    /// job `job`; `so_far` holds each stream's output up to now.
    Running { job: String, so_far: ExecResult },
    /// The host stopped answering (or failed a request) once the job was
    /// asked for; it may still run, under this name.
    Unknown { job: String, error: CallError },
}

/// A running command's figures between two looks at its job.
#[derive(Debug, Clone, Default)]
pub struct JobProgress {
    pub elapsed: Duration,
    /// Both streams together, so far.
    pub bytes: u64,
    /// The last non-empty line written (cut to the protocol's progress line
    /// length).
    pub last_line: String,
}

/// Runs `req` as a job with split streams and the request's own timeout,
/// waits for it until `deadline` (telling `seen` how it goes about every
/// `look`), and returns its result, or leaves it running as a background
/// job. A host whose agent cannot run jobs (an in-process agent) runs it
/// inline. If the returned future is dropped (the call was cancelled), the
/// job is cancelled and removed.
pub async fn run_within(
    session: &Arc<Session>,
    req: ExecRequest,
    deadline: Instant,
    look: Duration,
    mut seen: impl FnMut(JobProgress),
) -> Result<Outcome, CallError> {
    let started = Instant::now();
    let output_limit = req.output_limit;
    // Named here, so that a call dropped while the job starts can still
    // cancel it.
    let job = job_name();
    let spec = JobSpec {
        name: Some(job.clone()),
        command: req.command.clone(),
        cwd: req.cwd.clone(),
        env: req.env.clone(),
        log_file: None,
        watch: WatchSpec::default(),
        timeout_ms: req.timeout_ms,
        split_streams: true,
        stdin: req.stdin.clone(),
        // Set by the agent from the `InSandbox` a sandbox's request comes in.
        sandbox: None,
    };
    let mut guard = CancelOnDrop(Some((Arc::clone(session), job.clone())));
    match jobs::start(session, spec).await {
        Ok(_) => {}
        Err(CallError::Agent(e)) if e.kind == ErrorKind::Unsupported => {
            guard.0 = None;
            return session.exec(req, |_, _| {}).await.map(Outcome::Done);
        }
        // A full disk must not stop the `rm` that would free it.
        Err(CallError::Agent(e))
            if e.kind == ErrorKind::Unavailable && e.message.starts_with(NO_ROOM_FOR_JOB) =>
        {
            guard.0 = None;
            let mut req = req;
            let left = deadline.saturating_duration_since(Instant::now());
            let left_ms = (left.as_millis() as u64).max(1000);
            req.timeout_ms = Some(req.timeout_ms.map_or(left_ms, |t| t.min(left_ms)));
            let result = session.exec(req, |_, _| {}).await?;
            return Ok(Outcome::Inline {
                result,
                why: format!(
                    "ran inline, killed after {:.0} s at most: {}",
                    left_ms as f64 / 1000.0,
                    e.message
                ),
            });
        }
        // The host may have started it before the connection failed.
        Err(e) if e.is_connection() => {
            guard.0 = None;
            return Ok(Outcome::Unknown { job, error: e });
        }
        Err(e) => {
            guard.0 = None;
            return Err(e);
        }
    }
    let unknown = |error: CallError| Outcome::Unknown {
        job: job.clone(),
        error,
    };
    let mut progress = JobProgress::default();
    let mut cursor = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let wait = JobWait {
            name: job.clone(),
            cursor,
            timeout_ms: left.min(look).as_millis() as u64,
            pattern: None,
            silence_ms: None,
            max_bytes: LAST_LINE_SCAN,
        };
        let waited = match jobs::wait(session, wait).await {
            Ok(w) => w,
            Err(e) => {
                guard.0 = None;
                return Ok(unknown(e));
            }
        };
        cursor = waited.cursor_after;
        progress.elapsed = started.elapsed();
        progress.bytes = waited.job.log_size;
        if let Some(line) = last_line(&waited.output) {
            progress.last_line = line;
        }
        seen(progress.clone());
        if waited.job.state != JobState::Running {
            break;
        }
    }
    let collected = jobs::collect(session, &job, output_limit, true).await;
    guard.0 = None;
    match collected {
        Ok((info, so_far)) if info.state == JobState::Running => {
            Ok(Outcome::Running { job, so_far })
        }
        Ok((_, result)) => Ok(Outcome::Done(result)),
        Err(e) => Ok(unknown(e)),
    }
}

/// A job name no other controller picks: `exec-` and the time, this
/// process and a counter.
fn job_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "exec-{nanos:x}-{:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Output looked at per wait for the last line.
const LAST_LINE_SCAN: u64 = 4096;

/// The last non-empty line of `output`, cut to the progress line length.
fn last_line(output: &[u8]) -> Option<String> {
    let line = output
        .split(|&b| b == b'\n' || b == b'\r')
        .rfind(|l| !l.iter().all(u8::is_ascii_whitespace))?;
    let mut text = String::from_utf8_lossy(line).into_owned();
    let max = outpost_protocol::limits::PROGRESS_LINE_LEN;
    if text.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
    }
    Some(text)
}

/// Cancels and removes the job of a call that was dropped before it
/// returned: a person who stops a call stops its command.
struct CancelOnDrop(Option<(Arc<Session>, String)>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some((session, job)) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = jobs::cancel(&session, &job, Duration::from_millis(500)).await;
                let _ = jobs::collect(&session, &job, 0, false).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let cmd = |timeout_s, max_output| Command {
            command: "true",
            timeout_s,
            max_output,
            ..Command::default()
        };
        assert!(request(&cmd(Some(-1.0), 0)).is_err());
        assert!(request(&cmd(Some(f64::NAN), 0)).is_err());
        assert!(request(&cmd(Some(1.0), -1)).is_err());
        assert_eq!(request(&cmd(Some(1.5), 7)).unwrap().timeout_ms, Some(1500));
        assert_eq!(request(&cmd(None, 0)).unwrap().timeout_ms, None);
        let empty = Command {
            command: "  ",
            ..Command::default()
        };
        assert!(request(&empty).is_err());
    }

    #[test]
    fn last_lines_skip_blank_ones_and_are_cut() {
        assert_eq!(last_line(b"a\nb\n\n  \n").as_deref(), Some("b"));
        assert_eq!(last_line(b"50%\r60%\r").as_deref(), Some("60%"));
        assert_eq!(last_line(b"\n"), None);
        let long = "é".repeat(outpost_protocol::limits::PROGRESS_LINE_LEN);
        let cut = last_line(long.as_bytes()).unwrap();
        assert!(cut.len() <= outpost_protocol::limits::PROGRESS_LINE_LEN && cut.starts_with('é'));
    }

    #[test]
    fn outcomes_are_grouped_in_order() {
        let outcomes = [("a", 1), ("b", 2), ("c", 1)].map(|(n, o)| (n.to_string(), o));
        assert_eq!(
            group_outcomes(outcomes),
            vec![
                (vec!["a".to_string(), "c".to_string()], 1),
                (vec!["b".to_string()], 2)
            ]
        );
    }
}
