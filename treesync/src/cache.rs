//! A stat cache: (dev, inode, size, mtime_ns, ctime_ns) → hash and chunks, so a
//! rescan hashes only what changed.
//!
//! The ctime is part of the key because nothing but the kernel can set it: a
//! tool that rewrites a file and puts its old mtime back still changes it.
//! A file whose ctime is too recent when it is hashed is not cached at all
//! (the "racy" case git also guards against): a write landing in the same
//! timestamp tick after our read would leave every field of the key unchanged.
//!
//! File format (all integers little-endian):
//!
//! ```text
//! magic "OPSTATC3" | u64 count | records | BLAKE3 of everything before it
//! record: dev u64, ino u64, size u64, mtime i64, ctime i64, hash [32],
//!         u32 n, n × (offset u64, len u32, hash [32])
//! ```
//!
//! The trailing checksum makes a torn or corrupt file load as an empty cache
//! (the cost is one full rehash), so saving needs no fsync.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use outpost_protocol::ChunkRef;

use crate::sys::{self, Stat};

// Version 2: chunk sizes grow with the file (chunk lists of version 1 would
// not match the other side's). Version 3: smaller chunks below 512 MiB (16 KiB on average).
const MAGIC: &[u8; 8] = b"OPSTATC3";
/// Bytes of a record without chunks: dev, ino, size, mtime, ctime, hash,
/// chunk count.
const RECORD_MIN_LEN: usize = 5 * 8 + 32 + 4;

/// Files whose ctime is less than this old when hashing starts are not
/// cached. Generous, because network filesystems stamp times with the
/// server's clock, and some filesystems only in whole seconds.
const RACY_WINDOW_NS: i64 = 1_000_000_000;

/// The same on a local filesystem that stamps to the nanosecond: the kernel
/// stamps a change with its coarse clock, at most one tick (10 ms at
/// 100 Hz) behind the wall clock, so a write after a read that started
/// this long after a stamp gets a later one.
const LOCAL_RACY_WINDOW_NS: i64 = 20_000_000;

/// Local filesystems (statfs magic numbers), where the kernel's own clock
/// stamps every change: ext2/3/4, XFS, Btrfs, tmpfs, F2FS, overlayfs (a
/// container's root), ZFS, bcachefs.
const LOCAL_FILESYSTEMS: &[i64] = &[
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0xF2F5_2010,
    0x794C_7630,
    0x2FC1_2FC1,
    0xCA45_1A4E,
];

/// The device of `fd`'s filesystem when it is a local one, whose stamps
/// are trusted after [`LOCAL_RACY_WINDOW_NS`]; None elsewhere.
pub(crate) fn local_device(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    let kind = sys::fs_type(fd).ok()?;
    if !LOCAL_FILESYSTEMS.contains(&kind) {
        return None;
    }
    sys::fstat(fd).ok().map(|st| st.dev)
}

/// How old a stamp of a file on `dev` must be for the file to be trusted:
/// `window` shortened to [`LOCAL_RACY_WINDOW_NS`] on the `local` device
/// (not on another filesystem mounted below it), and a second for a stamp
/// in whole seconds, which may be all its filesystem keeps.
fn window_for(stamp_ns: i64, dev: u64, local: Option<u64>, window: i64) -> i64 {
    let window = if local == Some(dev) {
        window.min(LOCAL_RACY_WINDOW_NS)
    } else {
        window
    };
    if stamp_ns % 1_000_000_000 == 0 {
        window.max(RACY_WINDOW_NS)
    } else {
        window
    }
}

/// A file an applier committed: the hash its content was checked against,
/// under the stat the file had just after its rename. A file of at least
/// [`crate::chunk::CHUNKED_MIN_SIZE`] is recorded without its chunk list
/// (the applier has none): its hash serves scans that want no chunk lists,
/// as a sync's scan of the host does, and a scan or describe that wants the
/// list reads the file once more. Only files whose mtime (the source's) is
/// older than the racy window: any later write sets the mtime
/// to now, so a record never describes content it did not check. (Unlike a
/// scan's records, the ctime is fresh: one left alone is exact; a writer
/// that restored the old mtime within the same ctime tick would go unseen,
/// as it would by any stat-based cache with a coarse clock.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub hash: [u8; 32],
}

