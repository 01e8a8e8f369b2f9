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

// ---------------------------------------------------------------- status

/// How the ids to report are chosen.
enum Select<'a> {
    /// These jobs.
    Ids(&'a [u64]),
    /// This user's Outpost batch jobs (live ones from `squeue`, ended ones
    /// from their files), the newest `limit`.
    Newest(u32),
}

/// The one command that reports on the jobs `select` picks. Prints
/// `N|<count>` (lists: jobs there are), then one `Q|id|STATE|reason|time|
/// limit` line per job `slurmctld` still holds, then one
/// `X|id|ours|exit|submitted|STATE|ExitCode|reason|command` line per job
/// from its files. A job that ended otherwise than by its command's exit
/// has its end kept in `<id>.state` the first time it is seen here
/// (`scontrol` for its `ExitCode`), so it outlives `MinJobAge`.
fn status_script(select: Select<'_>) -> String {
    let mut s = String::new();
    let (ids, list) = match select {
        Select::Ids(ids) => (
            format!(
                "ids={}\n",
                shell_quote(&ids.iter().map(u64::to_string).collect::<Vec<_>>().join(" "))
            ),
            false,
        ),
        Select::Newest(limit) => {
            let limit = if limit == 0 {
                LIST_MAX
            } else {
                limit.min(LIST_MAX)
            };
            (
                format!(
                    "live=$(squeue -h -u \"$(id -un)\" -n {JOB_NAME} -o %i) || exit 3\n\
                     all=$( {{ printf '%s\\n' \"$live\"; [ -d \"$d\" ] && cd \"$d\" && for f in *.cmd; do [[ $f =~ ^[0-9]+\\.cmd$ ]] && echo \"${{f%.cmd}}\"; done; }} | grep -E '^[0-9]+$' | sort -nu )\n\
                     echo \"N|$(printf '%s\\n' \"$all\" | grep -c .)\"\n\
                     ids=$(printf '%s\\n' \"$all\" | tail -n {limit})\n"
                ),
                true,
            )
        }
    };
    if list {
        s.push_str("command -v squeue >/dev/null 2>&1 || exit 0\n");
    } else {
        s.push_str("command -v squeue >/dev/null 2>&1 || { echo 'no squeue on this host: not a Slurm login node' >&2; exit 3; }\n");
    }
    s.push_str(&format!("d={DIR_WORD}\n"));
    s.push_str(&ids);
    s.push_str("set -f\n");
    let live = LIVE_STATES.join("|");
    let read_cmd = if list {
        "{ read -r t; read -r cm; } < \"$f.cmd\""
    } else {
        ":"
    };
    s.push_str(&format!(
        r#"set -- $ids
[ $# -gt 0 ] || exit 0
jl=$(printf '%s,' "$@"); jl=${{jl%,}}
# The first id twice: squeue fails on one id it no longer knows.
q=$(squeue -h -t all -u "$(id -un)" -n {JOB_NAME} -j "$jl,$1" -o '%i|%T|%r|%M|%l') || exit 3
declare -A st
while IFS='|' read -r i s r m l; do
  [ -n "$i" ] || continue
  st[$i]="$s|$r"
  printf 'Q|%s|%s|%s|%s|%s\n' "$i" "$s" "$r" "$m" "$l"
done <<< "$q"
for i in "$@"; do
  f="$d/$i"; e=; k=; c=0; t=; cm=
  {{ read -r e < "$f.exit"; }} 2>/dev/null
  {{ read -r k < "$f.state"; }} 2>/dev/null
  if [ -e "$f.cmd" ]; then
    c=1
    {read_cmd}
    if [ -z "$k" ] && [ -n "${{st[$i]}}" ]; then
      s=${{st[$i]%%|*}}
      case $s in
        {live}) ;;
        COMPLETED|FAILED) [ -n "$e" ] || k=keep ;;
        *) k=keep ;;
      esac
      if [ "$k" = keep ]; then
        j=$(scontrol -o show job "$i" 2>/dev/null); x=
        case $j in *' ExitCode='*) x=${{j#*' ExitCode='}}; x=${{x%% *}} ;; esac
        k="$s|$x|${{st[$i]#*|}}"
        printf '%s\n' "$k" > "$f.state"
      fi
    fi
  fi
  printf 'X|%s|%s|%s|%s|%s|%s\n' "$i" "$c" "$e" "$t" "${{k:-||}}" "$cm"
done
"#
    ));
    s
}

