//! Every message of the protocol, in this module: the envelope, requests
//! and responses here, what they carry by subject in `jobs`, `tree` and
//! `sandbox`.
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
//! Rule for evolving these files: append enum variants and bump
//! [`crate::PROTOCOL_VERSION`] for any other change.

use serde::{Deserialize, Serialize};

mod jobs;
mod sandbox;
mod tree;

pub use jobs::*;
pub use sandbox::*;
pub use tree::*;

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
