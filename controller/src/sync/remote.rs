//! The host's side through the agent, outside the file pipeline: the
//! public [`scan_remote`], [`read_remote`] and [`write_remote`], and what a
//! sync asks of the host on its own (its scans, creating a push's missing
//! root, dropping staged transfers).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use outpost_protocol::{
    ApplyMeta, EntryKind, Expect, FileContent, FilePut, FilterSpec, MetaOp, PartData, PutFiles,
    PutPart, ReadFiles, ReadSpec, RelPath, Request, Response, ScanRequest, ScanSummary, TreeEntry,
};
use outpost_treesync::plan::FileChange;
use outpost_treesync::{codec, known};

use super::helpers::{check_cancelled, unexpected};
use super::limits::REQUEST_BYTES;
use super::memo;
use super::parts::next_xfer;
use super::pipeline::final_answer;
use super::planning::{Side, take_described, undescribed};
use super::types::{Progress, SyncError};
use crate::session::{CallError, ScopedConn, Session};

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
                chunk_lists: false,
                recursive: false,
                max_entries: 1,
                known: None,
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
// Requests of a sync

/// A sync's scan of the host's side: hashes, and no chunk lists (see
/// [`describe_on`]) unless the root is in an isolated sandbox, whose
/// files the host keeps no stat cache for: there, describing would read
/// the changed large files a second time.
pub(super) fn scan_request(conn: &ScopedConn, root: &str, spec: &FilterSpec) -> ScanRequest {
    ScanRequest {
        root: root.to_string(),
        filter: spec.clone(),
        hashes: true,
        chunk_lists: conn.sandbox().is_some(),
        recursive: true,
        max_entries: 0,
        known: None,
    }
}

/// Paths in one `DescribeFiles`, so a request stays far below the frame cap
/// (at most 4,096 bytes a path).
const DESCRIBE_PATHS: usize = 512;

/// Gives the host's large files among `changes` (those `useful` picks)
/// their chunk lists, which the scan left out: no request when no such
/// file changed (every no-op). A file that changed since the scan keeps no
/// chunk list, and so does every file when the host cannot describe them:
/// they then travel whole, which costs bytes, never correctness.
pub(super) async fn describe_on(
    conn: &ScopedConn,
    root: &str,
    changes: &mut [FileChange],
    side: Side,
    useful: impl Fn(&FileChange) -> bool,
) -> Result<(), CallError> {
    let wanted = undescribed(changes, side, useful);
    let paths: Vec<RelPath> = wanted.keys().cloned().collect();
    for some in paths.chunks(DESCRIBE_PATHS) {
        let mut call = conn.start(Request::DescribeFiles {
            root: root.to_string(),
            paths: some.to_vec(),
        })?;
        loop {
            match call.next().await? {
                Response::Entries(described) => {
                    take_described(changes, side, &wanted, described);
                }
                Response::ScanDone(_) => break,
                // Refused (an agent error): the files travel whole.
                Response::Error(_) => return Ok(()),
                other => return Err(unexpected("describing files", &other)),
            }
        }
    }
    Ok(())
}

pub(super) async fn scan_on(
    conn: &ScopedConn,
    mut request: ScanRequest,
) -> Result<(Vec<TreeEntry>, ScanSummary), CallError> {
    // A scan of a whole tree names the one kept from before (see `memo`).
    let key = memo::key(conn, &request);
    let mut kept = key.as_ref().and_then(memo::get);
    loop {
        request.known = kept.as_ref().map(|(digest, _)| *digest);
        let mut call = conn.start(Request::Scan(request.clone()))?;
        let mut entries = Vec::new();
        let summary = loop {
            match call.next().await? {
                Response::Entries(batch) => entries.extend(batch),
                Response::ScanDone(summary) => break summary,
                Response::Error(e) => return Err(CallError::Agent(e)),
                other => return Err(unexpected("a scan", &other)),
            }
        };
        let entries_sent = entries.len();
        let whole = match (&kept, summary.unchanged || summary.delta) {
            (_, false) => Some(entries),
            (None, true) => return Err(unexpected("a scan", &Response::ScanDone(summary))),
            (Some((_, kept)), true) if summary.unchanged => Some((**kept).clone()),
            (Some((_, kept)), true) => known::patched(kept, entries, &summary.removed)
                .filter(|whole| known::digest(whole, &summary) == summary.digest),
        };
        tracing::debug!(
            root = request.root,
            sent = entries_sent,
            removed = summary.removed.len(),
            unchanged = summary.unchanged,
            delta = summary.delta,
            "scanned the host"
        );
        let Some(whole) = whole else {
            // Only a fault on one side could get here; a full scan mends it.
            tracing::warn!("a scan's changes did not add up to its digest; scanning again");
            kept = None;
            continue;
        };
        if let (Some(key), Some(digest)) = (key, summary.digest)
            && !summary.unchanged
        {
            let whole = Arc::new(whole);
            memo::keep(key, digest, Arc::clone(&whole));
            return Ok((Arc::unwrap_or_clone(whole), summary));
        }
        return Ok((whole, summary));
    }
}

/// The entry of `name` in the remote directory `parent`, if there is one.
async fn stat_remote(
    conn: &ScopedConn,
    parent: &str,
    name: &[u8],
) -> Result<Option<TreeEntry>, SyncError> {
    let (entries, _) = scan_on(
        conn,
        ScanRequest {
            root: parent.to_string(),
            filter: only(name),
            hashes: false,
            chunk_lists: false,
            recursive: false,
            max_entries: 1,
            known: None,
        },
    )
    .await?;
    Ok(entries.into_iter().find(|e| e.path == name))
}

/// A filter that excludes every name of a directory but `name`.
pub(super) fn only(name: &[u8]) -> FilterSpec {
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

/// Creates a push's missing remote root: a `Mkdir` of its name in its
/// parent, which the agent creates with any missing ancestors.
pub(super) async fn create_remote_root(
    conn: &ScopedConn,
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

/// Drops staged transfers on the host; best effort (the agent also drops
/// them when the connection ends).
pub(super) async fn abort_remote(conn: &ScopedConn, root: &str, xfers: &[u64]) {
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

/// Splits a remote file path into the directory the agent resolves and the
/// file's name. A bare name's directory is `.`: the home on a host, the
/// work dir in an isolated sandbox (the agent resolves relative paths so).
pub(super) fn split_remote(path: &str) -> Result<(String, RelPath), SyncError> {
    let invalid = || SyncError::Invalid(format!("not a file path: {path:?}"));
    if path.is_empty() || path.ends_with('/') || path.contains('\0') {
        return Err(invalid());
    }
    let (parent, name) = match path.rfind('/') {
        Some(0) => ("/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (".", path),
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
