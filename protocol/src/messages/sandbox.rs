//! Isolated sandboxes: their specs, states, checkpoints and changes.

use serde::{Deserialize, Serialize};

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
