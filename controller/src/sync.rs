//! Tree sync between this machine and a sandbox, in both directions, with one
//! engine: scan both sides (the remote side by the agent, with its stat cache),
//! diff with [`outpost_treesync::plan`], then send only what is missing —
//! small files batched, large files as FastCDC chunks the other side lacks,
//! everything zstd-compressed and pipelined (no round trip per file) under a
//! bound on bytes in flight, so other calls on the same host stay fast.
//!
//! Push applies on the host through the agent's `PutFiles`/`PutPart`/
//! `ApplyMeta`; pull reads through `ReadFiles` and applies here with the same
//! [`outpost_treesync::apply::Applier`] the agent uses.
//!
//! Both directions apply in the same order, each phase finished before the
//! next starts: paths whose kind changes are removed, directories created
//! (parents first), file contents written, symlinks made, attributes set,
//! extras removed, and directory attributes set last (writing into a
//! directory changes its mtime). A problem with one path is reported and the
//! sync goes on; only a lost connection, an error of a whole request, or a
//! cancel stops it. A sync is never retried: running it again is the retry,
//! and it sends nothing that was already committed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::stream::{FuturesUnordered, StreamExt};
use outpost_protocol::{
    ApplyMeta, ApplyReport, ChunkRef, EntryKind, Expect, FileContent, FilePut, FilterSpec, MetaOp,
    PartData, Partial, PathProblem, PutFiles, PutPart, ReadFiles, ReadSpec, RelPath, Request,
    Response, Resume, ScanRequest, ScanSummary, TreeEntry,
};
use outpost_treesync::apply::Applier;
use outpost_treesync::cache::StatCache;
use outpost_treesync::filter::{self, DEFAULT_EXCLUDES, Filter};
use outpost_treesync::plan::{self, DiffOptions, FileChange, Plan};
use outpost_treesync::scan::{self, ScanOptions, ScanOutput};
use outpost_treesync::{codec, relpath};

