//! Describing a tree.
//!
//! The walk pops paths from a min-heap ordered by path bytes and lists a
//! directory only when its own entry is emitted. Since every child's path is
//! greater than its parent's, entries come out already sorted, and a scan cut
//! short by `max_entries` returns exactly the first entries of the full
//! listing (a plain depth-first walk would not: `a.txt` sorts before `a/b`).
//!
//! Every entry is `lstat`ed relative to its directory's descriptor, symlinks
//! are read, never followed, and a directory is only listed if the inode we
//! open is the one its parent listed, so a path swapped for a symlink
//! mid-scan cannot pull outside files into the listing.
//!
//! Hashing comes after the walk: cached files first, then the rest, spread
//! over a few threads when there is enough of it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::path::Path;

use outpost_protocol::{
    ChunkRef, EntryKind, FilterSpec, Partial, PathProblem, ScanSummary, TreeEntry,
};

use crate::apply;
use crate::cache::StatCache;
use crate::chunk::{self, CHUNKED_MIN_SIZE};
use crate::filter::{Filter, TEMP_PREFIX};
use crate::parallel::in_parallel;
use crate::sys::{self, DirStream, Stat};

#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Compute BLAKE3 hashes (and chunk lists for files of at least
    /// [`crate::chunk::CHUNKED_MIN_SIZE`]).
    pub hashes: bool,
    /// Whether the caller wants large files' chunk lists. Without, a cached
    /// hash serves even where the cache holds no chunk list (the record of
    /// a file an applier wrote). A large file that is read is chunked
    /// either way, for the cache.
    pub chunk_lists: bool,
    pub recursive: bool,
    /// 0: no limit.
    pub max_entries: u64,
    /// Remove Outpost temporary files that a killed process left behind
    /// (see [`crate::apply::reap_stale_temp`]) and list the partial files a
    /// transfer could resume: for scans that prepare a sync, not listings.
    pub reap_stale_temps: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ScanOutput {
    /// Sorted by path bytes; the root itself is not listed; symlinks are never
    /// followed; excluded paths and Outpost's own temporary files are absent.
    pub entries: Vec<TreeEntry>,
    pub summary: ScanSummary,
}

/// How often a file that changes while it is read is read again before it is
/// listed without a hash.
const HASH_ATTEMPTS: usize = 3;

/// Scans `root`. A missing root gives `root_exists: false` and no entries; an
/// unreadable path becomes a problem and the scan goes on.
///
/// The root itself may be a symlink to a directory (it is the caller's choice
/// of path); a root that is not a directory is a problem, `"not a directory"`,
/// with an empty path. Special files (fifos, sockets, devices) are not listed
/// and each becomes a problem. A file that cannot be hashed stays listed
/// without a hash (plus a problem); one that vanished before it could be
/// hashed is dropped (plus a problem).
///
/// With a cache, cached files are not read; after a complete recursive scan
/// with hashes, files the scan did not see are dropped from the cache.
pub fn scan(
    root: &Path,
    filter: &FilterSpec,
    options: &ScanOptions,
    cache: Option<&mut StatCache>,
) -> ScanOutput {
    let mut out = ScanOutput::default();
    let problems = &mut out.summary.problems;
    let root_fd = match sys::open_path(
        root,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
        0,
    ) {
        Ok(fd) => fd,
        Err(err) if sys::is_errno(&err, libc::ENOENT) => return out,
        Err(err) => {
            out.summary.root_exists = true;
            let message = if sys::is_errno(&err, libc::ENOTDIR) {
                not_a_directory(root)
            } else {
                format!("cannot open: {err}")
            };
            problems.push(PathProblem {
                path: Vec::new(),
                message,
            });
            return out;
        }
    };
    out.summary.root_exists = true;
    let mut cache = cache;
    if let Some(cache) = cache.as_deref_mut() {
        cache.trust_stamps_of(root_fd.as_fd());
    }
    let filter = match Filter::new(root, filter) {
        Ok(f) => f,
        Err(message) => {
            problems.push(PathProblem {
                path: Vec::new(),
                message,
            });
            return out;
        }
    };

    let mut walk = Walk {
        root,
        filter: &filter,
        heap: BinaryHeap::new(),
        problems: Vec::new(),
        reap_stale_temps: options.reap_stale_temps,
        partials: Vec::new(),
    };
    match DirStream::new(root_fd) {
        Ok(mut dir) => walk.list(&mut dir, b""),
        Err(err) => walk.problem(b"", format!("cannot list: {err}")),
    }
    let mut stats = Vec::new();
    while let Some(Reverse(item)) = walk.heap.pop() {
        if options.max_entries > 0 && out.entries.len() as u64 >= options.max_entries {
            out.summary.truncated = true;
            break;
        }
        if item.st.is_dir() && options.recursive {
            walk.expand(&item);
        }
        stats.push(item.st);
        out.entries.push(item.into_entry());
    }
    let truncated = out.summary.truncated;
    out.summary.problems.append(&mut walk.problems);
    out.summary.partials = std::mem::take(&mut walk.partials);

    if options.hashes {
        hash_entries(
            root,
            &mut out,
            &stats,
            cache,
            options.chunk_lists,
            options.recursive && !truncated,
        );
    }
    out
}