/// What the status command said about one job, before it is mapped.
#[derive(Debug, Default, Clone, PartialEq)]
struct Report {
    /// From `squeue`: state, reason, time used, time limit.
    queue: Option<(String, String, String, String)>,
    /// Its files are ours (`<id>.cmd` exists).
    ours: bool,
    exit: Option<i32>,
    /// From `<id>.state`: state, ExitCode, reason.
    kept: Option<(String, String, String)>,
    submitted_unix: Option<u64>,
    command: Option<String>,
}

fn nonempty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Parses [`status_script`]'s output: the count it reported (lists) and
/// each job's report, in the order of the `X` lines.
fn parse_reports(out: &str) -> (Option<u64>, Vec<(u64, Report)>) {
    let mut count = None;
    let mut queue = std::collections::HashMap::new();
    let mut reports: Vec<(u64, Report)> = Vec::new();
    for line in out.lines() {
        if let Some(n) = line.strip_prefix("N|") {
            count = n.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("Q|") {
            let f: Vec<&str> = rest.splitn(5, '|').collect();
            if let [id, state, reason, used, limit] = f[..]
                && let Ok(id) = id.parse::<u64>()
            {
                queue.insert(
                    id,
                    (
                        state.trim().to_string(),
                        reason.trim().to_string(),
                        used.trim().to_string(),
                        limit.trim().to_string(),
                    ),
                );
            }
        } else if let Some(rest) = line.strip_prefix("X|") {
            let f: Vec<&str> = rest.splitn(8, '|').collect();
            if f.len() != 8 {
                continue;
            }
            let Ok(id) = f[0].parse::<u64>() else {
                continue;
            };
            let kept = nonempty(f[4])
                .map(|state| (state, f[5].trim().to_string(), f[6].trim().to_string()));
            reports.push((
                id,
                Report {
                    queue: None,
                    ours: f[1] == "1",
                    exit: f[2].trim().parse().ok(),
                    kept,
                    submitted_unix: f[3].trim().parse().ok(),
                    command: nonempty(f[7]),
                },
            ));
        }
    }
    for (id, report) in &mut reports {
        report.queue = queue.remove(id);
    }
    (count, reports)
}

/// Slurm's `ExitCode=N:S`: the batch script's exit code and the signal
/// that ended it.
fn parse_exit_code(text: &str) -> (Option<i32>, Option<i32>) {
    let Some((code, sig)) = text.trim().split_once(':') else {
        return (text.trim().parse().ok(), None);
    };
    (code.parse().ok(), sig.parse().ok().filter(|s| *s > 0))
}

fn reason_detail(reason: &str) -> Option<String> {
    let r = reason.trim().trim_start_matches('(').trim_end_matches(')');
    (!r.is_empty() && r != "None" && r != "NonZeroExitCode").then(|| r.to_string())
}

/// An ended job's status from Slurm's final `state` (`CANCELLED by 0` is
/// `CANCELLED`), its `ExitCode` (may be empty), its reason, and the exit
/// file's status, which is exact when present.
fn ended(
    state: &str,
    exit_code: &str,
    reason: &str,
    exit: Option<i32>,
) -> (BatchState, Option<i32>, Option<i32>, Option<String>) {
    let state = state.split_whitespace().next().unwrap_or("");
    match state {
        "COMPLETED" | "FAILED" => match exit {
            Some(code) => (BatchState::Exited, Some(code), None, None),
            None => {
                let (code, signal) = parse_exit_code(exit_code);
                let detail = reason_detail(reason);
                match (code, signal) {
                    (_, Some(sig)) => (BatchState::Exited, None, Some(sig), detail),
                    (Some(code), None) => (BatchState::Exited, Some(code), None, detail),
                    (None, None) => (
                        BatchState::Failed,
                        None,
                        None,
                        Some(detail.unwrap_or_else(|| state.to_string())),
                    ),
                }
            }
        },
        "CANCELLED" => (BatchState::Cancelled, None, None, None),
        "TIMEOUT" => (BatchState::Timeout, None, None, None),
        "OUT_OF_MEMORY" => (BatchState::OutOfMemory, None, None, None),
        // NODE_FAIL, BOOT_FAIL, PREEMPTED, DEADLINE, and any other end.
        other => (BatchState::Failed, None, None, Some(other.to_string())),
    }
}

/// Maps one job's report to Outpost's state; None when the job is neither
/// in Slurm nor among this user's batch files.
fn map_report(job: u64, r: &Report) -> Option<BatchStatus> {
    let mut status = BatchStatus {
        job,
        state: BatchState::Lost,
        exit_code: None,
        signal: None,
        detail: None,
        elapsed: None,
        limit: None,
        submitted_unix: r.submitted_unix,
        command: r.command.clone(),
    };
    if let Some((_, _, used, limit)) = &r.queue {
        status.elapsed = nonempty(used);
        status.limit = nonempty(limit);
    }
    // A kept end is a past job's when Slurm runs one under this id now.
    let queued_live = r.queue.as_ref().is_some_and(|(state, ..)| {
        state == "PENDING" || state.starts_with("REQUEUE") || LIVE_STATES.contains(&state.as_str())
    });
    let kept = r.kept.as_ref().filter(|_| !queued_live);
    let (state, exit_code, signal, detail) = if let Some((state, code, reason)) = kept {
        ended(state, code, reason, r.exit)
    } else if let Some((state, reason, _, _)) = &r.queue {
        match state.as_str() {
            "PENDING" => (BatchState::Pending, None, None, reason_detail(reason)),
            "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESV_DEL_HOLD" => {
                (BatchState::Pending, None, None, Some(state.clone()))
            }
            "SUSPENDED" | "STOPPED" => (BatchState::Running, None, None, Some(state.clone())),
            // The command has ended and said how; Slurm is cleaning up.
            "COMPLETING" if r.exit.is_some() => (BatchState::Exited, r.exit, None, None),
            s if LIVE_STATES.contains(&s) => (BatchState::Running, None, None, None),
            s => ended(s, "", reason, r.exit),
        }
    } else if let Some(code) = r.exit {
        (BatchState::Exited, Some(code), None, None)
    } else if r.ours {
        (
            BatchState::Lost,
            None,
            None,
            Some("Slurm no longer knows it; no exit status".into()),
        )
    } else {
        return None;
    };
    status.state = state;
    status.exit_code = exit_code;
    status.signal = signal;
    status.detail = detail;
    Some(status)
}

/// The status of each of `ids` (in that order; a job unknown here is left
/// out), in one command on the login node.
pub async fn statuses(session: &Session, ids: &[u64]) -> Result<Vec<BatchStatus>, String> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let out = run(session, &status_script(Select::Ids(ids)))
        .await
        .map_err(|e| format!("Slurm status on {}: {e}", session.name()))?;
    let (_, reports) = parse_reports(&out);
    Ok(reports
        .iter()
        .filter_map(|(id, r)| map_report(*id, r))
        .collect())
}

