//! The local side of a push, shared by every host it goes to ([`Source`]):
//! the root (a directory, or one file's directory and name), its filter,
//! one scan for all hosts, and the file contents read, checked and
//! compressed once for every host that needs them ([`Reads`]).
//!
//! A push to one host has a source of its own; a push to many
//! ([`super::push_many`]) shares one, so the tree is scanned and hashed
//! once and each piece of content compressed once, however many hosts it
//! goes to.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use outpost_protocol::{FilterSpec, RelPath, ScanSummary, TreeEntry};

use super::local::{local_dir, scan_local};
use super::planning::{filter_spec, only_name, problem_paths, root_problem};
use super::single;
use super::types::{SyncError, SyncOptions};

/// What the local scan found, filtered to the one name of a single file.
pub(super) struct Scanned {
    pub(super) entries: Vec<TreeEntry>,
    pub(super) summary: ScanSummary,
    /// Paths the scan reported a problem for.
    pub(super) problems: HashSet<RelPath>,
}

/// The one local scan of a push: it goes on (on its blocking thread) even
/// if the host that started it drops out, and every host awaits the same
/// result. A failure is a message: the source itself was refused.
type SharedScan = Shared<BoxFuture<'static, Result<Arc<Scanned>, String>>>;

pub(super) struct Source {
    /// The local directory synced (a single file's parent).
    pub(super) root: PathBuf,
    /// The options, with `only` set to the file's name for a single file.
    pub(super) options: SyncOptions,
    /// The source is one file (named by `options.only`).
    single_file: bool,
    pub(super) spec: FilterSpec,
    /// Let go (`None`) once every host has planned: a tree's entries are
    /// not held through the transfer.
    scan: Mutex<Option<SharedScan>>,
    /// Hosts still to plan.
    planning: AtomicUsize,
    /// Why the scan failed, if it did.
    scan_error: OnceLock<String>,
    pub(super) reads: Reads,
}

impl Source {
    /// The source of a push of `local` to `hosts` hosts: a directory, or one
    /// regular file (then `options.only` is its name).
    pub(super) fn new(
        local: &Path,
        options: &SyncOptions,
        hosts: usize,
    ) -> Result<Source, SyncError> {
        let mut options = options.clone();
        let file = match options.only {
            None => single::local_file(local)?,
            Some(_) => None,
        };
        let single_file = file.is_some();
        let root = match file {
            Some((dir, name)) => {
                options.only = Some(name);
                local_dir(&dir, true)?
            }
            None => local_dir(local, true)?,
        };
        let spec = filter_spec(&options, &root)?;
        let scan = scan(root.clone(), spec.clone(), options.clone())
            .boxed()
            .shared();
        Ok(Source {
            root,
            options,
            single_file,
            spec,
            scan: Mutex::new(Some(scan)),
            planning: AtomicUsize::new(hosts),
            scan_error: OnceLock::new(),
            reads: Reads::new(hosts),
        })
    }

    /// The file's name when the source is one file.
    pub(super) fn single(&self) -> Option<&str> {
        self.options.only.as_deref().filter(|_| self.single_file)
    }

    /// The local scan, made once for every host. Each host asks once,
    /// then calls [`Source::planned`].
    pub(super) async fn scanned(&self) -> Result<Arc<Scanned>, SyncError> {
        let scan = lock(&self.scan).clone();
        let Some(scan) = scan else {
            return Err(SyncError::Invalid("the local scan was let go".into()));
        };
        scan.await.map_err(|message| {
            let _ = self.scan_error.set(message.clone());
            SyncError::Invalid(message)
        })
    }

    /// A host is done with the scan (planned, or failed before): once every
    /// host is, the scan is let go.
    pub(super) fn planned(&self) {
        if self.planning.fetch_sub(1, Ordering::AcqRel) == 1 {
            lock(&self.scan).take();
        }
    }

