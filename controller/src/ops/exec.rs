//! Running a command on a sandbox, as both front ends do it: the request
//! from its parameters, the exit status a shell would report for the
//! result, and the outcomes of a fan-out grouped.
//!
//! Also [`run_within`]: a command that may outlast its caller's patience
//! runs inline, as any exec, under a supervisor on the host that can hand
//! it over as a background job when the caller must answer, with no byte of
//! output lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_protocol::{ExecProgress, ExecRequest, ExecResult, HandOver, Request};

use super::jobs;
use crate::session::{CallError, ExecEnd, Session};

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
        hand_over: None,
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
    /// It could not become a job (a host with no room to record one), so
    /// it was stopped at the budget (why: the agent's words).
    Inline { result: ExecResult, why: String },
    /// Still running when the budget was spent: from now on the background
    /// job `job`; `so_far` holds each stream's output up to now.
    Running { job: String, so_far: ExecResult },
    /// The host stopped answering while the command ran; it may have been
    /// handed over and still run, under this name.
    Unknown { job: String, error: CallError },
}

/// Runs `req` inline, telling `on_progress` how it goes when it asks for
/// progress; if it still runs at `deadline`, the agent hands it over as a
/// background job and it is left running. A host whose agent cannot run
/// jobs (an in-process agent) runs it to its end. If the returned future is
/// dropped (the call was cancelled), the command is cancelled, and so is
/// its job if the hand-over crossed the cancel.
pub async fn run_within(
    session: &Arc<Session>,
    mut req: ExecRequest,
    deadline: Instant,
    on_progress: impl FnMut(ExecProgress),
) -> Result<Outcome, CallError> {
    // Named here, so that a call dropped while the answer is on its way can
    // still cancel the job.
    let job = job_name();
    let after = deadline.saturating_duration_since(Instant::now());
    req.hand_over = Some(HandOver {
        after_ms: after.as_millis() as u64,
        job: job.clone(),
    });
    let limit_ms = req.timeout_ms.map_or(after.as_millis() as u64, |t| {
        t.min(after.as_millis() as u64)
    });
    let mut guard = CancelOnDrop(Some((Arc::clone(session), job.clone())));
    let ended = session
        .exec_end(Request::Exec(req), Some(limit_ms), |_, _| {}, on_progress)
        .await;
    guard.0 = None;
    match ended {
        Ok(ExecEnd::Done(result)) => Ok(Outcome::Done(result)),
        Ok(ExecEnd::HandedOver { job, so_far }) => Ok(Outcome::Running { job, so_far }),
        Ok(ExecEnd::CutShort { result, why }) => Ok(Outcome::Inline {
            result,
            why: format!(
                "stopped after {:.0} s, when it should have become a background job: {why}",
                after.as_secs_f64()
            ),
        }),
        // The host may have handed it over before the connection failed.
        Err(e) if e.is_connection() => Ok(Outcome::Unknown { job, error: e }),
        Err(e) => Err(e),
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

/// Cancels the job of a call that was dropped before it returned, in case
/// the hand-over crossed the cancel: a person who stops a call stops its
/// command.
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