/// The status of one job, or why there is none.
pub async fn status(session: &Session, job: u64) -> Result<BatchStatus, String> {
    statuses(session, &[job])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| unknown(session, job))
}

fn unknown(session: &Session, job: u64) -> String {
    format!(
        "no Slurm batch task {} on {} (not an Outpost batch job of this user)",
        task_name(job),
        session.name()
    )
}

/// This user's newest `limit` (0: many) Outpost batch jobs, oldest first,
/// and how many older ones were left out; nothing when the host has no
/// Slurm.
pub async fn list(session: &Session, limit: u32) -> Result<(Vec<BatchStatus>, u64), String> {
    if session.isolated_in().is_some() {
        return Ok((Vec::new(), 0));
    }
    let out = run(session, &status_script(Select::Newest(limit)))
        .await
        .map_err(|e| format!("Slurm jobs on {}: {e}", session.name()))?;
    let (count, reports) = parse_reports(&out);
    let jobs: Vec<BatchStatus> = reports
        .iter()
        .filter_map(|(id, r)| map_report(*id, r))
        .collect();
    let omitted = count.unwrap_or(0).saturating_sub(reports.len() as u64);
    Ok((jobs, omitted))
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

// ---------------------------------------------------------------- logs

/// Bytes `[from, from + len)` of the job's log, and its size: the command
/// prints the size on the first line, then the bytes (clamped to the size
/// it saw).
async fn log_range(
    session: &Session,
    job: u64,
    from: Option<u64>,
    len: u64,
) -> Result<(u64, u64, Vec<u8>), String> {
    // from None: the last `len` bytes.
    let start = match from {
        Some(from) => format!("o={from}"),
        None => format!("o=$(( s > {len} ? s - {len} : 0 ))"),
    };
    let script = format!(
        "f={DIR_WORD}/{job}.log\n\
         [ -e \"$f\" ] || {{ echo '0 0'; exit 0; }}\n\
         s=$(stat -c %s -- \"$f\") || exit 3\n\
         {start}\n\
         [ \"$o\" -le \"$s\" ] || o=$s\n\
         n=$(( s - o )); [ \"$n\" -le {len} ] || n={len}\n\
         echo \"$s $o\"\n\
         [ \"$n\" -eq 0 ] || tail -c +$(( o + 1 )) -- \"$f\" | head -c \"$n\"\n"
    );
    let out = run_raw(session, &script, None).await.map_err(|e| {
        format!(
            "reading the log of {} on {}: {e}",
            task_name(job),
            session.name()
        )
    })?;
    let nl = out
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| "no log size in the answer".to_string())?;
    let head = String::from_utf8_lossy(&out[..nl]).into_owned();
    let (size, offset) = head
        .split_once(' ')
        .and_then(|(s, o)| Some((s.parse().ok()?, o.parse().ok()?)))
        .ok_or_else(|| format!("bad log header {head:?}"))?;
    Ok((size, offset, out[nl + 1..].to_vec()))
}

