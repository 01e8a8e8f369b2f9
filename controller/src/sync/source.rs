//! The local side of a push, shared by every host it goes to ([`Source`]):
//! the root (a directory, or one file's directory and name), its filter,
//! one scan for all hosts, and the file contents read, checked and
//! compressed once for every host that needs them ([`Reads`]).
//!
//! A push to one host has a source of its own; a push to many
//! ([`super::push_many`]) shares one, so the tree is scanned and hashed
//! once and each piece of content compressed once, however many hosts it
//! goes to.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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

pub(super) struct Source {
    /// The local directory synced (a single file's parent).
    pub(super) root: PathBuf,
    /// The options, with `only` set to the file's name for a single file.
    pub(super) options: SyncOptions,
    /// The source is one file (named by `options.only`).
    single_file: bool,
    pub(super) spec: FilterSpec,
    scanned: tokio::sync::OnceCell<Arc<Scanned>>,
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
        Ok(Source {
            root,
            options,
            single_file,
            spec,
            scanned: tokio::sync::OnceCell::new(),
            reads: Reads::new(hosts),
        })
    }

    /// The file's name when the source is one file.
    pub(super) fn single(&self) -> Option<&str> {
        self.options.only.as_deref().filter(|_| self.single_file)
    }

    /// The local scan, made by the first host to ask (an error is each
    /// asker's own, and the next one scans again).
    pub(super) async fn scanned(&self) -> Result<Arc<Scanned>, SyncError> {
        self.scanned
            .get_or_try_init(|| async {
                let mut out = scan_local(self.root.clone(), self.spec.clone()).await?;
                root_problem(&self.root.display().to_string(), &out.summary)?;
                only_name(&mut out.entries, &self.options);
                if let Some(name) = &self.options.only {
                    single::the_file_is_there(&out.entries, name)?;
                }
                Ok(Arc::new(Scanned {
                    problems: problem_paths(&out.summary),
                    entries: out.entries,
                    summary: out.summary,
                }))
            })
            .await
            .cloned()
    }
}

/// A piece of content one or more hosts are sent: a whole small file, or a
/// range of a large one (`hash` the file's, so a key never outlives the
/// content it was read as).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Piece {
    pub(super) path: RelPath,
    pub(super) hash: Option<[u8; 32]>,
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
/// that), the rest take the same bytes; a piece goes once every host took
/// it, or when [`READS_KEPT`] is passed.
pub(super) struct Reads {
    hosts: usize,
    /// [`READS_KEPT`] but in tests.
    limit: u64,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    slots: HashMap<Piece, Arc<Slot>>,
    /// Pieces in the order they were read, for dropping the oldest.
    order: VecDeque<Piece>,
    bytes: u64,
}

#[derive(Default)]
struct Slot {
    read: OnceLock<Read>,
    taken: AtomicUsize,
    /// Its bytes are in [`Kept::bytes`] (set and read under that lock).
    counted: AtomicBool,
}

impl Reads {
    fn new(hosts: usize) -> Reads {
        Reads {
            hosts,
            limit: READS_KEPT,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// The piece, read by `read` unless another host already did. Blocks
    /// while another host reads it: call off the async workers.
    pub(super) fn get(&self, piece: &Piece, read: impl FnOnce() -> Read) -> Read {
        if self.hosts < 2 {
            return read();
        }
        let slot = {
            let mut kept = self.lock();
            kept.slots.entry(piece.clone()).or_default().clone()
        };
        let mut first = false;
        let value = slot
            .read
            .get_or_init(|| {
                first = true;
                read()
            })
            .clone();
        let taken = slot.taken.fetch_add(1, Ordering::AcqRel) + 1;
        let mut kept = self.lock();
        let held = kept.slots.get(piece).is_some_and(|s| Arc::ptr_eq(s, &slot));
        if held && first {
            kept.bytes += size(&value);
            kept.order.push_back(piece.clone());
            slot.counted.store(true, Ordering::Relaxed);
        }
        if held && taken >= self.hosts {
            kept.slots.remove(piece);
            if slot.counted.load(Ordering::Relaxed) {
                kept.bytes -= size(&value);
            }
        }
        while kept.bytes > self.limit {
            let Some(oldest) = kept.order.pop_front() else {
                break;
            };
            if let Some(gone) = kept.slots.remove(&oldest)
                && gone.counted.load(Ordering::Relaxed)
                && let Some(read) = gone.read.get()
            {
                kept.bytes -= size(read);
            }
        }
        // Pieces taken by every host leave `order` lazily, here.
        while kept
            .order
            .front()
            .is_some_and(|p| !kept.slots.contains_key(p))
        {
            kept.order.pop_front();
        }
        value
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn size(read: &Read) -> u64 {
    read.as_ref().map_or(0, |(data, _)| data.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(n: u64) -> Piece {
        Piece {
            path: b"f".to_vec(),
            hash: None,
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
        let kept = reads.lock();
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
        let kept = reads.lock().bytes;
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
    fn one_host_keeps_nothing() {
        let reads = Reads::new(1);
        reads.get(&piece(0), || bytes(5)).unwrap();
        assert!(reads.lock().slots.is_empty());
    }
}
