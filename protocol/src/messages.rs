//! Every message of the protocol, in one place.
//!
//! Direction and order:
//! 1. The agent sends [`Hello`] as its first frame (decoded on its own, so its
//!    leading `protocol_version` field stays readable across versions).
//! 2. The controller sends [`ClientMessage::Request`]s with ids it chooses; many may
//!    be in flight at once. [`ClientMessage::Cancel`] asks the agent to stop one.
//! 3. The agent answers each request with zero or more streaming
//!    [`AgentMessage::Response`]s ([`Response::Output`]) and exactly one final one
//!    ([`Response::is_final`]), sent only after all output has been drained.
//!
//! Rule for evolving this file: append enum variants and bump
//! [`crate::PROTOCOL_VERSION`] for any other change.

use serde::{Deserialize, Serialize};

/// Chosen by the controller, unique among the requests in flight on one stream.
pub type RequestId = u64;

/// First frame from the agent. Field order matters: `protocol_version` must stay
/// first so that any controller can read it from any agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    /// The agent's crate version, e.g. `0.1.0`.
    pub agent_version: String,
    /// BLAKE3 of the agent's own executable file, hex. The controller compares it
    /// with the artifact it meant to run to detect a corrupt or stale install.
    pub build_hash: String,
    pub os: String,
    pub arch: String,
    /// `glibc 2.36`, `musl`, or `unknown`.
    pub libc: String,
    pub capabilities: Vec<String>,
    pub pid: u32,
}

/// Only the leading field of [`Hello`]; decodes from any agent's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloVersion {
    pub protocol_version: u32,
}