/// A page of the job's log, as `read_background_log` reads an agent job's:
/// from `offset`, the last `tail_lines` lines, or only the lines matching
/// `grep` (Rust regex syntax, as for agent jobs); at most `max_bytes`.
pub async fn read_log(
    session: &Session,
    job: u64,
    offset: Option<u64>,
    tail_lines: Option<u32>,
    grep: Option<&str>,
    max_bytes: u64,
) -> Result<LogPage, String> {
    let max = max_bytes.clamp(1, MAX_READ);
    let re = grep
        .map(|p| Regex::new(p).map_err(|e| format!("bad grep regex: {e}")))
        .transpose()?;
    match (offset, tail_lines, re) {
        (None, Some(lines), None) => {
            let (size, start, data) = log_range(session, job, None, max).await?;
            let (cut, data) = last_lines(&data, start == 0, lines);
            Ok(LogPage {
                offset: start + cut,
                next_offset: size,
                data,
                size,
            })
        }
        (None, Some(lines), Some(re)) => {
            let (size, start, data) = log_range(session, job, None, MAX_READ).await?;
            let from = if start == 0 {
                0
            } else {
                first_line_start(&data)
            };
            let mut matched: Vec<&[u8]> = line_spans(&data[from..])
                .filter(|line| re.is_match(&String::from_utf8_lossy(line)))
                .collect();
            let keep = matched.len().saturating_sub(lines as usize);
            matched.drain(..keep);
            let mut out = matched.concat();
            if out.len() as u64 > max {
                out.drain(..out.len() - max as usize);
            }
            Ok(LogPage {
                data: out,
                offset: start + from as u64,
                next_offset: size,
                size,
            })
        }
        (offset, _, Some(re)) => {
            let from = offset.unwrap_or(0);
            let (size, start, data) = log_range(session, job, Some(from), MAX_READ).await?;
            let mut out = Vec::new();
            let mut consumed = 0usize;
            for line in line_spans(&data) {
                // Only whole lines: the rest is read next time.
                if !line.ends_with(b"\n") {
                    break;
                }
                if re.is_match(&String::from_utf8_lossy(line)) {
                    if (out.len() + line.len()) as u64 > max {
                        break;
                    }
                    out.extend_from_slice(line);
                }
                consumed += line.len();
            }
            Ok(LogPage {
                data: out,
                offset: start,
                next_offset: start + consumed as u64,
                size,
            })
        }
        (offset, _, None) => {
            let (size, start, data) =
                log_range(session, job, Some(offset.unwrap_or(0)), max).await?;
            Ok(LogPage {
                next_offset: start + data.len() as u64,
                offset: start,
                data,
                size,
            })
        }
    }
}

/// The lines of `data`, each with its newline (the last may lack one).
fn line_spans(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split_inclusive(|b| *b == b'\n')
}

/// Where the first whole line of a window that may start mid-line begins.
fn first_line_start(data: &[u8]) -> usize {
    data.iter()
        .position(|b| *b == b'\n')
        .map_or(data.len(), |i| i + 1)
}

