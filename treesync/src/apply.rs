//! Carrying a plan out on the receiving side.
//!
//! Architecture invariant: nothing is ever written at a final path directly.
//! Content goes to `.outpost-*.tmp` in the target's directory, is checked
//! against its BLAKE3 hash, flushed (one `syncfs` per batch rather than an
//! `fsync` per file), checked against [`outpost_protocol::Expect`], and renamed
//! into place. Parents are walked without following symlinks, so a symlink in
//! the tree can never redirect a write outside the root.
//!
//! How parents are walked: the root is opened (it may itself be a symlink; it
//! is the caller's choice of path), then each parent component is opened
//! relative to the previous one with `O_NOFOLLOW`, and every later operation
//! (`openat`, `renameat`, `unlinkat`, …) names a single component relative to
//! that descriptor. A component that is a symlink or not a directory stops the
//! operation with "parent is not a directory (symlink?)". Because the checks
//! and the operations use the same descriptors, swapping a directory for a
//! symlink halfway through changes nothing.
//!
//! Durability of [`Applier::put_files`]: all temporary files of a batch are
//! written first, then one `syncfs` per filesystem flushes them together (a
//! per-file `fsync` costs a journal commit each, which dominates when
//! thousands of small files arrive), then each is checked and renamed, and
//! finally every directory that gained or lost a name is `fsync`ed once. After
//! a crash a path holds either its old content or its complete new content.
//! Metadata operations fsync the directories they touched once at the end.
//!
//! Resuming: a large file is staged under a name made of its new content's
//! hash and size ([`resumable_name`]). When a transfer is cut short (its
//! connection goes, its process is killed) that file stays, a sync scan
//! lists it, and the next transfer of the same content adopts it with
//! [`Applier::resume`], which says which chunks it already holds (checked by
//! hash) so only the others are sent. A transfer given up by its sender
//! (`Abort`: a cancel, or a file the sender could not read) leaves its
//! partial in the same way, so running the sync again resumes it too; a
//! staging file that could not be written, or whose content failed its hash
//! check at the commit, is removed.
//!
//! Leftovers: a process killed mid-write leaves its `.outpost-*.tmp` files
//! behind (never at a final path). Staging files are `flock`ed until they
//! are committed or released, and other temporary files live for one request, so
//! [`reap_stale_temp`] removes one only when it is unlocked and older than
//! [`STALE_AFTER`] ([`RESUMABLE_FOR`] for a resumable partial); scans that
//! prepare a sync call it for each such file they meet. Removing a live one by
//! mistake would cost a refused commit, never data: a commit checks that its
//! temporary file is still the inode it wrote.
//!
//! Problems vs errors: every file and every op succeeds or fails on its own; a
//! failure is a [`PathProblem`] in the report and never touches what is at the
//! final path. Only [`Applier::put_part`] returns an error (for its one part).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outpost_protocol::{
    ApplyReport, ChunkRef, EntryKind, Expect, FileContent, FilePut, MetaOp, PartData, PathProblem,
    PutFiles, ReadSpec, RelPath, TreeEntry,
};

use crate::cache::{StatCache, Written};
use crate::chunk::{self, CHUNKED_MIN_SIZE};
use crate::codec;
use crate::filter::TEMP_PREFIX;
use crate::parallel::in_parallel;
use crate::relpath;
use crate::sys::{self, Stat};

mod dirs;
mod read;
mod staging;

use dirs::*;
pub use read::{Described, describe_files, read_file};
#[cfg(test)]
pub(crate) use staging::CLOCK_SKEW_NS;
use staging::*;
pub use staging::{
    RESUMABLE_FOR, STALE_AFTER, parse_resumable_name, reap_stale_temp, resumable_name,
};

/// A part's data decompresses to at most this much.
pub const MAX_PART_LEN: usize = 16 << 20;

/// Directories created for missing parents get this mode (before umask).
const PARENT_MODE: u32 = 0o755;

