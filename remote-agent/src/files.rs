//! File trees over the protocol: scans, atomic writes, staged parts of large
//! files, metadata changes and reads.
//!
//! The tree engine is `outpost-treesync`, shared with the controller so a push
//! and a pull behave alike. This module only adds what belongs to the agent:
//! resolving roots on the host (`~`, relative paths), running file IO on
//! blocking threads, streaming results under the outbox's backpressure,
//! honouring cancellation, and keeping one [`Applier`] per root for the life
//! of the connection so parts staged by one request are there for the next.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use outpost_protocol::limits::MAX_FRAME_LEN;
use outpost_protocol::{
    AgentError, ApplyMeta, ErrorKind, FilterSpec, PutFiles, PutPart, ReadFiles, RelPath, RequestId,
    Response, Resume, ScanRequest, ScanSummary, TreeEntry, encode_file_data_frame,
};
use outpost_treesync::apply::{self, Applier};
use outpost_treesync::cache::{StatCache, Written};
use outpost_treesync::filter::Filter;
use outpost_treesync::known::{self, KeptScans};
use outpost_treesync::scan::{self, ScanOptions, ScanOutput};
use tokio::sync::{mpsc, watch};

use crate::account;
use crate::outbox::{Frame, Outbox};
use crate::paths;

/// Most entries in one `Entries` response.
const BATCH_ENTRIES: usize = 2_000;
/// Most estimated bytes in one `Entries` response: well under the frame cap,
/// so an estimate that is a little off can never produce an unsendable frame.
const BATCH_BYTES: usize = 2 * 1024 * 1024;
/// An entry whose chunk list alone would come near the frame cap (a file of
/// many GiB) is sent without it: the other side then sends the file whole
/// instead of failing the scan.
const MAX_ENTRY_BYTES: usize = MAX_FRAME_LEN / 2;
/// Raw bytes per `FileData` piece. Small frames keep the outbox's bounded
/// queue (64 frames) at a few MiB and let pings and other requests' answers
/// through between pieces.
const READ_PIECE: usize = 256 * 1024;
/// Encoded pieces waiting between the reading thread and the outbox.
const READ_QUEUE: usize = 4;

fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError {
        kind,
        message: message.into(),
    }
}

fn cancelled() -> Response {
    Response::Error(error(ErrorKind::Unavailable, "cancelled"))
}

/// The appliers of one connection, one per resolved root.
///
/// Each sits behind its own mutex: requests run concurrently, and two writes
/// to one root must not interleave (parts of one staged file, the check of
/// what is at a path and the rename that replaces it). A batch of files lets
/// it go while it waits for the disk ([`put_files`]). Roots do not block
/// each other.
#[derive(Default)]
pub struct Appliers {
    roots: Mutex<HashMap<PathBuf, Arc<Mutex<Applier>>>>,
}

impl Appliers {
    fn roots(&self) -> MutexGuard<'_, HashMap<PathBuf, Arc<Mutex<Applier>>>> {
        self.roots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, root: &Path) -> Arc<Mutex<Applier>> {
        Arc::clone(
            self.roots()
                .entry(root.to_path_buf())
                .or_insert_with(|| Arc::new(Mutex::new(Applier::new(root)))),
        )
    }

    /// Drops every applier, removing the staging files of transfers that were
    /// never committed, and records what they committed in the stat caches.
    /// Waits for work still running on each root, so call it on a blocking
    /// thread; a batch still flushing then records nothing (its files are
    /// hashed again at the next scan).
    pub fn close(&self) {
        let all: Vec<_> = self.roots().drain().map(|(_, a)| a).collect();
        for applier in all {
            // Taking the lock waits for a write in progress; the applier is
            // dropped with the last reference.
            let mut applier = lock(&applier);
            record_written(&mut applier, None);
        }
    }

    /// What `root`'s applier committed and has not recorded yet.
    fn take_written(&self, root: &Path) -> Vec<Written> {
        let applier = self.roots().get(root).cloned();
        applier.map_or_else(Vec::new, |a| lock(&a).take_written())
    }
}

fn lock(applier: &Mutex<Applier>) -> MutexGuard<'_, Applier> {
    // An applier whose holder panicked is still a consistent set of staging
    // files; carry on rather than fail every later request on the root.
    applier.lock().unwrap_or_else(|p| p.into_inner())
}