impl Written {
    /// Whether a file of this mtime on `dev` may be recorded now, where
    /// `local` is the root's [`local_device`].
    pub(crate) fn recordable(mtime_ns: i64, dev: u64, local: Option<u64>) -> bool {
        let window = window_for(mtime_ns, dev, local, RACY_WINDOW_NS);
        crate::sys::now_ns().saturating_sub(mtime_ns) >= window
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub hash: [u8; 32],
    pub chunks: Vec<ChunkRef>,
    /// Looked up or stored during the current scan.
    pub seen: bool,
}

#[derive(Debug)]
pub struct StatCache {
    records: HashMap<(u64, u64), Record>,
    pub(crate) racy_window_ns: i64,
    /// Records were added, replaced or dropped since it was loaded.
    changed: bool,
    /// The scanned root's [`local_device`].
    local_dev: Option<u64>,
    /// The file it was loaded from or saved to, as it was then.
    file: Option<FileId>,
}

impl Default for StatCache {
    fn default() -> StatCache {
        StatCache {
            records: HashMap::new(),
            racy_window_ns: RACY_WINDOW_NS,
            changed: false,
            local_dev: None,
            file: None,
        }
    }
}

/// A cache file's identity: (dev, inode, size, mtime, ctime). A save is a
/// rename of a new file, so any process's save changes it.
type FileId = (u64, u64, u64, i64, i64);

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    ))
}

/// Records the caches kept in memory ([`StatCache::keep`]) hold in all; the
/// least recently kept go first.
const KEPT_RECORDS: usize = 200_000;

/// The caches this process last loaded or saved, by file, most recent last.
static KEPT: std::sync::Mutex<Vec<(std::path::PathBuf, StatCache)>> =
    std::sync::Mutex::new(Vec::new());

fn kept() -> std::sync::MutexGuard<'static, Vec<(std::path::PathBuf, StatCache)>> {
    // Plain data: a panic elsewhere leaves it consistent.
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

impl StatCache {
    /// Trusts the stamps of files on the filesystem of `fd` (a scan's
    /// root) as soon as that filesystem allows ([`local_device`]).
    pub fn trust_stamps_of(&mut self, fd: std::os::fd::BorrowedFd<'_>) {
        self.local_dev = local_device(fd);
    }

    /// Loads a cache file; a missing or unreadable one gives an empty cache.
    pub fn load(path: &Path) -> StatCache {
        let mut cache = StatCache::default();
        if let Ok(bytes) = std::fs::read(path)
            && let Some(records) = decode(&bytes)
        {
            cache.records = records;
        }
        cache
    }

    /// `path`'s cache: the one this process kept ([`StatCache::keep`]) when
    /// the file is still the one it read or wrote, else read from the file.
    /// A long-lived agent or controller so reads and checks the file only
    /// when another process saved it. (Every record is true of the stat it
    /// is keyed by, whoever wrote it: a stale copy costs hashing, never a
    /// wrong hash.)
    pub fn load_kept(path: &Path) -> StatCache {
        let id = file_id(path);
        let mut kept = kept();
        let at = kept.iter().position(|(p, _)| p == path);
        match at.map(|at| kept.remove(at).1) {
            Some(cache) if id.is_some() && cache.file == id => cache,
            _ => {
                drop(kept);
                let mut cache = StatCache::load(path);
                cache.file = id;
                cache
            }
        }
    }