/// One listed path waiting in the heap.
struct Item {
    path: Vec<u8>,
    st: Stat,
    target: Option<Vec<u8>>,
}

impl Item {
    fn into_entry(self) -> TreeEntry {
        let (kind, size) = match self.target {
            Some(target) => {
                let len = target.len() as u64;
                (EntryKind::Symlink { target }, len)
            }
            None if self.st.is_dir() => (EntryKind::Dir, 0),
            None => (EntryKind::File, self.st.size),
        };
        TreeEntry {
            path: self.path,
            kind,
            mode: self.st.perm(),
            size,
            mtime_ns: self.st.mtime_ns,
            hash: None,
            chunks: Vec::new(),
        }
    }
}

impl PartialEq for Item {
    fn eq(&self, other: &Item) -> bool {
        self.path == other.path
    }
}

impl Eq for Item {}

impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Item) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Item {
    fn cmp(&self, other: &Item) -> std::cmp::Ordering {
        self.path.cmp(&other.path)
    }
}

struct Walk<'a> {
    root: &'a Path,
    filter: &'a Filter,
    heap: BinaryHeap<Reverse<Item>>,
    problems: Vec<PathProblem>,
    reap_stale_temps: bool,
    partials: Vec<Partial>,
}

impl Walk<'_> {
    fn problem(&mut self, path: &[u8], message: String) {
        self.problems.push(PathProblem {
            path: path.to_vec(),
            message,
        });
    }

    /// Opens the directory `item` and queues its children, provided it is
    /// still the directory that was listed.
    fn expand(&mut self, item: &Item) {
        let path = self.root.join(sys::path_of(&item.path));
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let opened = sys::open_path(&path, flags, 0).and_then(|fd| {
            let st = sys::fstat(fd.as_fd())?;
            if (st.dev, st.ino) != (item.st.dev, item.st.ino) {
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            DirStream::new(fd)
        });
        match opened {
            Ok(mut dir) => self.list(&mut dir, &item.path),
            Err(err) => {
                let message = describe(&err, "cannot list");
                self.problem(&item.path, message);
            }
        }
    }

    fn list(&mut self, dir: &mut DirStream, parent: &[u8]) {
        while let Some(next) = dir.next_entry() {
            let (name, d_type) = match next {
                Ok(e) => e,
                Err(err) => {
                    self.problem(parent, format!("listing stopped early: {err}"));
                    return;
                }
            };
            let name_bytes = name.to_bytes();
            if name_bytes.starts_with(TEMP_PREFIX.as_bytes()) {
                if self.reap_stale_temps
                    && matches!(d_type, libc::DT_REG | libc::DT_UNKNOWN)
                    && !apply::reap_stale_temp(dir.fd(), &name)
                    && let Some((hash_prefix, size)) = apply::parse_resumable_name(name_bytes)
                {
                    self.partials.push(Partial {
                        dir: parent.to_vec(),
                        hash_prefix,
                        size,
                    });
                }
                continue;
            }
            let mut rel = Vec::with_capacity(parent.len() + 1 + name_bytes.len());
            if !parent.is_empty() {
                rel.extend_from_slice(parent);
                rel.push(b'/');
            }
            rel.extend_from_slice(name_bytes);
            // Excluded paths are skipped before their stat when the
            // directory entry already tells us whether they are directories.
            let known_dir = match d_type {
                libc::DT_UNKNOWN => None,
                libc::DT_DIR => Some(true),
                _ => Some(false),
            };
            if let Some(is_dir) = known_dir
                && self.filter.excluded_leaf(&rel, is_dir)
            {
                continue;
            }
            let st = match sys::lstatat(dir.fd(), &name) {
                Ok(st) => st,
                Err(err) => {
                    self.problem(&rel, describe(&err, "cannot stat"));
                    continue;
                }
            };
            if known_dir.is_none() && self.filter.excluded_leaf(&rel, st.is_dir()) {
                continue;
            }
            let target = if st.is_symlink() {
                match sys::readlinkat(dir.fd(), &name) {
                    Ok(t) => Some(t),
                    Err(err) => {
                        self.problem(&rel, describe(&err, "cannot read symlink"));
                        continue;
                    }
                }
            } else if st.is_dir() || st.is_file() {
                None
            } else {
                self.problem(&rel, format!("skipped: {} is not synced", st.kind_name()));
                continue;
            };
            self.heap.push(Reverse(Item {
                path: rel,
                st,
                target,
            }));
        }
    }
}

