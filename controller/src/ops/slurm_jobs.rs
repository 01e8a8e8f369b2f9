//! Slurm batch jobs as background tasks. On a host that is a Slurm login
//! node, `exec_bash_background(scheduler="slurm")` submits the command with
//! `sbatch` instead of starting it under the host's job daemon; the task is
//! named `slurm-<jobid>` and the task tools (check, wait, cancel, read the
//! log, list) work on it as on any job.
//!
//! Everything is a shell command on the login node through the session's
//! exec: nothing of the agent or the protocol is involved. Each job keeps
//! its files in `~/.outpost/batch/` (0700) on the login node: `<id>.log`
//! (sbatch's `--output`, stdout and stderr), `<id>.exit` (the command's
//! exact exit status, written by the batch script atomically before it
//! exits with it), `<id>.cmd` (submit time and the command's first line, for
//! lists) and `<id>.state` (the end Slurm reported, kept once seen, since
//! `slurmctld` forgets ended jobs after `MinJobAge`). The batch script runs
//! on a compute node and writes `<id>.exit` there: the home directory must
//! be shared between the login and the compute nodes, as on real clusters.
//!
//! Status is batched: one command on the login node answers for any number
//! of jobs (`squeue -t all -j ID,…` for what `slurmctld` still holds, the
//! files for the rest). `sacct` is never needed (a cluster may have no
//! accounting database).
//!
//! Every value that reaches `sbatch` is checked ([`check_slurm_name`],
//! [`check_slurm_time`], a number) and shell-quoted: only the command
//! itself runs as code, with bash, as `exec_bash` runs it.

use std::time::{Duration, Instant};

use regex::Regex;

use super::jobs::short_command;
use super::slurm::{run, run_raw, run_with_input};
use crate::config::{SlurmDefaults, check_slurm_name, check_slurm_time};
use crate::host::bootstrap::shell_quote;
use crate::session::Session;

mod log;
mod status;

pub use log::read_log;
use log::*;
use status::*;
pub use status::{list, status, statuses};

/// How a task name marks a Slurm batch job: `slurm-<jobid>`.
pub const NAME_PREFIX: &str = "slurm-";
/// The batch jobs' Slurm name: how this user's Outpost jobs are told apart
/// from their other jobs.
pub const JOB_NAME: &str = "outpost-batch";
/// Where each job's files are kept on the login node, as a shell word.
const DIR_WORD: &str = "\"$HOME/.outpost/batch\"";
/// Most log bytes one read carries (an exec's output is at most 3 MiB).
pub const MAX_READ: u64 = 2 << 20;
/// How often a wait looks at the job.
const WAIT_POLL: Duration = Duration::from_secs(1);
/// How often a cancel looks whether the job has stopped.
const CANCEL_POLL: Duration = Duration::from_millis(500);
/// How long a cancel waits for the batch script to KILL its command.
const USR1_WAIT: Duration = Duration::from_secs(5);
/// How long a cancel waits for a killed job to leave Slurm's running states.
const KILL_WAIT: Duration = Duration::from_secs(30);
/// Most bytes of new output a wait scans for its pattern per poll.
const SCAN_PER_POLL: u64 = 1 << 20;
/// Most jobs one list shows (`limit` 0).
const LIST_MAX: u32 = 1000;

/// Slurm's states of a job that has not ended.
const LIVE_STATES: &[&str] = &[
    "PENDING",
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESV_DEL_HOLD",
    "POWER_UP_NODE",
];

/// The Slurm job id of a task name `slurm-<jobid>`.
pub fn job_id(name: &str) -> Option<u64> {
    let digits = name.trim().strip_prefix(NAME_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|id| *id > 0)
}

/// A state only batch jobs have (as a list filter), spelled as the tools do.
pub fn batch_only_state(state: &str) -> Option<&'static str> {
    ["pending", "timeout", "out_of_memory", "failed"]
        .into_iter()
        .find(|s| *s == state)
}

/// The task name of Slurm job `id`.
pub fn task_name(id: u64) -> String {
    format!("{NAME_PREFIX}{id}")
}

/// A batch job to submit, as plain data from a front end's arguments.
#[derive(Debug, Default, Clone)]
pub struct SubmitRequest {
    pub command: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub gpus: Option<u32>,
    /// Slurm's form: minutes, `H:MM:SS`, `D-HH:MM:SS`.
    pub time: Option<String>,
    pub partition: Option<String>,
}

/// A submitted job: its task name and its log on the login node.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub name: String,
    pub job: u64,
    pub log_file: String,
}

