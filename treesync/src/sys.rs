//! Thin wrappers over the `*at` system calls the engine is built on.
//!
//! Everything that touches a path inside a sync root goes through a directory
//! file descriptor and a single name, with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`,
//! so a symlink (or one swapped in while we work) can never redirect an
//! operation outside the root.
//!
//! Calls that glibc added late (`renameat2`, `getrandom`, `copy_file_range`)
//! go through `syscall(2)`: the portable agent build targets glibc 2.17, and a
//! direct reference to a newer symbol would keep it from loading there.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The fields of `struct stat` the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub dev: u64,
    pub ino: u64,
    /// The whole `st_mode`, type bits included.
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub uid: u32,
    pub gid: u32,
}

// The casts are no-ops on 64-bit targets but not on every libc/arch pair.
#[allow(clippy::unnecessary_cast)]
impl Stat {
    fn from_raw(st: &libc::stat) -> Stat {
        Stat {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            mode: st.st_mode as u32,
            size: st.st_size as u64,
            mtime_ns: to_ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime_ns: to_ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
            uid: st.st_uid as u32,
            gid: st.st_gid as u32,
        }
    }

    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT as u32
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR as u32
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG as u32
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK as u32
    }

    /// Permission bits, as listed in a [`outpost_protocol::TreeEntry`].
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// A word for the kinds a tree entry cannot describe.
    pub fn kind_name(&self) -> &'static str {
        match self.file_type() as libc::mode_t {
            libc::S_IFIFO => "a fifo",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR => "a character device",
            libc::S_IFBLK => "a block device",
            libc::S_IFDIR => "a directory",
            libc::S_IFLNK => "a symlink",
            libc::S_IFREG => "a file",
            _ => "of an unknown kind",
        }
    }
}

fn to_ns(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

fn timespec(ns: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A name or path as a C string; an embedded NUL is an invalid-input error.
pub(crate) fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

pub(crate) fn path_of(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

pub(crate) fn open_path(
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let c = cstring(path.as_os_str().as_bytes())?;
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: `open` returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `openat` returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(Stat::from_raw(&st))
}

/// `lstat` of `name` in `dir`.
pub(crate) fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(Stat::from_raw(&st))
}

pub(crate) fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        // Possibly truncated: grow and ask again.
        let len = buf.len() * 2;
        buf.resize(len, 0);
    }
}

pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

/// `renameat`, or `renameat2(RENAME_NOREPLACE)` when `noreplace`. A
/// filesystem without `RENAME_NOREPLACE` answers `EINVAL`; the caller decides
/// how to fall back.
pub(crate) fn renameat(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
    noreplace: bool,
) -> io::Result<()> {
    if noreplace {
        let ret = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                from_dir.as_raw_fd(),
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        cvt_long(ret)?;
    } else {
        cvt(unsafe {
            libc::renameat(
                from_dir.as_raw_fd(),
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
            )
        })?;
    }
    Ok(())
}

/// A hard link at `to`/`to_name` to `from`/`from_name`, never following a
/// final symlink.
pub(crate) fn linkat(
    from: BorrowedFd<'_>,
    from_name: &CStr,
    to: BorrowedFd<'_>,
    to_name: &CStr,
) -> io::Result<()> {
    cvt(unsafe {
        libc::linkat(
            from.as_raw_fd(),
            from_name.as_ptr(),
            to.as_raw_fd(),
            to_name.as_ptr(),
            0,
        )
    })?;
    Ok(())
}

pub(crate) fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), (mode & 0o7777) as libc::mode_t) })?;
    Ok(())
}

/// `fchmodat` follows a final symlink on Linux; callers check the kind first.
pub(crate) fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    cvt(unsafe {
        libc::fchmodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            (mode & 0o7777) as libc::mode_t,
            0,
        )
    })?;
    Ok(())
}

fn times(mtime_ns: i64) -> [libc::timespec; 2] {
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    [omit, timespec(mtime_ns)]
}