/// Why a root that exists cannot be scanned: `"not a directory"` for a
/// file, and for anything else what it is (`"a character device, not a file
/// or directory"`), which neither side can sync.
fn not_a_directory(root: &Path) -> String {
    use std::os::unix::fs::FileTypeExt;
    // Followed like the open that failed: a root may be a symlink.
    let Ok(kind) = std::fs::metadata(root).map(|m| m.file_type()) else {
        return "not a directory".to_string();
    };
    let special = if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a fifo"
    } else if kind.is_socket() {
        "a socket"
    } else {
        return "not a directory".to_string();
    };
    format!("{special}, not a file or directory")
}

fn describe(err: &io::Error, what: &str) -> String {
    match err.raw_os_error() {
        Some(libc::ENOENT) => "vanished during the scan".to_string(),
        Some(libc::ESTALE) | Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            "replaced during the scan".to_string()
        }
        Some(libc::EACCES) | Some(libc::EPERM) => format!("{what}: permission denied"),
        _ => format!("{what}: {err}"),
    }
}

/// What hashing one file gave.
enum Hashed {
    Done {
        hash: [u8; 32],
        chunks: Vec<ChunkRef>,
        /// The stat the hash belongs to.
        st: Stat,
        read_start_ns: i64,
    },
    /// Changed on every attempt: listed without a hash.
    Unstable(Stat),
    Vanished,
    Failed(String),
}

fn hash_entries(
    root: &Path,
    out: &mut ScanOutput,
    stats: &[Stat],
    cache: Option<&mut StatCache>,
    chunk_lists: bool,
    prune: bool,
) {
    let mut cache = cache;
    let mut jobs = Vec::new();
    for (i, entry) in out.entries.iter_mut().enumerate() {
        if entry.kind != EntryKind::File {
            continue;
        }
        if let Some(cache) = cache.as_deref_mut()
            && let Some((hash, chunks)) = cache.lookup(&stats[i], chunk_lists)
        {
            entry.hash = Some(hash);
            entry.chunks = chunks;
            continue;
        }
        jobs.push(i);
    }

    let results = run_jobs(root, &out.entries, stats, &jobs);

    let mut vanished = Vec::new();
    for (i, result) in jobs.into_iter().zip(results) {
        let entry = &mut out.entries[i];
        match result {
            Hashed::Done {
                hash,
                chunks,
                st,
                read_start_ns,
            } => {
                entry.size = st.size;
                entry.mtime_ns = st.mtime_ns;
                entry.mode = st.perm();
                entry.hash = Some(hash);
                if let Some(cache) = cache.as_deref_mut() {
                    cache.store(&st, read_start_ns, hash, chunks.clone());
                }
                entry.chunks = chunks;
            }
            Hashed::Unstable(st) => {
                entry.size = st.size;
                entry.mtime_ns = st.mtime_ns;
                out.summary.problems.push(PathProblem {
                    path: entry.path.clone(),
                    message: "kept changing while being read; listed without a hash".to_string(),
                });
            }
            Hashed::Vanished => {
                out.summary.problems.push(PathProblem {
                    path: entry.path.clone(),
                    message: "vanished during the scan".to_string(),
                });
                vanished.push(i);
            }
            Hashed::Failed(message) => out.summary.problems.push(PathProblem {
                path: entry.path.clone(),
                message,
            }),
        }
    }
    if !vanished.is_empty() {
        let mut index = 0;
        let mut drop = vanished.into_iter().peekable();
        out.entries.retain(|_| {
            let gone = drop.peek() == Some(&index);
            if gone {
                drop.next();
            }
            index += 1;
            !gone
        });
    }
    if let Some(cache) = cache {
        if prune {
            cache.prune_unseen();
        } else {
            cache.clear_seen();
        }
    }
}