/// Controller → agent.
// Messages are built once and moved once; boxing the large variants would only
// add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientMessage {
    Request {
        id: RequestId,
        body: Request,
    },
    /// Stop the request with this id. Its final response still follows.
    Cancel {
        id: RequestId,
    },
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Run a bash command. Answered by `Output*` (when `stream`) then `ExecDone`.
    Exec(ExecRequest),
    /// Liveness check. Answered by `Pong`.
    Ping,
    /// Host resource snapshot. Answered by `Metrics`. The first request starts
    /// a sampler (about once a second) that lives as long as this agent.
    Metrics,
    /// Reserve `count` GPUs for this connection. Answered by `GpuLease`. The
    /// lease is recorded on the host, so every controller sees it, and ends on
    /// `GpuRelease` or when this agent (the connection) goes.
    GpuLease(GpuLeaseRequest),
    /// End a lease. Answered by `Released`.
    GpuRelease { lease_id: String },
    /// Describe a tree. Answered by `Entries*` then `ScanDone`.
    Scan(ScanRequest),
    /// Write whole files atomically. Answered by `Applied`.
    PutFiles(PutFiles),
    /// Stage part of a large file (at an explicit offset, so parts may be
    /// applied in any order) for a later `PutFiles` with `Staged` content.
    /// Answered by `Ack`.
    PutPart(PutPart),
    /// Directories, symlinks, attributes and removals. Answered by `Applied`.
    ApplyMeta(ApplyMeta),
    /// Read files or ranges of them. Answered by `FileData*` then `ReadDone`.
    ReadFiles(ReadFiles),
    /// Start a background job under the per-user daemon. Answered by `Job`.
    JobStart(JobSpec),
    /// One job's state. Answered by `Job`.
    JobStatus { name: String },
    /// Jobs, optionally only those in one state. Answered by `Jobs`.
    /// The newest `limit` (0: as many as fit an answer), newest first.
    JobList { state: Option<JobState>, limit: u32 },
    /// TERM to the job's whole tree, KILL after `grace_ms`. Answered by `Job`.
    JobCancel { name: String, grace_ms: u64 },
    /// Block until the job ends, its new output matches, or it is silent.
    /// Answered by `JobWaited`.
    JobWait(JobWait),
    /// Page through a job's log. Answered by `JobLog`.
    JobRead(JobRead),
    /// Job events after a sequence number. Answered by `JobEvents`.
    JobEvents {
        name: Option<String>,
        after_seq: u64,
        limit: u32,
    },
    /// Begin staging a large file by adopting the partial file an interrupted
    /// transfer of the same content left (a scan lists them). Answered by
    /// `Resumed`; later `PutPart`s with the same `xfer` fill in the rest.
    Resume(Resume),
    /// A job's outcome shaped like an exec's: exit status and each stream's
    /// head and tail (the job must have been started with `split_streams`;
    /// while it runs, the output so far). Answered by `JobCollected`.
    JobCollect(JobCollect),
    /// Make an isolated, expiring sandbox on this host. Answered by `Sandbox`
    /// once it can run commands.
    SandboxCreate(SandboxSpec),
    /// This user's sandboxes on this host, live and recently ended.
    /// Answered by `Sandboxes`.
    SandboxList,
    /// Expire `ttl_ms` from now. Answered by `Sandbox`.
    SandboxRenew { id: String, ttl_ms: u64 },
    /// End every process of the sandbox and remove its files (unless it
    /// keeps them). Answered by `Sandbox`.
    SandboxDelete { id: String },
    /// Run `request` inside sandbox `id`: commands and jobs start in its
    /// isolation, file roots are confined to its directories (relative
    /// roots are its work dir). Answered as `request` is.
    InSandbox { id: String, request: Box<Request> },
    /// Run code in an interpreter of this host or sandbox that keeps its
    /// state between runs (a context, made on first use and held by the job
    /// daemon, so it outlives this connection). Answered by `CodeRan`.
    CodeRun(CodeRun),
    /// This host's or sandbox's code contexts. Answered by `CodeContexts`.
    CodeContexts,
    /// Interrupt, restart or remove a context. Answered by `CodeContexts`.
    CodeControl { context: String, action: CodeAction },
    /// Install Python packages into this host's or sandbox's virtual
    /// environment (made on first use; `uv` when the host has it, else
    /// pip), where the next `CodeRun` finds them. Answered like `Exec`
    /// (`ExecProgress` when `progress_ms`, then `ExecDone`).
    CodeInstall(CodeInstall),
    /// The hash and chunk list of each of these regular files under `root`
    /// (symlinks never followed). Answered by `Entries*` then `ScanDone`,
    /// whose problems name the paths that could not be described.
    DescribeFiles { root: String, paths: Vec<RelPath> },
    /// Freeze every command of sandbox `id`; with `stop_clock` its TTL
    /// waits too. New commands are refused until `SandboxResume`.
    /// Answered by `Sandbox`.
    SandboxPause { id: String, stop_clock: bool },
    /// Thaw what `SandboxPause` froze. Answered by `Sandbox`.
    SandboxResume { id: String },
    /// Copy sandbox `id`'s work dir, its commands frozen meanwhile.
    /// Answered by `Checkpoint`.
    SandboxCheckpoint { id: String, label: Option<String> },
    /// Its checkpoints, oldest first. Answered by `Checkpoints`.
    SandboxCheckpoints { id: String },
    /// Make the work dir (or only `paths` in it) as it was at checkpoint
    /// `number`. Answered by `Restored`.
    SandboxRestore {
        id: String,
        number: u32,
        paths: Vec<String>,
    },
    /// What changed in the work dir since checkpoint `number`. Answered by
    /// `CheckpointDiff`.
    SandboxDiff { id: String, number: u32 },
    /// A new sandbox with `id`'s settings and a copy of its work dir, both
    /// going on independently. Answered by `Sandbox` (the new one).
    SandboxFork { id: String },
    /// Serve `port` of sandbox `id` (its own loopback) on a unix socket of
    /// this host for as long as the sandbox lives. Answered by `Exposed`.
    SandboxExpose { id: String, port: u16 },
    /// A terminal of this host or sandbox, held by the daemon (so it
    /// outlives this connection). Answered by `Terminal`.
    Terminal(TermRequest),
}

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

