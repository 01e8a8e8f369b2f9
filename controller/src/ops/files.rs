//! The file tools behind MCP: syncs (inline or background), listing, reading
//! and writing remote files. Parameters and result fields follow
//! remote-sandbox-mcp; the work is done by [`crate::sync`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use outpost_protocol::{EntryKind, FilterSpec, ScanRequest};
use outpost_treesync::relpath;
use serde::Serialize;

use crate::fleet::Fleet;
use crate::ops::localpath::{Intent, Roots};
use crate::ops::transfers::{Direction, HostResult, ProgressView, Status, Transfer, Transfers};
use crate::session::Session;
use crate::sync::{self, Progress, SyncOptions, SyncReport};

/// How long an inline sync may wait for its plan before it is known whether
/// it fits the inline limits; past that it continues in the background.
const PLAN_WAIT: Duration = Duration::from_secs(20);
/// Longest an inline sync blocks a tool call before going to the background.
const INLINE_WAIT: Duration = Duration::from_secs(100);

// Requests as plain data: the MCP front end (`mcp/files.rs`) parses its
// arguments, with their defaults and documentation, into these.

pub struct SyncRequest {
    pub local_path: String,
    pub remote_path: String,
    pub delete_extras: bool,
    pub excludes: Option<Vec<String>>,
    pub exclude_file: Option<String>,
    pub use_gitignore: bool,
    pub dry_run: bool,
    pub force: bool,
    pub sandbox_name: Option<String>,
    /// A push to several sandboxes at once; `["all"]` is every configured
    /// host but the local one.
    pub sandboxes: Option<Vec<String>>,
}