/// Outpost's view of a batch job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    Pending,
    Running,
    Exited,
    Cancelled,
    Timeout,
    OutOfMemory,
    /// Slurm ended it for another reason (`detail` says which).
    Failed,
    /// Slurm no longer knows it and it left no exit status.
    Lost,
}

impl BatchState {
    /// As the tools spell it (the agent's jobs' states and these).
    pub fn name(self) -> &'static str {
        match self {
            BatchState::Pending => "pending",
            BatchState::Running => "running",
            BatchState::Exited => "exited",
            BatchState::Cancelled => "cancelled",
            BatchState::Timeout => "timeout",
            BatchState::OutOfMemory => "out_of_memory",
            BatchState::Failed => "failed",
            BatchState::Lost => "lost",
        }
    }

    pub fn ended(self) -> bool {
        !matches!(self, BatchState::Pending | BatchState::Running)
    }
}

/// One batch job as the login node reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStatus {
    pub job: u64,
    pub state: BatchState,
    pub exit_code: Option<i32>,
    /// Set (and `exit_code` absent) when signal N ended the batch script
    /// before it could record the command's status.
    pub signal: Option<i32>,
    /// Slurm's reason while it pends, or what ended it when that is not
    /// told by the state (`NODE_FAIL`, `PREEMPTED`, …).
    pub detail: Option<String>,
    /// Time used and time limit as `squeue` shows them, while Slurm lists it.
    pub elapsed: Option<String>,
    pub limit: Option<String>,
    /// Submit time (lists only).
    pub submitted_unix: Option<u64>,
    /// The command's first line (lists only).
    pub command: Option<String>,
}

impl BatchStatus {
    pub fn name(&self) -> String {
        task_name(self.job)
    }

    /// The status a shell would report: the exit code, 128+N for signal N,
    /// 124 for Slurm's time limit (as `timeout(1)`); None while it runs or
    /// when unknown.
    pub fn shell_status(&self) -> Option<i32> {
        match self.state {
            BatchState::Timeout => Some(124),
            _ => self.exit_code.or(self.signal.map(|s| 128 + s)),
        }
    }

    /// A few words for people: `exit 3`, `signal 9`, `NODE_FAIL`, or empty.
    pub fn summary(&self) -> String {
        match (self.exit_code, self.signal, &self.detail) {
            (Some(code), _, _) => format!("exit {code}"),
            (None, Some(sig), _) => format!("signal {sig}"),
            (None, None, Some(d)) if self.state.ended() => d.clone(),
            _ => String::new(),
        }
    }
}

/// A page of a job's log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogPage {
    pub data: Vec<u8>,
    pub offset: u64,
    pub next_offset: u64,
    pub size: u64,
}

/// What a wait saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    pub status: BatchStatus,
    /// ended, matched, silent or timed_out (as the agent's waits say).
    pub reason: &'static str,
    pub output: Vec<u8>,
    /// Bytes after the cursor left out of `output` (its end is kept).
    pub omitted: u64,
    pub cursor_after: u64,
}

/// A wait's settings, as `wait_background_task` takes them.
#[derive(Debug, Clone)]
pub struct WaitRequest {
    pub cursor: u64,
    pub timeout: Duration,
    pub pattern: Option<String>,
    pub silence: Option<Duration>,
    pub max_bytes: u64,
}

// ---------------------------------------------------------------- submit

/// Checks `r` against the cluster's defaults (none when the login node has
/// no `[sandbox.slurm]`) and gives the `sbatch` options, each one shell word.
fn sbatch_args(defaults: Option<&SlurmDefaults>, r: &SubmitRequest) -> Result<Vec<String>, String> {
    let mut args: Vec<String> = [
        "--parsable",
        &format!("--job-name={JOB_NAME}"),
        "--open-mode=append",
        "-N1",
        "-n1",
    ]
    .iter()
    .map(|a| shell_quote(a))
    .collect();
    // The log path is known at submit time: %j is the job id.
    args.insert(1, format!("--output={DIR_WORD}/%j.log"));
    let time = r.time.clone().or_else(|| defaults.map(|d| d.time.clone()));
    if let Some(time) = &time {
        check_slurm_time(time)?;
        args.push(shell_quote(&format!("--time={time}")));
    }
    let partition = r
        .partition
        .clone()
        .or_else(|| defaults.and_then(|d| d.partition.clone()));
    for (option, value) in [
        ("partition", partition.as_ref()),
        ("account", defaults.and_then(|d| d.account.as_ref())),
        ("qos", defaults.and_then(|d| d.qos.as_ref())),
    ] {
        if let Some(value) = value {
            check_slurm_name(option, value)?;
            args.push(shell_quote(&format!("--{option}={value}")));
        }
    }
    if let Some(gpus) = r.gpus.filter(|g| *g > 0) {
        if gpus > 1024 {
            return Err(format!("gpus must be at most 1024, got {gpus}"));
        }
        let gres = defaults.map_or("gpu", |d| d.gpu_gres.as_str());
        args.push(shell_quote(&format!("--gres={gres}:{gpus}")));
    }
    if let Some(cwd) = &r.cwd {
        args.push(format!("--chdir={}", cwd_word(cwd)));
    }
    Ok(args)
}

