//! Content on its way to a final path: temp and staging files (named for
//! their content when resumable, `flock`ed while in use, swept when stale),
//! written, checked against their hash, and committed by rename.

use super::*;

/// The staging file name for content of this hash and size: a transfer cut
/// short leaves it behind, and the next transfer of the same content finds
/// it by this name.
pub fn resumable_name(hash: &[u8; 32], size: u64) -> String {
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{TEMP_PREFIX}part-{hex}-{size}.tmp")
}

/// The hash prefix and size a [`resumable_name`] stands for.
pub fn parse_resumable_name(name: &[u8]) -> Option<([u8; 16], u64)> {
    let rest = name
        .strip_prefix(format!("{TEMP_PREFIX}part-").as_bytes())?
        .strip_suffix(b".tmp")?;
    let rest = std::str::from_utf8(rest).ok()?;
    let (hex, size) = rest.split_once('-')?;
    if hex.len() != 32 || size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut prefix = [0u8; 16];
    for (i, byte) in prefix.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((prefix, size.parse().ok()?))
}

/// Unlocked temporary files older than this are leftovers of a process that
/// died (a request's own temporary files live for seconds).
pub const STALE_AFTER: Duration = Duration::from_secs(600);

/// Partial files a later transfer could resume ([`resumable_name`]) are kept
/// this long.
pub const RESUMABLE_FOR: Duration = Duration::from_secs(24 * 3600);

/// Locks a staging file for this applier and checks that `name` still
/// holds it (a reaper may have unlinked it between our open and our lock).
/// `None` when another transfer holds it. Where the filesystem has no locks,
/// only a file we `created` ourselves is used: someone else's could be live.
pub(super) fn lock_staging(
    dir: &OwnedFd,
    name: &CStr,
    fd: OwnedFd,
    created: bool,
) -> Option<OwnedFd> {
    if let Err(err) = sys::flock(fd.as_fd(), libc::LOCK_EX | libc::LOCK_NB)
        && (sys::is_errno(&err, libc::EWOULDBLOCK) || !created)
    {
        return None;
    }
    let held = sys::fstat(fd.as_fd()).ok()?;
    let named = sys::lstatat(dir.as_fd(), name).ok()?;
    ((held.dev, held.ino) == (named.dev, named.ino)).then_some(fd)
}

/// Opens the partial file `name` for adoption: a regular file, not longer
/// than the content it was becoming.
pub(super) fn adopt_partial(dir: &OwnedFd, name: &CStr, size: u64) -> Option<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = sys::openat(dir.as_fd(), name, flags, 0).ok()?;
    let st = sys::fstat(fd.as_fd()).ok()?;
    (st.is_file() && st.size <= size).then_some(fd)
}

/// Removes `name` in `dir` if it is a temporary file of ours that nobody
/// holds: a regular file named `.outpost-*.tmp`, unchanged for
/// [`STALE_AFTER`], that no applier has locked. Returns whether it did.
pub fn reap_stale_temp(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let bytes = name.to_bytes();
    if !bytes.starts_with(TEMP_PREFIX.as_bytes()) || !bytes.ends_with(b".tmp") {
        return false;
    }
    let keep = if parse_resumable_name(bytes).is_some() {
        RESUMABLE_FOR
    } else {
        STALE_AFTER
    };
    // Age by the inode's change time: every write, chmod and utimens moves
    // it, and unlike the mtime (set to the source's before the rename) it
    // cannot be set back.
    let now = sys::now_ns() + clock_skew_ns();
    let stale = |st: &Stat| {
        let age_ns = now.saturating_sub(st.ctime_ns);
        st.is_file() && age_ns > keep.as_nanos() as i64
    };
    match sys::lstatat(dir, name) {
        Ok(st) if stale(&st) => {}
        _ => return false,
    }
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let Ok(fd) = sys::openat(dir, name, flags, 0) else {
        return false;
    };
    // Held by a live applier. (Where the filesystem has no locks, age alone
    // decides.)
    if let Err(err) = sys::flock(fd.as_fd(), libc::LOCK_EX | libc::LOCK_NB)
        && sys::is_errno(&err, libc::EWOULDBLOCK)
    {
        return false;
    }
    // Still the file we locked, and still old?
    match (sys::fstat(fd.as_fd()), sys::lstatat(dir, name)) {
        (Ok(held), Ok(named)) if (held.dev, held.ino) == (named.dev, named.ino) && stale(&held) => {
            sys::unlinkat(dir, name, false).is_ok()
        }
        _ => false,
    }
}

#[cfg(not(test))]
pub(super) fn clock_skew_ns() -> i64 {
    0
}