pub struct ListRequest {
    /// Default "." (the home; an isolated sandbox's work dir).
    pub remote_path: Option<String>,
    pub recursive: bool,
    /// Default 200, at most 100000.
    pub max_entries: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListEntry {
    /// Relative to remote_path.
    pub path: String,
    pub is_dir: bool,
    pub size: u64,
    /// Seconds since the epoch.
    pub mtime: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListResult {
    pub entries: Vec<ListEntry>,
    pub truncated: bool,
}

pub struct ReadRequest {
    pub remote_path: String,
    /// Default 200000.
    pub max_bytes: Option<u64>,
    /// Default 0.
    pub offset: Option<u64>,
    pub sandbox_name: Option<String>,
    /// The bytes as base64 (`content_base64`), whatever they are.
    pub base64: bool,
}

#[derive(Debug, Serialize)]
pub struct ReadResult {
    pub size: u64,
    pub truncated: bool,
    /// The text; absent for binary files and with `base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The bytes read, with `base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub binary: bool,
}

pub struct WriteRequest {
    pub remote_path: String,
    pub content: String,
    /// `content` is base64 (binary data).
    pub base64: bool,
    /// Octal permission string, e.g. "755". Default "644".
    pub mode: Option<String>,
    /// Default true.
    pub create_parents: Option<bool>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct WriteResult {
    pub status: String,
    pub size: u64,
}

/// A sync's answer: the report when it ran inline, or the task when it went to
/// the background.
#[derive(Debug, Serialize)]
pub struct SyncOutcome {
    /// "inline" or "background".
    pub mode: String,
    #[serde(flatten)]
    pub report: Option<SyncReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressView>,
    /// A push to several hosts: each one's report or error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostResult>,
    /// Set when an inline sync outgrew the inline limits.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_switched: bool,
}

/// The local directory of a sync, checked against `roots`, and its options.
fn options(
    roots: &Roots,
    p: &SyncRequest,
    direction: Direction,
) -> Result<(PathBuf, SyncOptions), String> {
    let intent = match direction {
        Direction::Push => Intent::Read,
        Direction::Pull => Intent::Dest { create: !p.dry_run },
    };
    let local = roots.resolve(&p.local_path, intent)?;
    let mut excludes = p.excludes.clone().unwrap_or_default();
    // Last, so that no `!pattern` of the caller re-includes them.
    excludes.extend(local.secret_excludes);
    let options = SyncOptions {
        delete_extras: p.delete_extras,
        force: p.force,
        dry_run: p.dry_run,
        excludes,
        exclude_file: p
            .exclude_file
            .as_deref()
            .map(|f| roots.resolve(f, Intent::Read).map(|f| f.path))
            .transpose()?,
        default_excludes: true,
        use_gitignore: p.use_gitignore,
        only: None,
    };
    Ok((local.path, options))
}

pub fn sync_background(
    fleet: &Fleet,
    transfers: &Transfers,
    roots: &Roots,
    p: SyncRequest,
) -> Result<SyncOutcome, String> {
    let (task, _) = start_push(fleet, transfers, roots, p)?;
    let view = task.view(0);
    Ok(SyncOutcome {
        mode: "background".into(),
        report: None,
        task_id: Some(view.task_id),
        status: Some(view.status),
        // Nothing done yet: check_file_transfer_task reports it.
        progress: None,
        hosts: Vec::new(),
        auto_switched: false,
    })
}

/// Starts a push as a transfer task; also says to how many hosts.
fn start_push(
    fleet: &Fleet,
    transfers: &Transfers,
    roots: &Roots,
    p: SyncRequest,
) -> Result<(Arc<Transfer>, u64), String> {
    let (local, options) = options(roots, &p, Direction::Push)?;
    let sessions = push_targets(fleet, &p)?;
    let hosts = sessions.len() as u64;
    let fan_out = p.sandboxes.is_some();
    let task = transfers.start(
        sessions,
        fan_out,
        Direction::Push,
        local,
        p.remote_path,
        options,
    );
    Ok((task, hosts))
}

/// The sessions a push goes to: `sandboxes` (`["all"]`: every configured
/// host but the local one), else `sandbox_name` or the active sandbox.
pub fn push_targets(fleet: &Fleet, p: &SyncRequest) -> Result<Vec<Arc<Session>>, String> {
    let Some(names) = &p.sandboxes else {
        return Ok(vec![fleet.get(p.sandbox_name.as_deref())?]);
    };
    if p.sandbox_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err("give sandbox_name or sandboxes, not both".into());
    }
    let names: Vec<String> = match names.as_slice() {
        [] => return Err("sandboxes is empty: name at least one, or [\"all\"]".into()),
        names if names.iter().any(|n| n == "all") => {
            let hosts: Vec<String> = fleet
                .sessions()
                .iter()
                .filter(|s| s.config.target != crate::config::Target::Local)
                .map(|s| s.name().to_string())
                .collect();
            if hosts.is_empty() {
                return Err(
                    "no hosts are configured: [\"all\"] means every configured host but local"
                        .into(),
                );
            }
            hosts
        }
        names => names.to_vec(),
    };
    let mut sessions: Vec<Arc<Session>> = Vec::with_capacity(names.len());
    for name in &names {
        if name.trim().is_empty() {
            return Err("an empty name in sandboxes".into());
        }
        let session = fleet.get(Some(name))?;
        if sessions.iter().any(|s| s.name() == session.name()) {
            return Err(format!("{name} is named twice in sandboxes"));
        }
        sessions.push(session);
    }
    Ok(sessions)
}

/// Cancels a transfer when dropped, unless taken out first.
struct CancelOnDrop(Option<Arc<Transfer>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.cancel();
        }
    }
}