    /// Why the local scan failed, if it did.
    pub(super) fn scan_error(&self) -> Option<&str> {
        self.scan_error.get().map(String::as_str)
    }
}

/// Counts a host out of [`Source::planned`] when dropped, however its
/// push ends.
pub(super) struct Planning<'s>(pub(super) &'s Source);

impl Drop for Planning<'_> {
    fn drop(&mut self) {
        self.0.planned();
    }
}

async fn scan(
    root: PathBuf,
    spec: FilterSpec,
    options: SyncOptions,
) -> Result<Arc<Scanned>, String> {
    let refused = |e: SyncError| e.to_string();
    let mut out = scan_local(root.clone(), spec, true)
        .await
        .map_err(refused)?;
    root_problem(&root.display().to_string(), &out.summary).map_err(refused)?;
    only_name(&mut out.entries, &options);
    if let Some(name) = &options.only {
        single::the_file_is_there(&out.entries, name).map_err(refused)?;
    }
    Ok(Arc::new(Scanned {
        problems: problem_paths(&out.summary),
        entries: out.entries,
        summary: out.summary,
    }))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A piece of content one or more hosts are sent: a whole small file, or a
/// range of a large one (`hash` the file's, so a key never outlives the
/// content it was read as). A whole file and a range covering all of it are
/// different pieces: only the first carries the content's hash.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Piece {
    pub(super) path: RelPath,
    pub(super) hash: Option<[u8; 32]>,
    pub(super) whole: bool,
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// What reading a piece gave: compressed bytes and the BLAKE3 of the raw
/// ones (whole files), or why it could not be read.
pub(super) type Read = Result<(Arc<Vec<u8>>, [u8; 32]), String>;

/// Compressed bytes kept for hosts that have not taken them yet. Hosts of
/// one push move through the same plan order, so what one has read the
/// others want soon; past this bound the oldest are dropped, and a host far
/// behind reads them again rather than the controller holding a tree.
const READS_KEPT: u64 = 128 << 20;

/// Content read once for every host of a push: the first host to need a
/// piece reads, checks and compresses it (others asking meanwhile wait for
/// that), the rest take the same bytes; a piece goes once every host still
/// pushing took it, or when [`READS_KEPT`] is passed (oldest first).
pub(super) struct Reads {
    /// Hosts still pushing.
    hosts: AtomicUsize,
    /// [`READS_KEPT`] but in tests.
    limit: u64,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    slots: HashMap<Piece, Arc<Slot>>,
    /// Kept pieces by when they were read, for dropping the oldest.
    order: BTreeMap<u64, Piece>,
    next_seq: u64,
    bytes: u64,
}

#[derive(Default)]
struct Slot {
    read: OnceLock<Read>,
    taken: AtomicUsize,
    /// Its place in [`Kept::order`] once its bytes count in [`Kept::bytes`]
    /// (set and read under that lock).
    seq: OnceLock<u64>,
}

impl Kept {
    /// Removes a piece (if it is this slot) and its accounting.
    fn remove(&mut self, piece: &Piece, slot: &Arc<Slot>) {
        if !self.slots.get(piece).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            return;
        }
        self.slots.remove(piece);
        if let Some(seq) = slot.seq.get() {
            self.order.remove(seq);
            self.bytes -= size(slot.read.get());
        }
    }
}