/// Resolves a root as the host sees it: `~` is the home, and a relative path
/// is taken from the home, as SSH does for commands.
pub fn resolve_root(raw: &str) -> Result<PathBuf, AgentError> {
    let bad = |m: &str| error(ErrorKind::BadRequest, m);
    if raw.is_empty() {
        return Err(bad("the root path is empty"));
    }
    if raw.contains('\0') {
        return Err(bad("the root path contains a NUL byte"));
    }
    let home = paths::home_dir();
    let path = paths::expand_tilde(raw, home.as_deref());
    if path.is_absolute() {
        return Ok(path);
    }
    match home {
        Some(h) => Ok(h.join(path)),
        None => Err(bad(&format!(
            "cannot resolve {raw:?}: no home directory ($HOME unset and no passwd entry)"
        ))),
    }
}

/// `<state dir>/cache/scan-<first 16 hex digits of BLAKE3(root)>`: one stat
/// cache per root, shared by every connection (saves are atomic renames, so
/// concurrent scans at worst lose one another's additions). The root is
/// spelled as its components, as the appliers' map compares it: `dir/`
/// (as a pull's source is often written) and `dir` share one cache.
fn cache_path(root: &Path) -> Option<PathBuf> {
    // A sandbox's root opened for one connection: its name does not last.
    if root.starts_with("/proc/self/fd") {
        return None;
    }
    let root: PathBuf = root.components().collect();
    let hex = blake3::hash(root.as_os_str().as_bytes()).to_hex();
    let name = format!("scan-{}", &hex[..16]);
    Some(paths::state_dir()?.join("cache").join(name))
}

/// Answers a `Scan`: `Entries` batches, then `ScanDone`.
///
/// The walk itself cannot be interrupted from here (the engine scans in one
/// call); a cancel answers at once and lets the walk finish unseen.
pub async fn scan(
    id: RequestId,
    req: ScanRequest,
    appliers: &Arc<Appliers>,
    outbox: &Outbox,
    mut cancel: watch::Receiver<bool>,
) -> Response {
    let root = match resolve_root(&req.root) {
        Ok(root) => root,
        Err(e) => return Response::Error(e),
    };
    // Compiled here first so a bad pattern is refused by name, before any walk.
    if let Err(e) = Filter::new(&root, &req.filter) {
        return Response::Error(error(ErrorKind::BadRequest, e));
    }
    let appliers = Arc::clone(appliers);
    let work = tokio::task::spawn_blocking(move || {
        let _as = account::act_for_root(&root);
        let options = ScanOptions {
            hashes: req.hashes,
            chunk_lists: req.chunk_lists,
            recursive: req.recursive,
            max_entries: req.max_entries,
            // A hashing scan prepares a sync into or out of this root.
            reap_stale_temps: req.hashes,
        };
        // Only hashes are worth caching; a listing stats and nothing more.
        let cache_file = if req.hashes { cache_path(&root) } else { None };
        let mut cache = cache_file.as_deref().map(StatCache::load_kept);
        if let Some(cache) = cache.as_mut() {
            cache.record_written(&appliers.take_written(&root));
        }
        let mut output = scan::scan(&root, &req.filter, &options, cache.as_mut());
        if let (Some(cache), Some(file)) = (cache, cache_file)
            && output.summary.root_exists
        {
            keep_cache(cache, &file);
        }
        for entry in &mut output.entries {
            // A chunk list too long for a frame is left out, as it is sent.
            if !req.chunk_lists || entry_bytes(entry) > MAX_ENTRY_BYTES {
                entry.chunks = Vec::new();
            }
        }
        if req.hashes && req.recursive && req.max_entries == 0 && !output.summary.truncated {
            answer_against_known(&root, &req, &mut output);
        }
        output
    });
    let output = tokio::select! {
        joined = work => match joined {
            Ok(output) => output,
            Err(_) => return Response::Error(error(ErrorKind::Internal, "the scan panicked")),
        },
        _ = wait_cancelled(&mut cancel) => return cancelled(),
    };
    send_entries(id, output, outbox, &cancel).await
}

