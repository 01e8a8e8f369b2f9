//! Reading files and describing them (hashes, chunk lists) for the other
//! side, through the same symlink-refusing opens as writing.

use super::dirs::*;
use super::*;

/// Reads the file (or ranges) named by `spec` under `root`, in pieces of at
/// most `piece` bytes, calling `emit(offset, encoded)` for each: the piece
/// encoded by [`codec`], read straight into its encoding.
///
/// A final symlink is not followed (a problem), nor is one among the parents.
/// A whole empty file emits one empty piece at offset 0, so the reader learns
/// it exists; a range past the end of the file emits only what exists.
#[allow(clippy::type_complexity)]
pub fn read_file(
    root: &Path,
    spec: &ReadSpec,
    piece: usize,
    emit: &mut dyn FnMut(u64, Vec<u8>) -> Result<(), String>,
) -> Result<(), PathProblem> {
    let problem = |message: String| PathProblem {
        path: spec.path.clone(),
        message,
    };
    let (file, st) = open_regular(&mut Dirs::new(root), &spec.path).map_err(problem)?;
    let piece = if piece == 0 {
        64 << 10
    } else {
        piece.min(16 << 20)
    };
    let whole = [(0u64, u64::MAX)];
    let ranges: &[(u64, u64)] = spec.ranges.as_deref().unwrap_or(&whole);
    // Pieces sized from the stat; a file that grew since it was opened
    // may outrun that, and its pieces grow up to the piece size.
    let mut size = piece.min(st.size.max(1) as usize).max(1);
    let mut emitted = false;
    for &(offset, len) in ranges {
        let end = offset.saturating_add(len);
        let mut pos = offset;
        while pos < end {
            let want = size.min((end - pos).min(usize::MAX as u64) as usize);
            let (encoded, n) = codec::read_at(&file, pos, want)
                .map_err(|err| problem(format!("read failed: {err}")))?;
            if n == 0 {
                break;
            }
            emit(pos, encoded).map_err(problem)?;
            emitted = true;
            pos += n as u64;
            if n == size && size < piece {
                size = piece;
            }
        }
    }
    if spec.ranges.is_none() && !emitted {
        emit(0, codec::compress(&[])).map_err(problem)?;
    }
    Ok(())
}

/// Opens the regular file at `path` under the root for reading: no
/// component, the file included, is followed if it is a symlink.
pub(super) fn open_regular(dirs: &mut Dirs, path: &[u8]) -> Result<(File, Stat), String> {
    let comps = relpath::components(path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    let dir = dirs.parent(parents, false).map_err(|e| e.message)?;
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = sys::openat(dir.as_fd(), &name, flags, 0).map_err(|err| match err.raw_os_error() {
        Some(libc::ELOOP) => "is a symlink; not followed".to_string(),
        Some(libc::ENOENT) => "does not exist".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        _ => format!("cannot open: {err}"),
    })?;
    let st: Stat = sys::fstat(fd.as_fd()).map_err(|e| e.to_string())?;
    if !st.is_file() {
        return Err(format!("is {}, not a file", st.kind_name()));
    }
    Ok((File::from(fd), st))
}

/// What [`describe_files`] found.
#[derive(Debug, Default)]
pub struct Described {
    pub entries: Vec<TreeEntry>,
    /// The paths that could not be described, and why.
    pub problems: Vec<PathProblem>,
    /// Files read because the cache did not know them.
    pub read: usize,
}

/// The hash and chunk list of each file of `paths` under `root` (for a sync
/// whose scan left the chunk lists out and found these files changed),
/// from `cache` where it knows the file, else read once (several files at a
/// time on several threads, once they are worth it). An entry carries
/// the file's stat as it was read; a path that cannot be described (gone,
/// not a regular file, changing while read) is a problem instead.
pub fn describe_files(
    root: &Path,
    paths: &[RelPath],
    mut cache: Option<&mut StatCache>,
) -> Described {
    let mut dirs = Dirs::new(root);
    let mut out = Described::default();
    if let (Some(cache), Ok(dir)) = (cache.as_deref_mut(), std::fs::File::open(root)) {
        cache.trust_stamps_of(dir.as_fd());
    }
    for window in paths.chunks(DESCRIBE_WINDOW) {
        // Per path: its entry or its problem; `None` while it waits to be read.
        let mut results: Vec<Option<Result<TreeEntry, String>>> = Vec::new();
        let mut to_read = Vec::new();
        for (k, path) in window.iter().enumerate() {
            results.push(match open_regular(&mut dirs, path) {
                Err(message) => Some(Err(message)),
                Ok((file, st)) => match cache.as_deref_mut().and_then(|c| c.lookup(&st, true)) {
                    Some((hash, chunks)) => Some(Ok(described(path, &st, hash, chunks))),
                    None => {
                        to_read.push((k, file, st));
                        None
                    }
                },
            });
        }
        out.read += to_read.len();
        let bytes = to_read.iter().map(|(_, _, st)| st.size).sum();
        let read = in_parallel(to_read.len(), bytes, |buf, j| {
            let (_, file, st) = &to_read[j];
            read_whole(file, st, buf)
        });
        for ((k, _, st), read) in to_read.iter().zip(read) {
            results[*k] = Some(read.map(|(hash, chunks, read_start_ns)| {
                if let Some(cache) = cache.as_deref_mut() {
                    cache.store(st, read_start_ns, hash, chunks.clone());
                }
                described(&window[*k], st, hash, chunks)
            }));
        }
        for (path, result) in window.iter().zip(results) {
            match result.expect("every path was looked up or read") {
                Ok(entry) => out.entries.push(entry),
                Err(message) => out.problems.push(PathProblem {
                    path: path.clone(),
                    message,
                }),
            }
        }
    }
    out
}

/// Files a describe holds open at once, to read them on several threads.
pub(super) const DESCRIBE_WINDOW: usize = 64;

pub(super) fn described(
    path: &RelPath,
    st: &Stat,
    hash: [u8; 32],
    chunks: Vec<ChunkRef>,
) -> TreeEntry {
    TreeEntry {
        path: path.clone(),
        kind: EntryKind::File,
        mode: st.perm(),
        size: st.size,
        mtime_ns: st.mtime_ns,
        hash: Some(hash),
        chunks,
    }
}

/// Hash and chunk list of an open file, provided it stays as `st` while it
/// is read; with the wall clock at the start of the read, for the cache.
pub(super) fn read_whole(
    mut file: &File,
    st: &Stat,
    buf: &mut Vec<u8>,
) -> Result<([u8; 32], Vec<ChunkRef>, i64), String> {
    let read_start_ns = sys::now_ns();
    let sizes = (st.size >= CHUNKED_MIN_SIZE).then(|| chunk::chunk_sizes(st.size));
    let (hash, chunks, n) =
        chunk::hash_reader(&mut file, sizes, buf).map_err(|e| format!("read failed: {e}"))?;
    let after = sys::fstat(file.as_fd()).map_err(|e| e.to_string())?;
    if after != *st || n != st.size {
        return Err("changed while being read".to_string());
    }
    Ok((hash, chunks, read_start_ns))
}