/// Sets the mtime of an open file (the atime is left alone).
pub(crate) fn futimens(fd: BorrowedFd<'_>, mtime_ns: i64) -> io::Result<()> {
    let ts = times(mtime_ns);
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), ts.as_ptr()) })?;
    Ok(())
}

/// Sets the mtime of `name` in `dir` without following a symlink.
pub(crate) fn lutimensat(dir: BorrowedFd<'_>, name: &CStr, mtime_ns: i64) -> io::Result<()> {
    let ts = times(mtime_ns);
    cvt(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// Starts writing back `len` bytes at `offset` without waiting for them
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): a hint, so errors are
/// ignored; the flush before the commit is what guarantees durability.
pub(crate) fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return;
    };
    // SAFETY: a plain syscall on a descriptor we hold.
    unsafe {
        libc::sync_file_range(fd.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Appends to `buf` up to `len` bytes read at `offset`, into its spare
/// capacity (nothing is zeroed first); short only at the end of the file.
/// Returns the bytes appended; on an error, `buf` is as it was.
pub(crate) fn pread_append(
    fd: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> io::Result<usize> {
    buf.reserve_exact(len);
    let mut done = 0;
    while done < len {
        let at = offset
            .checked_add(done as u64)
            .and_then(|at| libc::off64_t::try_from(at).ok())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let spare = buf.spare_capacity_mut();
        // SAFETY: pread writes at most `len - done` bytes into the spare
        // capacity, which `reserve_exact` made at least that large.
        let n = unsafe { libc::pread64(fd.as_raw_fd(), spare.as_mut_ptr().cast(), len - done, at) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            buf.truncate(buf.len() - done);
            return Err(err);
        }
        if n == 0 {
            break;
        }
        // SAFETY: pread initialized the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n as usize) };
        done += n as usize;
    }
    Ok(done)
}

pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) })?;
    Ok(())
}

pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(())
}

/// The type of the filesystem `fd` is on (`statfs`'s magic number).
pub(crate) fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: fstatfs fills the struct for an open descriptor.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) })?;
    Ok(fs.f_type as i64)
}

/// The wall clock in nanoseconds since the epoch, as mtimes are.
pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// `flock(2)`; `op` is `LOCK_EX`, `LOCK_NB`… as in libc.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    cvt(unsafe { libc::flock(fd.as_raw_fd(), op) })?;
    Ok(())
}

pub(crate) fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    cvt(unsafe { libc::fsync(fd.as_raw_fd()) })?;
    Ok(())
}

/// Copies `len` bytes between explicit offsets in the kernel. Returns how many
/// were copied, which is short only at the source's end of file.
pub(crate) fn copy_file_range(
    from: &File,
    mut from_off: u64,
    to: &File,
    mut to_off: u64,
    len: u64,
) -> io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        let mut off_in = from_off as libc::loff_t;
        let mut off_out = to_off as libc::loff_t;
        let ret = unsafe {
            libc::syscall(
                libc::SYS_copy_file_range,
                from.as_raw_fd(),
                &mut off_in as *mut libc::loff_t,
                to.as_raw_fd(),
                &mut off_out as *mut libc::loff_t,
                want,
                0u32,
            )
        };
        let n = cvt_long(ret)? as u64;
        if n == 0 {
            break;
        }
        done += n;
        from_off += n;
        to_off += n;
    }
    Ok(done)
}

