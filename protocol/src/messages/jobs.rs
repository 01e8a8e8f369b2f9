//! What outlives one request: terminals and code contexts (held by the
//! daemon) and background jobs.

use serde::{Deserialize, Serialize};

use super::CapturedOutput;

/// What a `Terminal` request does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TermRequest {
    /// `command` under `bash -c` on a new pseudo-terminal of this size.
    Open {
        command: String,
        cols: u16,
        rows: u16,
    },
    /// Bytes to type; the screen answered once output settles (at most
    /// `wait_ms`).
    Send {
        id: String,
        data: Vec<u8>,
        wait_ms: u32,
    },
    /// The screen, once there is output not yet read or `wait_ms` passed.
    Read {
        id: String,
        wait_ms: u32,
    },
    Resize {
        id: String,
        cols: u16,
        rows: u16,
    },
    /// Hang up (SIGHUP to its session, SIGKILL after a grace) and forget it.
    Close {
        id: String,
    },
}

impl TermRequest {
    /// How long the daemon may take to answer it.
    pub fn wait_ms(&self) -> u32 {
        match self {
            TermRequest::Send { wait_ms, .. } | TermRequest::Read { wait_ms, .. } => *wait_ms,
            _ => 0,
        }
    }
}

/// A terminal as its emulator renders it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermScreen {
    pub id: String,
    /// The visible rows, trailing blanks trimmed.
    pub screen: String,
    /// Lines that scrolled off the top since the last answer.
    pub scrollback: Vec<String>,
    /// (row, col), from 0.
    pub cursor: (u16, u16),
    /// Set once its command ended: the exit code, or 128 + the signal.
    pub exit_code: Option<i32>,
}

/// Languages a code context speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CodeLanguage {
    /// A Python interpreter (the host's `python3`): the last expression's
    /// value comes back as a result, open matplotlib figures as PNGs.
    #[default]
    Python,
    /// A bash shell: `cd` and variables stick between runs.
    Bash,
}