/// Runs inline while the work to send stays within the configured limits;
/// otherwise leaves it running in the background and says so. `watch` gets
/// the transfer's live counters once it has started.
pub async fn sync_maybe_inline(
    fleet: &Fleet,
    transfers: &Transfers,
    roots: &Roots,
    p: SyncRequest,
    watch: impl FnOnce(Arc<Progress>),
) -> Result<SyncOutcome, String> {
    let (task, hosts) = start_push(fleet, transfers, roots, p)?;
    watch(task.progress.clone());
    // A call dropped while inline (the client cancelled it) stops its
    // transfer; one that went to the background is the task's to cancel.
    let mut inline = CancelOnDrop(Some(task.clone()));
    let (max_files, max_bytes) = (
        fleet.config.inline_sync_max_files,
        fleet.config.inline_sync_max_bytes,
    );
    let started = std::time::Instant::now();
    let mut switched = false;
    // The decision follows the plan's size, whatever the timing: a transfer
    // past the limits is reported as a background task even if it already
    // finished, so the limits mean the same on fast and slow links.
    loop {
        let finished = tokio::time::timeout(Duration::from_millis(50), task.finished())
            .await
            .is_ok();
        let view = task.view(0);
        // The totals add up every host's plan; the hosts go at once.
        let too_big = view.progress.files_total > max_files.saturating_mul(hosts)
            || view.progress.bytes_total > max_bytes.saturating_mul(hosts);
        let planless = view.progress.files_total == 0 && started.elapsed() > PLAN_WAIT;
        if too_big || (!finished && (planless || started.elapsed() > INLINE_WAIT)) {
            switched = true;
            break;
        }
        if finished {
            break;
        }
    }
    inline.0 = None;
    let view = task.view(20);
    if switched {
        return Ok(SyncOutcome {
            mode: "background".into(),
            report: None,
            task_id: Some(view.task_id),
            status: Some(view.status),
            progress: Some(view.progress),
            hosts: Vec::new(),
            auto_switched: true,
        });
    }
    // Several hosts: each one's report or error, whatever the others did;
    // an error when none got anything.
    if !view.hosts.is_empty() {
        if view.hosts.iter().all(|h| h.error.is_some()) {
            let errors: Vec<String> = view
                .hosts
                .iter()
                .map(|h| format!("{}: {}", h.sandbox, h.error.as_deref().unwrap_or_default()))
                .collect();
            return Err(format!("every host failed: {}", errors.join("; ")));
        }
        return Ok(SyncOutcome {
            mode: "inline".into(),
            report: None,
            task_id: None,
            status: None,
            progress: None,
            hosts: view.hosts,
            auto_switched: false,
        });
    }
    match (view.status, view.result, view.error) {
        (Status::Completed, Some(report), _) => Ok(SyncOutcome {
            mode: "inline".into(),
            report: Some(report),
            task_id: None,
            status: None,
            progress: None,
            hosts: Vec::new(),
            auto_switched: false,
        }),
        (_, _, Some(error)) => Err(error),
        (status, _, _) => Err(format!("sync ended {status:?}")),
    }
}

/// Pulls inline; `progress` holds its live counters.
pub async fn pull(
    fleet: &Fleet,
    roots: &Roots,
    mut p: SyncRequest,
    progress: Arc<Progress>,
) -> Result<SyncReport, String> {
    let session = fleet.get(p.sandbox_name.as_deref())?;
    // A tree pulled before, into a directory that is there: no round trip
    // to ask what the remote path is. Should it have become a file, the
    // tree's scan says so before anything is written, and the file is
    // pulled into that directory, as it would have been.
    let local_is_dir = || {
        roots
            .resolve(&p.local_path, Intent::Dest { create: false })
            .is_ok_and(|l| l.path.is_dir())
    };
    if sync::synced_as_tree(&session, &p.remote_path).await && local_is_dir() {
        let (local, options) = options(roots, &p, Direction::Pull)?;
        match sync::pull(
            &session,
            &p.remote_path,
            &local,
            &options,
            Arc::clone(&progress),
        )
        .await
        {
            Err(e) if sync::is_not_a_directory(&e, &p.remote_path) => {}
            pulled => return pulled.map_err(|e| e.to_string()),
        }
    }
    let one = file_pull(&session, &p.remote_path, &p.local_path, roots).await?;
    if let Some(one) = &one {
        p.local_path = one.local_dir.clone();
        p.remote_path = one.remote_dir.clone();
    }
    let (local, mut options) = options(roots, &p, Direction::Pull)?;
    options.only = one.map(|one| one.name);
    let single_file = options.only.is_some();
    let mut report = sync::pull(&session, &p.remote_path, &local, &options, progress)
        .await
        .map_err(|e| e.to_string())?;
    report.single_file = single_file;
    Ok(report)
}

/// A pull of one file: where it is on the host and where it goes here.
pub struct FilePull {
    pub remote_dir: String,
    /// The local directory, as given (still to be resolved against the roots).
    pub local_dir: String,
    pub name: String,
}

/// For a pull whose `remote` names one file (None for a directory): it goes
/// into `local` when that is a directory (or ends in `/`), else to `local`
/// itself, under its own name (see [`sync::file_target`]).
pub async fn file_pull(
    session: &crate::session::Session,
    remote: &str,
    local: &str,
    roots: &Roots,
) -> Result<Option<FilePull>, String> {
    let kind = sync::remote_kind(session, remote)
        .await
        .map_err(|e| e.to_string())?;
    if kind != sync::RemoteKind::Other {
        return Ok(None);
    }
    let (remote_dir, name) = sync::file_target(remote, false, "");
    let local_is_dir = roots
        .resolve(local, Intent::Dest { create: false })
        .is_ok_and(|l| l.path.is_dir());
    let (local_dir, target) = sync::file_target(local, local_is_dir, &name);
    if target != name {
        return Err(sync::renames(&name, local).to_string());
    }
    Ok(Some(FilePull {
        remote_dir,
        local_dir,
        name,
    }))
}