/// Random bits for temporary names. Falls back to the clock and pid if the
/// kernel's generator is unavailable: names are also created with `O_EXCL`,
/// so uniqueness, not secrecy, is what matters.
pub(crate) fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    let ret = unsafe { libc::syscall(libc::SYS_getrandom, buf.as_mut_ptr(), buf.len(), 0u32) };
    if ret == 8 {
        return u64::from_ne_bytes(buf);
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    now ^ ((std::process::id() as u64) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// An open directory stream over a descriptor we own.
pub(crate) struct DirStream {
    dir: *mut libc::DIR,
}

// SAFETY: the stream is owned by exactly one `DirStream` and only used through
// `&mut self`; libc's DIR has no thread affinity.
unsafe impl Send for DirStream {}

impl DirStream {
    /// Takes ownership of `fd`, which must be a directory opened for reading.
    pub fn new(fd: OwnedFd) -> io::Result<DirStream> {
        use std::os::fd::IntoRawFd;
        let raw = fd.into_raw_fd();
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let err = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so the descriptor is still ours to close.
            drop(unsafe { OwnedFd::from_raw_fd(raw) });
            return Err(err);
        }
        Ok(DirStream { dir })
    }

    /// The directory's descriptor, for `*at` calls on its entries.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor lives as long as the stream.
        unsafe { BorrowedFd::borrow_raw(libc::dirfd(self.dir)) }
    }

    /// The next name (never `.` or `..`) and its `d_type`.
    pub fn next_entry(&mut self) -> Option<io::Result<(CString, u8)>> {
        loop {
            // readdir reports errors only through errno, so clear it first.
            unsafe { *libc::__errno_location() = 0 };
            let ent = unsafe { libc::readdir(self.dir) };
            if ent.is_null() {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(0) | None => None,
                    _ => Some(Err(err)),
                };
            }
            // SAFETY: readdir returned a valid entry that lives until the next call.
            let (name, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            return Some(Ok((name.to_owned(), d_type)));
        }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.dir) };
    }
}

pub(crate) fn is_errno(err: &io::Error, errno: libc::c_int) -> bool {
    err.raw_os_error() == Some(errno)
}

/// `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// Extents whose place on disk is not known or not theirs alone to read:
/// unknown, delayed allocation, encoded, inline data, packed tails.
const FIEMAP_EXTENT_UNCERTAIN: u32 = 0x2 | 0x4 | 0x8 | 0x200 | 0x400;
const FIEMAP_EXTENT_SHARED: u32 = 0x2000;
/// Extents asked for at once; a file with more is compared by content.
const FIEMAP_MAX_EXTENTS: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_MAX_EXTENTS],
}

/// The file's extents (flushed first with `sync`); None when the
/// filesystem cannot map them or there are more than fit.
fn fiemap(fd: BorrowedFd<'_>, sync: bool) -> Option<Vec<FiemapExtent>> {
    let mut map = Box::new(Fiemap {
        start: 0,
        length: u64::MAX,
        flags: if sync { FIEMAP_FLAG_SYNC } else { 0 },
        mapped_extents: 0,
        extent_count: FIEMAP_MAX_EXTENTS as u32,
        reserved: 0,
        extents: [FiemapExtent::default(); FIEMAP_MAX_EXTENTS],
    });
    // SAFETY: the kernel writes at most `extent_count` extents into the
    // buffer, which holds that many.
    if unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FIEMAP as _, &mut *map as *mut Fiemap) } != 0 {
        return None;
    }
    let found = map.extents[..(map.mapped_extents as usize).min(FIEMAP_MAX_EXTENTS)].to_vec();
    let complete = found
        .last()
        .is_none_or(|e| e.flags & FIEMAP_EXTENT_LAST != 0);
    complete.then_some(found)
}

/// Whether two files of the same size provably hold the same bytes because
/// they share every block on disk (one is a reflink copy of the other, as
/// a restore writes them): a comparison without reading. False when it
/// cannot tell. Files with no shared block cost one look each, and are
/// not flushed.
pub(crate) fn same_extents(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let shares = |fd| {
        fiemap(fd, false).is_some_and(|x| x.iter().any(|e| e.flags & FIEMAP_EXTENT_SHARED != 0))
    };
    if !shares(a) || !shares(b) {
        return false;
    }
    // Flushed: data not yet written back still has its old blocks mapped.
    let certain = |fd| {
        fiemap(fd, true)
            .filter(|x| x.iter().all(|e| e.flags & FIEMAP_EXTENT_UNCERTAIN == 0))
            .map(|x| {
                x.iter()
                    .map(|e| (e.logical, e.physical, e.length))
                    .collect::<Vec<_>>()
            })
    };
    match (certain(a), certain(b)) {
        (Some(x), Some(y)) => !x.is_empty() && x == y,
        _ => false,
    }
}