/// The last `lines` lines of a window of a log (`whole`: it starts at the
/// log's start, else its first, partial line is dropped unless it is all
/// there is): how many bytes were cut from its front, and the rest.
fn last_lines(data: &[u8], whole: bool, lines: u32) -> (u64, Vec<u8>) {
    let mut from = if whole { 0 } else { first_line_start(data) };
    if from >= data.len() {
        from = 0;
    }
    let window = &data[from..];
    let body = window.strip_suffix(b"\n").unwrap_or(window);
    let mut cut = 0;
    if lines == 0 {
        cut = window.len();
    } else {
        let mut seen = 0;
        for (i, b) in body.iter().enumerate().rev() {
            if *b == b'\n' {
                seen += 1;
                if seen == lines {
                    cut = i + 1;
                    break;
                }
            }
        }
    }
    ((from + cut) as u64, window[cut..].to_vec())
}

// ---------------------------------------------------------------- wait

/// Matches whole lines of a log as they arrive.
struct LineMatcher {
    re: Regex,
    pos: u64,
    partial: Vec<u8>,
}

impl LineMatcher {
    /// Feeds bytes that follow `pos`; the offset past the first matching
    /// line, if any.
    fn feed(&mut self, data: &[u8]) -> Option<u64> {
        for line in line_spans(data) {
            self.pos += line.len() as u64;
            if !line.ends_with(b"\n") {
                self.partial.extend_from_slice(line);
                // A runaway line is matched by its start only.
                self.partial.truncate(64 << 10);
                continue;
            }
            let matched = if self.partial.is_empty() {
                self.re.is_match(&String::from_utf8_lossy(line))
            } else {
                self.partial.extend_from_slice(line);
                let m = self.re.is_match(&String::from_utf8_lossy(&self.partial));
                self.partial.clear();
                m
            };
            if matched {
                return Some(self.pos);
            }
        }
        None
    }

    fn partial_matches(&self) -> bool {
        !self.partial.is_empty() && self.re.is_match(&String::from_utf8_lossy(&self.partial))
    }
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
mod tests {
    use std::process::Command;

    use super::*;

    fn request(command: &str) -> SubmitRequest {
        SubmitRequest {
            command: command.into(),
            ..SubmitRequest::default()
        }
    }

    #[test]
    fn task_names_are_slurm_job_ids() {
        assert_eq!(job_id("slurm-42"), Some(42));
        assert_eq!(job_id(" slurm-7 "), Some(7));
        for bad in [
            "slurm-",
            "slurm-0",
            "slurm-4x",
            "slurm--1",
            "job-3",
            "slurm-1;id",
            "42",
        ] {
            assert_eq!(job_id(bad), None, "{bad}");
        }
        assert_eq!(task_name(42), "slurm-42");
    }

    /// The batch script of `r` as Slurm would run it (bash, with
    /// SLURM_JOB_ID set to `job`) in a fresh scratch dir, and that dir.
    fn batch_command(r: &SubmitRequest, job: &str) -> (Command, std::path::PathBuf) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("outpost-batch-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "#!/bin/bash\nd={}\n{}",
            shell_quote(&dir.display().to_string()),
            batch_body(r).unwrap()
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(&script)
            .current_dir(&dir)
            .env("SLURM_JOB_ID", job);
        (cmd, dir)
    }