/// A cwd as one shell word on the login node: `~` and relative paths are
/// taken from the home directory, as `exec_bash` takes them.
fn cwd_word(cwd: &str) -> String {
    let home = "\"$HOME\"";
    match cwd.strip_prefix('~') {
        Some("") => home.to_string(),
        Some(rest) if rest.starts_with('/') => {
            format!("{home}/{}", shell_quote(rest.trim_start_matches('/')))
        }
        _ if cwd.starts_with('/') => shell_quote(cwd),
        _ => format!("{home}/{}", shell_quote(cwd)),
    }
}

/// The batch script after its first two lines (`#!/bin/bash` and `d=DIR`,
/// which the submit command writes): the caller's env exported, the
/// command run by bash, its exact status written to `$d/<id>.exit`
/// atomically, then returned. The line `d=…` ends sbatch's `#SBATCH`
/// parsing, so nothing in the command or env can become an option.
pub fn batch_body(r: &SubmitRequest) -> Result<String, String> {
    if r.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    if r.command.contains('\0') {
        return Err("command contains a NUL byte".into());
    }
    let mut exports = String::new();
    for (name, value) in &r.env {
        super::exec::check_env_name(name)?;
        if value.contains('\0') {
            return Err(format!("env {name} contains a NUL byte"));
        }
        exports.push_str(&format!("export {name}={}; ", shell_quote(value)));
    }
    // A reused job id (ids wrap; a cluster's state can be lost) must not
    // inherit an earlier job's end.
    let mut body = String::from(
        "# Outpost batch job: the command's exact status goes to $d/<id>.exit.\n\
         rm -f \"$d/$SLURM_JOB_ID.state\" \"$d/$SLURM_JOB_ID.exit\"\n",
    );
    // Job control gives the command a process group of its own (this
    // script reaches all of it through it) and its default SIGINT and
    // SIGQUIT, as exec_bash's commands have. TERM and USR1 to the script
    // do not end it before its command: TERM is passed on, USR1 (a
    // cancel's grace is over) KILLs the group. Until the command ends its
    // processes stay this script's descendants, all that Slurm's linuxproc
    // tracker can find; what it left behind is killed at its end, as
    // Slurm's cgroup tracker would. The caller's env is the command's
    // only, never this script's.
    body.push_str(
        "set -m\n\
         outpost_c=\n\
         trap '[ -n \"$outpost_c\" ] && kill -TERM -- -\"$outpost_c\" 2>/dev/null' TERM\n\
         trap '[ -n \"$outpost_c\" ] && kill -KILL -- -\"$outpost_c\" 2>/dev/null' USR1\n",
    );
    body.push_str(&format!(
        "( {exports}exec bash -c {} ) &\n",
        shell_quote(&r.command)
    ));
    body.push_str(
        "outpost_c=$!\n\
         # With job control bash reports a job killed by a signal, command\n\
         # line and all, on its stderr (the log): the script says nothing.\n\
         exec 2>/dev/null\n\
         while wait \"$outpost_c\" 2>/dev/null; outpost_s=$?; [ \"$outpost_s\" -gt 128 ] && kill -0 \"$outpost_c\" 2>/dev/null; do :; done\n\
         # Reaped while a trap interrupted the wait: bash still knows its status.\n\
         wait \"$outpost_c\" 2>/dev/null; outpost_r=$?; [ \"$outpost_r\" -ne 127 ] && outpost_s=$outpost_r\n\
         kill -KILL -- -\"$outpost_c\" 2>/dev/null\n\
         printf '%s\\n' \"$outpost_s\" > \"$d/$SLURM_JOB_ID.exit.tmp\" && mv -f \"$d/$SLURM_JOB_ID.exit.tmp\" \"$d/$SLURM_JOB_ID.exit\"\n\
         exit \"$outpost_s\"\n",
    );
    Ok(body)
}

