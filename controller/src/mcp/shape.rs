//! JSON schemas for the results that `ops`, `fleet`, `resources` and `sync`
//! build, so that only `mcp/` knows schemars.
//!
//! Those layers return plain serde types (the CLI prints the same values as
//! JSON). Here each gets a schema-only mirror: a struct with the same field
//! names, types and serde attributes that derives `JsonSchema` and nothing
//! else. [`Shaped`] pairs a value with its mirror for a tool's return type;
//! a field of an MCP result struct takes its mirror with
//! `#[schemars(with = "…")]`.
//!
//! A mirror that drifts from its type would advertise a wrong output schema,
//! which strict clients reject. The end-to-end tests check every structured
//! result they receive against the tool's advertised schema, refusing any key
//! the schema does not name. (The advertised schemas leave out value types
//! and name fields two levels deep, see `listing.rs`: what that check
//! catches is a field the mirror lacks.)

use std::borrow::Cow;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, Serializer};

/// `T` serialized as itself, described by the schema of `S`.
pub struct Shaped<T, S>(pub T, PhantomData<S>);

impl<T, S> Shaped<T, S> {
    pub fn new(value: T) -> Self {
        Shaped(value, PhantomData)
    }
}

impl<T: Serialize, S> Serialize for Shaped<T, S> {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        self.0.serialize(serializer)
    }
}

impl<T, S: JsonSchema> JsonSchema for Shaped<T, S> {
    fn inline_schema() -> bool {
        S::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        S::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        S::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        S::json_schema(generator)
    }
}

// Mirrors. Names drop the `Shape` suffix in the schema so that the
// advertised `$defs` keep the names they always had.

// Mirrors `crate::fleet::HostStatus`.
#[derive(JsonSchema)]
#[schemars(rename = "HostStatus")]
#[allow(dead_code)]
pub struct SandboxStatusShape {
    name: String,
    host: String,
    port: u16,
    user: String,
    is_active: bool,
    connection_alive: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    connection_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resources: Option<ResourcesShape>,
}

// Mirrors `crate::resources::Resources`.
#[derive(JsonSchema)]
#[schemars(rename = "Resources")]
#[allow(dead_code)]
pub struct ResourcesShape {
    cpu: CpuShape,
    memory: MemoryShape,
    /// Per-GPU usage; empty without a readable NVIDIA GPU.
    gpu: Vec<GpuShape>,
    /// "nvml", "nvidia-smi", or "none".
    gpu_source: String,
    /// A GPU driver is present but could not be read: GPU state unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    disks: Vec<DiskShape>,
    processes: u32,
    uptime_s: u64,
    /// 0 = fully busy, 1 = fully idle.
    idle_score: f64,
    /// The cluster's partitions, on a Slurm login node.
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmShape>,
}

#[derive(JsonSchema)]
#[schemars(rename = "SlurmResources")]
#[allow(dead_code)]
struct SlurmShape {
    partitions: Vec<PartitionShape>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(JsonSchema)]
#[schemars(rename = "PartitionResources")]
#[allow(dead_code)]
struct PartitionShape {
    name: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    default: bool,
    up: bool,
    nodes: PartitionNodesShape,
    cpus: PartitionCpusShape,
    #[serde(skip_serializing_if = "String::is_empty")]
    gres: String,
}

#[derive(JsonSchema)]
#[schemars(rename = "PartitionNodes")]
#[allow(dead_code)]
struct PartitionNodesShape {
    idle: u32,
    allocated: u32,
    other: u32,
}

#[derive(JsonSchema)]
#[schemars(rename = "PartitionCpus")]
#[allow(dead_code)]
struct PartitionCpusShape {
    idle: u32,
    total: u32,
}

#[derive(JsonSchema)]
#[schemars(rename = "CpuResources")]
#[allow(dead_code)]
struct CpuShape {
    load_1m: f64,
    load_5m: f64,
    load_15m: f64,
    count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_pct: Option<f64>,
}

#[derive(JsonSchema)]
#[schemars(rename = "MemoryResources")]
#[allow(dead_code)]
struct MemoryShape {
    total_mb: u64,
    used_mb: u64,
    free_mb: u64,
    used_pct: f64,
    swap_total_mb: u64,
    swap_used_mb: u64,
}

#[derive(JsonSchema)]
#[schemars(rename = "GpuResources")]
#[allow(dead_code)]
struct GpuShape {
    index: u32,
    util_pct: f64,
    mem_used_mb: u64,
    mem_total_mb: u64,
    mem_used_pct: f64,
    name: String,
    uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature_c: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    power_w: Option<f64>,
    /// The live lease holding this GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    processes: Vec<GpuProcessShape>,
}

#[derive(JsonSchema)]
#[schemars(rename = "GpuProcessResources")]
#[allow(dead_code)]
struct GpuProcessShape {
    pid: u32,
    user: String,
    command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_mb: Option<u64>,
}