    /// Runs the batch script to its end: its stdout and stderr, and the
    /// exit file.
    fn run_batch(r: &SubmitRequest) -> (String, String, Option<String>, i32) {
        let (mut cmd, dir) = batch_command(r, "77");
        let out = cmd.output().unwrap();
        let exit = std::fs::read_to_string(dir.join("77.exit")).ok();
        assert!(!dir.join("77.exit.tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            exit,
            out.status.code().unwrap_or(-1),
        )
    }

    #[test]
    fn the_batch_script_runs_awkward_commands_exactly_and_records_their_status() {
        let command = "echo \"it's $((6*7))\" '$HOME' `echo tick`; echo err >&2\n#SBATCH --wrap=id\ncat <<'E'\nOUTPOST_BATCH_0\nE\nexit 7";
        let (stdout, stderr, exit, code) = run_batch(&request(command));
        assert_eq!(stdout, "it's 42 $HOME tick\nOUTPOST_BATCH_0\n");
        assert_eq!(stderr, "err\n");
        assert_eq!(exit.as_deref(), Some("7\n"));
        assert_eq!(code, 7);

        // A command killed by a signal: 128+N, as a shell reports it, and
        // nothing in the log but what the command printed.
        let (_, stderr, exit, code) = run_batch(&request("echo before >&2; kill -9 $$"));
        assert_eq!((exit.as_deref(), code), (Some("137\n"), 137));
        assert_eq!(stderr, "before\n");
    }

    /// The batch script as Slurm runs it, in the background: its process
    /// and scratch dir.
    fn spawn_batch(command: &str) -> (std::process::Child, std::path::PathBuf) {
        let (mut cmd, dir) = batch_command(&request(command), "5");
        let child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        (child, dir)
    }

    fn wait_for(path: &std::path::Path) -> String {
        for _ in 0..500 {
            if let Ok(text) = std::fs::read_to_string(path)
                && text.ends_with('\n')
            {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} never appeared", path.display());
    }

    fn alive(pid: &str) -> bool {
        std::path::Path::new(&format!("/proc/{}", pid.trim())).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                .unwrap_or_default()
                .contains(") Z ")
    }

    #[test]
    fn term_reaches_the_command_and_usr1_kills_what_ignores_it() {
        // TERM to the script is passed to the command, which ends by it.
        let (mut child, dir) = spawn_batch("echo $$ > pid; sleep 300");
        let pid = wait_for(&dir.join("pid"));
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        assert_eq!(child.wait().unwrap().code(), Some(143));
        assert_eq!(wait_for(&dir.join("5.exit")), "143\n");
        assert!(!alive(&pid));
        let _ = std::fs::remove_dir_all(&dir);

        // A command that ignores TERM keeps running; USR1 ends all of it.
        let (mut child, dir) = spawn_batch("trap '' TERM; sleep 300 & echo $! > pid; wait");
        let pid = wait_for(&dir.join("pid"));
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(300));
        assert!(alive(&pid), "TERM was ignored");
        assert!(child.try_wait().unwrap().is_none());
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(137));
        assert!(!alive(&pid), "sleep {pid} outlived the KILL");
        // The log gets what the command printed, not the script's notes.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("Killed"), "{stderr}");
        let _ = std::fs::remove_dir_all(&dir);

        // What the command leaves behind ends with it.
        let (mut child, dir) = spawn_batch("sleep 300 & echo $! > pid; exit 4");
        let pid = wait_for(&dir.join("pid"));
        assert_eq!(child.wait().unwrap().code(), Some(4));
        assert!(!alive(&pid), "a leftover sleep {pid} outlived its job");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn env_values_stay_data() {
        let mut r = request("printf '%s|%s|%s' \"$A\" \"$B\" \"$C\"");
        r.env = vec![
            ("A".into(), "it's $(id) `id`".into()),
            ("B".into(), "line1\nline2".into()),
            ("C".into(), String::new()),
        ];
        let (stdout, _, exit, code) = run_batch(&r);
        assert_eq!(stdout, "it's $(id) `id`|line1\nline2|");
        assert_eq!((exit.as_deref(), code), (Some("0\n"), 0));

        for bad in ["A B", "1X", "X;id", "BASH_ENV", "LD_PRELOAD"] {
            let mut r = request("true");
            r.env = vec![(bad.into(), "v".into())];
            assert!(batch_body(&r).unwrap_err().contains("env"), "{bad}");
        }
        assert!(batch_body(&request(" ")).unwrap_err().contains("empty"));
        assert!(batch_body(&request("a\0b")).unwrap_err().contains("NUL"));
    }

    #[test]
    fn values_are_checked_and_quoted_into_sbatch_options() {
        let mut r = request("true");
        r.cwd = Some("~/my proj/it's".into());
        r.time = Some("1:00:00".into());
        r.partition = Some("gpu".into());
        r.gpus = Some(2);
        let args = sbatch_args(None, &r).unwrap();
        assert_eq!(
            args,
            [
                "'--parsable'",
                "--output=\"$HOME/.outpost/batch\"/%j.log",
                "'--job-name=outpost-batch'",
                "'--open-mode=append'",
                "'-N1'",
                "'-n1'",
                "'--time=1:00:00'",
                "'--partition=gpu'",
                "'--gres=gpu:2'",
                "--chdir=\"$HOME\"/'my proj/it'\\''s'",
            ]
        );
        // The cluster's defaults fill in; the call's values win.
        let defaults = SlurmDefaults {
            partition: Some("batch".into()),
            account: Some("lab".into()),
            qos: None,
            time: "30".into(),
            gpu_gres: "gpu:a100".into(),
        };
        let args = sbatch_args(Some(&defaults), &request("true"))
            .unwrap()
            .join(" ");
        assert!(
            args.contains("'--time=30' '--partition=batch' '--account=lab'"),
            "{args}"
        );
        let args = sbatch_args(Some(&defaults), &r).unwrap().join(" ");
        assert!(
            args.contains("'--partition=gpu'") && args.contains("'--gres=gpu:a100:2'"),
            "{args}"
        );
        // With no defaults, nothing is asked that the call did not give.
        let args = sbatch_args(None, &request("true")).unwrap().join(" ");
        assert!(
            !args.contains("--time") && !args.contains("--partition"),
            "{args}"
        );

        for (field, bad) in [
            ("time", "1;id"),
            ("time", "--wrap=id"),
            ("partition", "--wrap=id"),
            ("partition", "a b"),
        ] {
            let mut r = request("true");
            match field {
                "time" => r.time = Some(bad.into()),
                _ => r.partition = Some(bad.into()),
            }
            assert!(sbatch_args(None, &r).is_err(), "{field} {bad}");
        }
        let mut r = request("true");
        r.gpus = Some(5000);
        assert!(sbatch_args(None, &r).is_err());

        assert_eq!(cwd_word("/w/a b"), "'/w/a b'");
        assert_eq!(cwd_word("~"), "\"$HOME\"");
        assert_eq!(cwd_word("rel"), "\"$HOME\"/'rel'");
    }

    #[test]
    fn the_submit_script_is_valid_shell_whatever_the_command() {
        let mut r = request("cat <<'OUTPOST_BATCH_0'\nhi\nOUTPOST_BATCH_0\necho '}' ) \"");
        r.cwd = Some("/tmp/x'y".into());
        r.env = vec![("TOKEN".into(), "s3cret-value".into())];
        let (script, body) = submit_script(None, &r).unwrap();
        // The env's values go on stdin, never in the login node's argv.
        assert!(!script.contains("s3cret"), "{script}");
        assert!(body.contains("s3cret-value"), "{body}");
        let check = Command::new("bash")
            .args(["-n", "-c", &script])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}\n{script}",
            String::from_utf8_lossy(&check.stderr)
        );
        for select in [Select::Ids(&[1, 2, 3]), Select::Newest(50)] {
            let script = status_script(select);
            let check = Command::new("bash")
                .args(["-n", "-c", &script])
                .output()
                .unwrap();
            assert!(
                check.status.success(),
                "{}\n{script}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }

    fn parse(out: &str) -> Vec<BatchStatus> {
        let (_, reports) = parse_reports(out);
        reports
            .iter()
            .filter_map(|(id, r)| map_report(*id, r))
            .collect()
    }

    #[test]
    fn squeue_and_files_map_to_states() {
        let out = "N|9\n\
            Q|11|PENDING|Resources|0:00|1:00:00\n\
            Q|12|RUNNING|None|0:05|UNLIMITED\n\
            Q|13|COMPLETED|None|0:01|1:00\n\
            Q|14|TIMEOUT|TimeLimit|1:01|1:00\n\
            Q|16|COMPLETING|None|0:01|1:00\n\
            X|11|1||||||\n\
            X|12|1||1700000000||||train.py --lr 0.1|x\n\
            X|13|1|7|||||\n\
            X|14|1|||TIMEOUT||TimeLimit|\n\
            X|15|1|0|||||\n\
            X|16|1|3|||||\n\
            X|17|1|||CANCELLED||cancelled|\n\
            X|18|1|||NODE_FAIL|0:0|NodeDown|\n\
            X|19|1|||FAILED|0:15|JobLaunchFailure|\n\
            X|20|1|||OUT_OF_MEMORY|0:125|OutOfMemory|\n\
            X|21|1||||||\n\
            X|22|0||||||\n";
        let (count, _) = parse_reports(out);
        assert_eq!(count, Some(9));
        let s = parse(out);
        let by = |id: u64| {
            s.iter()
                .find(|j| j.job == id)
                .unwrap_or_else(|| panic!("{id}: {s:?}"))
        };
        assert_eq!(by(11).state, BatchState::Pending);
        assert_eq!(by(11).detail.as_deref(), Some("Resources"));
        assert_eq!(by(12).state, BatchState::Running);
        assert_eq!(by(12).elapsed.as_deref(), Some("0:05"));
        assert_eq!(by(12).command.as_deref(), Some("train.py --lr 0.1|x"));
        assert_eq!(by(12).submitted_unix, Some(1_700_000_000));
        assert_eq!(
            (by(13).state, by(13).exit_code),
            (BatchState::Exited, Some(7))
        );
        assert_eq!(by(14).state, BatchState::Timeout);
        assert_eq!(by(14).shell_status(), Some(124));
        // Forgotten by Slurm: the exit file says it all.
        assert_eq!(
            (by(15).state, by(15).exit_code),
            (BatchState::Exited, Some(0))
        );
        assert_eq!(
            (by(16).state, by(16).exit_code),
            (BatchState::Exited, Some(3))
        );
        assert_eq!(by(17).state, BatchState::Cancelled);
        assert_eq!(
            (by(18).state, by(18).detail.as_deref()),
            (BatchState::Failed, Some("NODE_FAIL"))
        );
        assert_eq!(
            (by(19).state, by(19).exit_code, by(19).signal),
            (BatchState::Exited, None, Some(15))
        );
        assert_eq!(by(20).state, BatchState::OutOfMemory);
        assert_eq!(by(21).state, BatchState::Lost);
        // Neither Slurm's nor ours: unknown.
        assert!(s.iter().all(|j| j.job != 22));
    }

    #[test]
    fn slurm_end_states_map_as_documented() {
        for (state, want, detail) in [
            ("CANCELLED", BatchState::Cancelled, None),
            ("CANCELLED by 1000", BatchState::Cancelled, None),
            ("TIMEOUT", BatchState::Timeout, None),
            ("OUT_OF_MEMORY", BatchState::OutOfMemory, None),
            ("NODE_FAIL", BatchState::Failed, Some("NODE_FAIL")),
            ("BOOT_FAIL", BatchState::Failed, Some("BOOT_FAIL")),
            ("PREEMPTED", BatchState::Failed, Some("PREEMPTED")),
            ("DEADLINE", BatchState::Failed, Some("DEADLINE")),
        ] {
            let (got, code, _, d) = ended(state, "", "None", None);
            assert_eq!((got, code, d.as_deref()), (want, None, detail), "{state}");
        }
        // The exit file is exact; Slurm's ExitCode is the fallback.
        assert_eq!(
            ended("FAILED", "1:0", "NonZeroExitCode", Some(3)).1,
            Some(3)
        );
        assert_eq!(ended("FAILED", "2:0", "NonZeroExitCode", None).1, Some(2));
        assert_eq!(ended("COMPLETED", "0:0", "None", None).1, Some(0));
        for s in LIVE_STATES {
            assert!(!["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"].contains(s));
        }
        let names: Vec<&str> = [
            BatchState::Pending,
            BatchState::Running,
            BatchState::Exited,
            BatchState::Cancelled,
            BatchState::Timeout,
            BatchState::OutOfMemory,
            BatchState::Failed,
            BatchState::Lost,
        ]
        .iter()
        .map(|s| s.name())
        .collect();
        assert_eq!(
            names,
            [
                "pending",
                "running",
                "exited",
                "cancelled",
                "timeout",
                "out_of_memory",
                "failed",
                "lost"
            ]
        );
    }

    #[test]
    fn log_windows_cut_at_lines() {
        assert_eq!(last_lines(b"a\nb\nc\n", true, 2), (2, b"b\nc\n".to_vec()));
        assert_eq!(last_lines(b"a\nb\nc", true, 2), (2, b"b\nc".to_vec()));
        assert_eq!(last_lines(b"a\nb\n", true, 5), (0, b"a\nb\n".to_vec()));
        // A window that starts mid-line drops that partial line.
        assert_eq!(last_lines(b"xx\nb\n", false, 5), (3, b"b\n".to_vec()));
        assert_eq!(last_lines(b"x", false, 1), (0, b"x".to_vec()));
        assert_eq!(last_lines(b"a\n", true, 0), (2, Vec::new()));

        let mut m = LineMatcher {
            re: Regex::new("^ep(och)? 3").unwrap(),
            pos: 10,
            partial: Vec::new(),
        };
        assert_eq!(m.feed(b"epoch 1\nepo"), None);
        assert!(!m.partial_matches());
        assert_eq!(m.feed(b"ch 3\nmore\n"), Some(10 + 16));
        let mut m = LineMatcher {
            re: Regex::new("ready").unwrap(),
            pos: 0,
            partial: Vec::new(),
        };
        assert_eq!(m.feed(b"not yet\nready"), None);
        assert!(m.partial_matches());
    }
}