/// Lifts the soft limit on open descriptors to the hard one (at most
/// 65536): batches waiting for their commit hold their parent directories
/// open (up to [`MAX_OPEN_DIRS`] each).
pub fn raise_open_files() {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            let want = lim.rlim_max.min(65536);
            if lim.rlim_cur < want {
                lim.rlim_cur = want;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}

/// The message for an [`Expect`] that no longer holds.
const CHANGED: &str = "changed underneath since the scan; rerun";

/// Parent directories held open at once while writing a batch.
const MAX_OPEN_DIRS: usize = 256;

/// Deepest directory tree a `Remove` takes apart.
const MAX_REMOVE_DEPTH: usize = 1024;

/// The receiving side of one root. Holds staged parts of large files; staging
/// files it still holds are removed when it is dropped.
pub struct Applier {
    root: PathBuf,
    staged: HashMap<u64, Staged>,
    /// Transfers given up by `Abort`: a part or resume of one that arrives
    /// later (requests run concurrently) must not stage it again.
    aborted: std::collections::HashSet<u64>,
    /// Committed files not yet handed to a stat cache.
    written: Vec<Written>,
}

/// A large file being assembled from parts: `.outpost-part-<xfer>.tmp` in the
/// directory of the file it will replace.
struct Staged {
    path: Vec<u8>,
    dir: Arc<OwnedFd>,
    name: CString,
    file: File,
    dev: u64,
    ino: u64,
    /// The hash of bytes `0..hashed` while parts arrive in order, so a fresh
    /// file is not read back at its commit; `None` once a part came out of
    /// order or was copied (the commit then hashes what is on disk).
    running: Option<(blake3::Hasher, u64)>,
    /// Named after its content ([`resumable_name`]): left in place, not
    /// removed, when its transfer ends without a commit, so a later
    /// transfer of the same content can resume it.
    resumable: bool,
    /// A write into the staging file failed (a full disk, an I/O error, a
    /// corrupt part): what it holds is not worth keeping.
    damaged: bool,
}

impl Staged {
    /// Removes the staging file, unless its name now belongs to another file.
    fn discard(self) {
        remove_if_ours(self.dir.as_fd(), &self.name, self.dev, self.ino);
    }

    /// Ends a transfer that will not be committed. A resumable partial is
    /// kept for a later transfer of the same content (closing it releases
    /// its lock); anything else is removed.
    fn release(self) {
        if !self.resumable || self.damaged {
            self.discard();
        }
    }
}

/// Unlinks `name` if it is still the inode we created.
fn remove_if_ours(dir: BorrowedFd<'_>, name: &CStr, dev: u64, ino: u64) {
    if let Ok(st) = sys::lstatat(dir, name)
        && (st.dev, st.ino) == (dev, ino)
    {
        let _ = sys::unlinkat(dir, name, false);
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        for (_, staged) in self.staged.drain() {
            // A transfer cut short (the connection went) may be resumed.
            staged.release();
        }
    }
}

/// A verified temporary file waiting for its rename.
struct Ready {
    path: Vec<u8>,
    parent: Vec<u8>,
    dir: Arc<OwnedFd>,
    tmp: CString,
    name: CString,
    dev: u64,
    ino: u64,
    expect: Expect,
    /// Size, mtime and checked hash, for the stat cache once it is in
    /// place (files [`Written::recordable`]).
    record: Option<(u64, i64, [u8; 32])>,
    /// A staging file stays open, and so locked, until its rename: another
    /// transfer of the same content must not take it over in between.
    _hold: Option<File>,
}

/// Files of one `put_files` batch written and waiting to be committed
/// together. Temporary files are closed once written (a batch may hold
/// thousands); one open file per filesystem is kept for `syncfs`.
struct Group {
    dirs: Dirs,
    ready: Vec<(usize, Ready)>,
    flush_with: HashMap<u64, File>,
    /// Each filesystem's flush error, once flushed.
    flushed: Option<HashMap<u64, Option<String>>>,
}

impl Group {
    fn new(root: &Path) -> Group {
        Group {
            dirs: Dirs::new(root),
            ready: Vec::new(),
            flush_with: HashMap::new(),
            flushed: None,
        }
    }

    /// Flushes the written files, renames each into place if its
    /// expectation holds (with what `hold` returns held), and fsyncs the
    /// directories that changed. Committed files worth caching go to
    /// `written`.
    fn finish<G>(
        mut self,
        hold: impl Fn() -> G,
        done: &mut u32,
        problems: &mut Vec<(usize, PathProblem)>,
        written: &mut Vec<Written>,
    ) {
        self.flush();
        {
            let _held = hold();
            self.place(done, problems, written);
        }
        self.sync_dirs(problems);
    }

    /// One `syncfs` per filesystem, once. The files stay open until the
    /// renames: one may be the only descriptor, and so the lock, of a
    /// staging file.
    fn flush(&mut self) {
        if self.flushed.is_some() {
            return;
        }
        let flushed = self
            .flush_with
            .iter()
            .map(|(&dev, file)| (dev, sys::syncfs(file.as_fd()).err().map(|e| e.to_string())))
            .collect();
        self.flushed = Some(flushed);
    }

    /// Renames each flushed file into place if its expectation holds
    /// (flushing first if that is still to do).
    fn place(
        &mut self,
        done: &mut u32,
        problems: &mut Vec<(usize, PathProblem)>,
        written: &mut Vec<Written>,
    ) {
        self.flush();
        let flushed = self.flushed.take().unwrap_or_default();
        for (index, r) in self.ready.drain(..) {
            let result = match flushed.get(&r.dev) {
                Some(Some(err)) => Err(format!("could not flush to disk: {err}")),
                _ => commit(&r),
            };
            match result {
                Ok(()) => {
                    *done += 1;
                    self.dirs.touch(&r.parent, &r.dir);
                    written.extend(r.written());
                }
                Err(message) => {
                    r.discard();
                    problems.push((
                        index,
                        PathProblem {
                            path: r.path,
                            message,
                        },
                    ));
                }
            }
        }
        self.flush_with.clear();
    }

    /// fsyncs the directories that gained a name.
    fn sync_dirs(mut self, problems: &mut Vec<(usize, PathProblem)>) {
        problems.extend(
            self.dirs
                .sync_touched()
                .into_iter()
                .map(|p| (usize::MAX, p)),
        );
    }
}

/// Staged transfers a `PutFiles` commits, taken out of their applier by
/// [`Applier::claim`]: each one, or why it cannot be committed.
/// Keyed by transfer and path: a request naming one transfer twice is
/// answered as if its files were committed in order.
pub struct Claimed(HashMap<(u64, Vec<u8>), Result<Staged, String>>);

/// The first half of a `PutFiles` ([`Applier::put_files`]): writes and
/// checks the temporary files of `req` under `root`; it needs no applier.
/// The other half is [`PreparedFiles::commit`]. A batch spread over very
/// many directories commits its first groups here, renaming them with what
/// `hold` returns held (the shared applier's guard).
pub fn prepare_files<G>(
    root: &Path,
    req: &PutFiles,
    mut claimed: Claimed,
    hold: impl Fn() -> G,
) -> PreparedFiles {
    let mut done = 0;
    // (index in the request, problem): reported in request order.
    let mut problems: Vec<(usize, PathProblem)> = Vec::new();
    let mut written = Vec::new();
    let mut group = Group::new(root);
    for (index, put) in req.files.iter().enumerate() {
        match prepare(put, &mut group.dirs, req.create_parents, &mut claimed) {
            Ok((ready, file)) => {
                group.flush_with.entry(ready.dev).or_insert(file);
                group.ready.push((index, ready));
            }
            Err(message) => problems.push((
                index,
                PathProblem {
                    path: put.path.clone(),
                    message,
                },
            )),
        }
        // Each open parent holds a descriptor; a batch spread over very
        // many directories is committed in groups to stay far from the
        // process's descriptor limit.
        if group.dirs.open.len() >= MAX_OPEN_DIRS {
            group.finish(&hold, &mut done, &mut problems, &mut written);
            group = Group::new(root);
        }
    }
    PreparedFiles {
        group,
        done,
        problems,
        written,
    }
}

/// Writes a file's content to a temporary file beside it and checks it.
fn prepare(
    put: &FilePut,
    dirs: &mut Dirs,
    create_parents: bool,
    claimed: &mut Claimed,
) -> Result<(Ready, File), String> {
    let comps = relpath::components(&put.path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    let parent = relpath::parent(&put.path).to_vec();
    match &put.content {
        FileContent::Inline(data) => {
            let dir = dirs.parent(parents, create_parents)?;
            let (tmp, file) =
                create_temp(&dir).map_err(|e| format!("cannot create a temporary file: {e}"))?;
            let st = sys::fstat(file.as_fd()).map_err(|e| e.to_string());
            let written = st.clone().and_then(|_| write_inline(&file, data, put));
            if let Err(message) = written {
                let _ = sys::unlinkat(dir.as_fd(), &tmp, false);
                return Err(message);
            }
            let st = st?;
            let record = recordable(put, st.dev, dirs.local_device());
            let ready = Ready {
                path: put.path.clone(),
                parent,
                dir,
                tmp,
                name,
                dev: st.dev,
                ino: st.ino,
                expect: put.expect.clone(),
                record,
                _hold: None,
            };
            Ok((ready, file))
        }
        FileContent::Staged { xfer } => {
            let mut staged = claimed
                .0
                .remove(&(*xfer, put.path.clone()))
                .unwrap_or_else(|| Err(format!("no staged transfer {xfer}")))?;
            // The staging directory must still be the one at the path: if
            // it was removed and recreated, a rename would land nowhere.
            let current = dirs.parent(parents, false);
            let id = |fd: &OwnedFd| sys::fstat(fd.as_fd()).ok().map(|st| (st.dev, st.ino));
            let same_dir = current.as_deref().ok().and_then(id) == id(&staged.dir);
            let checked = match current {
                Err(message) => Err(message.into()),
                Ok(_) if !same_dir => {
                    Err("the directory was replaced while parts were staged".to_string())
                }
                Ok(_) => verify_staged(&staged.file, staged.running.take(), put),
            };
            if let Err(message) = checked {
                staged.discard();
                return Err(message);
            }
            // One descriptor holds the lock until the rename, the other
            // may serve the batch's flush.
            let (hold, flush) = match staged.file.try_clone() {
                Ok(flush) => (Some(staged.file), flush),
                Err(_) => (None, staged.file),
            };
            let ready = Ready {
                path: put.path.clone(),
                parent,
                dir: staged.dir.clone(),
                tmp: staged.name.clone(),
                name,
                dev: staged.dev,
                ino: staged.ino,
                expect: put.expect.clone(),
                record: recordable(put, staged.dev, dirs.local_device()),
                _hold: hold,
            };
            Ok((ready, flush))
        }
    }
}

/// A `put_files` batch written to temporary files and checked
/// ([`prepare_files`]), waiting to be flushed, renamed into place and its
/// directories synced: [`PreparedFiles::flush`], [`PreparedFiles::place`],
/// [`Placed::finish`] ([`PreparedFiles::commit`] does all three). Only the
/// renames must not interleave with another batch's on the same root (each
/// checks what is at its path just before it renames); the flush and the
/// directory syncs, which wait for the disk, need no applier.
pub struct PreparedFiles {
    group: Group,
    done: u32,
    /// (index in the request, problem).
    problems: Vec<(usize, PathProblem)>,
    written: Vec<Written>,
}

impl PreparedFiles {
    /// Flushes the batch: one `syncfs` per filesystem.
    pub fn flush(&mut self) {
        self.group.flush();
    }

    /// Renames each file whose expectation holds into place, flushing first
    /// if [`PreparedFiles::flush`] was not called.
    pub fn place(mut self) -> Placed {
        let (group, done, problems, written) = (
            &mut self.group,
            &mut self.done,
            &mut self.problems,
            &mut self.written,
        );
        group.place(done, problems, written);
        Placed(self)
    }

    /// Flushes, places and syncs the directories.
    pub fn commit(self) -> (ApplyReport, Vec<Written>) {
        self.place().finish()
    }
}

/// [`Applier::put_files`] for an applier shared between threads: it is held
/// to claim the staged files and for the renames only, so other batches and
/// parts are written while this one is written and waits for the disk.
pub fn put_files_shared(applier: &Mutex<Applier>, req: &PutFiles) -> ApplyReport {
    let lock = || applier.lock().unwrap_or_else(PoisonError::into_inner);
    let (root, claimed) = {
        let mut applier = lock();
        (applier.root().to_path_buf(), applier.claim(req))
    };
    let mut prepared = prepare_files(&root, req, claimed, lock);
    prepared.flush();
    let placed = {
        let _held = lock();
        prepared.place()
    };
    let (report, written) = placed.finish();
    lock().add_written(written);
    report
}

/// A batch renamed into place ([`PreparedFiles::place`]), its directories
/// still to be synced.
pub struct Placed(PreparedFiles);

impl Placed {
    /// fsyncs the directories that gained a name. Returns the report and the
    /// committed files for the stat cache ([`Applier::add_written`]).
    pub fn finish(self) -> (ApplyReport, Vec<Written>) {
        let PreparedFiles {
            group,
            done,
            mut problems,
            written,
        } = self.0;
        group.sync_dirs(&mut problems);
        problems.sort_by_key(|(index, _)| *index);
        let report = ApplyReport {
            done,
            problems: problems.into_iter().map(|(_, p)| p).collect(),
        };
        (report, written)
    }
}

impl Ready {
    fn discard(&self) {
        remove_if_ours(self.dir.as_fd(), &self.tmp, self.dev, self.ino);
    }

    /// After the rename: the file as the stat cache may record it, if it is
    /// still ours with the size and mtime it was written with.
    fn written(&self) -> Option<Written> {
        let (size, mtime_ns, hash) = self.record?;
        let st = sys::lstatat(self.dir.as_fd(), &self.name).ok()?;
        ((st.dev, st.ino, st.size, st.mtime_ns) == (self.dev, self.ino, size, mtime_ns)).then_some(
            Written {
                dev: st.dev,
                ino: st.ino,
                size,
                mtime_ns,
                ctime_ns: st.ctime_ns,
                hash,
            },
        )
    }
}

impl Applier {
    pub fn new(root: &Path) -> Applier {
        Applier {
            root: root.to_path_buf(),
            staged: HashMap::new(),
            aborted: Default::default(),
            written: Vec::new(),
        }
    }

    /// The files committed since the last call, for the stat cache of this
    /// root ([`crate::cache::StatCache::record_written`]).
    pub fn take_written(&mut self) -> Vec<Written> {
        std::mem::take(&mut self.written)
    }

    /// How many committed files wait for [`Applier::take_written`].
    pub fn written_count(&self) -> usize {
        self.written.len()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes whole files; each file succeeds or becomes a problem on its own.
    ///
    /// With `create_parents`, missing parents (and the root itself) are
    /// created, mode 0755 before umask. `done` counts committed files.
    pub fn put_files(&mut self, req: &PutFiles) -> ApplyReport {
        let claimed = self.claim(req);
        let (report, written) = prepare_files(&self.root, req, claimed, || ()).commit();
        self.add_written(written);
        report
    }

    /// Takes out the staged transfers `req` commits, for [`prepare_files`]
    /// (see [`PreparedFiles`] for what of a batch must still not interleave
    /// with another's on the same root).
    pub fn claim(&mut self, req: &PutFiles) -> Claimed {
        let mut claimed = HashMap::new();
        for put in &req.files {
            let FileContent::Staged { xfer } = put.content else {
                continue;
            };
            let claim = match self.staged.remove(&xfer) {
                None => Err(format!("no staged transfer {xfer}")),
                Some(staged) if staged.path != put.path => {
                    let message = format!(
                        "transfer {xfer} was staged for {}, not for this path",
                        relpath::display(&staged.path)
                    );
                    self.staged.insert(xfer, staged);
                    Err(message)
                }
                Some(staged) => Ok(staged),
            };
            claimed.entry((xfer, put.path.clone())).or_insert(claim);
        }
        Claimed(claimed)
    }

    /// Takes in files a [`PreparedFiles::commit`] put in place, for
    /// [`Applier::take_written`].
    pub fn add_written(&mut self, written: Vec<Written>) {
        self.written.extend(written);
    }

    /// Writes one part of a staged file at `offset`. `content` is the hash
    /// and size of the whole new file.
    ///
    /// The first part of a transfer creates the staging file (and any missing
    /// parent directories, as a commit with `create_parents` would). A failed
    /// part leaves the staging file in place for a retry or an `Abort`.
    pub fn put_part(
        &mut self,
        xfer: u64,
        path: &[u8],
        content: (&[u8; 32], u64),
        offset: u64,
        data: &PartData,
    ) -> Result<(), String> {
        let comps = relpath::components(path)?;
        let (leaf, _) = comps.split_last().expect("components are never empty");
        if !self.staged.contains_key(&xfer) {
            if self.aborted.contains(&xfer) {
                return Err(format!("transfer {xfer} was aborted"));
            }
            self.begin_staging(xfer, path, content, false)?;
        }
        let staged = self.staged.get_mut(&xfer).expect("inserted above");
        if staged.path != path {
            return Err(format!(
                "transfer {xfer} is staging {}, not {}",
                relpath::display(&staged.path),
                relpath::display(path)
            ));
        }
        match data {
            PartData::Data(compressed) => {
                // Decompressed and written a piece at a time: a piece stays
                // in the CPU cache between the two, where a whole part would
                // not.
                if staged
                    .running
                    .as_ref()
                    .is_some_and(|(_, end)| *end != offset)
                {
                    staged.running = None;
                }
                let mut at = offset;
                let (file, running) = (&staged.file, &mut staged.running);
                codec::decompress_into(compressed, MAX_PART_LEN as u64, &mut |piece| {
                    let end = at
                        .checked_add(piece.len() as u64)
                        .ok_or_else(|| io::Error::other("part offset out of range"))?;
                    file.write_all_at(piece, at)?;
                    if let Some((hasher, hashed)) = running {
                        hasher.update(piece);
                        *hashed = end;
                    }
                    at = end;
                    Ok(())
                })
                .map(|_| {
                    // The part goes to disk while the next ones arrive, so
                    // the flush before the commit has little left to wait
                    // for (a 1 GiB push: 2.87–3.13 s with it, 3.43–3.63 s
                    // without, on one VM).
                    sys::start_writeback(file.as_fd(), offset, at - offset);
                })
                .map_err(|e| {
                    staged.running = None;
                    staged.damaged = true;
                    format!("cannot write the staging file: {e}")
                })
            }
            PartData::Copy { from_offset, len } => {
                staged.running = None;
                if from_offset.checked_add(*len).is_none() || offset.checked_add(*len).is_none() {
                    return Err("copy range out of range".to_string());
                }
                let leaf = sys::cstring(leaf).map_err(|e| e.to_string())?;
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
                let source = match sys::openat(staged.dir.as_fd(), &leaf, flags, 0) {
                    Ok(fd) => File::from(fd),
                    Err(err) if sys::is_errno(&err, libc::ELOOP) => {
                        return Err("the file to copy from is a symlink; not followed".to_string());
                    }
                    Err(err) => return Err(format!("cannot open the file to copy from: {err}")),
                };
                let st = sys::fstat(source.as_fd()).map_err(|e| e.to_string())?;
                if !st.is_file() {
                    return Err(format!(
                        "the path to copy from is {}, not a file",
                        st.kind_name()
                    ));
                }
                let copied = copy_range(&source, *from_offset, &staged.file, offset, *len)
                    .map_err(|e| {
                        staged.damaged = true;
                        format!("copy failed: {e}")
                    })?;
                if copied < *len {
                    staged.damaged = true;
                    return Err(format!(
                        "the current file ends before {} (copied {copied} of {len} bytes)",
                        from_offset + len
                    ));
                }
                Ok(())
            }
        }
    }

    /// Begins transfer `xfer` of `path` by adopting the partial file an
    /// interrupted transfer of the same content left in its directory, and
    /// returns the indices of `chunks` it already holds (checked by hash).
    /// Without a partial to adopt (none, or one a live transfer holds) the
    /// transfer starts empty and the answer is empty.
    pub fn resume(
        &mut self,
        xfer: u64,
        path: &[u8],
        content: (&[u8; 32], u64),
        chunks: &[ChunkRef],
    ) -> Result<Vec<u32>, String> {
        if self.staged.contains_key(&xfer) {
            return Err(format!("transfer {xfer} has already begun"));
        }
        if self.aborted.contains(&xfer) {
            return Err(format!("transfer {xfer} was aborted"));
        }
        self.begin_staging(xfer, path, content, true)?;
        let staged = &self.staged[&xfer];
        let held = match sys::fstat(staged.file.as_fd()) {
            Ok(st) => st.size,
            Err(err) => {
                if let Some(staged) = self.staged.remove(&xfer) {
                    staged.discard();
                }
                return Err(err.to_string());
            }
        };
        let mut present = Vec::new();
        let mut buf = Vec::new();
        for (index, chunk) in chunks.iter().enumerate() {
            let end = chunk.offset.saturating_add(u64::from(chunk.len));
            if end > held || end > content.1 {
                continue;
            }
            buf.resize(chunk.len as usize, 0);
            if staged.file.read_exact_at(&mut buf, chunk.offset).is_ok()
                && blake3::hash(&buf).as_bytes() == &chunk.hash
            {
                present.push(index as u32);
            }
        }
        Ok(present)
    }

    /// Creates the staging file of transfer `xfer`: named after its content
    /// so it can be resumed, or after the transfer when that name is taken.
    /// With `adopt`, an existing file of that name that nobody holds is
    /// taken over with its content.
    fn begin_staging(
        &mut self,
        xfer: u64,
        path: &[u8],
        (hash, size): (&[u8; 32], u64),
        adopt: bool,
    ) -> Result<(), String> {
        let comps = relpath::components(path)?;
        let (_, parents) = comps.split_last().expect("components are never empty");
        let root = self.root.clone();
        let mut dirs = Dirs::new(&root);
        let dir = dirs.parent(parents, true)?;
        let fresh = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let content_name =
            sys::cstring(resumable_name(hash, size).as_bytes()).map_err(|e| e.to_string())?;
        let opened = match sys::openat(dir.as_fd(), &content_name, fresh, 0o600) {
            // Ours, unless another transfer adopts it before we lock it.
            Ok(fd) => lock_staging(&dir, &content_name, fd, true),
            // A partial of this content, left by a transfer cut short: taken
            // over if nobody holds it, with its content when resuming.
            Err(err) if sys::is_errno(&err, libc::EEXIST) => {
                adopt_partial(&dir, &content_name, size)
                    .and_then(|fd| lock_staging(&dir, &content_name, fd, false))
                    .filter(|fd| adopt || sys::ftruncate(fd.as_fd(), 0).is_ok())
            }
            Err(_) => None,
        };
        let (name, fd, resumable) = match opened {
            Some(fd) => (content_name, fd, true),
            None => {
                // The content's name is held by a live transfer: this one
                // gets a name of its own, which is not resumed later.
                let name = sys::cstring(format!("{TEMP_PREFIX}part-{xfer}.tmp").as_bytes())
                    .map_err(|e| e.to_string())?;
                let fd = match sys::openat(dir.as_fd(), &name, fresh, 0o600) {
                    // A leftover from an agent that died mid-transfer.
                    // Removing it is safe even if it were live: a commit
                    // verifies the hash and that its name still holds its
                    // own inode.
                    Err(err) if sys::is_errno(&err, libc::EEXIST) => {
                        let _ = sys::unlinkat(dir.as_fd(), &name, false);
                        sys::openat(dir.as_fd(), &name, fresh, 0o600)
                    }
                    other => other,
                }
                .map_err(|e| format!("cannot create the staging file: {e}"))?;
                let _ = sys::flock(fd.as_fd(), libc::LOCK_EX | libc::LOCK_NB);
                (name, fd, false)
            }
        };
        // The lock is held until the file is committed or dropped: it tells
        // `reap_stale_temp` and other transfers that the file is in use.
        let st = sys::fstat(fd.as_fd()).map_err(|e| e.to_string())?;
        // Parents created here must outlive a crash as the commit will.
        if let Some(problem) = dirs.sync_touched().into_iter().next() {
            remove_if_ours(dir.as_fd(), &name, st.dev, st.ino);
            return Err(problem.message);
        }
        self.staged.insert(
            xfer,
            Staged {
                path: path.to_vec(),
                dir,
                name,
                file: File::from(fd),
                dev: st.dev,
                ino: st.ino,
                running: (st.size == 0).then(|| (blake3::Hasher::new(), 0)),
                resumable,
                damaged: false,
            },
        );
        Ok(())
    }

    /// Applies ops in order; each op succeeds or becomes a problem on its own.
    ///
    /// `Mkdir` creates missing parents and the root; the other ops need their
    /// parent directory to exist. `Remove` of a missing path succeeds.
    /// A problem about an `Abort` has an empty path.
    pub fn apply_meta(&mut self, ops: &[MetaOp]) -> ApplyReport {
        let mut report = ApplyReport::default();
        let root = self.root.clone();
        let mut dirs = Dirs::new(&root);
        for op in ops {
            let (path, result) = match op {
                MetaOp::Mkdir { path, mode } => (path.as_slice(), mkdir(&mut dirs, path, *mode)),
                MetaOp::Symlink { path, target } => {
                    (path.as_slice(), symlink(&mut dirs, path, target))
                }
                MetaOp::SetAttrs {
                    path,
                    mode,
                    mtime_ns,
                } => (
                    path.as_slice(),
                    set_attrs(&mut dirs, path, *mode, *mtime_ns),
                ),
                MetaOp::Remove { path } => (path.as_slice(), remove(&mut dirs, path)),
                MetaOp::Abort { xfer } => {
                    // Given up by its sender (a cancel, a file it could not
                    // read): kept for a resume like one whose connection
                    // went.
                    self.aborted.insert(*xfer);
                    if let Some(staged) = self.staged.remove(xfer) {
                        staged.release();
                    }
                    (&[][..], Ok(()))
                }
            };
            match result {
                Ok(()) => report.done += 1,
                Err(message) => report.problems.push(PathProblem {
                    path: path.to_vec(),
                    message,
                }),
            }
        }
        report.problems.extend(dirs.sync_touched());
        report
    }
}