#[derive(JsonSchema)]
#[schemars(rename = "DiskResources")]
#[allow(dead_code)]
struct DiskShape {
    /// "home" or "cwd".
    role: String,
    mount: String,
    total_gb: f64,
    free_gb: f64,
}

// Mirrors `crate::ops::files::SyncOutcome` in background mode, as
// `sync_local_to_remote_background` always answers.
#[derive(JsonSchema)]
#[schemars(rename = "BackgroundSync")]
#[allow(dead_code)]
pub struct BackgroundSyncShape {
    /// "background".
    mode: String,
    task_id: String,
    status: TransferStatusShape,
}

// Mirrors `crate::ops::files::ListResult`.
#[derive(JsonSchema)]
#[schemars(rename = "ListResult")]
#[allow(dead_code)]
pub struct FileListShape {
    entries: Vec<FileEntryShape>,
    truncated: bool,
}

#[derive(JsonSchema)]
#[schemars(rename = "ListEntry")]
#[allow(dead_code)]
struct FileEntryShape {
    /// Relative to remote_path.
    path: String,
    is_dir: bool,
    size: u64,
    /// Seconds since the epoch.
    mtime: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink: Option<String>,
}

// Mirrors `crate::ops::files::ReadResult`.
#[derive(JsonSchema)]
#[schemars(rename = "ReadResult")]
#[allow(dead_code)]
pub struct ReadShape {
    size: u64,
    truncated: bool,
    /// The text; absent for binary files.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_base64: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    binary: bool,
}

// Mirrors `crate::ops::files::UploadResult`.
#[derive(JsonSchema)]
#[schemars(rename = "UploadResult")]
#[allow(dead_code)]
pub struct UploadShape {
    files: usize,
    bytes: u64,
}

// Mirrors `crate::ops::files::DownloadResult`.
#[derive(JsonSchema)]
#[schemars(rename = "DownloadResult")]
#[allow(dead_code)]
pub struct DownloadShape {
    files: Vec<DownloadedShape>,
}

// Mirrors `crate::ops::files::Downloaded`: a read's fields, or `error`.
#[derive(JsonSchema)]
#[schemars(rename = "Downloaded")]
#[allow(dead_code)]
pub struct DownloadedShape {
    size: Option<u64>,
    truncated: Option<bool>,
    content: Option<String>,
    content_base64: Option<String>,
    error: Option<String>,
}

// Mirrors `crate::ops::files::WriteResult`.
#[derive(JsonSchema)]
#[schemars(rename = "WriteResult")]
#[allow(dead_code)]
pub struct WriteShape {
    status: String,
    size: u64,
}

// Mirrors `crate::ops::transfers::Status`.
#[derive(JsonSchema)]
#[schemars(rename = "Status")]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum TransferStatusShape {
    Running,
    Completed,
    Failed,
    Cancelled,
}

// Mirrors `crate::ops::transfers::ProgressView`.
#[derive(JsonSchema)]
#[schemars(rename = "ProgressView")]
#[allow(dead_code)]
pub struct ProgressShape {
    files_done: u64,
    files_total: u64,
    bytes_done: u64,
    bytes_total: u64,
    /// Content bytes per second since the start.
    rate_mb_s: f64,
}

// Mirrors `crate::ops::events::FollowerView`.
#[derive(JsonSchema)]
#[schemars(rename = "FollowerView")]
#[allow(dead_code)]
pub struct FollowerShape {
    sandbox: String,
    /// Whether this process runs the hooks for this sandbox (else another
    /// Outpost process holding its events lock does).
    runs_hooks: bool,
    last_seq: u64,
    /// Failed reachability checks in a row.
    failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

// Mirrors `crate::ops::sandboxes::SandboxView`.
#[derive(JsonSchema)]
#[schemars(rename = "Sandbox")]
#[allow(dead_code)]
pub struct SandboxShape {
    sandbox_name: String,
    state: String,
    expires_at: String,
    isolation: String,
    network: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<LimitsShape>,
    #[serde(skip_serializing_if = "Option::is_none")]
    enforcement: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gpus: Vec<u32>,
    work_dir: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    kept_files: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ports: Option<std::collections::BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

// Mirrors `crate::ops::sandboxes::Limits`.
#[derive(JsonSchema)]
#[schemars(rename = "Limits")]
#[allow(dead_code)]
struct LimitsShape {
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pids: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_mb: Option<u64>,
}

// Mirrors `crate::ops::sandboxes::HostRow`: a `HostStatus` and the
// isolated sandboxes live on it.
#[derive(JsonSchema)]
#[schemars(rename = "HostStatus")]
#[allow(dead_code)]
pub struct HostRowShape {
    #[serde(flatten)]
    status: SandboxStatusShape,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandboxes: Option<Vec<SandboxShape>>,
}