impl Request {
    /// Whether it makes, lists or changes a sandbox as a whole (not a
    /// request run inside one).
    pub fn is_sandbox_lifecycle(&self) -> bool {
        matches!(
            self,
            Request::SandboxCreate(_)
                | Request::SandboxList
                | Request::SandboxRenew { .. }
                | Request::SandboxDelete { .. }
                | Request::SandboxPause { .. }
                | Request::SandboxResume { .. }
                | Request::SandboxCheckpoint { .. }
                | Request::SandboxCheckpoints { .. }
                | Request::SandboxRestore { .. }
                | Request::SandboxDiff { .. }
                | Request::SandboxFork { .. }
                | Request::SandboxExpose { .. }
        )
    }

    /// The content a `PutPart` carries, inside a sandbox's wrapper too: the
    /// byte string a frame may write after its head (see
    /// [`crate::codec::encode_frame_with_tail`]).
    pub fn content_mut(&mut self) -> Option<&mut Vec<u8>> {
        match self {
            Request::PutPart(PutPart {
                data: PartData::Data(data),
                ..
            }) => Some(data),
            Request::InSandbox { request, .. } => request.content_mut(),
            _ => None,
        }
    }
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
    /// Bytes kept per stream, as in [`ExecRequest::output_limit`].
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

/// A path relative to a sync root, as raw bytes (names need not be UTF-8).
pub type RelPath = Vec<u8>;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanRequest {
    /// The tree's root on the host; `~` is the home.
    pub root: String,
    pub filter: FilterSpec,
    /// Include content hashes. Listings that only show names and sizes
    /// leave it off.
    pub hashes: bool,
    /// With `hashes`, also the chunk lists of large files. A sync leaves
    /// them out (on a no-op they would be most of the answer) and asks
    /// `DescribeFiles` for those of the files it finds changed.
    pub chunk_lists: bool,
    /// Descend into subdirectories.
    pub recursive: bool,
    /// Stop after this many entries (0: no limit); `ScanDone.truncated` says so.
    pub max_entries: u64,
    /// The [`ScanSummary::digest`] of an earlier answer the caller keeps:
    /// when this scan's is the same, no `Entries` come (`ScanDone.unchanged`);
    /// when the host kept that answer too, only what changed since
    /// (`ScanDone.delta`).
    pub known: Option<[u8; 32]>,
}

/// Which paths a scan skips. Patterns use gitignore syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterSpec {
    pub excludes: Vec<String>,
    /// Also honour `.gitignore` files inside the tree.
    pub use_gitignore: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink {
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub kind: EntryKind,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    /// BLAKE3 of the content (files, when hashes were asked for).
    pub hash: Option<[u8; 32]>,
    /// Content-defined chunks of large files (when hashes were asked for).
    pub chunks: Vec<ChunkRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub offset: u64,
    pub len: u32,
    pub hash: [u8; 32],
}

/// A problem with one path; the rest of the operation goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathProblem {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanSummary {
    pub root_exists: bool,
    pub truncated: bool,
    pub problems: Vec<PathProblem>,
    /// Partial files of interrupted transfers that a `Resume` can adopt
    /// (hashing scans only).
    pub partials: Vec<Partial>,
    /// BLAKE3 of the entries and the fields above, for a complete hashing
    /// scan: what a later scan's `known` names.
    pub digest: Option<[u8; 32]>,
    /// The entries are those of the request's `known`, and none were sent.
    pub unchanged: bool,
    /// The entries sent are only those added or changed since the request's
    /// `known`, and `removed` the paths gone since; `digest` is still the
    /// whole scan's.
    pub delta: bool,
    pub removed: Vec<RelPath>,
}

/// The partial content of an interrupted transfer, by the directory of the
/// file it was for and the identity of the content it was becoming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    #[serde(with = "serde_bytes")]
    pub dir: RelPath,
    /// The first 16 bytes of the BLAKE3 hash of the complete content.
    pub hash_prefix: [u8; 16],
    /// The complete content's size.
    pub size: u64,
}