    /// Saves the cache to `path` if it changed (making its directory, mode
    /// 0700), and keeps it in memory for the next [`StatCache::load_kept`].
    pub fn keep(mut self, path: &Path) -> std::io::Result<()> {
        if self.changed {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            self.save(path)?;
            self.file = file_id(path);
        }
        if self.file.is_none() {
            return Ok(());
        }
        self.clear_seen();
        self.changed = false;
        self.local_dev = None;
        let mut kept = kept();
        kept.retain(|(p, _)| p != path);
        kept.push((path.to_path_buf(), self));
        let mut total: usize = kept.iter().map(|(_, c)| c.records.len()).sum();
        while total > KEPT_RECORDS && !kept.is_empty() {
            total -= kept.remove(0).1.records.len();
        }
        Ok(())
    }

    /// Saves atomically (temp file + rename), mode 0600.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = self.encode();
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cache path has no file name",
            )
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{:016x}.tmp", sys::random_u64()));
        let tmp = dir.join(tmp_name);
        let result = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Whether it differs from the file it was loaded from (a scan that
    /// found nothing new need not rewrite it).
    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// Number of files the cache knows.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The cached hash and chunks of a file with this stat, marking it seen.
    /// With `chunk_lists`, a large file's record must hold its chunk list
    /// (one an applier wrote holds only the hash).
    pub(crate) fn lookup(
        &mut self,
        st: &Stat,
        chunk_lists: bool,
    ) -> Option<([u8; 32], Vec<ChunkRef>)> {
        let rec = self.records.get_mut(&(st.dev, st.ino))?;
        if rec.size != st.size || rec.mtime_ns != st.mtime_ns || rec.ctime_ns != st.ctime_ns {
            return None;
        }
        if chunk_lists && st.size >= crate::chunk::CHUNKED_MIN_SIZE && rec.chunks.is_empty() {
            return None;
        }
        rec.seen = true;
        Some((rec.hash, rec.chunks.clone()))
    }

    /// Records a hash computed from a file with stat `st`, read starting at
    /// `read_start_ns` (wall clock), unless the stat is too fresh to trust.
    pub(crate) fn store(
        &mut self,
        st: &Stat,
        read_start_ns: i64,
        hash: [u8; 32],
        chunks: Vec<ChunkRef>,
    ) {
        let window = window_for(st.ctime_ns, st.dev, self.local_dev, self.racy_window_ns);
        if read_start_ns.saturating_sub(st.ctime_ns) < window
            || read_start_ns.saturating_sub(st.mtime_ns) < window
        {
            self.changed |= self.records.remove(&(st.dev, st.ino)).is_some();
            return;
        }
        self.changed = true;
        self.records.insert(
            (st.dev, st.ino),
            Record {
                size: st.size,
                mtime_ns: st.mtime_ns,
                ctime_ns: st.ctime_ns,
                hash,
                chunks,
                seen: true,
            },
        );
    }

    /// Records files an applier wrote and checked ([`Written`]), so the next
    /// scan takes their hashes from here instead of reading them again.
    pub fn record_written(&mut self, files: &[Written]) {
        self.changed |= !files.is_empty();
        for w in files {
            self.records.insert(
                (w.dev, w.ino),
                Record {
                    size: w.size,
                    mtime_ns: w.mtime_ns,
                    ctime_ns: w.ctime_ns,
                    hash: w.hash,
                    chunks: Vec::new(),
                    seen: false,
                },
            );
        }
    }

    /// Drops what the last scan did not see, and resets the marks.
    pub(crate) fn prune_unseen(&mut self) {
        let before = self.records.len();
        self.records.retain(|_, rec| std::mem::take(&mut rec.seen));
        self.changed |= self.records.len() != before;
    }

    /// Resets the marks without dropping anything (after a partial scan).
    pub(crate) fn clear_seen(&mut self) {
        for rec in self.records.values_mut() {
            rec.seen = false;
        }
    }

    #[cfg(test)]
    pub(crate) fn records_mut(&mut self) -> &mut HashMap<(u64, u64), Record> {
        &mut self.records
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.records.len() * 100);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.records.len() as u64).to_le_bytes());
        for (&(dev, ino), rec) in &self.records {
            out.extend_from_slice(&dev.to_le_bytes());
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&rec.size.to_le_bytes());
            out.extend_from_slice(&rec.mtime_ns.to_le_bytes());
            out.extend_from_slice(&rec.ctime_ns.to_le_bytes());
            out.extend_from_slice(&rec.hash);
            out.extend_from_slice(&(rec.chunks.len() as u32).to_le_bytes());
            for c in &rec.chunks {
                out.extend_from_slice(&c.offset.to_le_bytes());
                out.extend_from_slice(&c.len.to_le_bytes());
                out.extend_from_slice(&c.hash);
            }
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }
}