/// The command that submits `r` on the login node and prints
/// `OK|<jobid>|<dir>`, and the batch script's body it reads on its stdin
/// (never in its argv: the login node's other users see argv, and the
/// body carries the env's values).
pub fn submit_script(
    defaults: Option<&SlurmDefaults>,
    r: &SubmitRequest,
) -> Result<(String, String), String> {
    let args = sbatch_args(defaults, r)?;
    let body = batch_body(r)?;
    let cwd_check = match &r.cwd {
        Some(cwd) => format!(
            "[ -d {w} ] || {{ echo \"cwd is not a directory: \"{w} >&2; exit 3; }}\n",
            w = cwd_word(cwd)
        ),
        None => String::new(),
    };
    let shown = shell_quote(&short_command(&r.command, 200));
    let script = format!(
        "command -v sbatch >/dev/null 2>&1 || {{ echo 'no sbatch on this host: scheduler \"slurm\" needs a Slurm login node' >&2; exit 3; }}\n\
         d={DIR_WORD}\n\
         (umask 077 && mkdir -p \"$d\") && chmod 700 \"$d\" || exit 3\n\
         {cwd_check}\
         id=$( {{ printf '#!/bin/bash\\nd=%q\\n' \"$d\"; cat; }} | sbatch {args} ) || exit 3\n\
         id=${{id%%;*}}\n\
         case $id in ''|*[!0-9]*) echo \"sbatch answered: $id\" >&2; exit 3;; esac\n\
         printf '%s\\n%s\\n' \"$(date +%s)\" {shown} > \"$d/$id.cmd\"\n\
         printf 'OK|%s|%s\\n' \"$id\" \"$d\"\n",
        args = args.join(" "),
    );
    Ok((script, body))
}

/// Submits `r` from the login node `session`.
pub async fn submit(session: &Session, r: &SubmitRequest) -> Result<Submitted, String> {
    if let Some((host, _)) = session.isolated_in() {
        return Err(format!(
            "scheduler \"slurm\" submits from a cluster's login node: use sandbox {}, not {}",
            host.name(),
            session.name()
        ));
    }
    let (script, body) = submit_script(session.config.slurm.as_ref(), r)?;
    let out = run_with_input(session, &script, body.into_bytes())
        .await
        .map_err(|e| format!("sbatch on {}: {e}", session.name()))?;
    let line = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("OK|"))
        .ok_or_else(|| {
            format!(
                "sbatch on {}: no job id in {:?}",
                session.name(),
                out.trim()
            )
        })?;
    let (id, dir) = line
        .split_once('|')
        .ok_or_else(|| format!("sbatch on {}: bad answer {line:?}", session.name()))?;
    let job: u64 = id
        .parse()
        .map_err(|_| format!("sbatch on {}: bad job id {id:?}", session.name()))?;
    Ok(Submitted {
        name: task_name(job),
        job,
        log_file: format!("{dir}/{job}.log"),
    })
}

// ---------------------------------------------------------------- cancel