impl Reads {
    fn new(hosts: usize) -> Reads {
        Reads {
            hosts: AtomicUsize::new(hosts),
            limit: READS_KEPT,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn sharing(&self) -> bool {
        self.hosts.load(Ordering::Acquire) > 1
    }

    /// The piece, read by `read` unless another host already did. Blocks
    /// while another host reads it: call off the async workers.
    pub(super) fn get(&self, piece: &Piece, read: impl FnOnce() -> Read) -> Read {
        if !self.sharing() {
            return read();
        }
        let slot = lock(&self.kept)
            .slots
            .entry(piece.clone())
            .or_default()
            .clone();
        let mut first = false;
        let value = slot
            .read
            .get_or_init(|| {
                first = true;
                read()
            })
            .clone();
        let taken = slot.taken.fetch_add(1, Ordering::AcqRel) + 1;
        let mut kept = lock(&self.kept);
        let held = kept.slots.get(piece).is_some_and(|s| Arc::ptr_eq(s, &slot));
        if held && first {
            let seq = kept.next_seq;
            kept.next_seq += 1;
            let _ = slot.seq.set(seq);
            kept.order.insert(seq, piece.clone());
            kept.bytes += size(Some(&value));
        }
        if taken >= self.hosts.load(Ordering::Acquire) {
            kept.remove(piece, &slot);
        }
        while kept.bytes > self.limit {
            let Some((_, oldest)) = kept.order.pop_first() else {
                break;
            };
            if let Some(gone) = kept.slots.remove(&oldest) {
                kept.bytes -= size(gone.read.get());
            }
        }
        value
    }

    /// A host's push ended: pieces every remaining host took are let go.
    pub(super) fn host_done(&self) {
        let hosts = self.hosts.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        let mut kept = lock(&self.kept);
        let done: Vec<(Piece, Arc<Slot>)> = kept
            .slots
            .iter()
            .filter(|(_, s)| s.taken.load(Ordering::Acquire) >= hosts)
            .map(|(p, s)| (p.clone(), Arc::clone(s)))
            .collect();
        for (piece, slot) in done {
            kept.remove(&piece, &slot);
        }
    }
}

fn size(read: Option<&Read>) -> u64 {
    read.and_then(|r| r.as_ref().ok())
        .map_or(0, |(data, _)| data.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(n: u64) -> Piece {
        Piece {
            path: b"f".to_vec(),
            hash: None,
            whole: false,
            offset: n,
            len: 1,
        }
    }

    fn bytes(n: usize) -> Read {
        Ok((Arc::new(vec![7; n]), [0; 32]))
    }

    #[test]
    fn a_piece_is_read_once_for_every_host_and_then_let_go() {
        let reads = Reads::new(3);
        let mut count = 0;
        for _ in 0..3 {
            let got = reads.get(&piece(1), || {
                count += 1;
                bytes(10)
            });
            assert_eq!(got.unwrap().0.len(), 10);
        }
        assert_eq!(count, 1);
        let kept = lock(&reads.kept);
        assert!(kept.slots.is_empty() && kept.order.is_empty() && kept.bytes == 0);
    }

    #[test]
    fn past_the_bound_the_oldest_pieces_are_read_again() {
        let reads = Reads {
            limit: 100,
            ..Reads::new(2)
        };
        for n in 0..3 {
            reads.get(&piece(n), || bytes(50)).unwrap();
        }
        let kept = lock(&reads.kept).bytes;
        assert!(kept <= 100, "{kept}");
        let mut again = 0;
        for n in [0, 2] {
            reads
                .get(&piece(n), || {
                    again += 1;
                    bytes(50)
                })
                .unwrap();
        }
        // The oldest was dropped (read again), the newest kept.
        assert_eq!(again, 1);
    }

    #[test]
    fn a_host_that_ends_is_not_waited_for() {
        let reads = Reads::new(3);
        reads.get(&piece(0), || bytes(5)).unwrap();
        reads.get(&piece(0), || bytes(5)).unwrap();
        assert_eq!(lock(&reads.kept).slots.len(), 1);
        reads.host_done();
        let kept = lock(&reads.kept);
        assert!(kept.slots.is_empty() && kept.order.is_empty() && kept.bytes == 0);
    }

    #[test]
    fn one_host_keeps_nothing() {
        let reads = Reads::new(1);
        reads.get(&piece(0), || bytes(5)).unwrap();
        assert!(lock(&reads.kept).slots.is_empty());
    }
}