/// Answers a `DescribeFiles`: `Entries` batches, then `ScanDone` with the
/// paths that could not be described. Uses (and adds to) the root's stat
/// cache, which the scan before it filled.
pub async fn describe(
    id: RequestId,
    raw_root: &str,
    paths: Vec<RelPath>,
    appliers: &Arc<Appliers>,
    outbox: &Outbox,
    mut cancel: watch::Receiver<bool>,
) -> Response {
    let root = match resolve_root(raw_root) {
        Ok(root) => root,
        Err(e) => return Response::Error(e),
    };
    let appliers = Arc::clone(appliers);
    let work = tokio::task::spawn_blocking(move || {
        let _as = account::act_for_root(&root);
        let cache_file = cache_path(&root);
        let mut cache = cache_file.as_deref().map(StatCache::load_kept);
        if let Some(cache) = cache.as_mut() {
            cache.record_written(&appliers.take_written(&root));
        }
        let described = apply::describe_files(&root, &paths, cache.as_mut());
        if let (Some(cache), Some(file)) = (cache, cache_file) {
            keep_cache(cache, &file);
        }
        ScanOutput {
            entries: described.entries,
            summary: ScanSummary {
                root_exists: true,
                problems: described.problems,
                ..ScanSummary::default()
            },
        }
    });
    let output = tokio::select! {
        joined = work => match joined {
            Ok(output) => output,
            Err(_) => return Response::Error(error(ErrorKind::Internal, "describing files panicked")),
        },
        _ = wait_cancelled(&mut cancel) => return cancelled(),
    };
    send_entries(id, output, outbox, &cancel).await
}

/// Sends a scan's entries in batches that fit a frame, then its summary.
async fn send_entries(
    id: RequestId,
    output: ScanOutput,
    outbox: &Outbox,
    cancel: &watch::Receiver<bool>,
) -> Response {
    if output.summary.unchanged {
        // The caller has them: a no-op sync costs the walk, not the list.
        return Response::ScanDone(output.summary);
    }
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    for mut entry in output.entries {
        if entry_bytes(&entry) > MAX_ENTRY_BYTES {
            entry.chunks = Vec::new();
        }
        let size = entry_bytes(&entry);
        if !batch.is_empty() && (batch.len() >= BATCH_ENTRIES || batch_bytes + size > BATCH_BYTES) {
            if *cancel.borrow() {
                return cancelled();
            }
            if !outbox
                .send(id, Response::Entries(std::mem::take(&mut batch)))
                .await
            {
                return cancelled();
            }
            batch_bytes = 0;
        }
        batch_bytes += size;
        batch.push(entry);
    }
    if !batch.is_empty() && !outbox.send(id, Response::Entries(batch)).await {
        return cancelled();
    }
    Response::ScanDone(output.summary)
}

fn keep_cache(cache: StatCache, file: &Path) {
    // A cache that cannot be saved only costs hashing again next time.
    if let Err(e) = cache.keep(file) {
        eprintln!("outpost-agent: cannot save {}: {e}", file.display());
    }
}

/// The last whole-tree scan of each root (with its filter) this agent
/// answered, so a rescan that names its digest gets only what changed.
static KEPT: KeptScans<(PathBuf, FilterSpec, bool)> = KeptScans::new();

/// Sets `output`'s digest and, when the caller keeps the scan this agent
/// kept last for the root (`known`), answers against it: nothing when the
/// tree is the same, or only what changed when that is much less.
fn answer_against_known(root: &Path, req: &ScanRequest, output: &mut ScanOutput) {
    let Some(digest) = known::digest(&output.entries, &output.summary) else {
        return;
    };
    output.summary.digest = Some(digest);
    let key = (root.to_path_buf(), req.filter.clone(), req.chunk_lists);
    let before = KEPT.get(&key).filter(|(kept, _)| req.known == Some(*kept));
    let entries = Arc::new(std::mem::take(&mut output.entries));
    match before {
        Some((kept, _)) if kept == digest => output.summary.unchanged = true,
        Some((_, kept)) => {
            let delta = known::delta(&kept, &entries);
            if delta.worth_it(&entries) {
                output.entries = delta.changed;
                output.summary.removed = delta.removed;
                output.summary.delta = true;
            } else {
                output.entries = entries.to_vec();
            }
        }
        None => output.entries = entries.to_vec(),
    }
    KEPT.keep(key, digest, entries);
}