pub async fn list(fleet: &Fleet, p: ListRequest) -> Result<ListResult, String> {
    let session = fleet.get(p.sandbox_name.as_deref())?;
    // Relative: the agent takes it from the home, or from an isolated
    // sandbox's work dir.
    let root = match p.remote_path.as_deref() {
        None | Some("") => ".".to_string(),
        Some(path) => path.to_string(),
    };
    let request = ScanRequest {
        root: root.clone(),
        filter: FilterSpec::default(),
        hashes: false,
        chunk_lists: false,
        recursive: p.recursive,
        max_entries: match p.max_entries.unwrap_or(200) {
            n @ 1..=MAX_LIST_ENTRIES => n,
            n => {
                return Err(format!(
                    "max_entries must be 1 to {MAX_LIST_ENTRIES}, got {n}; page with a narrower remote_path"
                ));
            }
        },
        known: None,
    };
    let (entries, summary) = sync::scan_remote(&session, request)
        .await
        .map_err(|e| e.to_string())?;
    if !summary.root_exists {
        return Err(format!("remote path not found: {root}"));
    }
    Ok(ListResult {
        entries: entries
            .into_iter()
            .map(|e| ListEntry {
                path: relpath::display(&e.path),
                is_dir: e.kind == EntryKind::Dir,
                size: e.size,
                mtime: e.mtime_ns as f64 / 1e9,
                symlink: match &e.kind {
                    EntryKind::Symlink { target } => Some(relpath::display(target)),
                    _ => None,
                },
            })
            .collect(),
        truncated: summary.truncated,
    })
}

pub async fn read(fleet: &Fleet, p: ReadRequest) -> Result<ReadResult, String> {
    let session = fleet.get(p.sandbox_name.as_deref())?;
    let max = p.max_bytes.unwrap_or(200_000);
    let offset = p.offset.unwrap_or(0);
    let (bytes, size) = sync::read_remote(&session, &p.remote_path, offset, max)
        .await
        .map_err(|e| e.to_string())?;
    let truncated = offset + (bytes.len() as u64) < size;
    let encoding = if p.base64 {
        Encoding::Base64
    } else {
        Encoding::Text
    };
    Ok(ReadResult::of(&bytes, size, truncated, encoding))
}

/// How read bytes are given back.
#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    /// Text, or nothing but `binary: true` for bytes that are not.
    Text,
    Base64,
    /// Text, or base64 for bytes that are not.
    Auto,
}

impl ReadResult {
    fn of(bytes: &[u8], size: u64, truncated: bool, encoding: Encoding) -> ReadResult {
        let binary = looks_binary(bytes, truncated);
        let base64 = encoding == Encoding::Base64 || (binary && encoding == Encoding::Auto);
        ReadResult {
            size,
            truncated,
            content: (!base64 && !binary).then(|| String::from_utf8_lossy(bytes).into_owned()),
            content_base64: base64.then(|| BASE64.encode(bytes)),
            binary: binary && !base64,
        }
    }
}

/// NUL bytes, or invalid UTF-8 other than a sequence cut at the end of a
/// truncated read, mean binary.
fn looks_binary(bytes: &[u8], truncated: bool) -> bool {
    if bytes.contains(&0) {
        return true;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => false,
        Err(e) => !(truncated && e.error_len().is_none()),
    }
}

/// Most entries one `list_remote_files` returns.
const MAX_LIST_ENTRIES: u64 = 100_000;

/// Most content `write_remote_file` takes: the whole file travels inside one
/// MCP message and one model turn; larger files belong to the sync tools.
pub const MAX_WRITE_BYTES: usize = 8 << 20;

pub async fn write(fleet: &Fleet, p: WriteRequest) -> Result<WriteResult, String> {
    let content = write_content(&p.content, p.base64)?;
    let session = fleet.get(p.sandbox_name.as_deref())?;
    let mode = match p.mode.as_deref() {
        None => 0o644,
        Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| format!("mode must be octal like \"644\", got {m:?}"))?,
    };
    sync::write_remote(
        &session,
        &p.remote_path,
        &content,
        mode,
        p.create_parents.unwrap_or(true),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(WriteResult {
        status: "written".into(),
        size: content.len() as u64,
    })
}