// Tests age files by moving the reaper's clock: a change time cannot be set
// back.
#[cfg(test)]
thread_local! {
    pub(crate) static CLOCK_SKEW_NS: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
pub(super) fn clock_skew_ns() -> i64 {
    CLOCK_SKEW_NS.get()
}

/// Creates `.outpost-<random>.tmp` in `dir`, mode 0600, exclusively.
pub(super) fn create_temp(dir: &OwnedFd) -> io::Result<(CString, File)> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let mut last = None;
    for _ in 0..8 {
        let name = sys::cstring(format!("{TEMP_PREFIX}{:016x}.tmp", sys::random_u64()).as_bytes())?;
        match sys::openat(dir.as_fd(), &name, flags, 0o600) {
            Ok(fd) => return Ok((name, File::from(fd))),
            Err(err) if sys::is_errno(&err, libc::EEXIST) => last = Some(err),
            Err(err) => return Err(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

/// Decompresses inline content into `file`, checks size and hash, and sets
/// mode and mtime.
pub(super) fn write_inline(file: &File, data: &[u8], put: &FilePut) -> Result<(), String> {
    let mut hasher = blake3::Hasher::new();
    let mut out = file;
    let n = codec::decompress_into(data, put.size, &mut |piece| {
        hasher.update(piece);
        out.write_all(piece)
    })?;
    if n != put.size {
        return Err(format!("content is {n} bytes, expected {}", put.size));
    }
    if hasher.finalize().as_bytes() != &put.hash {
        return Err("content does not match its hash".to_string());
    }
    finish(file, put)
}

/// Checks an assembled staging file against the put's size and hash, and sets
/// mode and mtime. `running` is the hash of the file as its parts were written
/// in order, if they were.
pub(super) fn verify_staged(
    file: &File,
    running: Option<(blake3::Hasher, u64)>,
    put: &FilePut,
) -> Result<(), String> {
    let st = sys::fstat(file.as_fd()).map_err(|e| e.to_string())?;
    if st.size != put.size {
        return Err(format!(
            "staged content is {} bytes, expected {}",
            st.size, put.size
        ));
    }
    if let Some((hasher, hashed)) = running
        && hashed == put.size
    {
        if hasher.finalize().as_bytes() != &put.hash {
            return Err("staged content does not match its hash".to_string());
        }
        return finish(file, put);
    }
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; (1 << 20).min(put.size.max(1) as usize)];
    let mut pos = 0u64;
    while pos < put.size {
        let want = buf.len().min((put.size - pos) as usize);
        let n = file
            .read_at(&mut buf[..want], pos)
            .map_err(|e| format!("cannot read the staged content: {e}"))?;
        if n == 0 {
            return Err("staged content ended early".to_string());
        }
        hasher.update(&buf[..n]);
        pos += n as u64;
    }
    if hasher.finalize().as_bytes() != &put.hash {
        return Err("staged content does not match its hash".to_string());
    }
    finish(file, put)
}

pub(super) fn finish(file: &File, put: &FilePut) -> Result<(), String> {
    sys::fchmod(file.as_fd(), put.mode).map_err(|e| format!("cannot set the mode: {e}"))?;
    sys::futimens(file.as_fd(), put.mtime_ns).map_err(|e| format!("cannot set the mtime: {e}"))
}

/// What a put's committed file (on `dev`) may record in the stat cache,
/// where `local` is the root's [`crate::cache::local_device`].
pub(super) fn recordable(
    put: &FilePut,
    dev: u64,
    local: Option<u64>,
) -> Option<(u64, i64, [u8; 32])> {
    Written::recordable(put.mtime_ns, dev, local).then_some((put.size, put.mtime_ns, put.hash))
}

/// Renames a verified temporary file into place if the target still looks as
/// expected.
pub(super) fn commit(r: &Ready) -> Result<(), String> {
    let dir = r.dir.as_fd();
    match sys::lstatat(dir, &r.tmp) {
        Ok(st) if (st.dev, st.ino) == (r.dev, r.ino) => {}
        _ => return Err("the temporary file was removed or replaced; not committed".to_string()),
    }
    let rename = |noreplace: bool| sys::renameat(dir, &r.tmp, dir, &r.name, noreplace);
    let result = match r.expect {
        Expect::Any => rename(false),
        Expect::Absent => match rename(true) {
            Err(err) if sys::is_errno(&err, libc::EEXIST) => return Err(CHANGED.to_string()),
            // No RENAME_NOREPLACE on this filesystem: check, then rename.
            Err(err) if sys::is_errno(&err, libc::EINVAL) || sys::is_errno(&err, libc::ENOSYS) => {
                match sys::lstatat(dir, &r.name) {
                    Err(e) if sys::is_errno(&e, libc::ENOENT) => rename(false),
                    _ => return Err(CHANGED.to_string()),
                }
            }
            other => other,
        },
        Expect::File { size, mtime_ns } => match sys::lstatat(dir, &r.name) {
            Ok(st) if st.is_file() && st.size == size && st.mtime_ns == mtime_ns => rename(false),
            _ => return Err(CHANGED.to_string()),
        },
    };
    result.map_err(|err| match err.raw_os_error() {
        Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
            "a directory is in the way".to_string()
        }
        _ => format!("cannot rename into place: {err}"),
    })
}

/// Copies a byte range between files, in the kernel where it can (which also
/// shares extents on filesystems that support it).
pub(super) fn copy_range(
    from: &File,
    from_off: u64,
    to: &File,
    to_off: u64,
    len: u64,
) -> io::Result<u64> {
    match sys::copy_file_range(from, from_off, to, to_off, len) {
        Ok(n) => Ok(n),
        Err(err)
            if [
                libc::EXDEV,
                libc::EINVAL,
                libc::ENOSYS,
                libc::EOPNOTSUPP,
                libc::EBADF,
                libc::EPERM,
            ]
            .iter()
            .any(|&e| sys::is_errno(&err, e)) =>
        {
            let mut buf = vec![0u8; (1 << 20).min(len.max(1) as usize)];
            let mut done = 0u64;
            while done < len {
                let want = buf.len().min((len - done) as usize);
                let n = from.read_at(&mut buf[..want], from_off + done)?;
                if n == 0 {
                    break;
                }
                to.write_all_at(&buf[..n], to_off + done)?;
                done += n as u64;
            }
            Ok(done)
        }
        Err(err) => Err(err),
    }
}