/// An upper bound on an entry's encoded size (postcard varints are never
/// longer than these fixed widths).
fn entry_bytes(entry: &TreeEntry) -> usize {
    let target = match &entry.kind {
        outpost_protocol::EntryKind::Symlink { target } => target.len(),
        _ => 0,
    };
    64 + entry.path.len() + target + entry.chunks.len() * (32 + 10 + 5)
}

async fn wait_cancelled(cancel: &mut watch::Receiver<bool>) {
    // A dropped sender means nobody can cancel any more.
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Runs `work` on `root`'s applier on a blocking thread.
async fn with_applier(
    appliers: &Arc<Appliers>,
    raw_root: &str,
    work: impl FnOnce(&mut Applier) -> Response + Send + 'static,
) -> Response {
    with_shared_applier(appliers, raw_root, move |applier| work(&mut lock(applier))).await
}

/// Runs `work` with `root`'s applier on a blocking thread; `work` locks it
/// for as long as it needs it.
async fn with_shared_applier(
    appliers: &Arc<Appliers>,
    raw_root: &str,
    work: impl FnOnce(&Mutex<Applier>) -> Response + Send + 'static,
) -> Response {
    let root = match resolve_root(raw_root) {
        Ok(root) => root,
        Err(e) => return Response::Error(e),
    };
    let applier = appliers.get(&root);
    match tokio::task::spawn_blocking(move || {
        let _as = account::act_for_root(&root);
        work(&applier)
    })
    .await
    {
        Ok(response) => response,
        Err(_) => Response::Error(error(ErrorKind::Internal, "the write panicked")),
    }
}

/// Committed files held before they are written to the stat cache file at
/// once (a cache file is rewritten whole: once per batch would cost the
/// square of a large tree's size).
const WRITTEN_HELD: usize = 50_000;

/// Answers a `PutFiles` with `Applied`. The files it committed go into the
/// root's stat cache (a large one by its hash alone) (at the next scan of the root, when the
/// connection ends, or once [`WRITTEN_HELD`] wait), so the next scan (a
/// re-push's) does not read back what was just written and checked.
///
/// The applier is held to claim the batch's staged files and while they are
/// renamed into place (each checks what is at its path just before), not
/// while they are written nor while they wait for the disk (the flush: a
/// journal commit and the writeback of everything dirty; the directories'
/// fsyncs): meanwhile the next batches and parts of the transfer are
/// written.
pub async fn put_files(req: PutFiles, appliers: &Arc<Appliers>) -> Response {
    let raw_root = req.root.clone();
    with_shared_applier(appliers, &raw_root, move |applier| {
        let report = apply::put_files_shared(applier, &req);
        let mut applier = lock(applier);
        if applier.written_count() >= WRITTEN_HELD {
            record_written(&mut applier, None);
        }
        Response::Applied(report)
    })
    .await
}

/// Writes what `applier` committed into its root's stat cache file: into
/// `cache` when a scan has it loaded (and saves it itself), else loaded and
/// saved here.
fn record_written(applier: &mut Applier, cache: Option<&mut StatCache>) {
    let written = applier.take_written();
    if written.is_empty() {
        return;
    }
    match cache {
        Some(cache) => cache.record_written(&written),
        None => {
            if let Some(file) = cache_path(applier.root()) {
                let mut cache = StatCache::load_kept(&file);
                cache.record_written(&written);
                keep_cache(cache, &file);
            }
        }
    }
}

/// Answers a `PutPart` with `Ack`, or an error giving the reason.
pub async fn put_part(req: PutPart, appliers: &Arc<Appliers>) -> Response {
    let root = req.root.clone();
    with_applier(appliers, &root, move |applier| {
        let content = (&req.hash, req.size);
        match applier.put_part(req.xfer, &req.path, content, req.offset, &req.data) {
            Ok(()) => Response::Ack,
            Err(e) => Response::Error(error(ErrorKind::Internal, e)),
        }
    })
    .await
}

/// Answers a `Resume` with `Resumed`, or an error giving the reason.
pub async fn resume(req: Resume, appliers: &Arc<Appliers>) -> Response {
    let root = req.root.clone();
    with_applier(appliers, &root, move |applier| {
        match applier.resume(req.xfer, &req.path, (&req.hash, req.size), &req.chunks) {
            Ok(present) => Response::Resumed { present },
            Err(e) => Response::Error(error(ErrorKind::Internal, e)),
        }
    })
    .await
}

/// Answers an `ApplyMeta` with `Applied`.
pub async fn apply_meta(req: ApplyMeta, appliers: &Arc<Appliers>) -> Response {
    let root = req.root.clone();
    with_applier(appliers, &root, move |applier| {
        Response::Applied(applier.apply_meta(&req.ops))
    })
    .await
}

/// Answers a `ReadFiles`: `FileData` pieces, then `ReadDone`.
///
/// One blocking thread reads and encodes; a small queue hands pieces to
/// the outbox, whose bounded channel in turn slows the reader to the link's
/// pace, so memory stays at a few pieces whatever the files' sizes.
pub async fn read_files(
    id: RequestId,
    req: ReadFiles,
    outbox: &Outbox,
    mut cancel: watch::Receiver<bool>,
) -> Response {
    let root = match resolve_root(&req.root) {
        Ok(root) => root,
        Err(e) => return Response::Error(e),
    };
    let (tx, mut rx) = mpsc::channel::<Frame>(READ_QUEUE);
    let reader_cancel = cancel.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let _as = account::act_for_root(&root);
        let mut problems = Vec::new();
        for (index, spec) in req.reads.iter().enumerate() {
            let mut emit = |offset: u64, data: Vec<u8>| {
                if *reader_cancel.borrow() {
                    return Err("cancelled".to_string());
                }
                // Encoded here, off the session's thread, with the
                // content left where it was read.
                let piece = encode_file_data_frame(id, index as u32, offset, data)
                    .map_err(|e| e.to_string())?;
                tx.blocking_send(piece)
                    .map_err(|_| "the request ended".to_string())
            };
            let read = apply::read_file(&root, spec, READ_PIECE, &mut emit);
            if tx.is_closed() || *reader_cancel.borrow() {
                return None;
            }
            if let Err(problem) = read {
                problems.push(problem);
            }
        }
        Some(problems)
    });
    loop {
        tokio::select! {
            piece = rx.recv() => match piece {
                Some(piece) => {
                    if !outbox.send_encoded(piece).await {
                        return cancelled();
                    }
                }
                None => break,
            },
            // Dropping the receiver stops the reader at its next piece.
            _ = wait_cancelled(&mut cancel) => return cancelled(),
        }
    }
    match reader.await {
        Ok(Some(problems)) => Response::ReadDone { problems },
        Ok(None) => cancelled(),
        Err(_) => Response::Error(error(ErrorKind::Internal, "the read panicked")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_resolve_against_the_home() {
        let home = paths::home_dir().unwrap();
        assert_eq!(resolve_root("~").unwrap(), home);
        assert_eq!(resolve_root("~/a/b").unwrap(), home.join("a/b"));
        assert_eq!(resolve_root("rel/x").unwrap(), home.join("rel/x"));
        assert_eq!(resolve_root("/abs").unwrap(), PathBuf::from("/abs"));
        assert_eq!(resolve_root("").unwrap_err().kind, ErrorKind::BadRequest);
        assert_eq!(
            resolve_root("a\0b").unwrap_err().kind,
            ErrorKind::BadRequest
        );
    }

    #[test]
    fn cache_files_are_per_root() {
        let a = cache_path(Path::new("/srv/a")).unwrap();
        let b = cache_path(Path::new("/srv/b")).unwrap();
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("scan-") && name.len() == 5 + 16, "{name}");
        assert_eq!(a.parent().unwrap().file_name().unwrap(), "cache");
        // One root however it is spelled.
        for same in ["/srv/a/", "/srv//a", "/srv/./a/"] {
            assert_eq!(cache_path(Path::new(same)).unwrap(), a, "{same}");
        }
    }

    #[test]
    fn huge_chunk_lists_are_bounded_by_the_estimate() {
        let entry = TreeEntry {
            path: b"big".to_vec(),
            kind: outpost_protocol::EntryKind::File,
            mode: 0o644,
            size: u64::MAX,
            mtime_ns: i64::MIN,
            hash: Some([7; 32]),
            chunks: vec![
                outpost_protocol::ChunkRef {
                    offset: u64::MAX,
                    len: u32::MAX,
                    hash: [1; 32],
                };
                100
            ],
        };
        let encoded =
            outpost_protocol::encode_frame(&Response::Entries(vec![entry.clone()])).unwrap();
        assert!(encoded.len() <= entry_bytes(&entry), "{}", encoded.len());
    }
}