impl CodeLanguage {
    pub fn name(self) -> &'static str {
        match self {
            CodeLanguage::Python => "python",
            CodeLanguage::Bash => "bash",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeRun {
    /// `[A-Za-z0-9._-]`, at most 64 bytes. One name, one language.
    pub context: String,
    pub language: CodeLanguage,
    /// Empty: wait for the result of the context's last run, which outlived
    /// the `wait_ms` of the call that started it.
    pub code: String,
    /// Variables for this run only (set before it, put back after it).
    pub env: Vec<(String, String)>,
    /// After this long the run is interrupted (SIGINT; state kept), and
    /// after a grace the interpreter is restarted. 0: no limit.
    pub timeout_ms: u64,
    /// Answer after this long even if the run goes on (`running`); a later
    /// run with empty code collects it. 0: when the run ends.
    pub wait_ms: u64,
    /// Bytes kept per stream (half head, half tail), clamped to
    /// [`crate::limits::MAX_CODE_OUTPUT_LIMIT`].
    pub output_limit: u64,
}

/// How a run went, shaped like E2B's `Execution`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeExecution {
    /// Displayed values: `display()` calls and figures in order, then the
    /// last expression's value (`is_main_result`).
    pub results: Vec<CodeResult>,
    pub stdout: CapturedOutput,
    pub stderr: CapturedOutput,
    pub error: Option<CodeError>,
    /// Runs of this context so far, this one included (1 after a restart).
    pub execution_count: u32,
    pub duration_ms: u64,
    /// Still running after `wait_ms`; everything else is empty.
    pub running: bool,
    /// Interrupted at its timeout (`error` is the `KeyboardInterrupt`).
    pub timed_out: bool,
    /// The interpreter was restarted (it died, or ignored the interrupt);
    /// its state is gone. Says why.
    pub restarted: Option<String>,
}

/// One displayed value as a MIME bundle: `text/plain`, `text/html`,
/// `image/png` (base64), `image/svg+xml`, `application/json`, …
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeResult {
    pub data: Vec<(String, String)>,
    pub is_main_result: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeError {
    /// The exception's class, e.g. `ZeroDivisionError`.
    pub name: String,
    pub value: String,
    pub traceback: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeContextInfo {
    pub name: String,
    pub language: CodeLanguage,
    /// `idle`, `running`, or `stopped` (no interpreter until the next run).
    pub state: String,
    pub execution_count: u32,
    pub pid: Option<i32>,
    /// Resident memory of the interpreter and its children.
    pub rss_bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub last_used_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CodeAction {
    /// SIGINT to the running code (`KeyboardInterrupt`); state kept.
    Interrupt,
    /// A fresh interpreter on the next run; state gone.
    Restart,
    /// End the interpreter and forget the context.
    Remove,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeInstall {
    /// Requirement specifiers (`numpy`, `pandas==2.2`, `torch>=2`); none may
    /// start with `-`.
    pub packages: Vec<String>,
    pub timeout_ms: Option<u64>,
    pub output_limit: u64,
    pub progress_ms: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    Running,
    /// Ended by itself: exit_code or signal says how.
    Exited,
    /// Ended by `JobCancel`.
    Cancelled,
    /// No exit record and no live process (reboot, killed shim); a resume
    /// may follow.
    Lost,
}

/// How to resume a job found lost, as remote-sandbox-mcp's watch parameters
/// describe it. All optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSpec {
    pub run_id: Option<String>,
    pub watch_name: Option<String>,
    pub resume_command: Option<String>,
    pub resume_plan_json: Option<String>,
    pub checkpoint_path: Option<String>,
    /// "text" or "json".
    pub checkpoint_format: Option<String>,
    pub checkpoint_command: Option<String>,
    pub auto_resume: bool,
    pub max_resume_attempts: u32,
    pub resume_delay_s: u64,
    pub alert_after_failures: u32,
    pub interval_s: u64,
    pub metadata_json: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Unique among live and recorded jobs; None: the agent picks one.
    pub name: Option<String>,
    pub command: String,
    /// `~` is the home. None: the home.
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    /// Where the output goes; None: the job's own directory.
    pub log_file: Option<String>,
    pub watch: WatchSpec,
    // The fields below came with protocol 8; `default` lets an agent read
    // the job records older agents wrote (JSON, on the host).
    /// The shim terminates the job's whole tree after this long and records
    /// `timed_out`. None: no limit.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Besides the merged log, keep stdout and stderr apart in the job's
    /// directory, for `JobCollect`.
    #[serde(default)]
    pub split_streams: bool,
    /// Bytes the command reads on stdin (at most
    /// [`crate::limits::MAX_STDIN_LEN`]). None: /dev/null.
    #[serde(default, with = "serde_bytes")]
    pub stdin: Option<Vec<u8>>,
    /// Run inside this sandbox (protocol 9).
    #[serde(default)]
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub name: String,
    pub command: String,
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub pid: Option<u32>,
    pub started_unix: u64,
    pub ended_unix: Option<u64>,
    pub log_file: String,
    pub log_size: u64,
    pub resume_attempts: u32,
    pub watch: WatchSpec,
    /// Ended by its `timeout_ms`.
    pub timed_out: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCollect {
    pub name: String,
    /// Bytes kept per stream, as in [`super::ExecRequest::output_limit`].
    pub output_limit: u64,
    /// Delete the job's record once read if it ended and its end is not
    /// already a background job's (an event).
    pub remove_if_ended: bool,
    /// A running job is detached from its call: a background job from then
    /// on, whose start and end are events. Without it, the job stays its
    /// call's (a call that gives up on it cancels it first).
    pub detach: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobWait {
    pub name: String,
    /// Log offset the caller has read up to; output after it is returned.
    pub cursor: u64,
    pub timeout_ms: u64,
    /// Return when new output matches this regex.
    pub pattern: Option<String>,
    /// Return when no new output arrived for this long.
    pub silence_ms: Option<u64>,
    /// Most output bytes to return (the tail is kept).
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    Ended,
    Matched,
    Silent,
    TimedOut,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobWaited {
    pub job: JobInfo,
    pub reason: WaitReason,
    /// Output between the cursor and `cursor_after` (its tail, if longer than
    /// max_bytes; `omitted` says how much was skipped).
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    pub omitted: u64,
    pub cursor_after: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRead {
    pub name: String,
    /// Start here; None with `tail_lines`: that many last lines.
    pub offset: Option<u64>,
    pub tail_lines: Option<u32>,
    /// Only lines matching this regex (searched on the host).
    pub grep: Option<String>,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLog {
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Where `data` starts in the log (for grep: where the scan started).
    pub offset: u64,
    /// Where the next page starts.
    pub next_offset: u64,
    pub log_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Increasing across all jobs of the host.
    pub seq: u64,
    pub job: String,
    /// started, completed, failed, cancelled, interrupted, resume_started,
    /// resume_failed.
    pub kind: String,
    pub at_unix: u64,
    pub detail: String,
}