/// What a replaced path must still look like for the write to go ahead, so a
/// file changed underneath since the scan is never overwritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// Write regardless.
    Any,
    /// Nothing may exist at the path.
    Absent,
    /// The path holds a file with this size and mtime.
    File { size: u64, mtime_ns: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileContent {
    /// The whole content, encoded by `outpost_treesync::codec` (zstd or stored).
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Assembled earlier by `PutPart`s with this transfer id.
    Staged { xfer: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePut {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub mode: u32,
    pub mtime_ns: i64,
    pub size: u64,
    /// BLAKE3 of the content; the file is committed only if it matches.
    pub hash: [u8; 32],
    pub expect: Expect,
    pub content: FileContent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutFiles {
    pub root: String,
    /// Create missing parent directories (0755 before umask).
    pub create_parents: bool,
    pub files: Vec<FilePut>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartData {
    /// Bytes, encoded by `outpost_treesync::codec` (zstd or stored).
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Bytes already in the current file at `path`, from this offset.
    Copy { from_offset: u64, len: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutPart {
    pub root: String,
    pub xfer: u64,
    /// The file being replaced (source of `Copy` parts) and the staging
    /// file's directory.
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    /// Where the part goes in the new file.
    pub offset: u64,
    /// The whole new file's hash and size: they name its staging file, so
    /// that an interrupted transfer can be resumed by a later one.
    pub hash: [u8; 32],
    pub size: u64,
    /// Last, so that content is encoded last: a frame can be its head, then
    /// content shared with other hosts' frames ([`Request::content_mut`]).
    pub data: PartData,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    pub root: String,
    pub xfer: u64,
    /// The file being replaced; the partial sits in its directory.
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub hash: [u8; 32],
    pub size: u64,
    /// The new content's chunks: the answer lists those the partial already
    /// holds, checked by hash.
    pub chunks: Vec<ChunkRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    Mkdir {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        mode: u32,
    },
    Symlink {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
    SetAttrs {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        mode: u32,
        mtime_ns: i64,
    },
    /// Remove a file, symlink, or directory tree (never following symlinks).
    Remove {
        #[serde(with = "serde_bytes")]
        path: RelPath,
    },
    /// End a transfer that will not be committed: its resumable partial is
    /// kept (and unlocked) for the next transfer of the same content, other
    /// staging files are removed.
    Abort { xfer: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyMeta {
    pub root: String,
    pub ops: Vec<MetaOp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    pub done: u32,
    pub problems: Vec<PathProblem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSpec {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    /// (offset, length) ranges; None: the whole file.
    pub ranges: Option<Vec<(u64, u64)>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFiles {
    pub root: String,
    pub reads: Vec<ReadSpec>,
}

/// How strongly a sandbox is kept apart from the rest of the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Isolation {
    /// Asked for: the strongest rung this host reaches.
    #[default]
    Auto,
    /// bubblewrap: own mount, pid, ipc and uts namespaces (and network,
    /// when off), read-only `/`, the real home hidden.
    Bwrap,
    /// Landlock (writes only to the sandbox, the home unreadable) plus a
    /// seccomp filter on network sockets when the network is off.
    Landlock,
    /// Its own directories only: not isolated.
    None,
}

/// Resource limits of a sandbox; None: no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLimits {
    pub memory_mb: Option<u64>,
    /// Thousandths of a CPU.
    pub cpu_millis: Option<u32>,
    pub pids: Option<u32>,
    pub disk_mb: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// None: the agent picks `sbx-` and 4 hex digits.
    pub id: Option<String>,
    pub ttl_ms: u64,
    pub isolation: Isolation,
    pub network: bool,
    pub limits: SandboxLimits,
    /// GPUs to lease for the sandbox's life.
    pub gpus: u32,
    /// Environment of every command run in it.
    pub env: Vec<(String, String)>,
    /// Leave its files on the host when it ends.
    pub keep_files: bool,
    /// Live sandboxes this user may have on the host, this one included
    /// (0: no cap).
    pub max_sandboxes: u32,
    /// With `network: false` under bwrap: the only places its commands
    /// reach, through the agent's HTTP proxy (`name`, `*.suffix`, either
    /// with `:port`).
    pub allow_hosts: Vec<String>,
    /// For an agent running as root: the uids (first, last) its isolated
    /// sandboxes may run as, from the host's config; None: the agent's
    /// default range.
    pub sandbox_uids: Option<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    /// Being set up or running.
    Running,
    /// Its TTL passed.
    Expired,
    Deleted,
    /// Could not be kept running (its isolation or supervisor failed).
    Failed,
    /// Its commands frozen by `SandboxPause`.
    Paused,
}

/// How a copy of a work dir went (a checkpoint, a restore or a fork).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyReport {
    /// Files (and symlinks) written, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Of those, files that share their content copy-on-write.
    pub cloned: u64,
    /// Of those, files unchanged since the previous checkpoint, which share
    /// its copy (a checkpoint is never written in place).
    #[serde(default)]
    pub unchanged: u64,
    /// Entries removed (a restore).
    pub removed: u64,
    /// Entries that are no file, directory or symlink, left out.
    pub skipped: Vec<String>,
    pub took_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// 1, 2, … within its sandbox.
    pub number: u32,
    pub label: Option<String>,
    pub created_unix: u64,
    pub copy: CopyReport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Added,
    Changed,
    Removed,
}

/// One path that differs from a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathChange {
    pub path: String,
    pub change: Change,
    /// Its size now (before, for a removed one).
    pub size: u64,
    /// A unified diff, for small text files that changed.
    pub diff: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub state: SandboxState,
    pub created_unix: u64,
    pub expires_unix: u64,
    /// What applies, never `Auto`.
    pub isolation: Isolation,
    pub network: bool,
    pub limits: SandboxLimits,
    /// How the limits are enforced: `cgroup v2`, `cgroup v1`, or
    /// `rlimits+watchdog` (and what is not enforced).
    pub enforcement: String,
    /// Leased GPU indices.
    pub gpus: Vec<u32>,
    /// Where commands start, on the host and inside.
    pub work_dir: String,
    /// Files left on the host after the end.
    pub kept_files: bool,
    /// Ports served by `SandboxExpose`.
    pub ports: Vec<u16>,
    /// Why it ended, or what its isolation lacks.
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuLeaseRequest {
    pub count: u32,
    /// Only GPUs with at least this much free memory qualify.
    pub min_free_mem_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Passed to `bash -c`.
    pub command: String,
    /// Working directory; `~` and `~/…` are expanded on the host. None: home.
    pub cwd: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Bytes written to the command's stdin, which is then closed. None: /dev/null.
    #[serde(with = "serde_bytes")]
    pub stdin: Option<Vec<u8>>,
    /// After this long the whole process tree is terminated. None: no limit.
    pub timeout_ms: Option<u64>,
    /// Bytes kept per stream (half head, half tail); the agent clamps it to
    /// [`crate::limits::MAX_EXEC_OUTPUT_LIMIT`].
    pub output_limit: u64,
    /// Also send output as it arrives (`Response::Output`); the captured output in
    /// `ExecDone` is then empty.
    pub stream: bool,
    /// Send `Response::ExecProgress` this often (at least 100 ms apart, the
    /// first one period in) until the command ends. None: no progress.
    pub progress_ms: Option<u32>,
    /// Still running after this long, the command becomes the background job
    /// `job` instead of ending (answered by `ExecHandedOver`). None: it runs
    /// inline to its end. Not with `stream`.
    pub hand_over: Option<HandOver>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandOver {
    pub after_ms: u64,
    /// The job's name, chosen by the caller so that a call dropped while the
    /// answer is on its way can still cancel the job.
    pub job: String,
}

/// How far a running command has got (not final): what a person watching
/// its terminal would see at a glance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecProgress {
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Newlines written to either stream.
    pub lines: u64,
    /// The last non-empty line either stream completed (or the partial line
    /// being written), cut to [`crate::limits::PROGRESS_LINE_LEN`] bytes.
    pub last_line: String,
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Agent → controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    Response { id: RequestId, body: Response },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// A chunk of streamed output (not final).
    Output {
        stream: OutputStream,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    ExecDone(ExecResult),
    Pong,
    Metrics(HostMetrics),
    Error(AgentError),
    GpuLease(GpuLease),
    Released,
    /// Part of a scan (not final).
    Entries(Vec<TreeEntry>),
    ScanDone(ScanSummary),
    Applied(ApplyReport),
    Ack,
    /// Part of a read (not final): bytes of `reads[index]` at `offset`,
    /// encoded by `outpost_treesync::codec`.
    FileData {
        index: u32,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    ReadDone {
        problems: Vec<PathProblem>,
    },
    /// Answer to `JobStart`, `JobStatus` and `JobCancel`.
    Job(JobInfo),
    /// Answer to `JobList`: newest first, and how many older jobs matched
    /// but were left out.
    Jobs {
        jobs: Vec<JobInfo>,
        omitted: u64,
    },
    /// Answer to `JobWait`.
    JobWaited(JobWaited),
    /// Answer to `JobRead`.
    JobLog(JobLog),
    /// Answer to `JobEvents`, oldest first.
    JobEvents(Vec<JobEvent>),
    /// Answer to `Resume`: indices of the chunks already in place (none when
    /// there was nothing to adopt).
    Resumed {
        present: Vec<u32>,
    },
    /// Part of an exec with `progress_ms` (not final).
    ExecProgress(ExecProgress),
    /// Answer to `JobCollect`.
    JobCollected {
        job: JobInfo,
        result: ExecResult,
    },
    /// Answer to `SandboxCreate`, `SandboxRenew` and `SandboxDelete`.
    Sandbox(SandboxInfo),
    /// Answer to `SandboxList`, newest first.
    Sandboxes(Vec<SandboxInfo>),
    /// Answer to `CodeRun`.
    CodeRan(CodeExecution),
    /// Answer to `CodeContexts` and `CodeControl`.
    CodeContexts(Vec<CodeContextInfo>),
    /// Answer to an `Exec` with `hand_over` still running at its time: from
    /// now on the background job `job`; `so_far` holds its output until now.
    ExecHandedOver {
        job: String,
        so_far: ExecResult,
    },
    /// Answer to an `Exec` with `hand_over` that could not become a job (a
    /// full disk, say): it was stopped then, and `why` says why.
    ExecCutShort {
        result: ExecResult,
        why: String,
    },
    /// Answer to `SandboxCheckpoint`.
    Checkpoint(CheckpointInfo),
    /// Answer to `SandboxCheckpoints`.
    Checkpoints(Vec<CheckpointInfo>),
    /// Answer to `SandboxRestore`.
    Restored(CopyReport),
    /// Answer to `SandboxDiff`: the first changes by path, and how many
    /// more there are.
    CheckpointDiff {
        changes: Vec<PathChange>,
        more: u64,
    },
    /// Answer to `SandboxExpose`: the socket that reaches the port.
    Exposed {
        socket: String,
    },
    /// Answer to `Terminal`.
    Terminal(TermScreen),
}

impl Response {
    /// Whether this response ends its request.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Response::Output { .. }
                | Response::Entries(_)
                | Response::FileData { .. }
                | Response::ExecProgress(_)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    /// Exit status when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the command was killed by one.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub stdout: CapturedOutput,
    pub stderr: CapturedOutput,
    pub duration_ms: u64,
    /// In a sandbox with `allow_hosts`: the places (`host:port`) its proxy
    /// refused while the command ran.
    pub egress_denied: Vec<String>,
    /// In a sandbox with a network of its own: the ports it began listening
    /// on while the command ran.
    pub listening: Vec<u16>,
}

/// Output kept under a byte limit: the first and last bytes, and how many were
/// dropped between them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturedOutput {
    #[serde(with = "serde_bytes")]
    pub head: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub tail: Vec<u8>,
    pub omitted: u64,
}

impl CapturedOutput {
    /// Total bytes the command wrote to this stream.
    pub fn total_len(&self) -> u64 {
        self.head.len() as u64 + self.tail.len() as u64 + self.omitted
    }

    /// Text for people and agents: invalid UTF-8 replaced, and an explicit marker
    /// where bytes were omitted.
    pub fn to_text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[… {} bytes omitted …]\n", self.omitted));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        text
    }
}

/// A resource snapshot of the host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostMetrics {
    pub cpu_count: u32,
    /// Whole-machine CPU use over the last sampling interval; None until the
    /// sampler has two samples.
    pub cpu_usage_pct: Option<f32>,
    pub per_cpu_pct: Vec<f32>,
    pub load_1m: f64,
    pub load_5m: f64,
    pub load_15m: f64,
    pub mem_total_bytes: u64,
    /// Total minus available: what the kernel cannot hand out without swapping.
    pub mem_used_bytes: u64,
    pub mem_available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
    /// The filesystems holding the home and the working directory.
    pub disks: Vec<DiskUsage>,
    pub uptime_s: u64,
    pub process_count: u32,
    pub gpu: GpuReport,
    /// How old the snapshot is.
    pub age_ms: u32,
    /// The cluster's partitions, when the host is a Slurm login node (has
    /// `sinfo`); None otherwise.
    pub slurm: Option<SlurmSummary>,
}

/// What `sinfo` says about the cluster the host submits to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmSummary {
    pub partitions: Vec<SlurmPartition>,
    /// Why `sinfo` gave nothing usable (first line of its stderr, a timeout…);
    /// `partitions` is then empty.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmPartition {
    pub name: String,
    /// Where jobs go that name no partition.
    pub default: bool,
    pub up: bool,
    pub nodes_idle: u32,
    /// Allocated or mixed (partly allocated).
    pub nodes_allocated: u32,
    /// Down, drained, draining, reserved, unknown…
    pub nodes_other: u32,
    pub cpus_idle: u32,
    pub cpus_total: u32,
    /// Generic resources as `sinfo` prints them (`gpu:a100:4`); empty for none.
    pub gres: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// What the disk was measured for: `home` or `cwd`.
    pub role: String,
    pub path: String,
    pub mount_point: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuSource {
    Nvml,
    NvidiaSmi,
}

/// What the host's GPUs look like, and how that was learned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// Where `gpus` came from; None when no source works.
    pub source: Option<GpuSource>,
    pub gpus: Vec<GpuInfo>,
    /// True when an NVIDIA driver is present but no source could read it: the
    /// GPUs' state is unknown, which must never be taken for idle.
    pub failed: bool,
    /// Why a source did not work (NVML not loadable, nvidia-smi crashed…).
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub util_pct: Option<u32>,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f32>,
    pub processes: Vec<GpuProcess>,
    /// Id of the live lease holding this GPU, if any.
    pub lease: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub user: String,
    pub command: String,
    pub mem_bytes: Option<u64>,
}

/// A granted GPU lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLease {
    pub lease_id: String,
    /// NVML indices of the leased GPUs.
    pub indices: Vec<u32>,
    /// Their UUIDs, for `CUDA_VISIBLE_DEVICES` (unambiguous whatever the
    /// device order).
    pub uuids: Vec<String>,
}

/// How an `Unavailable` error starts when a job could not be recorded
/// because the host's disk (or quota) is full: the controller can still run
/// the command inline, which needs no record.
pub const NO_ROOM_FOR_JOB: &str = "no room for a job record";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request is malformed or breaks a limit.
    BadRequest,
    /// The command could not be started (missing cwd, no bash, fork failed).
    SpawnFailed,
    /// The agent does not know this request (older agent).
    Unsupported,
    /// A bug or an unexpected host condition.
    Internal,
    /// The host cannot satisfy the request now (e.g. too few free GPUs).
    Unavailable,
}
