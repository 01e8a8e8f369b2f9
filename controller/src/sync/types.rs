//! The public types of a sync: what a caller asks for ([`SyncOptions`]),
//! what it can watch while one runs ([`Progress`]), and what it gets back
//! ([`SyncReport`], [`SyncError`]). They sit at the bottom of `sync/` so
//! every other file can name them without going through `mod.rs`, which
//! re-exports them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};

use crate::session::CallError;

#[derive(Debug, Clone)]
pub struct SyncOptions {
    pub delete_extras: bool,
    /// Allow delete_extras to empty most of a non-trivial target.
    pub force: bool,
    /// Plan only; change nothing.
    pub dry_run: bool,
    /// gitignore-syntax patterns.
    pub excludes: Vec<String>,
    /// A local file of patterns, one per line.
    pub exclude_file: Option<PathBuf>,
    /// Add remote-sandbox-mcp's default excludes (.git/, node_modules/, …).
    pub default_excludes: bool,
    /// Honour .gitignore files inside the source tree.
    pub use_gitignore: bool,
    /// Sync this one top-level name of the roots (a single file) and leave
    /// every other name alone: never scanned, sent or deleted.
    pub only: Option<String>,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            delete_extras: false,
            force: false,
            dry_run: false,
            excludes: Vec::new(),
            exclude_file: None,
            default_excludes: true,
            use_gitignore: false,
            only: None,
        }
    }
}

/// Live counters of a running sync, read by progress bars and task status.
#[derive(Debug, Default)]
pub struct Progress {
    pub files_total: AtomicU64,
    pub files_done: AtomicU64,
    /// Content bytes of the files to send (before delta and compression).
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
    /// Set by a canceller; the sync stops between requests and leaves no
    /// partial file at a final path.
    pub cancelled: AtomicBool,
}

/// What a sync did (or, with dry_run, would do).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SyncReport {
    /// The source was one file, not a directory.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub single_file: bool,
    pub files_sent: u64,
    pub files_unchanged: u64,
    pub dirs_created: u64,
    pub symlinks: u64,
    /// Mode or mtime updates without content.
    pub attrs_updated: u64,
    pub deleted: u64,
    /// What the deletes take away, entries inside a deleted directory
    /// included: files (and symlinks) and directories (a delete that failed
    /// is among the problems).
    pub deleted_files: u64,
    pub deleted_dirs: u64,
    /// Content bytes of the files sent.
    pub bytes_total: u64,
    /// Bytes that crossed the link (compressed data, chunk deltas).
    pub bytes_sent: u64,
    /// Content bytes an interrupted earlier transfer had already delivered,
    /// taken from its partial file instead of being sent again.
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes_resumed: u64,
    /// Per-path problems (permission denied, vanished, disk full…); the rest
    /// of the sync completed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    pub duration_s: f64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// With dry_run: the paths that would be sent (new or changed files,
    /// symlinks), at most [`PLAN_LISTING`] of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<String>,
    /// With dry_run: the paths that would be deleted, likewise capped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_delete: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Paths a dry run lists per kind; the counts cover the rest.
pub const PLAN_LISTING: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Call(#[from] CallError),
    /// Bad input or an impossible request (missing local root, refused delete…).
    #[error("{0}")]
    Invalid(String),
    #[error("cancelled")]
    Cancelled,
}