/// The bytes a write carries: the text, or decoded base64; at most
/// [`MAX_WRITE_BYTES`].
fn write_content(content: &str, base64: bool) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    let bytes: std::borrow::Cow<'_, [u8]> = if base64 {
        // Whitespace (line breaks every 76 characters) is common in base64.
        let compact: String = content.split_ascii_whitespace().collect();
        BASE64
            .decode(compact.as_bytes())
            .map_err(|e| {
                format!("content is not valid base64 ({e}); or pass text with base64 false")
            })?
            .into()
    } else {
        content.as_bytes().into()
    };
    if bytes.len() > MAX_WRITE_BYTES {
        return Err(format!(
            "content is {} bytes; one write takes at most {} MiB: write the file locally and use sync_local_to_remote",
            bytes.len(),
            MAX_WRITE_BYTES >> 20
        ));
    }
    Ok(bytes)
}

/// One file of an [`upload`].
pub struct UploadFile {
    pub remote_path: String,
    pub content: String,
    pub base64: bool,
    pub mode: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct UploadResult {
    pub files: usize,
    pub bytes: u64,
}

/// Writes several files, each atomically, in order; stops at the first
/// that fails, saying which and how many were written before it. All are
/// checked (size, base64, mode) before the first is written.
pub async fn upload(
    fleet: &Fleet,
    files: Vec<UploadFile>,
    sandbox_name: Option<String>,
) -> Result<UploadResult, String> {
    if files.is_empty() {
        return Err("files is empty".into());
    }
    for (i, f) in files.iter().enumerate() {
        write_content(&f.content, f.base64).map_err(|e| format!("files[{i}]: {e}"))?;
    }
    let mut bytes = 0;
    let count = files.len();
    for (i, f) in files.into_iter().enumerate() {
        let written = write(
            fleet,
            WriteRequest {
                remote_path: f.remote_path,
                content: f.content,
                base64: f.base64,
                mode: f.mode,
                create_parents: Some(true),
                sandbox_name: sandbox_name.clone(),
            },
        )
        .await
        .map_err(|e| format!("files[{i}]: {e} ({i} of {count} written before it)"))?;
        bytes += written.size;
    }
    Ok(UploadResult {
        files: count,
        bytes,
    })
}

/// One file of a [`download`]: what [`read`] gives with binary bytes as
/// base64, or why it could not be read.
#[derive(Debug, Serialize)]
pub struct Downloaded {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub read: Option<ReadResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DownloadResult {
    /// In the order asked.
    pub files: Vec<Downloaded>,
}

/// Most files one download reads.
pub const MAX_DOWNLOAD_FILES: usize = 100;

/// Reads several files (each up to `max_bytes`, default 200000)
/// concurrently: text as text, anything else as base64.
pub async fn download(
    fleet: &Fleet,
    remote_paths: Vec<String>,
    max_bytes: Option<u64>,
    sandbox_name: Option<String>,
) -> Result<DownloadResult, String> {
    if remote_paths.is_empty() || remote_paths.len() > MAX_DOWNLOAD_FILES {
        return Err(format!(
            "remote_paths must name 1 to {MAX_DOWNLOAD_FILES} files, got {}",
            remote_paths.len()
        ));
    }
    let session = fleet.get(sandbox_name.as_deref())?;
    let max = max_bytes.unwrap_or(200_000);
    let reads = remote_paths.iter().map(|path| {
        let session = &session;
        async move {
            match sync::read_remote(session, path, 0, max).await {
                Ok((bytes, size)) => Downloaded {
                    read: Some(ReadResult::of(
                        &bytes,
                        size,
                        (bytes.len() as u64) < size,
                        Encoding::Auto,
                    )),
                    error: None,
                },
                Err(e) => Downloaded {
                    read: None,
                    error: Some(e.to_string()),
                },
            }
        }
    });
    Ok(DownloadResult {
        files: futures::future::join_all(reads).await,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_detection() {
        assert!(!looks_binary(b"plain text\n", false));
        assert!(looks_binary(b"a\0b", false));
        assert!(looks_binary(b"\xff\xfe", false));
        // A multi-byte character cut by max_bytes is still text.
        assert!(!looks_binary("héllo".as_bytes().split_at(2).0, true));
    }
}