/// Parses a cache file; None when it is not one of ours or is damaged.
pub(crate) fn decode(bytes: &[u8]) -> Option<HashMap<(u64, u64), Record>> {
    let body_len = bytes.len().checked_sub(32)?;
    let (body, sum) = bytes.split_at(body_len);
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    let mut r = Reader { bytes: body };
    if r.take(8)? != MAGIC {
        return None;
    }
    let count = r.u64()?;
    // Reserve no more than the rest could hold (a damaged count must not
    // allocate for records that are not there).
    let room = (r.bytes.len() / RECORD_MIN_LEN) as u64;
    let mut records = HashMap::with_capacity(count.min(room).min(1 << 20) as usize);
    for _ in 0..count {
        let dev = r.u64()?;
        let ino = r.u64()?;
        let size = r.u64()?;
        let mtime_ns = r.u64()? as i64;
        let ctime_ns = r.u64()? as i64;
        let hash = r.hash()?;
        let n = r.u32()?;
        // Each chunk takes 44 bytes; a count the rest cannot hold is damage.
        if (n as usize).checked_mul(44)? > r.bytes.len() {
            return None;
        }
        let mut chunks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            chunks.push(ChunkRef {
                offset: r.u64()?,
                len: r.u32()?,
                hash: r.hash()?,
            });
        }
        records.insert(
            (dev, ino),
            Record {
                size,
                mtime_ns,
                ctime_ns,
                hash,
                chunks,
                seen: false,
            },
        );
    }
    r.bytes.is_empty().then_some(records)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn hash(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    fn stat(ino: u64, size: u64) -> Stat {
        Stat {
            dev: 1,
            ino,
            mode: 0o100644,
            size,
            mtime_ns: 1_000,
            ctime_ns: 2_000,
            uid: 0,
            gid: 0,
        }
    }

    #[test]
    fn a_local_filesystem_s_stamps_are_trusted_after_two_ticks() {
        let t = TempDir::new();
        let dir = std::fs::File::open(t.path()).unwrap();
        // The tests' scratch is a local filesystem; /proc is none of them.
        let local = local_device(dir.as_fd());
        let dev = local.expect("the scratch is on a local filesystem");
        let proc = std::fs::File::open("/proc/self").unwrap();
        assert_eq!(local_device(proc.as_fd()), None);

        let mut c = StatCache::default();
        c.trust_stamps_of(dir.as_fd());
        let read_start = 50_000_000_123;
        let stamped = |ino, ago: i64| Stat {
            dev,
            mtime_ns: read_start - ago,
            ctime_ns: read_start - ago,
            ..stat(ino, 5)
        };
        c.store(&stamped(1, 30_000_000), read_start, [1; 32], vec![]);
        c.store(&stamped(2, 5_000_000), read_start, [2; 32], vec![]);
        assert!(c.lookup(&stamped(1, 30_000_000), false).is_some());
        assert!(c.lookup(&stamped(2, 5_000_000), false).is_none(), "racy");
        // Another filesystem mounted below the root keeps a second.
        let elsewhere = Stat {
            dev: dev + 1,
            ..stamped(4, 30_000_000)
        };
        c.store(&elsewhere, read_start, [4; 32], vec![]);
        assert!(c.lookup(&elsewhere, false).is_none());
        // A stamp in whole seconds may be all the filesystem keeps.
        let whole = Stat {
            dev,
            mtime_ns: 49_000_000_000,
            ctime_ns: 49_000_000_000,
            ..stat(3, 5)
        };
        c.store(&whole, 49_900_000_000, [3; 32], vec![]);
        assert!(c.lookup(&whole, false).is_none());
        c.store(&whole, 50_000_000_000, [3; 32], vec![]);
        assert!(c.lookup(&whole, false).is_some());
        // An applier's record goes by the source's mtime alike.
        let now = sys::now_ns();
        assert!(Written::recordable(now - 30_000_000 - 7, dev, local));
        assert!(!Written::recordable(now - 7, dev, local));
        assert!(!Written::recordable(now - 30_000_000 - 7, dev + 1, local));
        assert!(!Written::recordable(now - 30_000_000 - 7, dev, None));
    }

    #[test]
    fn a_kept_cache_serves_until_another_process_saves_its_file() {
        let t = TempDir::new();
        let path = t.path().join("sub/cache");
        let held = |path: &Path| kept().iter().any(|(p, _)| p == path);
        let mut c = StatCache::default();
        c.store(&stat(1, 5), 10_000_000_000, [1; 32], vec![]);
        c.keep(&path).unwrap();
        let written = file_id(&path);
        assert!(written.is_some() && held(&path));

        let mut c = StatCache::load_kept(&path);
        assert!(!held(&path), "taken while in use");
        assert_eq!(c.lookup(&stat(1, 5), false), Some(([1; 32], vec![])));
        assert!(!c.is_changed());
        // Unchanged: kept again, the file left as it was.
        c.keep(&path).unwrap();
        assert!(held(&path) && file_id(&path) == written);

        // Another process saves the file: the next load reads it.
        let mut other = StatCache::default();
        other.store(&stat(2, 5), 10_000_000_000, [2; 32], vec![]);
        other.save(&path).unwrap();
        let mut c = StatCache::load_kept(&path);
        assert_eq!(c.len(), 1);
        assert!(c.lookup(&stat(2, 5), false).is_some());
    }

    #[test]
    fn save_load_round_trip() {
        let t = TempDir::new();
        let path = t.path().join("cache");
        let mut c = StatCache::default();
        let chunks = vec![ChunkRef {
            offset: 0,
            len: 5,
            hash: [9; 32],
        }];
        c.store(&stat(1, 5), 10_000_000_000, [1; 32], vec![]);
        c.store(&stat(2, 2 << 20), 10_000_000_000, [2; 32], chunks.clone());
        // A large file an applier wrote: a hash, no chunk list.
        c.store(&stat(3, 2 << 20), 10_000_000_000, [3; 32], vec![]);
        c.save(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let mut d = StatCache::load(&path);
        assert_eq!(d.len(), 3);
        assert_eq!(d.lookup(&stat(1, 5), true), Some(([1; 32], vec![])));
        assert_eq!(d.lookup(&stat(2, 2 << 20), true), Some(([2; 32], chunks)));
        assert_eq!(
            d.lookup(&stat(1, 6), false),
            None,
            "size is part of the key"
        );
        assert_eq!(d.lookup(&stat(3, 2 << 20), true), None, "no chunk list");
        assert_eq!(d.lookup(&stat(3, 2 << 20), false), Some(([3; 32], vec![])));
        // No temp files left beside it.
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }

    #[test]
    fn missing_or_corrupt_loads_empty() {
        let t = TempDir::new();
        let path = t.path().join("cache");
        assert!(StatCache::load(&path).is_empty());
        let mut c = StatCache::default();
        c.store(&stat(1, 5), 10_000_000_000, [1; 32], vec![]);
        c.save(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(StatCache::load(&path).is_empty());
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(StatCache::load(&path).is_empty());
    }

    #[test]
    fn racy_entries_are_not_cached() {
        let mut c = StatCache::default();
        // Hashed 0.5 s after its last change: a later write could keep the key.
        c.store(&stat(1, 5), 2_000 + 500_000_000, [1; 32], vec![]);
        assert!(c.is_empty());
    }
}