use crate::session::{Call, CallError, Connection, Session};

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
#[derive(Debug, Clone, Default, serde::Serialize, schemars::JsonSchema)]
pub struct SyncReport {
    pub files_sent: u64,
    pub files_unchanged: u64,
    pub dirs_created: u64,
    pub symlinks: u64,
    /// Mode or mtime updates without content.
    pub attrs_updated: u64,
    pub deleted: u64,
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

/// Content per request: compressed bytes of a `PutFiles` batch or a
/// `PutPart`, raw bytes asked for by one `ReadFiles`. The controller hears
/// nothing from the agent while it uploads one request, and the heartbeat
/// gives a connection up after 4 s of silence, so a request must cross even
/// a slow uplink in well under that; per-request costs on the host (one
/// flush per batch) stay small next to 2 MiB.
const REQUEST_BYTES: u64 = 2 << 20;
/// Files up to this size travel whole inside a batch; larger ones as parts.
const INLINE_MAX: u64 = REQUEST_BYTES;
/// Most files in one batch: bounds the per-file overhead of a frame and how
/// long one request holds the root on the host.
const BATCH_FILES: usize = 1_000;
/// Most raw bytes read for one batch, however well they compress.
const BATCH_RAW: u64 = 16 << 20;
/// Requests in flight on the connection, and their content bytes: enough to
/// fill a fast link's round trip, little enough that an exec sent meanwhile
/// is not queued behind a long transfer.
const MAX_IN_FLIGHT: usize = 8;
const MAX_IN_FLIGHT_BYTES: u64 = 16 << 20;
/// Most ops, and estimated bytes, in one `ApplyMeta` (far below the frame cap
/// even for paths and link targets of the longest kind).
const META_OPS: usize = 2_000;
const META_BYTES: usize = 1 << 20;
/// Most chunks a `Resume` lists, so it fits a frame whatever the offsets
/// (at most ~47 encoded bytes a chunk): about 85 GiB at the largest chunk
/// size. Larger files are sent afresh.
const MAX_RESUME_CHUNKS: usize = outpost_protocol::limits::MAX_FRAME_LEN / 2 / 48;
/// How often a long wait (a scan) looks at [`Progress::cancelled`].
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Local tree → `remote` on the session's host.
pub async fn push(
    session: &Session,
    local: &Path,
    remote: &str,
    options: &SyncOptions,
    progress: Arc<Progress>,
) -> Result<SyncReport, SyncError> {
    let started = Instant::now();
    let local = local_dir(local, true)?;
    let spec = filter_spec(options, &local)?;
    // One connection for the whole sync: staged parts live in the agent of
    // that connection, and a sync whose connection dies is not carried on by
    // a new one.
    let conn = session.connection().await?;
    let remote_scan = scan_on(&conn, scan_request(remote, &spec));
    let local_scan = scan_local(local.clone(), spec);
    let (src, (dst, dst_summary)) = until_cancelled(&progress, async {
        tokio::try_join!(local_scan, async { Ok(remote_scan.await?) })
    })
    .await?;

    root_problem(&local.display().to_string(), &src.summary)?;
    root_problem(remote, &dst_summary)?;
    let src_problems = problem_paths(&src.summary);
    let mut report = SyncReport::default();
    add_problems(&mut report, &src.summary.problems);
    add_problems(&mut report, &dst_summary.problems);
    let mut plan =
        plan::diff(&src.entries, &dst, &diff_options(options)).map_err(SyncError::Invalid)?;
    spare_unseen(&mut plan, &src_problems);
    drop((src, dst));
    if options.dry_run {
        return Ok(dry_run_report(report, &plan, started));
    }
    start_progress(&progress, &plan, &mut report);
    let changes = std::mem::take(&mut plan.files);

    let dest = Dest::Remote {
        conn: Arc::clone(&conn),
        root: remote.to_string(),
    };
    if !dst_summary.root_exists {
        create_remote_root(&conn, remote, &progress).await?;
    }
    let mut run = Run {
        dest,
        progress,
        report,
        src_problems,
        partials: partial_set(&dst_summary.partials),
    };
    run.before_files(&plan).await?;
    let files = PushFiles::new(conn, remote.to_string(), local, &mut run);
    files.run(changes).await?;
    run.after_files(&plan).await?;
    Ok(run.finish(&plan, started))
}

/// `remote` on the session's host → local tree.
pub async fn pull(
    session: &Session,
    remote: &str,
    local: &Path,
    options: &SyncOptions,
    progress: Arc<Progress>,
) -> Result<SyncReport, SyncError> {
    let started = Instant::now();
    let local = local_dir(local, false)?;
    let spec = filter_spec(options, &local)?;
    let conn = session.connection().await?;
    let remote_scan = scan_on(&conn, scan_request(remote, &spec));
    let local_scan = scan_local(local.clone(), spec);
    let ((src, src_summary), dst) = until_cancelled(&progress, async {
        tokio::try_join!(async { Ok(remote_scan.await?) }, local_scan)
    })
    .await?;
    if !src_summary.root_exists {
        return Err(SyncError::Invalid(format!(
            "remote path not found: {remote}"
        )));
    }
    root_problem(remote, &src_summary)?;
    root_problem(&local.display().to_string(), &dst.summary)?;
    let src_problems = problem_paths(&src_summary);

    let mut report = SyncReport::default();
    add_problems(&mut report, &src_summary.problems);
    add_problems(&mut report, &dst.summary.problems);
    let mut plan =
        plan::diff(&src, &dst.entries, &diff_options(options)).map_err(SyncError::Invalid)?;
    spare_unseen(&mut plan, &src_problems);
    let local_exists = dst.summary.root_exists;
    let partials = partial_set(&dst.summary.partials);
    drop((src, dst));
    if options.dry_run {
        return Ok(dry_run_report(report, &plan, started));
    }
    start_progress(&progress, &plan, &mut report);
    let changes = std::mem::take(&mut plan.files);

    if !local_exists {
        std::fs::create_dir_all(&local)
            .map_err(|e| SyncError::Invalid(format!("cannot create {}: {e}", local.display())))?;
    }
    let applier = Arc::new(Mutex::new(Applier::new(&local)));
    let mut run = Run {
        dest: Dest::Local {
            applier: Arc::clone(&applier),
        },
        progress,
        report,
        src_problems,
        partials,
    };
    run.before_files(&plan).await?;
    let files = PullFiles::new(conn, remote.to_string(), local, applier, &mut run);
    files.run(changes).await?;
    run.after_files(&plan).await?;
    Ok(run.finish(&plan, started))
}

/// Runs a remote scan and collects its entries.
pub async fn scan_remote(
    session: &Session,
    request: ScanRequest,
) -> Result<(Vec<TreeEntry>, ScanSummary), CallError> {
    let conn = session.connection().await?;
    scan_on(&conn, request).await
}

/// Reads `len` bytes at `offset` of a remote file (decompressed), and the
/// file's size. `path` is absolute or `~`-relative on the host.
///
/// The size comes from a scan of the file's directory that excludes every
/// name but the file's (one directory listing, no stat of anything else),
/// sent together with the read so it costs no extra round trip. The two are
/// not atomic: a file that grew in between reports at least what was read.
pub async fn read_remote(
    session: &Session,
    path: &str,
    offset: u64,
    len: u64,
) -> Result<(Vec<u8>, u64), SyncError> {
    let (parent, name) = split_remote(path)?;
    let conn = session.connection().await?;
    let stat = stat_remote(&conn, &parent, &name);
    let read = async {
        let mut call = conn.start(Request::ReadFiles(ReadFiles {
            root: parent.clone(),
            reads: vec![ReadSpec {
                path: name.clone(),
                ranges: Some(vec![(offset, len)]),
            }],
        }))?;
        let mut data = Vec::new();
        loop {
            match call.next().await? {
                Response::FileData {
                    offset: at,
                    data: piece,
                    ..
                } => {
                    let room = usize::try_from(len).unwrap_or(usize::MAX) - data.len();
                    let piece = codec::decompress(&piece, room).map_err(|e| {
                        CallError::Protocol(format!("bad data for {path} at {at}: {e}"))
                    })?;
                    data.extend_from_slice(&piece);
                }
                Response::ReadDone { problems } => {
                    return Ok::<_, SyncError>(match problems.first() {
                        Some(p) => Err(p.message.clone()),
                        None => Ok(data),
                    });
                }
                Response::Error(e) => return Err(CallError::Agent(e).into()),
                other => return Err(unexpected("a read", &other).into()),
            }
        }
    };
    let (stat, read) = tokio::try_join!(stat, read)?;
    let entry = match stat {
        Some(entry) => entry,
        None => return Err(SyncError::Invalid(format!("remote file not found: {path}"))),
    };
    if !matches!(entry.kind, EntryKind::File) {
        return Err(SyncError::Invalid(format!("not a regular file: {path}")));
    }
    let data = read.map_err(|message| SyncError::Invalid(format!("{path}: {message}")))?;
    let size = match data.len() as u64 {
        0 => entry.size,
        n => entry.size.max(offset.saturating_add(n)),
    };
    Ok((data, size))
}

/// Writes a whole remote file atomically (temp + verify + rename).
pub async fn write_remote(
    session: &Session,
    path: &str,
    content: &[u8],
    mode: u32,
    create_parents: bool,
) -> Result<(), SyncError> {
    let (parent, name) = split_remote(path)?;
    let conn = session.connection().await?;
    let compressed = codec::compress(content);
    let file = FilePut {
        path: name.clone(),
        mode,
        mtime_ns: now_ns(),
        size: content.len() as u64,
        hash: *blake3::hash(content).as_bytes(),
        expect: Expect::Any,
        content: FileContent::Inline(Vec::new()),
    };
    let content = if compressed.len() as u64 <= REQUEST_BYTES {
        FileContent::Inline(compressed)
    } else {
        // Too big for one frame: stage it in parts, as a sync would. The
        // first part creates missing directories, so without create_parents
        // their absence is checked first.
        if !create_parents {
            let request = ScanRequest {
                root: parent.clone(),
                filter: only(&name),
                hashes: false,
                recursive: false,
                max_entries: 1,
            };
            if !scan_on(&conn, request).await?.1.root_exists {
                return Err(SyncError::Invalid(format!(
                    "{path}: the directory {parent} does not exist"
                )));
            }
        }
        let xfer = next_xfer();
        let mut acks = Vec::new();
        for (at, piece) in content.chunks(REQUEST_BYTES as usize).enumerate() {
            let call = conn.start(Request::PutPart(PutPart {
                root: parent.clone(),
                xfer,
                path: name.clone(),
                offset: at as u64 * REQUEST_BYTES,
                data: PartData::Data(codec::compress(piece)),
                hash: file.hash,
                size: file.size,
            }))?;
            acks.push(final_answer(call));
        }
        for answer in futures::future::join_all(acks).await {
            match answer? {
                Response::Ack => {}
                Response::Error(e) => {
                    abort_remote(&conn, &parent, &[xfer]).await;
                    return Err(SyncError::Invalid(format!("{path}: {}", e.message)));
                }
                other => return Err(unexpected("a part", &other).into()),
            }
        }
        FileContent::Staged { xfer }
    };
    let call = conn.start(Request::PutFiles(PutFiles {
        root: parent,
        create_parents,
        files: vec![FilePut { content, ..file }],
    }))?;
    match final_answer(call).await? {
        Response::Applied(report) => match report.problems.first() {
            Some(p) => Err(SyncError::Invalid(format!("{path}: {}", p.message))),
            None => Ok(()),
        },
        Response::Error(e) => Err(CallError::Agent(e).into()),
        other => Err(unexpected("a write", &other).into()),
    }
}

// ---------------------------------------------------------------------------
// Scans and plans

fn scan_request(root: &str, spec: &FilterSpec) -> ScanRequest {
    ScanRequest {
        root: root.to_string(),
        filter: spec.clone(),
        hashes: true,
        recursive: true,
        max_entries: 0,
    }
}

async fn scan_on(
    conn: &Arc<Connection>,
    request: ScanRequest,
) -> Result<(Vec<TreeEntry>, ScanSummary), CallError> {
    let mut call = conn.start(Request::Scan(request))?;
    let mut entries = Vec::new();
    loop {
        match call.next().await? {
            Response::Entries(batch) => entries.extend(batch),
            Response::ScanDone(summary) => return Ok((entries, summary)),
            Response::Error(e) => return Err(CallError::Agent(e)),
            other => return Err(unexpected("a scan", &other)),
        }
    }
}

/// The entry of `name` in the remote directory `parent`, if there is one.
async fn stat_remote(
    conn: &Arc<Connection>,
    parent: &str,
    name: &[u8],
) -> Result<Option<TreeEntry>, SyncError> {
    let (entries, _) = scan_on(
        conn,
        ScanRequest {
            root: parent.to_string(),
            filter: only(name),
            hashes: false,
            recursive: false,
            max_entries: 1,
        },
    )
    .await?;
    Ok(entries.into_iter().find(|e| e.path == name))
}

/// A filter that excludes every name of a directory but `name`.
fn only(name: &[u8]) -> FilterSpec {
    let mut keep = String::from("!/");
    for c in String::from_utf8_lossy(name).chars() {
        // Everything glob or gitignore syntax could read as special,
        // escaped; a backslash makes any character literal.
        if "\\*?[]{}!# ".contains(c) {
            keep.push('\\');
        }
        keep.push(c);
    }
    FilterSpec {
        excludes: vec!["*".into(), keep],
        use_gitignore: false,
    }
}

/// Scans a local tree on a blocking thread, with the stat cache so unchanged
/// files are not hashed again.
async fn scan_local(root: PathBuf, filter: FilterSpec) -> Result<ScanOutput, SyncError> {
    tokio::task::spawn_blocking(move || {
        let cache_file = local_cache_file(&root);
        let mut cache = cache_file.as_deref().map(StatCache::load);
        let options = ScanOptions {
            hashes: true,
            recursive: true,
            max_entries: 0,
            reap_stale_temps: true,
        };
        let output = scan::scan(&root, &filter, &options, cache.as_mut());
        if let (Some(cache), Some(file)) = (cache, cache_file)
            && output.summary.root_exists
        {
            let saved = file.parent().map_or(Ok(()), |dir| {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
            });
            // A cache that cannot be saved only costs hashing again next time.
            if let Err(e) = saved.and_then(|()| cache.save(&file)) {
                tracing::debug!("cannot save {}: {e}", file.display());
            }
        }
        output
    })
    .await
    .map_err(|_| SyncError::Invalid("the local scan failed unexpectedly".into()))
}

/// `$OUTPOST_HOME` (else `~/.outpost`) `/cache/local-scan-<first 16 hex
/// digits of BLAKE3(root)>`.
fn local_cache_file(root: &Path) -> Option<PathBuf> {
    let nonempty = |v: std::ffi::OsString| (!v.is_empty()).then(|| PathBuf::from(v));
    let home = std::env::var_os("OUTPOST_HOME")
        .and_then(nonempty)
        .or_else(|| {
            Some(
                std::env::var_os("HOME")
                    .and_then(nonempty)?
                    .join(".outpost"),
            )
        })?;
    let hex = blake3::hash(root.as_os_str().as_bytes()).to_hex();
    Some(
        home.join("cache")
            .join(format!("local-scan-{}", &hex[..16])),
    )
}

/// The local root as an absolute path. A push needs an existing directory; a
/// pull creates a missing one.
fn local_dir(local: &Path, must_exist: bool) -> Result<PathBuf, SyncError> {
    let invalid = SyncError::Invalid;
    if local.as_os_str().is_empty() {
        return Err(invalid("the local path is empty".into()));
    }
    let abs = std::path::absolute(local)
        .map_err(|e| invalid(format!("cannot resolve {}: {e}", local.display())))?;
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => Ok(abs),
        Ok(m) => Err(invalid(match special_kind(&m.file_type()) {
            Some(kind) => format!(
                "local path {} is {kind}, not a file or directory",
                local.display()
            ),
            None => format!("local path is not a directory: {}", local.display()),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if must_exist {
                Err(invalid(format!(
                    "local path not found: {}",
                    local.display()
                )))
            } else {
                Ok(abs)
            }
        }
        Err(e) => Err(invalid(format!("cannot read {}: {e}", local.display()))),
    }
}

/// What a path that is neither a file nor a directory is, if it is that.
fn special_kind(kind: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_fifo() {
        Some("a fifo")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// The excludes of a sync: the defaults first, so that the caller's own
/// `!pattern`s can re-include what they exclude.
fn filter_spec(options: &SyncOptions, local: &Path) -> Result<FilterSpec, SyncError> {
    let mut excludes = Vec::new();
    if options.default_excludes {
        excludes.extend(DEFAULT_EXCLUDES.iter().map(|p| p.to_string()));
    }
    excludes.extend(options.excludes.iter().cloned());
    if let Some(file) = &options.exclude_file {
        excludes.extend(filter::read_exclude_file(file).map_err(SyncError::Invalid)?);
    }
    let spec = FilterSpec {
        excludes,
        use_gitignore: options.use_gitignore,
    };
    // Checked here so a bad pattern is refused before anything is scanned.
    Filter::new(local, &spec).map_err(SyncError::Invalid)?;
    Ok(spec)
}

fn diff_options(options: &SyncOptions) -> DiffOptions {
    DiffOptions {
        delete_extras: options.delete_extras,
        force: options.force,
    }
}

fn dry_run_report(mut report: SyncReport, plan: &Plan, started: Instant) -> SyncReport {
    report.would_send = plan
        .files
        .iter()
        .map(|f| &f.src.path)
        .chain(plan.symlinks.iter().map(|l| &l.path))
        .take(PLAN_LISTING)
        .map(|p| relpath::display(p))
        .collect();
    report.would_delete = plan
        .removes
        .iter()
        .take(PLAN_LISTING)
        .map(|p| relpath::display(p))
        .collect();
    report.files_sent = plan.files.len() as u64;
    report.files_unchanged = plan.unchanged;
    report.dirs_created = plan.mkdirs.len() as u64;
    report.symlinks = plan.symlinks.len() as u64;
    report.attrs_updated = plan.attrs.len() as u64;
    report.deleted = plan.removes.len() as u64;
    report.bytes_total = plan.content_bytes();
    report.duration_s = started.elapsed().as_secs_f64();
    report.dry_run = true;
    report
}

fn start_progress(progress: &Progress, plan: &Plan, report: &mut SyncReport) {
    report.bytes_total = plan.content_bytes();
    progress
        .files_total
        .store(plan.files.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .store(report.bytes_total, Ordering::Relaxed);
}

fn problem_paths(summary: &ScanSummary) -> HashSet<RelPath> {
    summary.problems.iter().map(|p| p.path.clone()).collect()
}

/// Drops removals that touch a path the source scan could not fully see (an
/// unreadable directory is listed without its contents): its destination copy
/// is not an extra, and deleting it would lose data.
fn spare_unseen(plan: &mut Plan, src_problems: &HashSet<RelPath>) {
    let related = |a: &[u8], b: &[u8]| {
        a.is_empty()
            || b.is_empty()
            || a == b
            || (a.len() > b.len() && a.starts_with(b) && a[b.len()] == b'/')
            || (b.len() > a.len() && b.starts_with(a) && b[a.len()] == b'/')
    };
    plan.removes
        .retain(|r| !src_problems.iter().any(|p| related(r, p)));
}

/// A root that exists but cannot be synced (not a directory, unreadable):
/// the scan reports it as a problem with an empty path.
fn root_problem(root: &str, summary: &ScanSummary) -> Result<(), SyncError> {
    match summary.problems.iter().find(|p| p.path.is_empty()) {
        // "a character device, not a file or directory"
        Some(p) if p.message.ends_with(", not a file or directory") => {
            Err(SyncError::Invalid(format!("{root} is {}", p.message)))
        }
        Some(p) => Err(SyncError::Invalid(format!("{root}: {}", p.message))),
        None => Ok(()),
    }
}

/// Creates a push's missing remote root: a `Mkdir` of its name in its
/// parent, which the agent creates with any missing ancestors.
async fn create_remote_root(
    conn: &Arc<Connection>,
    root: &str,
    progress: &Progress,
) -> Result<(), SyncError> {
    check_cancelled(progress)?;
    let trimmed = root.trim_end_matches('/');
    let (parent, name) = split_remote(trimmed)
        .map_err(|_| SyncError::Invalid(format!("cannot create {root}: not a directory path")))?;
    let call = conn.start(Request::ApplyMeta(ApplyMeta {
        root: parent,
        ops: vec![MetaOp::Mkdir {
            path: name,
            mode: 0o755,
        }],
    }))?;
    match final_answer(call).await? {
        Response::Applied(report) => match report.problems.first() {
            Some(p) => Err(SyncError::Invalid(format!(
                "cannot create {root}: {}",
                p.message
            ))),
            None => Ok(()),
        },
        Response::Error(e) => Err(CallError::Agent(e).into()),
        other => Err(unexpected("creating the root", &other).into()),
    }
}

// ---------------------------------------------------------------------------
// Applying a plan: the metadata phases

/// Where a plan is applied.
enum Dest {
    /// Through the agent.
    Remote { conn: Arc<Connection>, root: String },
    /// Here.
    Local { applier: Arc<Mutex<Applier>> },
}

/// A sync being applied: where, its counters, and its report so far.
struct Run {
    dest: Dest,
    progress: Arc<Progress>,
    report: SyncReport,
    /// Source paths the scan already reported a problem for (a file it could
    /// not hash, say), so skipping them does not report them twice.
    src_problems: HashSet<RelPath>,
    /// Partial files the target scan found: (directory, hash prefix, size).
    partials: HashSet<(RelPath, [u8; 16], u64)>,
}

fn partial_set(partials: &[Partial]) -> HashSet<(RelPath, [u8; 16], u64)> {
    partials
        .iter()
        .map(|p| (p.dir.clone(), p.hash_prefix, p.size))
        .collect()
}

impl Run {
    /// Whether an interrupted transfer left a partial file of this change's
    /// new content that chunks can be checked against.
    fn resumable(&self, change: &FileChange) -> bool {
        let src = &change.src;
        let Some(hash) = src.hash else { return false };
        let prefix: [u8; 16] = hash[..16].try_into().expect("16 of 32 bytes");
        tiles(&src.chunks, src.size)
            && src.chunks.len() <= MAX_RESUME_CHUNKS
            && self
                .partials
                .contains(&(relpath::parent(&src.path).to_vec(), prefix, src.size))
    }

    /// Takes a resume's answer in: the chunks the partial file holds count
    /// as done, and `parts` becomes what is left to send.
    fn take_resumed(&mut self, staged: &mut Staged, present: &[u32], parts: &mut Vec<Part>) {
        if present.is_empty() {
            return;
        }
        let (held, rest) = resume_plan(&staged.change, present);
        *parts = rest;
        staged.counted += held;
        self.report.bytes_resumed += held;
        self.progress.bytes_done.fetch_add(held, Ordering::Relaxed);
    }

    /// Reports a file that is not sent at all, unless the scan already did.
    fn skip(&mut self, change: &FileChange, message: &str) {
        if !self.src_problems.contains(&change.src.path) {
            let line = problem(&change.src.path, message);
            self.report.problems.push(line);
        }
        let progress = &self.progress;
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        progress
            .bytes_done
            .fetch_add(change.src.size, Ordering::Relaxed);
    }
}

impl Run {
    /// Kind changes, then new directories.
    async fn before_files(&mut self, plan: &Plan) -> Result<(), SyncError> {
        let removes = plan
            .replace_removes
            .iter()
            .map(|p| MetaOp::Remove { path: p.clone() });
        self.meta(removes.collect()).await?;
        let mkdirs = plan.mkdirs.iter().map(|e| MetaOp::Mkdir {
            path: e.path.clone(),
            mode: e.mode,
        });
        self.report.dirs_created = self.meta(mkdirs.collect()).await?;
        Ok(())
    }

    /// Symlinks, attributes, extras, directory attributes.
    async fn after_files(&mut self, plan: &Plan) -> Result<(), SyncError> {
        let links = plan.symlinks.iter().filter_map(|e| match &e.kind {
            EntryKind::Symlink { target } => Some(MetaOp::Symlink {
                path: e.path.clone(),
                target: target.clone(),
            }),
            _ => None,
        });
        self.report.symlinks = self.meta(links.collect()).await?;
        self.report.attrs_updated = self.meta(set_attrs(&plan.attrs)).await?;
        let removes = plan
            .removes
            .iter()
            .map(|p| MetaOp::Remove { path: p.clone() });
        self.report.deleted = self.meta(removes.collect()).await?;
        self.meta(set_attrs(&plan.dir_attrs)).await?;
        Ok(())
    }

    fn finish(mut self, plan: &Plan, started: Instant) -> SyncReport {
        self.report.files_unchanged = plan.unchanged;
        self.report.duration_s = started.elapsed().as_secs_f64();
        self.report
    }

    /// Applies `ops` in order, in requests of bounded size, one at a time
    /// (later ops may depend on earlier ones: a parent before its child).
    /// Returns how many succeeded.
    async fn meta(&mut self, ops: Vec<MetaOp>) -> Result<u64, SyncError> {
        let mut done = 0;
        for batch in meta_batches(ops) {
            check_cancelled(&self.progress)?;
            let report = match &self.dest {
                Dest::Remote { conn, root } => {
                    let call = conn.start(Request::ApplyMeta(ApplyMeta {
                        root: root.clone(),
                        ops: batch,
                    }))?;
                    match final_answer(call).await? {
                        Response::Applied(report) => report,
                        Response::Error(e) => return Err(CallError::Agent(e).into()),
                        other => return Err(unexpected("metadata changes", &other).into()),
                    }
                }
                Dest::Local { applier } => {
                    let applier = Arc::clone(applier);
                    blocking(move || lock(&applier).apply_meta(&batch)).await?
                }
            };
            done += u64::from(report.done);
            add_problems(&mut self.report, &report.problems);
        }
        Ok(done)
    }
}

fn set_attrs(entries: &[TreeEntry]) -> Vec<MetaOp> {
    entries
        .iter()
        .map(|e| MetaOp::SetAttrs {
            path: e.path.clone(),
            mode: e.mode,
            mtime_ns: e.mtime_ns,
        })
        .collect()
}

/// Splits ops into requests, keeping their order.
fn meta_batches(ops: Vec<MetaOp>) -> Vec<Vec<MetaOp>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let size = 32
            + match &op {
                MetaOp::Mkdir { path, .. }
                | MetaOp::SetAttrs { path, .. }
                | MetaOp::Remove { path } => path.len(),
                MetaOp::Symlink { path, target } => path.len() + target.len(),
                MetaOp::Abort { .. } => 0,
            };
        if !batch.is_empty() && (batch.len() >= META_OPS || bytes + size > META_BYTES) {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push(op);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

// ---------------------------------------------------------------------------
// File contents: how each file travels

/// One piece of a file sent in parts, at `offset` in the new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Bytes the receiver already has, at `from` in its current file.
    Copy { offset: u64, from: u64, len: u64 },
    /// Bytes to send.
    Data { offset: u64, len: u64 },
}

impl Part {
    fn len(&self) -> u64 {
        match *self {
            Part::Copy { len, .. } | Part::Data { len, .. } => len,
        }
    }
}

/// How a changed file travels.
enum Route {
    /// Whole, compressed, in a batch with other small files.
    Inline,
    /// In parts, then committed.
    Parts(Vec<Part>),
}

fn route(change: &FileChange) -> Route {
    let dst_chunks = change.dst.as_ref().map_or(&[][..], |d| &d.chunks[..]);
    if !change.src.chunks.is_empty() && !dst_chunks.is_empty() {
        Route::Parts(plan_parts(
            change.src.size,
            &change.src.chunks,
            dst_chunks,
            REQUEST_BYTES,
            &HashSet::new(),
        ))
    } else if change.src.size <= INLINE_MAX {
        Route::Inline
    } else {
        Route::Parts(plan_parts(
            change.src.size,
            &[],
            &[],
            REQUEST_BYTES,
            &HashSet::new(),
        ))
    }
}

/// The hash and size of a change's new content.
fn content_of(change: &FileChange) -> ([u8; 32], u64) {
    (change.src.hash.unwrap_or_default(), change.src.size)
}

/// A resumed file's parts: what the partial file does not hold yet (copied
/// from the current file where it has it). Returns the bytes held and the
/// parts.
fn resume_plan(change: &FileChange, present: &[u32]) -> (u64, Vec<Part>) {
    let src = &change.src;
    let in_place: HashSet<u32> = present
        .iter()
        .copied()
        .filter(|&i| (i as usize) < src.chunks.len())
        .collect();
    let held = in_place
        .iter()
        .map(|&i| u64::from(src.chunks[i as usize].len))
        .sum();
    let dst_chunks = change.dst.as_ref().map_or(&[][..], |d| &d.chunks[..]);
    let parts = plan_parts(src.size, &src.chunks, dst_chunks, REQUEST_BYTES, &in_place);
    (held, parts)
}

/// Describes a file of `size` bytes made of `src` chunks as parts: a chunk
/// the receiver's current file also has (same hash) is copied from there,
/// anything else is sent, and chunks whose indices are `in_place` (a resumed
/// partial file holds them) need nothing. Adjacent copies from adjacent
/// places become one copy; adjacent data becomes one part of at most
/// `max_data` bytes. Chunk lists that do not tile the file exactly (none, or
/// a file changed while it was described) fall back to sending everything.
fn plan_parts(
    size: u64,
    src: &[ChunkRef],
    dst: &[ChunkRef],
    max_data: u64,
    in_place: &HashSet<u32>,
) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    if !tiles(src, size) {
        let mut offset = 0;
        while offset < size {
            let len = max_data.min(size - offset);
            parts.push(Part::Data { offset, len });
            offset += len;
        }
        return parts;
    }
    let mut have: HashMap<[u8; 32], u64> = HashMap::with_capacity(dst.len());
    for chunk in dst {
        have.entry(chunk.hash).or_insert(chunk.offset);
    }
    for (index, chunk) in src.iter().enumerate() {
        if in_place.contains(&(index as u32)) {
            continue;
        }
        let len = u64::from(chunk.len);
        let part = match have.get(&chunk.hash) {
            Some(&from) => Part::Copy {
                offset: chunk.offset,
                from,
                len,
            },
            None => Part::Data {
                offset: chunk.offset,
                len,
            },
        };
        // Only neighbours merge: a chunk left out in between breaks a run.
        match (parts.last_mut(), part) {
            (
                Some(Part::Copy {
                    offset: prev_offset,
                    from: prev_from,
                    len: prev_len,
                }),
                Part::Copy { offset, from, len },
            ) if *prev_from + *prev_len == from && *prev_offset + *prev_len == offset => {
                *prev_len += len
            }
            (
                Some(Part::Data {
                    offset: prev_offset,
                    len: prev_len,
                }),
                Part::Data { offset, len },
            ) if *prev_len + len <= max_data && *prev_offset + *prev_len == offset => {
                *prev_len += len
            }
            _ => parts.push(part),
        }
    }
    split_data(parts, max_data)
}

/// Splits data parts longer than `max` (one chunk of a very large file can
/// be up to 4 MiB) so no request outgrows its budget.
fn split_data(parts: Vec<Part>, max: u64) -> Vec<Part> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Part::Data { offset, len } if len > max => {
                let mut at = 0;
                while at < len {
                    let piece = max.min(len - at);
                    out.push(Part::Data {
                        offset: offset + at,
                        len: piece,
                    });
                    at += piece;
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether `chunks` cover `0..size` exactly, in order.
fn tiles(chunks: &[ChunkRef], size: u64) -> bool {
    let mut end = 0u64;
    for chunk in chunks {
        if chunk.offset != end || chunk.len == 0 {
            return false;
        }
        end += u64::from(chunk.len);
    }
    !chunks.is_empty() && end == size
}

/// Groups consecutive data parts into reads of at most `max` bytes each.
fn group_ranges(parts: &[Part], max: u64) -> Vec<Vec<(u64, u64)>> {
    let mut groups = Vec::new();
    let mut group = Vec::new();
    let mut bytes = 0;
    for part in parts {
        if let Part::Data { offset, len } = *part {
            if !group.is_empty() && bytes + len > max {
                groups.push(std::mem::take(&mut group));
                bytes = 0;
            }
            bytes += len;
            group.push((offset, len));
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// What a write must find at its path: nothing for a new file, else the file
/// the plan saw, so a change made meanwhile is never overwritten.
fn expect_of(dst: &Option<TreeEntry>) -> Expect {
    match dst {
        None => Expect::Absent,
        Some(d) => Expect::File {
            size: d.size,
            mtime_ns: d.mtime_ns,
        },
    }
}

/// A file's put, content aside.
fn put_of(change: &FileChange, hash: [u8; 32], content: FileContent) -> FilePut {
    FilePut {
        path: change.src.path.clone(),
        mode: change.src.mode,
        mtime_ns: change.src.mtime_ns,
        size: change.src.size,
        hash,
        expect: expect_of(&change.dst),
        content,
    }
}

/// Unique transfer ids for this process: appliers are per root and
/// connection, and two syncs of one process may share both.
fn next_xfer() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// The request pipeline

type Flight<T> = Pin<Box<dyn Future<Output = Landed<T>> + Send>>;

/// A request that got its final answer.
struct Landed<T> {
    tag: T,
    weight: u64,
    /// Every response, the final one last.
    result: Result<Vec<Response>, CallError>,
}

/// Requests in flight on one connection, bounded in number and in content
/// bytes. Answers wait in the connection's queue until collected, so nothing
/// is lost while the sync is busy elsewhere.
struct Pipeline<T> {
    conn: Arc<Connection>,
    flights: FuturesUnordered<Flight<T>>,
    bytes: u64,
}

impl<T: Send + 'static> Pipeline<T> {
    fn new(conn: Arc<Connection>) -> Pipeline<T> {
        Pipeline {
            conn,
            flights: FuturesUnordered::new(),
            bytes: 0,
        }
    }

    /// Whether a request of `weight` bytes must wait for room.
    fn is_full(&self, weight: u64) -> bool {
        !self.flights.is_empty()
            && (self.flights.len() >= MAX_IN_FLIGHT || self.bytes + weight > MAX_IN_FLIGHT_BYTES)
    }

    fn start(&mut self, request: Request, tag: T, weight: u64) -> Result<(), CallError> {
        let mut call = self.conn.start(request)?;
        self.bytes += weight;
        self.flights.push(Box::pin(async move {
            let mut responses = Vec::new();
            let result = loop {
                match call.next().await {
                    Ok(response) => {
                        let last = response.is_final();
                        responses.push(response);
                        if last {
                            break Ok(responses);
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            Landed {
                tag,
                weight,
                result,
            }
        }));
        Ok(())
    }

    async fn next(&mut self) -> Option<Landed<T>> {
        let landed = self.flights.next().await?;
        self.bytes -= landed.weight;
        Some(landed)
    }
}

/// The final response of a landed request.
fn final_of(result: Result<Vec<Response>, CallError>) -> Result<Response, CallError> {
    result?
        .pop()
        .ok_or_else(|| CallError::Protocol("a request ended without an answer".into()))
}

async fn final_answer(mut call: Call) -> Result<Response, CallError> {
    loop {
        let response = call.next().await?;
        if response.is_final() {
            return Ok(response);
        }
    }
}

// ---------------------------------------------------------------------------
// Push: file contents to the agent

enum PushTag {
    /// A `PutFiles` of inline files: their paths and sizes.
    Batch(Vec<(RelPath, u64)>),
    /// A `PutPart` of `staged[i]`, covering `len` bytes of the file.
    Part { staged: usize, len: u64 },
    /// The `PutFiles` committing `staged[i]`.
    Commit { staged: usize },
}

/// A file sent in parts.
struct Staged {
    change: FileChange,
    xfer: u64,
    /// The receiver holds staging for this transfer (a resume began it, or a
    /// part was sent): a transfer given up must be aborted there.
    begun: bool,
    sent: usize,
    settled: usize,
    all_sent: bool,
    failed: bool,
    resolved: bool,
    committed: bool,
    /// Bytes of the file already counted in the progress.
    counted: u64,
}

impl Staged {
    fn new(change: FileChange) -> Staged {
        Staged {
            change,
            xfer: next_xfer(),
            begun: false,
            sent: 0,
            settled: 0,
            all_sent: false,
            failed: false,
            resolved: false,
            committed: false,
            counted: 0,
        }
    }

    /// Whether every part sent has been answered and no more will be sent.
    fn is_settled(&self) -> bool {
        self.all_sent && self.settled == self.sent && !self.resolved
    }
}

/// Inline files read and compressed for one `PutFiles`.
struct Batch {
    puts: Vec<FilePut>,
    /// Files that could not be read: path and message.
    problems: Vec<(RelPath, String)>,
    /// Bytes of the files in `problems`.
    skipped_bytes: u64,
    /// Compressed bytes plus a per-file allowance: the request's weight.
    weight: u64,
    compressed: u64,
    /// Where the next batch starts.
    next: usize,
}

/// Reads and compresses files of `changes` from `start` until the batch is
/// full. Each file is checked against the scan (size and hash), so what is
/// sent is exactly what the plan describes.
fn read_batch(local: &Path, changes: &[FileChange], start: usize) -> Batch {
    let mut batch = Batch {
        puts: Vec::new(),
        problems: Vec::new(),
        skipped_bytes: 0,
        weight: 0,
        compressed: 0,
        next: start,
    };
    let mut raw = 0;
    while batch.next < changes.len()
        && batch.puts.len() + batch.problems.len() < BATCH_FILES
        && batch.weight < REQUEST_BYTES
        && raw < BATCH_RAW
    {
        let change = &changes[batch.next];
        batch.next += 1;
        match read_whole(local, &change.src) {
            Ok((data, hash)) => {
                raw += data.len() as u64;
                let data = codec::compress(&data);
                batch.compressed += data.len() as u64;
                batch.weight += data.len() as u64 + change.src.path.len() as u64 + 128;
                batch
                    .puts
                    .push(put_of(change, hash, FileContent::Inline(data)));
            }
            Err(message) => {
                batch.skipped_bytes += change.src.size;
                batch.problems.push((change.src.path.clone(), message));
            }
        }
    }
    batch
}

fn read_whole(local: &Path, src: &TreeEntry) -> Result<(Vec<u8>, [u8; 32]), String> {
    let path = relpath::join(local, &src.path)?;
    let data = std::fs::read(&path).map_err(|e| format!("cannot read: {e}"))?;
    let hash = *blake3::hash(&data).as_bytes();
    if data.len() as u64 != src.size || src.hash.is_some_and(|h| h != hash) {
        return Err(CHANGED.into());
    }
    Ok((data, hash))
}

const CHANGED: &str = "changed while syncing; sync again to send it";
const UNHASHED: &str = "could not be hashed; not sent";

/// Reads `len` bytes at `offset` and compresses them.
fn read_range(local: &Path, src: &TreeEntry, offset: u64, len: u64) -> Result<Vec<u8>, String> {
    let path = relpath::join(local, &src.path)?;
    let file = std::fs::File::open(&path).map_err(|e| format!("cannot read: {e}"))?;
    let mut buf = vec![0; len as usize];
    file.read_exact_at(&mut buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CHANGED.to_string()
        } else {
            format!("cannot read: {e}")
        }
    })?;
    Ok(codec::compress(&buf))
}

/// Sends a push's file contents through a [`Pipeline`].
struct PushFiles<'r> {
    root: String,
    local: PathBuf,
    run: &'r mut Run,
    pipe: Pipeline<PushTag>,
    staged: Vec<Staged>,
    /// Staged files whose parts are all acknowledged, to commit.
    ready: VecDeque<usize>,
    /// Transfers that will not be committed.
    aborts: Vec<u64>,
}

impl<'r> PushFiles<'r> {
    fn new(conn: Arc<Connection>, root: String, local: PathBuf, run: &'r mut Run) -> Self {
        PushFiles {
            root,
            local,
            run,
            pipe: Pipeline::new(conn),
            staged: Vec::new(),
            ready: VecDeque::new(),
            aborts: Vec::new(),
        }
    }

    async fn run(mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let result = self.send_all(changes).await;
        if result.is_err() {
            self.wind_down().await;
        }
        result
    }

    async fn send_all(&mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let mut inline = Vec::new();
        let mut parted = Vec::new();
        for change in changes {
            match route(&change) {
                Route::Inline => inline.push(change),
                Route::Parts(parts) => parted.push((change, parts)),
            }
        }

        let inline = Arc::new(inline);
        let mut next = 0;
        while next < inline.len() {
            check_cancelled(&self.run.progress)?;
            // Read on a blocking thread; what is in flight meanwhile keeps
            // the link busy.
            let (local, changes) = (self.local.clone(), Arc::clone(&inline));
            let batch = blocking(move || read_batch(&local, &changes, next)).await?;
            next = batch.next;
            for (path, message) in &batch.problems {
                self.run.report.problems.push(problem(path, message));
            }
            let progress = &self.run.progress;
            progress
                .files_done
                .fetch_add(batch.problems.len() as u64, Ordering::Relaxed);
            progress
                .bytes_done
                .fetch_add(batch.skipped_bytes, Ordering::Relaxed);
            if batch.puts.is_empty() {
                continue;
            }
            let files = batch
                .puts
                .iter()
                .map(|p| (p.path.clone(), p.size))
                .collect();
            let request = Request::PutFiles(PutFiles {
                root: self.root.clone(),
                create_parents: false,
                files: batch.puts,
            });
            self.send(request, PushTag::Batch(files), batch.weight)
                .await?;
            self.run.report.bytes_sent += batch.compressed;
            self.commit_ready().await?;
        }

        for (change, parts) in parted {
            if change.src.hash.is_none() {
                // The scan could not hash it: nothing to check a commit
                // against.
                self.run.skip(&change, UNHASHED);
                continue;
            }
            self.send_parts(change, parts).await?;
            self.commit_ready().await?;
        }

        loop {
            self.commit_ready().await?;
            match self.pipe.next().await {
                Some(landed) => self.settle(landed)?,
                None => break,
            }
        }
        let aborts = std::mem::take(&mut self.aborts);
        self.abort(&aborts).await;
        Ok(())
    }

    async fn send_parts(
        &mut self,
        change: FileChange,
        mut parts: Vec<Part>,
    ) -> Result<(), SyncError> {
        let i = self.staged.len();
        let resumable = self.run.resumable(&change);
        self.staged.push(Staged::new(change));
        if resumable {
            // From here the agent may hold staging for it, even if this sync
            // is cancelled before the answer comes.
            self.staged[i].begun = true;
            match self.resume(i).await? {
                Ok(present) => self
                    .run
                    .take_resumed(&mut self.staged[i], &present, &mut parts),
                Err(message) => self.fail(i, &message),
            }
        }
        for part in parts {
            if self.staged[i].failed {
                break;
            }
            let staged = &self.staged[i];
            let (data, weight) = match part {
                Part::Copy { from, len, .. } => (
                    PartData::Copy {
                        from_offset: from,
                        len,
                    },
                    0,
                ),
                Part::Data { offset, len } => {
                    check_cancelled(&self.run.progress)?;
                    let (local, src) = (self.local.clone(), staged.change.src.clone());
                    match blocking(move || read_range(&local, &src, offset, len)).await? {
                        Ok(data) => {
                            let weight = data.len() as u64;
                            (PartData::Data(data), weight)
                        }
                        Err(message) => {
                            self.fail(i, &message);
                            break;
                        }
                    }
                }
            };
            let staged = &self.staged[i];
            let offset = match part {
                Part::Copy { offset, .. } | Part::Data { offset, .. } => offset,
            };
            let request = Request::PutPart(PutPart {
                root: self.root.clone(),
                xfer: staged.xfer,
                path: staged.change.src.path.clone(),
                offset,
                data,
                hash: staged.change.src.hash.unwrap_or_default(),
                size: staged.change.src.size,
            });
            let tag = PushTag::Part {
                staged: i,
                len: part.len(),
            };
            self.send(request, tag, weight).await?;
            self.staged[i].sent += 1;
            self.run.report.bytes_sent += weight;
        }
        self.staged[i].all_sent = true;
        self.resolve(i);
        Ok(())
    }

    /// Asks the agent to adopt the partial file of `staged[i]`'s content;
    /// `Err` is the reason it could not begin the transfer at all.
    async fn resume(&mut self, i: usize) -> Result<Result<Vec<u32>, String>, SyncError> {
        let change = &self.staged[i].change;
        let request = Request::Resume(Resume {
            root: self.root.clone(),
            xfer: self.staged[i].xfer,
            path: change.src.path.clone(),
            hash: change.src.hash.unwrap_or_default(),
            size: change.src.size,
            chunks: change.src.chunks.clone(),
        });
        let call = self.pipe.conn.start(request)?;
        match until_cancelled(&self.run.progress, async { Ok(final_answer(call).await?) }).await? {
            Response::Resumed { present } => Ok(Ok(present)),
            Response::Error(e) => Ok(Err(e.message)),
            other => Err(unexpected("a resume", &other).into()),
        }
    }

    /// Starts a request once there is room, settling answers meanwhile.
    async fn send(&mut self, request: Request, tag: PushTag, weight: u64) -> Result<(), SyncError> {
        while self.pipe.is_full(weight) {
            match self.pipe.next().await {
                Some(landed) => self.settle(landed)?,
                None => break,
            }
        }
        check_cancelled(&self.run.progress)?;
        self.pipe.start(request, tag, weight)?;
        Ok(())
    }

    async fn commit_ready(&mut self) -> Result<(), SyncError> {
        while let Some(i) = self.ready.pop_front() {
            let staged = &self.staged[i];
            // Checked before the first part was sent.
            let hash = staged.change.src.hash.unwrap_or_default();
            let put = put_of(
                &staged.change,
                hash,
                FileContent::Staged { xfer: staged.xfer },
            );
            let request = Request::PutFiles(PutFiles {
                root: self.root.clone(),
                create_parents: false,
                files: vec![put],
            });
            self.send(request, PushTag::Commit { staged: i }, 0).await?;
        }
        Ok(())
    }

    /// Takes in one answer. Errors of a whole request end the sync; a part's
    /// error only fails its file.
    fn settle(&mut self, landed: Landed<PushTag>) -> Result<(), SyncError> {
        let response = final_of(landed.result)?;
        let progress = Arc::clone(&self.run.progress);
        match landed.tag {
            PushTag::Batch(files) => {
                let report = applied(response, "a batch of files")?;
                self.run.report.files_sent += u64::from(report.done);
                add_problems(&mut self.run.report, &report.problems);
                let bytes: u64 = files.iter().map(|(_, size)| size).sum();
                progress
                    .files_done
                    .fetch_add(files.len() as u64, Ordering::Relaxed);
                progress.bytes_done.fetch_add(bytes, Ordering::Relaxed);
            }
            PushTag::Part { staged: i, len } => {
                self.staged[i].settled += 1;
                match response {
                    Response::Ack => {
                        self.staged[i].counted += len;
                        progress.bytes_done.fetch_add(len, Ordering::Relaxed);
                    }
                    Response::Error(e) => self.fail(i, &e.message),
                    other => return Err(unexpected("a part", &other).into()),
                }
                self.resolve(i);
            }
            PushTag::Commit { staged: i } => {
                let report = applied(response, "a commit")?;
                let staged = &mut self.staged[i];
                staged.committed = true;
                self.run.report.files_sent += u64::from(report.done);
                add_problems(&mut self.run.report, &report.problems);
                progress.files_done.fetch_add(1, Ordering::Relaxed);
                let rest = staged.change.src.size.saturating_sub(staged.counted);
                progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Marks a staged file failed (once) and reports why.
    fn fail(&mut self, i: usize, message: &str) {
        let staged = &mut self.staged[i];
        if !staged.failed {
            staged.failed = true;
            let line = problem(&staged.change.src.path, message);
            self.run.report.problems.push(line);
        }
        self.resolve(i);
    }

    /// Once a staged file has no part in flight and no more to send: queue
    /// its commit, or give its transfer up.
    fn resolve(&mut self, i: usize) {
        let staged = &mut self.staged[i];
        if !staged.is_settled() {
            return;
        }
        staged.resolved = true;
        if !staged.failed {
            self.ready.push_back(i);
            return;
        }
        let progress = &self.run.progress;
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        let rest = staged.change.src.size.saturating_sub(staged.counted);
        progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
        if staged.sent > 0 || staged.begun {
            self.aborts.push(staged.xfer);
        }
    }

    /// After a cancel or an error: let what is in flight land (a part still
    /// in flight could otherwise stage again after the abort), then end
    /// every uncommitted transfer. Committed files stay; so do the partial
    /// files of large ones, for the next sync to resume.
    async fn wind_down(&mut self) {
        while let Some(landed) = self.pipe.next().await {
            let _ = self.settle(landed);
        }
        let mut aborts = std::mem::take(&mut self.aborts);
        for staged in &self.staged {
            if (staged.sent > 0 || staged.begun)
                && !staged.committed
                && !aborts.contains(&staged.xfer)
            {
                aborts.push(staged.xfer);
            }
        }
        self.abort(&aborts).await;
    }

    async fn abort(&mut self, xfers: &[u64]) {
        // Not through `&self` across the await: the pipeline is not `Sync`.
        let (conn, root) = (Arc::clone(&self.pipe.conn), self.root.clone());
        abort_remote(&conn, &root, xfers).await;
    }
}

/// Drops staged transfers on the host; best effort (the agent also drops
/// them when the connection ends).
async fn abort_remote(conn: &Arc<Connection>, root: &str, xfers: &[u64]) {
    if xfers.is_empty() {
        return;
    }
    let ops = xfers.iter().map(|&xfer| MetaOp::Abort { xfer }).collect();
    if let Ok(call) = conn.start(Request::ApplyMeta(ApplyMeta {
        root: root.to_string(),
        ops,
    })) {
        let _ = final_answer(call).await;
    }
}

fn applied(response: Response, what: &str) -> Result<ApplyReport, SyncError> {
    match response {
        Response::Applied(report) => Ok(report),
        Response::Error(e) => Err(CallError::Agent(e).into()),
        other => Err(unexpected(what, &other).into()),
    }
}

// ---------------------------------------------------------------------------
// Pull: file contents from the agent

enum PullTag {
    /// A `ReadFiles` of whole inline files, in request order.
    Batch(Vec<FileChange>),
    /// A `ReadFiles` of ranges of `staged[i]`, `len` bytes in all.
    Range { staged: usize, len: u64 },
}

/// Reads a pull's file contents through a [`Pipeline`] and writes them here.
struct PullFiles<'r> {
    root: String,
    local: PathBuf,
    applier: Arc<Mutex<Applier>>,
    run: &'r mut Run,
    pipe: Pipeline<PullTag>,
    staged: Vec<Staged>,
}

impl<'r> PullFiles<'r> {
    fn new(
        conn: Arc<Connection>,
        root: String,
        local: PathBuf,
        applier: Arc<Mutex<Applier>>,
        run: &'r mut Run,
    ) -> Self {
        PullFiles {
            root,
            local,
            applier,
            run,
            pipe: Pipeline::new(conn),
            staged: Vec::new(),
        }
    }

    async fn run(mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let result = self.read_all(changes).await;
        if let Err(err) = &result {
            // Reads in flight are cancelled by dropping them.
            self.pipe.flights.clear();
            // Partial files are kept for the next pull to resume, whether
            // the connection was lost or the pull cancelled; an abort only
            // releases them here (see `Applier::apply_meta`).
            if matches!(err, SyncError::Call(e) if e.is_connection()) {
                return result;
            }
            let xfers: Vec<u64> = self
                .staged
                .iter()
                .filter(|s| !s.committed)
                .map(|s| s.xfer)
                .collect();
            let _ = self.abort(xfers).await;
        }
        result
    }

    async fn read_all(&mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        for change in changes {
            if change.src.hash.is_none() {
                // The host could not hash it (it kept changing): a commit
                // would have nothing to be checked against.
                self.run.skip(&change, UNHASHED);
                continue;
            }
            match route(&change) {
                Route::Inline => {
                    if !batch.is_empty()
                        && (batch.len() >= BATCH_FILES
                            || batch_bytes + change.src.size > REQUEST_BYTES)
                    {
                        self.send_batch(std::mem::take(&mut batch), batch_bytes)
                            .await?;
                        batch_bytes = 0;
                    }
                    batch_bytes += change.src.size;
                    batch.push(change);
                }
                Route::Parts(parts) => self.read_parts(change, parts).await?,
            }
        }
        if !batch.is_empty() {
            self.send_batch(batch, batch_bytes).await?;
        }
        while let Some(landed) = self.pipe.next().await {
            self.settle(landed).await?;
        }
        Ok(())
    }

    async fn send_batch(&mut self, batch: Vec<FileChange>, bytes: u64) -> Result<(), SyncError> {
        let reads = batch
            .iter()
            .map(|c| ReadSpec {
                path: c.src.path.clone(),
                ranges: None,
            })
            .collect();
        let request = Request::ReadFiles(ReadFiles {
            root: self.root.clone(),
            reads,
        });
        self.send(request, PullTag::Batch(batch), bytes).await
    }

    /// Takes what a partial file of an interrupted pull holds, copies what
    /// the local file already has, then asks for the rest.
    async fn read_parts(
        &mut self,
        change: FileChange,
        mut parts: Vec<Part>,
    ) -> Result<(), SyncError> {
        let i = self.staged.len();
        let resumable = self.run.resumable(&change);
        self.staged.push(Staged::new(change));
        if resumable {
            let applier = Arc::clone(&self.applier);
            let (xfer, change) = (self.staged[i].xfer, self.staged[i].change.clone());
            let resumed = blocking(move || {
                let (hash, size) = content_of(&change);
                let chunks = &change.src.chunks;
                lock(&applier).resume(xfer, &change.src.path, (&hash, size), chunks)
            })
            .await?;
            match resumed {
                Ok(present) => {
                    self.staged[i].begun = true;
                    self.run
                        .take_resumed(&mut self.staged[i], &present, &mut parts);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        let copies: Vec<Part> = parts
            .iter()
            .filter(|p| matches!(p, Part::Copy { .. }))
            .copied()
            .collect();
        if !copies.is_empty() {
            check_cancelled(&self.run.progress)?;
            let applier = Arc::clone(&self.applier);
            let (xfer, path) = (self.staged[i].xfer, self.staged[i].change.src.path.clone());
            let (hash, size) = content_of(&self.staged[i].change);
            let copied = blocking(move || {
                let mut applier = lock(&applier);
                for part in copies {
                    if let Part::Copy { offset, from, len } = part {
                        let data = PartData::Copy {
                            from_offset: from,
                            len,
                        };
                        applier.put_part(xfer, &path, (&hash, size), offset, &data)?;
                    }
                }
                Ok::<_, String>(())
            })
            .await?;
            match copied {
                Ok(()) => {
                    let len = parts
                        .iter()
                        .filter(|p| matches!(p, Part::Copy { .. }))
                        .map(Part::len)
                        .sum();
                    self.staged[i].counted += len;
                    self.run
                        .progress
                        .bytes_done
                        .fetch_add(len, Ordering::Relaxed);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        for ranges in group_ranges(&parts, REQUEST_BYTES) {
            if self.staged[i].failed {
                break;
            }
            let len = ranges.iter().map(|r| r.1).sum();
            let request = Request::ReadFiles(ReadFiles {
                root: self.root.clone(),
                reads: vec![ReadSpec {
                    path: self.staged[i].change.src.path.clone(),
                    ranges: Some(ranges),
                }],
            });
            self.send(request, PullTag::Range { staged: i, len }, len)
                .await?;
            self.staged[i].sent += 1;
        }
        self.staged[i].all_sent = true;
        self.resolve(i).await
    }

    async fn send(&mut self, request: Request, tag: PullTag, weight: u64) -> Result<(), SyncError> {
        while self.pipe.is_full(weight) {
            match self.pipe.next().await {
                Some(landed) => self.settle(landed).await?,
                None => break,
            }
        }
        check_cancelled(&self.run.progress)?;
        self.pipe.start(request, tag, weight)?;
        Ok(())
    }

    async fn settle(&mut self, landed: Landed<PullTag>) -> Result<(), SyncError> {
        let mut responses = landed.result?;
        let problems = match responses.pop() {
            Some(Response::ReadDone { problems }) => problems,
            Some(Response::Error(e)) => return Err(CallError::Agent(e).into()),
            Some(other) => return Err(unexpected("a read", &other).into()),
            None => return Err(CallError::Protocol("a read ended without an answer".into()).into()),
        };
        let mut pieces = Vec::with_capacity(responses.len());
        for response in responses {
            match response {
                Response::FileData {
                    index,
                    offset,
                    data,
                } => {
                    self.run.report.bytes_sent += data.len() as u64;
                    pieces.push((index, offset, data));
                }
                other => return Err(unexpected("a read", &other).into()),
            }
        }
        match landed.tag {
            PullTag::Batch(changes) => self.write_batch(changes, pieces, problems).await,
            PullTag::Range { staged: i, len } => self.write_range(i, len, pieces, problems).await,
        }
    }

    /// Writes a batch of whole files: each one that came as a single piece
    /// is committed from it directly; a file that came in several is staged
    /// first.
    async fn write_batch(
        &mut self,
        changes: Vec<FileChange>,
        pieces: Vec<(u32, u64, Vec<u8>)>,
        problems: Vec<PathProblem>,
    ) -> Result<(), SyncError> {
        add_problems(&mut self.run.report, &problems);
        let count = changes.len() as u64;
        let bytes: u64 = changes.iter().map(|c| c.src.size).sum();
        let applier = Arc::clone(&self.applier);
        let root = self.local.display().to_string();
        let (done, lines) =
            blocking(move || write_batch(&mut lock(&applier), root, changes, pieces, problems))
                .await?;
        self.run.report.files_sent += done;
        self.run.report.problems.extend(lines);
        let progress = &self.run.progress;
        progress.files_done.fetch_add(count, Ordering::Relaxed);
        progress.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    async fn write_range(
        &mut self,
        i: usize,
        len: u64,
        pieces: Vec<(u32, u64, Vec<u8>)>,
        problems: Vec<PathProblem>,
    ) -> Result<(), SyncError> {
        self.staged[i].settled += 1;
        if let Some(p) = problems.first() {
            self.staged[i].fail_with(&p.message, &mut self.run.report);
        }
        if !self.staged[i].failed {
            let applier = Arc::clone(&self.applier);
            let (xfer, path) = (self.staged[i].xfer, self.staged[i].change.src.path.clone());
            let (hash, size) = content_of(&self.staged[i].change);
            let written = blocking(move || {
                let mut applier = lock(&applier);
                for (_, offset, data) in pieces {
                    applier.put_part(xfer, &path, (&hash, size), offset, &PartData::Data(data))?;
                }
                Ok::<_, String>(())
            })
            .await?;
            match written {
                Ok(()) => {
                    self.staged[i].counted += len;
                    self.run
                        .progress
                        .bytes_done
                        .fetch_add(len, Ordering::Relaxed);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        self.resolve(i).await
    }

    /// Once a staged file has every range it asked for: commit it, or drop it.
    async fn resolve(&mut self, i: usize) -> Result<(), SyncError> {
        let staged = &mut self.staged[i];
        if !staged.is_settled() {
            return Ok(());
        }
        staged.resolved = true;
        let progress = Arc::clone(&self.run.progress);
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        let rest = staged.change.src.size.saturating_sub(staged.counted);
        progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
        if staged.failed {
            let xfer = staged.xfer;
            return self.abort(vec![xfer]).await;
        }
        staged.committed = true;
        // Files without a hash never get this far.
        let hash = staged.change.src.hash.unwrap_or_default();
        let put = put_of(
            &staged.change,
            hash,
            FileContent::Staged { xfer: staged.xfer },
        );
        let request = PutFiles {
            root: self.local.display().to_string(),
            create_parents: false,
            files: vec![put],
        };
        let applier = Arc::clone(&self.applier);
        let report = blocking(move || lock(&applier).put_files(&request)).await?;
        self.run.report.files_sent += u64::from(report.done);
        add_problems(&mut self.run.report, &report.problems);
        Ok(())
    }

    async fn abort(&mut self, xfers: Vec<u64>) -> Result<(), SyncError> {
        if xfers.is_empty() {
            return Ok(());
        }
        let ops: Vec<MetaOp> = xfers
            .into_iter()
            .map(|xfer| MetaOp::Abort { xfer })
            .collect();
        let applier = Arc::clone(&self.applier);
        blocking(move || lock(&applier).apply_meta(&ops)).await?;
        Ok(())
    }
}

impl Staged {
    fn fail_with(&mut self, message: &str, report: &mut SyncReport) {
        if !self.failed {
            self.failed = true;
            report
                .problems
                .push(problem(&self.change.src.path, message));
        }
    }
}

/// Commits a batch of whole files read from the host. Returns how many were
/// written and the problems of the others.
fn write_batch(
    applier: &mut Applier,
    root: String,
    changes: Vec<FileChange>,
    pieces: Vec<(u32, u64, Vec<u8>)>,
    problems: Vec<PathProblem>,
) -> (u64, Vec<String>) {
    let failed: HashSet<RelPath> = problems.into_iter().map(|p| p.path).collect();
    let mut by_file: HashMap<u32, Vec<(u64, Vec<u8>)>> = HashMap::new();
    for (index, offset, data) in pieces {
        by_file.entry(index).or_default().push((offset, data));
    }
    let mut lines = Vec::new();
    let mut puts = Vec::new();
    // Staged files: those in `puts`, and those that failed before it.
    let mut staged = Vec::new();
    let mut aborts = Vec::new();
    for (index, change) in changes.iter().enumerate() {
        if failed.contains(&change.src.path) {
            continue;
        }
        // Files without a hash never get this far.
        let hash = change.src.hash.unwrap_or_default();
        let mut pieces = by_file.remove(&(index as u32)).unwrap_or_default();
        let content = match pieces.len() {
            0 if change.src.size == 0 => FileContent::Inline(codec::compress(&[])),
            // The hash check of the commit would refuse it anyway; say why.
            0 => {
                lines.push(problem(&change.src.path, CHANGED));
                continue;
            }
            1 if pieces[0].0 == 0 => {
                FileContent::Inline(pieces.pop().map(|p| p.1).unwrap_or_default())
            }
            _ => {
                let xfer = next_xfer();
                let written = pieces.into_iter().try_for_each(|(offset, data)| {
                    let content = (&hash, change.src.size);
                    applier.put_part(
                        xfer,
                        &change.src.path,
                        content,
                        offset,
                        &PartData::Data(data),
                    )
                });
                if let Err(message) = written {
                    lines.push(problem(&change.src.path, &message));
                    aborts.push(MetaOp::Abort { xfer });
                    continue;
                }
                staged.push((change.src.path.clone(), xfer));
                FileContent::Staged { xfer }
            }
        };
        puts.push(put_of(change, hash, content));
    }
    let report = applier.put_files(&PutFiles {
        root,
        create_parents: false,
        files: puts,
    });
    lines.extend(report.problems.iter().map(|p| problem(&p.path, &p.message)));
    // Staged files that were not committed are dropped now, not when the
    // applier goes.
    let refused: HashSet<&[u8]> = report.problems.iter().map(|p| &p.path[..]).collect();
    aborts.extend(
        staged
            .into_iter()
            .filter(|(path, _)| refused.contains(&path[..]))
            .map(|(_, xfer)| MetaOp::Abort { xfer }),
    );
    if !aborts.is_empty() {
        applier.apply_meta(&aborts);
    }
    (u64::from(report.done), lines)
}

// ---------------------------------------------------------------------------
// Small helpers

fn lock(applier: &Mutex<Applier>) -> MutexGuard<'_, Applier> {
    applier.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs blocking file IO off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SyncError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SyncError::Invalid(format!("a file operation failed unexpectedly: {e}")))
}

fn check_cancelled(progress: &Progress) -> Result<(), SyncError> {
    if progress.cancelled.load(Ordering::Relaxed) {
        Err(SyncError::Cancelled)
    } else {
        Ok(())
    }
}

/// Runs `work` until it ends or the sync is cancelled (dropping it then,
/// which cancels its requests on the agent).
async fn until_cancelled<T>(
    progress: &Progress,
    work: impl Future<Output = Result<T, SyncError>>,
) -> Result<T, SyncError> {
    let watch = async {
        loop {
            if progress.cancelled.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    tokio::select! {
        result = work => result,
        () = watch => Err(SyncError::Cancelled),
    }
}

/// `path: message`, the form of every per-path problem in a report.
fn problem(path: &[u8], message: &str) -> String {
    if path.is_empty() {
        message.to_string()
    } else {
        format!("{}: {message}", relpath::display(path))
    }
}

fn add_problems(report: &mut SyncReport, problems: &[PathProblem]) {
    report
        .problems
        .extend(problems.iter().map(|p| problem(&p.path, &p.message)));
}

fn unexpected(what: &str, response: &Response) -> CallError {
    let name = match response {
        Response::Output { .. } => "Output",
        Response::ExecDone(_) => "ExecDone",
        Response::Pong => "Pong",
        Response::Metrics(_) => "Metrics",
        Response::Error(_) => "Error",
        Response::GpuLease(_) => "GpuLease",
        Response::Released => "Released",
        Response::Entries(_) => "Entries",
        Response::ScanDone(_) => "ScanDone",
        Response::Applied(_) => "Applied",
        Response::Ack => "Ack",
        Response::FileData { .. } => "FileData",
        Response::ReadDone { .. } => "ReadDone",
        Response::Job(_) => "Job",
        Response::Jobs { .. } => "Jobs",
        Response::JobWaited(_) => "JobWaited",
        Response::JobLog(_) => "JobLog",
        Response::JobEvents(_) => "JobEvents",
        Response::Resumed { .. } => "Resumed",
    };
    CallError::Protocol(format!("unexpected answer to {what}: {name}"))
}

/// Splits a remote file path into the directory the agent resolves (`~` and
/// relative paths are the home's business) and the file's name.
fn split_remote(path: &str) -> Result<(String, RelPath), SyncError> {
    let invalid = || SyncError::Invalid(format!("not a file path: {path:?}"));
    if path.is_empty() || path.ends_with('/') || path.contains('\0') {
        return Err(invalid());
    }
    let (parent, name) = match path.rfind('/') {
        Some(0) => ("/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("~", path),
    };
    if matches!(name, "." | ".." | "~") {
        return Err(invalid());
    }
    Ok((parent.to_string(), name.as_bytes().to_vec()))
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_say_what_they_are() {
        let err = local_dir(Path::new("/dev/zero"), true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "local path /dev/zero is a character device, not a file or directory"
        );
        // Pulling into one is refused the same way.
        assert!(local_dir(Path::new("/dev/null"), false).is_err());
        let dir = std::env::temp_dir().join(format!("outpost-sync-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = local_dir(&fifo, true).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.ends_with("is a fifo, not a file or directory"), "{err}");
        // A remote root (the agent's scan says what it is).
        let summary = ScanSummary {
            root_exists: true,
            problems: vec![PathProblem {
                path: Vec::new(),
                message: "a character device, not a file or directory".into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            root_problem("/dev/zero", &summary).unwrap_err().to_string(),
            "/dev/zero is a character device, not a file or directory"
        );
    }

    fn chunk(offset: u64, len: u32, tag: u8) -> ChunkRef {
        ChunkRef {
            offset,
            len,
            hash: [tag; 32],
        }
    }

    /// Chunks of the given lengths and tags, laid end to end.
    fn chunks(spec: &[(u32, u8)]) -> Vec<ChunkRef> {
        let mut offset = 0;
        spec.iter()
            .map(|&(len, tag)| {
                let c = chunk(offset, len, tag);
                offset += u64::from(len);
                c
            })
            .collect()
    }

    #[test]
    fn parts_copy_what_the_receiver_has() {
        let dst = chunks(&[(10, 1), (10, 2), (10, 3), (10, 4)]);
        // 2 and 3 kept in order, 9 new, 4 moved ahead, 1 dropped.
        let src = chunks(&[(10, 2), (10, 3), (5, 9), (10, 4)]);
        assert_eq!(
            plan_parts(35, &src, &dst, 100, &HashSet::new()),
            vec![
                Part::Copy {
                    offset: 0,
                    from: 10,
                    len: 20
                },
                Part::Data { offset: 20, len: 5 },
                Part::Copy {
                    offset: 25,
                    from: 30,
                    len: 10
                },
            ]
        );
    }

    #[test]
    fn copies_from_distant_places_stay_apart() {
        let dst = chunks(&[(10, 1), (10, 2), (10, 3)]);
        let src = chunks(&[(10, 3), (10, 1)]);
        assert_eq!(
            plan_parts(20, &src, &dst, 100, &HashSet::new()),
            vec![
                Part::Copy {
                    offset: 0,
                    from: 20,
                    len: 10
                },
                Part::Copy {
                    offset: 10,
                    from: 0,
                    len: 10
                },
            ]
        );
    }

    #[test]
    fn data_parts_are_bounded() {
        let src = chunks(&[(10, 5), (10, 6), (10, 7), (10, 8)]);
        let parts = plan_parts(40, &src, &[], 25, &HashSet::new());
        assert_eq!(
            parts,
            vec![
                Part::Data { offset: 0, len: 20 },
                Part::Data {
                    offset: 20,
                    len: 20
                },
            ]
        );
        // A chunk larger than the bound is split.
        assert_eq!(
            plan_parts(60, &chunks(&[(45, 5), (15, 6)]), &[], 20, &HashSet::new()),
            vec![
                Part::Data { offset: 0, len: 20 },
                Part::Data {
                    offset: 20,
                    len: 20
                },
                Part::Data { offset: 40, len: 5 },
                Part::Data {
                    offset: 45,
                    len: 15
                },
            ]
        );
        // No chunk list: plain ranges of at most the bound.
        assert_eq!(
            plan_parts(50, &[], &[], 20, &HashSet::new()),
            vec![
                Part::Data { offset: 0, len: 20 },
                Part::Data {
                    offset: 20,
                    len: 20
                },
                Part::Data {
                    offset: 40,
                    len: 10
                },
            ]
        );
    }

    #[test]
    fn chunk_lists_that_do_not_tile_are_not_trusted() {
        let dst = chunks(&[(10, 1)]);
        // A gap, and a list shorter than the file.
        let gap = vec![chunk(0, 10, 1), chunk(15, 10, 2)];
        assert_eq!(
            plan_parts(25, &gap, &dst, 100, &HashSet::new()),
            vec![Part::Data { offset: 0, len: 25 }]
        );
        assert_eq!(
            plan_parts(30, &chunks(&[(10, 1)]), &dst, 100, &HashSet::new()),
            vec![Part::Data { offset: 0, len: 30 }]
        );
        assert!(plan_parts(0, &[], &[], 100, &HashSet::new()).is_empty());
    }

    #[test]
    fn parts_cover_the_file() {
        let dst = chunks(&[(7, 1), (9, 2), (11, 3), (13, 4), (5, 5)]);
        let src = chunks(&[(9, 2), (4, 8), (7, 1), (13, 4), (6, 9), (11, 3)]);
        let size = src.iter().map(|c| u64::from(c.len)).sum();
        let parts = plan_parts(size, &src, &dst, 8, &HashSet::new());
        let mut end = 0;
        for part in &parts {
            let (Part::Copy { offset, .. } | Part::Data { offset, .. }) = *part;
            assert_eq!(offset, end);
            end += part.len();
        }
        assert_eq!(end, size);
    }

    #[test]
    fn ranges_are_grouped_under_the_bound() {
        let parts = [
            Part::Data { offset: 0, len: 10 },
            Part::Copy {
                offset: 10,
                from: 0,
                len: 5,
            },
            Part::Data {
                offset: 15,
                len: 10,
            },
            Part::Data {
                offset: 40,
                len: 30,
            },
        ];
        assert_eq!(
            group_ranges(&parts, 25),
            vec![vec![(0, 10), (15, 10)], vec![(40, 30)]]
        );
    }

    #[test]
    fn meta_batches_keep_order_and_bounds() {
        let ops: Vec<MetaOp> = (0..5000u32)
            .map(|i| MetaOp::Remove {
                path: i.to_string().into_bytes(),
            })
            .collect();
        let batches = meta_batches(ops.clone());
        assert!(batches.iter().all(|b| b.len() <= META_OPS));
        assert_eq!(batches.concat(), ops);
        let long = vec![
            MetaOp::Symlink {
                path: vec![b'a'; 4000],
                target: vec![b'b'; 4000],
            };
            1000
        ];
        for batch in meta_batches(long) {
            let size: usize = batch.len() * 8032;
            assert!(size <= META_BYTES, "{size}");
        }
    }

    #[test]
    fn remote_paths_split_into_root_and_name() {
        let split = |p: &str| split_remote(p).map(|(r, n)| (r, String::from_utf8(n).unwrap()));
        assert_eq!(split("~/a/b.txt").unwrap(), ("~/a".into(), "b.txt".into()));
        assert_eq!(split("~/b").unwrap(), ("~".into(), "b".into()));
        assert_eq!(
            split("/etc/hosts").unwrap(),
            ("/etc".into(), "hosts".into())
        );
        assert_eq!(split("/x").unwrap(), ("/".into(), "x".into()));
        assert_eq!(split("notes.md").unwrap(), ("~".into(), "notes.md".into()));
        for bad in ["", "~", "/", "a/", "a/..", "."] {
            assert!(split_remote(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn new_files_expect_nothing_and_replacements_expect_the_scan() {
        assert_eq!(expect_of(&None), Expect::Absent);
        let dst = TreeEntry {
            path: b"f".to_vec(),
            kind: EntryKind::File,
            mode: 0o644,
            size: 3,
            mtime_ns: 42,
            hash: None,
            chunks: vec![],
        };
        assert_eq!(
            expect_of(&Some(dst)),
            Expect::File {
                size: 3,
                mtime_ns: 42
            }
        );
    }

    #[test]
    fn a_filter_can_single_out_any_name() {
        let root = Path::new("/x");
        for name in [
            "plain.txt",
            "a b*{c}[d]?.txt",
            "!bang",
            "#hash",
            "trailing ",
            "back\\slash",
        ] {
            let filter = Filter::new(root, &only(name.as_bytes())).unwrap();
            assert!(
                !filter.excluded(name.as_bytes(), false),
                "{name:?} excluded"
            );
            assert!(filter.excluded(b"other", false), "{name:?}: others kept");
            assert!(
                filter.excluded(b"plain.txtx", false),
                "{name:?}: prefix kept"
            );
        }
    }

    #[test]
    fn defaults_come_first_so_the_caller_can_reinclude() {
        let options = SyncOptions {
            excludes: vec!["!.vscode/".into(), "*.log".into()],
            ..SyncOptions::default()
        };
        let spec = filter_spec(&options, Path::new("/nonexistent")).unwrap();
        assert_eq!(spec.excludes.len(), DEFAULT_EXCLUDES.len() + 2);
        assert_eq!(spec.excludes.last().unwrap(), "*.log");
        let bad = SyncOptions {
            excludes: vec!["a{b".into()],
            ..SyncOptions::default()
        };
        let err = filter_spec(&bad, Path::new("/x")).unwrap_err();
        assert!(err.to_string().contains("a{b"), "{err}");
        // Refused too, though the gitignore parser alone would take them
        // (an unclosed class as a literal, `#…` as a comment), from the
        // options and from an exclude file alike.
        for pattern in ["src/[abc", "#scratch"] {
            let bad = SyncOptions {
                excludes: vec![pattern.into()],
                ..SyncOptions::default()
            };
            let err = filter_spec(&bad, Path::new("/x")).unwrap_err();
            assert!(err.to_string().contains(pattern), "{err}");
        }
        let file = std::env::temp_dir().join(format!("outpost-excludes-{}", std::process::id()));
        std::fs::write(&file, "# a comment\n*.o\nbuild/[ab\n").unwrap();
        let from_file = SyncOptions {
            exclude_file: Some(file.clone()),
            ..SyncOptions::default()
        };
        let err = filter_spec(&from_file, Path::new("/x")).unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert!(err.to_string().contains("build/[ab"), "{err}");
    }
}