/// Cancels `job`: TERM to the batch script and everything it started
/// (`scancel --signal=TERM --full`), up to `grace` for it to stop, then
/// KILL and `scancel`; the job's end is kept as `CANCELLED`. Answers the
/// final state (an ended job is left as it was).
pub async fn cancel(session: &Session, job: u64, grace: Duration) -> Result<BatchStatus, String> {
    let before = status(session, job).await?;
    if before.state.ended() {
        return Ok(before);
    }
    let scancel = |args: &str| format!("scancel {args} {job}");
    if before.state == BatchState::Running {
        if let Err(e) = run(session, &scancel("--signal=TERM --full")).await {
            // It may have ended just now.
            let now = status(session, job).await?;
            if now.state.ended() {
                return Ok(now);
            }
            return Err(format!("scancel on {}: {e}", session.name()));
        }
        let began = Instant::now();
        let stopped = loop {
            if !still_running(session, job).await? {
                break true;
            }
            if began.elapsed() >= grace {
                break false;
            }
            tokio::time::sleep(CANCEL_POLL).await;
        };
        if !stopped {
            // The batch script KILLs its command's process group on USR1;
            // Slurm's own KILL follows if that is not enough.
            let _ = run(
                session,
                &format!("{} 2>/dev/null; true", scancel("--signal=USR1 --batch")),
            )
            .await;
            let began = Instant::now();
            while still_running(session, job).await? && began.elapsed() < USR1_WAIT {
                tokio::time::sleep(CANCEL_POLL).await;
            }
            let kill = format!(
                "{} 2>/dev/null; {} 2>/dev/null; true",
                scancel("--signal=KILL --full"),
                scancel("")
            );
            let _ = run(session, &kill).await;
        }
    } else {
        run(session, &scancel(""))
            .await
            .map_err(|e| format!("scancel on {}: {e}", session.name()))?;
    }
    let began = Instant::now();
    while still_running(session, job).await? {
        if began.elapsed() > KILL_WAIT {
            return Err(format!(
                "Slurm job {job} still runs {} s after scancel",
                KILL_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(CANCEL_POLL).await;
    }
    // A job ended by a signal it was sent reads FAILED to Slurm: keep what
    // happened.
    run(
        session,
        &format!("printf 'CANCELLED||cancelled\\n' > {DIR_WORD}/{job}.state"),
    )
    .await
    .map_err(|e| format!("recording the cancel on {}: {e}", session.name()))?;
    status(session, job).await
}

/// Whether Slurm still lists `job` in a state that runs (or may run) it.
async fn still_running(session: &Session, job: u64) -> Result<bool, String> {
    // A job Slurm has forgotten has stopped; any other failure (a busy
    // slurmctld) is an error, never "stopped".
    let out = run(
        session,
        &format!(
            "o=$(squeue -h -t all -j {job},{job} -o %T 2>&1) || case $o in *'Invalid job id'*) exit 0;; *) echo \"$o\" >&2; exit 1;; esac; printf '%s\\n' \"$o\""
        ),
    )
    .await
    .map_err(|e| format!("squeue on {}: {e}", session.name()))?;
    Ok(out.lines().any(|state| LIVE_STATES.contains(&state.trim())))
}

/// The job's status and its log's size, in one command.
async fn status_and_size(session: &Session, job: u64) -> Result<(BatchStatus, u64), String> {
    let script = format!(
        "{}echo \"S|$(stat -c %s -- {DIR_WORD}/{job}.log 2>/dev/null || echo 0)\"\n",
        status_script(Select::Ids(&[job]))
    );
    let out = run(session, &script)
        .await
        .map_err(|e| format!("Slurm status on {}: {e}", session.name()))?;
    let size = out
        .lines()
        .find_map(|l| l.strip_prefix("S|"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let (_, reports) = parse_reports(&out);
    let status = reports
        .iter()
        .find_map(|(id, r)| (*id == job).then(|| map_report(*id, r)).flatten())
        .ok_or_else(|| unknown(session, job))?;
    Ok((status, size))
}

/// Waits until the job ends, its new output matches `pattern`, it is
/// silent for `silence`, or `timeout` passes, looking every half second;
/// `on_poll` hears each status seen. Returns the output after the cursor
/// (its end, at most `max_bytes`) and where it stopped.
pub async fn wait(
    session: &Session,
    job: u64,
    w: &WaitRequest,
    mut on_poll: impl FnMut(&BatchStatus),
) -> Result<Waited, String> {
    let re = w
        .pattern
        .as_deref()
        .map(|p| Regex::new(p).map_err(|e| format!("bad pattern regex: {e}")))
        .transpose()?;
    let started = Instant::now();
    let (mut status, mut size) = status_and_size(session, job).await?;
    let cursor = w.cursor.min(size);
    let mut matcher = re.map(|re| LineMatcher {
        re,
        pos: cursor,
        partial: Vec::new(),
    });
    let mut seen = size;
    let mut last_growth = Instant::now();
    let (reason, stop) = loop {
        on_poll(&status);
        if size > seen {
            seen = size;
            last_growth = Instant::now();
        }
        if let Some(m) = matcher.as_mut()
            && m.pos < size
        {
            let len = (size - m.pos).min(SCAN_PER_POLL);
            let (_, start, data) = log_range(session, job, Some(m.pos), len).await?;
            if start == m.pos
                && let Some(end) = m.feed(&data)
            {
                break ("matched", end);
            }
        }
        let scanned = matcher.as_ref().map_or(size, |m| m.pos);
        let caught_up = scanned >= size;
        if caught_up && matcher.as_ref().is_some_and(LineMatcher::partial_matches) {
            break ("matched", scanned);
        }
        if status.state.ended() && caught_up {
            break ("ended", scanned);
        }
        if w.silence.is_some_and(|s| last_growth.elapsed() >= s) {
            break ("silent", scanned);
        }
        let left = w.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            break ("timed_out", scanned);
        }
        if caught_up {
            tokio::time::sleep(WAIT_POLL.min(left)).await;
        }
        (status, size) = status_and_size(session, job).await?;
    };
    let max = w.max_bytes.clamp(1, MAX_READ);
    let start = stop.saturating_sub(max).max(cursor);
    let output = if stop > start {
        let (_, _, data) = log_range(session, job, Some(start), stop - start).await?;
        data
    } else {
        Vec::new()
    };
    Ok(Waited {
        status,
        reason,
        omitted: start - cursor,
        cursor_after: start + output.len() as u64,
        output,
    })
}

#[cfg(test)]
mod tests;
