//! Sync results as the MCP tools answer them: remote-sandbox-mcp's field
//! names for what it reports too (a push's `uploaded_files` and
//! `uploaded_dirs`, a pull's `downloaded_files` and `created_dirs`,
//! `skipped_files`, `deleted_files`, `deleted_dirs`, `synced_type`), so
//! that what was written against it reads Outpost's results unchanged;
//! Outpost's own counts (bytes, symlinks, attributes, problems, the dry
//! run's plan) beside them.
//!
//! The sync engine's [`SyncReport`] keeps its own names (the CLI prints
//! them); this is the one place that maps them.

use schemars::JsonSchema;
use serde::Serialize;

use super::jobs::is_zero;
use super::shape::{ProgressShape, TransferStatusShape};
use crate::ops::files::SyncOutcome;
use crate::ops::transfers::{HostResult, ProgressView, Status, TransferView};
use crate::sync::SyncReport;

/// What both directions report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SyncCounts {
    /// "directory" or "file".
    pub synced_type: String,
    /// Already identical.
    pub skipped_files: u64,
    pub deleted_files: u64,
    pub deleted_dirs: u64,
    pub symlinks: u64,
    /// Mode or mtime updates without content.
    pub attrs_updated: u64,
    /// Content bytes of the files sent.
    pub bytes_total: u64,
    /// Bytes that crossed the link (compressed data, chunk deltas).
    pub bytes_sent: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes_resumed: u64,
    /// Per-path problems; the rest of the sync completed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    pub duration_s: f64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_delete: Vec<String>,
}

impl SyncCounts {
    /// The counts of `r` but the files sent and directories created, which
    /// each direction names its own way.
    fn of(r: SyncReport) -> (u64, u64, SyncCounts) {
        let counts = SyncCounts {
            synced_type: if r.single_file { "file" } else { "directory" }.into(),
            skipped_files: r.files_unchanged,
            deleted_files: r.deleted_files,
            deleted_dirs: r.deleted_dirs,
            symlinks: r.symlinks,
            attrs_updated: r.attrs_updated,
            bytes_total: r.bytes_total,
            bytes_sent: r.bytes_sent,
            bytes_resumed: r.bytes_resumed,
            problems: r.problems,
            duration_s: r.duration_s,
            dry_run: r.dry_run,
            would_send: r.would_send,
            would_delete: r.would_delete,
        };
        (r.files_sent, r.dirs_created, counts)
    }
}

/// A push's report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PushReport {
    pub uploaded_files: u64,
    pub uploaded_dirs: u64,
    #[serde(flatten)]
    pub counts: SyncCounts,
}

impl From<SyncReport> for PushReport {
    fn from(r: SyncReport) -> Self {
        let (uploaded_files, uploaded_dirs, counts) = SyncCounts::of(r);
        PushReport {
            uploaded_files,
            uploaded_dirs,
            counts,
        }
    }
}

/// A pull's report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PullReport {
    pub downloaded_files: u64,
    pub created_dirs: u64,
    #[serde(flatten)]
    pub counts: SyncCounts,
}

impl From<SyncReport> for PullReport {
    fn from(r: SyncReport) -> Self {
        let (downloaded_files, created_dirs, counts) = SyncCounts::of(r);
        PullReport {
            downloaded_files,
            created_dirs,
            counts,
        }
    }
}

/// `sync_local_to_remote`'s answer: the report of a push done inline, or
/// the background task a large one became.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PushAnswer {
    /// "inline" or "background".
    pub mode: String,
    #[serde(flatten)]
    pub report: Option<PushReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<TransferStatusShape>")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ProgressShape>")]
    pub progress: Option<ProgressView>,
    /// Per host, with `sandboxes`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<HostShape>")]
    pub hosts: Vec<HostPush>,
    /// Set when an inline push outgrew the inline limits.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_switched: bool,
}

/// One host's push of several: `sandbox`, and its report's fields (as a
/// push to one host answers them) or `error`. Its schema names none of them:
/// they are the report's, named once beside it, and every tool list pays for
/// each name it spells out.
#[derive(Debug, Serialize)]
pub struct HostPush {
    pub sandbox: String,
    #[serde(flatten)]
    pub report: Option<PushReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The schema of a report named elsewhere: any value.
type HostShape = serde_json::Value;

impl From<HostResult> for HostPush {
    fn from(h: HostResult) -> Self {
        HostPush {
            sandbox: h.sandbox,
            report: h.report.map(PushReport::from),
            error: h.error,
        }
    }
}

impl From<SyncOutcome> for PushAnswer {
    fn from(o: SyncOutcome) -> Self {
        PushAnswer {
            mode: o.mode,
            report: o.report.map(PushReport::from),
            task_id: o.task_id,
            status: o.status,
            progress: o.progress,
            hosts: o.hosts.into_iter().map(HostPush::from).collect(),
            auto_switched: o.auto_switched,
        }
    }
}

/// `check_file_transfer_task`'s answer (background transfers are pushes).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TransferAnswer {
    pub task_id: String,
    #[schemars(with = "TransferStatusShape")]
    pub status: Status,
    /// Present (true) while the transfer runs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    #[schemars(with = "ProgressShape")]
    pub progress: ProgressView,
    /// A push's report: its fields are named in sync_local_to_remote's
    /// schema, and not again here.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<HostShape>")]
    pub result: Option<PushReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<HostShape>")]
    pub hosts: Vec<HostPush>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub log_tail: String,
}

impl From<TransferView> for TransferAnswer {
    fn from(v: TransferView) -> Self {
        TransferAnswer {
            task_id: v.task_id,
            status: v.status,
            running: v.running,
            progress: v.progress,
            result: v.result.map(PushReport::from),
            hosts: v.hosts.into_iter().map(HostPush::from).collect(),
            error: v.error,
            log_tail: v.log_tail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_report_speaks_remote_sandbox_mcps_names() {
        let report = SyncReport {
            files_sent: 2,
            files_unchanged: 5,
            dirs_created: 1,
            deleted: 1,
            deleted_files: 3,
            deleted_dirs: 1,
            duration_s: 0.5,
            ..SyncReport::default()
        };
        let value = serde_json::to_value(PushReport::from(report)).unwrap();
        for (key, want) in [
            ("uploaded_files", 2),
            ("uploaded_dirs", 1),
            ("skipped_files", 5),
            ("deleted_files", 3),
            ("deleted_dirs", 1),
        ] {
            assert_eq!(value[key], want, "{key} in {value}");
        }
        assert_eq!(value["synced_type"], "directory");
        assert!(value.get("files_sent").is_none(), "{value}");
    }
}