/// Hashes the files `jobs` (indices into `entries`), in order.
fn run_jobs(root: &Path, entries: &[TreeEntry], stats: &[Stat], jobs: &[usize]) -> Vec<Hashed> {
    let bytes: u64 = jobs.iter().map(|&i| stats[i].size).sum();
    in_parallel(jobs.len(), bytes, |buf, j| {
        let i = jobs[j];
        hash_one(root, &entries[i].path, &stats[i], buf)
    })
}

/// Hashes one file with a single pass over its content, provided it is still
/// the regular file the walk listed; reads again if it changes meanwhile.
fn hash_one(root: &Path, rel: &[u8], listed: &Stat, buf: &mut Vec<u8>) -> Hashed {
    let path = root.join(sys::path_of(rel));
    let mut last = *listed;
    for _ in 0..HASH_ATTEMPTS {
        let read_start_ns = sys::now_ns();
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = match sys::open_path(&path, flags, 0) {
            Ok(fd) => fd,
            Err(err) if sys::is_errno(&err, libc::ENOENT) => return Hashed::Vanished,
            Err(err) => return Hashed::Failed(describe(&err, "cannot read")),
        };
        let st = match sys::fstat(fd.as_fd()) {
            Ok(st) => st,
            Err(err) => return Hashed::Failed(describe(&err, "cannot stat")),
        };
        if !st.is_file() || (st.dev, st.ino) != (listed.dev, listed.ino) {
            return Hashed::Failed("replaced during the scan".to_string());
        }
        let mut file = File::from(fd);
        let read = if st.size < CHUNKED_MIN_SIZE {
            read_small(&mut file, st.size as usize, buf)
                .map(|n| (*blake3::hash(&buf[..n]).as_bytes(), Vec::new(), n as u64))
        } else {
            chunk::hash_reader(&mut file, Some(chunk::chunk_sizes(st.size)), buf)
        };
        let (hash, chunks, n) = match read {
            Ok(r) => r,
            Err(err) => return Hashed::Failed(describe(&err, "cannot read")),
        };
        let after = match sys::fstat(file.as_fd()) {
            Ok(st) => st,
            Err(err) => return Hashed::Failed(describe(&err, "cannot stat")),
        };
        if after == st && n == st.size {
            return Hashed::Done {
                hash,
                chunks,
                st,
                read_start_ns,
            };
        }
        last = after;
    }
    Hashed::Unstable(last)
}

/// Reads up to `size` bytes into `buf` with as few reads as the kernel allows
/// (one, for a regular file). Growth past `size` shows in the stat taken
/// afterwards, so there is no need to read to end of file.
fn read_small(file: &mut File, size: usize, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.len() < size {
        buf.resize(size, 0);
    }
    let mut n = 0;
    while n < size {
        match file.read(&mut buf[n..size]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(n)
}

/// How hashing one path ended, for tests that cannot stage races.
#[cfg(test)]
pub(crate) fn hash_one_for_test(
    root: &Path,
    rel: &[u8],
    listed: &Stat,
    buf: &mut Vec<u8>,
) -> Option<&'static str> {
    Some(match hash_one(root, rel, listed, buf) {
        Hashed::Done { .. } => "done",
        Hashed::Unstable(_) => "unstable",
        Hashed::Vanished => "vanished",
        Hashed::Failed(_) => "failed",
    })
}
