//! One local tree made the same as another, on one machine: a sandbox's
//! checkpoints, their restore, and forks.
//!
//! Both trees are walked through directory descriptors, one name at a time,
//! never following a symlink (the source's symlinks are copied as
//! symlinks), so a link planted in either tree cannot lead a copy or a
//! removal outside it. Each file is written under a temporary name in its
//! directory and renamed into place. Content is shared copy-on-write where
//! the filesystem can (`FICLONE`: btrfs, XFS, bcachefs), else copied in the
//! kernel (`copy_file_range`); never hard-linked, so a later in-place write
//! to one tree cannot change the other. Files of other kinds (fifos,
//! sockets, devices) are counted and left out, never silently.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::relpath;
use crate::sys::{self, Stat};

/// `_IOW(0x94, 9, int)`: share `src`'s extents with `dst`.
const FICLONE: libc::c_ulong = 0x4004_9409;

pub(crate) const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MirrorOptions {
    /// Only these relative paths (and what is under them), each made as in
    /// the source or removed when the source has none; the rest is left.
    pub only: Option<Vec<Vec<u8>>>,
    /// A destination file is kept as it is when its size, mode and mtime
    /// are the source's and its ctime (which no process can set back) is
    /// before this: it was not written since the source was made from it.
    pub unchanged_before_ns: Option<i64>,
    /// As root: the owner (uid, gid) of everything written, instead of
    /// each source entry's own (a fork belongs to another account).
    pub owner: Option<(u32, u32)>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MirrorReport {
    /// Files written, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Of those, files whose content is shared copy-on-write.
    pub cloned: u64,
    /// Of those, files a [`crate::snapshot`] found unchanged since the
    /// earlier snapshot and linked to its copy.
    pub linked: u64,
    /// Entries removed from the destination (a directory counts once).
    pub removed: u64,
    /// Source entries that are no file, directory or symlink, left out.
    pub skipped: Vec<String>,
}

/// Makes `dst` (an existing directory) the same as `src`: content, modes,
/// mtimes, symlinks and, as root, owners.
pub fn mirror(src: &Path, dst: &Path, options: &MirrorOptions) -> io::Result<MirrorReport> {
    let src_fd = sys::open_path(src, DIR_FLAGS, 0)?;
    let dst_fd = sys::open_path(dst, DIR_FLAGS, 0)?;
    let mut run = Run {
        options,
        as_root: unsafe { libc::geteuid() } == 0,
        report: MirrorReport::default(),
    };
    match &options.only {
        None => run.dir(src_fd.as_fd(), dst_fd.as_fd(), b"")?,
        Some(paths) => {
            for rel in paths {
                run.one(src_fd.as_fd(), dst_fd.as_fd(), rel)?;
            }
        }
    }
    Ok(run.report)
}

/// The names in a directory, by descriptor.
pub(crate) fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
        .collect::<io::Result<_>>()?;
    out.sort();
    Ok(out)
}

fn cname(name: &[u8]) -> io::Result<CString> {
    sys::cstring(name)
}

pub(crate) fn lstat_opt(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Stat>> {
    match sys::lstatat(dir, name) {
        Ok(st) => Ok(Some(st)),
        Err(e) if sys::is_errno(&e, libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn join(base: &[u8], name: &[u8]) -> Vec<u8> {
    if base.is_empty() {
        return name.to_vec();
    }
    let mut out = base.to_vec();
    out.push(b'/');
    out.extend_from_slice(name);
    out
}

/// `st`'s mode and mtime on an open entry, and `owner` (as root).
pub(crate) fn set_attributes(
    fd: BorrowedFd<'_>,
    st: &Stat,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        // SAFETY: fchown on a descriptor we hold.
        let r = unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    sys::fchmod(fd, st.perm())?;
    sys::futimens(fd, st.mtime_ns)
}

/// A symlink to `target` at `name` in `dst`, with `st`'s mtime and `owner`
/// (as root).
pub(crate) fn make_symlink(
    target: &[u8],
    dst: BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    sys::symlinkat(&cname(target)?, dst, name)?;
    if let Some((uid, gid)) = owner {
        // SAFETY: fchownat on a name in a directory we hold, not following
        // the link.
        let r = unsafe {
            libc::fchownat(
                dst.as_raw_fd(),
                name.as_ptr(),
                uid,
                gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    sys::lutimensat(dst, name, st.mtime_ns)
}

/// Removes `name` in `dir` and, for a directory, everything under it.
/// Returns whether there was something to remove.
pub(crate) fn remove_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    let Some(st) = lstat_opt(dir, name)? else {
        return Ok(false);
    };
    if st.is_dir() {
        let sub = sys::openat(dir, name, DIR_FLAGS, 0)?;
        for child in names(sub.as_fd())? {
            remove_at(sub.as_fd(), &cname(&child)?)?;
        }
    }
    sys::unlinkat(dir, name, st.is_dir())?;
    Ok(true)
}

struct Run<'a> {
    options: &'a MirrorOptions,
    as_root: bool,
    report: MirrorReport,
}

impl Run<'_> {
    /// Makes directory `dst` the same as `src` (`rel` names it in reports).
    fn dir(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
        let wanted = names(src)?;
        let mut present: BTreeMap<Vec<u8>, ()> = names(dst)?.into_iter().map(|n| (n, ())).collect();
        for name in &wanted {
            present.remove(name);
            self.entry(src, dst, name, &join(rel, name))?;
        }
        for (name, ()) in present {
            if remove_at(dst, &cname(&name)?)? {
                self.report.removed += 1;
            }
        }
        Ok(())
    }

    /// One path of [`MirrorOptions::only`]: its parents made as in the
    /// source (never through a symlink), then the entry itself.
    fn one(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
        let parts =
            relpath::components(rel).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let (last, parents) = parts.split_last().expect("components are never empty");
        let (mut src_dir, mut dst_dir): (Option<OwnedFd>, Option<OwnedFd>) = (None, None);
        // Parents made here get their source's mode and mtime at the end.
        let mut made: Vec<(OwnedFd, Stat)> = Vec::new();
        for part in parents {
            let name = cname(part)?;
            let s = src_dir.as_ref().map_or(src, |f| f.as_fd());
            let d = dst_dir.as_ref().map_or(dst, |f| f.as_fd());
            let Some(st) = lstat_opt(s, &name)?.filter(Stat::is_dir) else {
                // Not a directory in the source: the path is not there.
                return self.absent(d, &name);
            };
            let next_src = sys::openat(s, &name, DIR_FLAGS, 0)?;
            let fresh = self.make_dir(d, &name)?;
            let next_dst = sys::openat(d, &name, DIR_FLAGS, 0)?;
            if fresh {
                made.push((next_dst.try_clone()?, st));
            }
            src_dir = Some(next_src);
            dst_dir = Some(next_dst);
        }
        let s = src_dir.as_ref().map_or(src, |f| f.as_fd());
        let d = dst_dir.as_ref().map_or(dst, |f| f.as_fd());
        self.entry(s, d, last, rel)?;
        for (fd, st) in made.iter().rev() {
            self.finish(fd.as_fd(), st)?;
        }
        Ok(())
    }

    /// The source has nothing at this name: neither may the destination.
    fn absent(&mut self, dst: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        if remove_at(dst, name)? {
            self.report.removed += 1;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
    ) -> io::Result<()> {
        let cname = cname(name)?;
        let Some(st) = lstat_opt(src, &cname)? else {
            return self.absent(dst, &cname);
        };
        if st.is_dir() {
            let sub_src = sys::openat(src, &cname, DIR_FLAGS, 0)?;
            self.make_dir(dst, &cname)?;
            let sub_dst = sys::openat(dst, &cname, DIR_FLAGS, 0)?;
            self.dir(sub_src.as_fd(), sub_dst.as_fd(), rel)?;
            // Last: writing its entries moved its mtime.
            self.finish(sub_dst.as_fd(), &st)
        } else if st.is_file() {
            self.file(src, dst, &cname, &st)
        } else if st.is_symlink() {
            self.symlink(src, dst, &cname, &st)
        } else {
            self.absent(dst, &cname)?;
            self.report
                .skipped
                .push(format!("{} ({})", relpath::display(rel), st.kind_name()));
            Ok(())
        }
    }

    /// A directory at `name` in `dst`, whatever was there before; true when
    /// made here. Its mode is set once nothing more is written in it.
    fn make_dir(&mut self, dst: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
        match lstat_opt(dst, name)? {
            Some(have) if have.is_dir() => return Ok(false),
            Some(_) => {
                remove_at(dst, name)?;
                self.report.removed += 1;
            }
            None => {}
        }
        sys::mkdirat(dst, name, 0o700)?;
        Ok(true)
    }

    /// Mode, owner and mtime of an open destination entry.
    fn finish(&self, fd: BorrowedFd<'_>, st: &Stat) -> io::Result<()> {
        let owner = self
            .as_root
            .then(|| self.options.owner.unwrap_or((st.uid, st.gid)));
        set_attributes(fd, st, owner)
    }

    fn unchanged(&self, have: &Stat, want: &Stat) -> bool {
        self.options.unchanged_before_ns.is_some_and(|before| {
            have.is_file()
                && have.size == want.size
                && have.mtime_ns == want.mtime_ns
                && have.perm() == want.perm()
                && have.ctime_ns < before
        })
    }

    fn file(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
    ) -> io::Result<()> {
        let have = lstat_opt(dst, name)?;
        if have.is_some_and(|h| self.unchanged(&h, st)) {
            return Ok(());
        }
        // Written since (its ctime says so), yet perhaps the same: a file a
        // restore wrote back has a new ctime. Reading both costs less than
        // writing it again.
        if self.options.unchanged_before_ns.is_some()
            && let Some(h) = have
            && h.is_file()
            && h.size == st.size
            && h.mtime_ns == st.mtime_ns
            && h.perm() == st.perm()
            && same_content(src, dst, name)?
        {
            return Ok(());
        }
        let from = File::from(sys::openat(
            src,
            name,
            libc::O_RDONLY | libc::O_NOFOLLOW,
            0,
        )?);
        let tmp = cname(format!(".outpost-mirror-{:016x}.tmp", sys::random_u64()).as_bytes())?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let to = File::from(sys::openat(dst, &tmp, flags, 0o600)?);
        let written = (|| -> io::Result<bool> {
            let cloned = copy_content(&from, &to, st.size)?;
            self.finish(to.as_fd(), st)?;
            if have.is_some_and(|h| h.is_dir()) {
                remove_at(dst, name)?;
            }
            sys::renameat(dst, &tmp, dst, name, false)?;
            Ok(cloned)
        })();
        match written {
            Ok(cloned) => {
                self.report.files += 1;
                self.report.bytes += st.size;
                self.report.cloned += u64::from(cloned);
                Ok(())
            }
            Err(e) => {
                let _ = sys::unlinkat(dst, &tmp, false);
                Err(e)
            }
        }
    }

    fn symlink(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
    ) -> io::Result<()> {
        let target = sys::readlinkat(src, name)?;
        if let Some(have) = lstat_opt(dst, name)? {
            if have.is_symlink() && sys::readlinkat(dst, name)? == target {
                return Ok(());
            }
            remove_at(dst, name)?;
        }
        let owner = self
            .as_root
            .then(|| self.options.owner.unwrap_or((st.uid, st.gid)));
        make_symlink(&target, dst, name, st, owner)?;
        self.report.files += 1;
        Ok(())
    }
}

/// How a path of the second tree differs from the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference {
    Added,
    Changed,
    Removed,
}

/// The paths of `now` that differ from `then`, in path order: added,
/// removed, or changed (kind, mode, symlink target or content; content is
/// compared byte for byte unless the file was provably not written since
/// `then` was taken: same size and mtime, ctime before
/// `unchanged_before_ns`). With each, its size in `now` (in `then` when
/// removed). A directory added or removed is one entry.
pub fn compare(
    then: &Path,
    now: &Path,
    unchanged_before_ns: Option<i64>,
) -> io::Result<Vec<(Vec<u8>, Difference, u64)>> {
    let a = sys::open_path(then, DIR_FLAGS, 0)?;
    let b = sys::open_path(now, DIR_FLAGS, 0)?;
    let mut out = Vec::new();
    compare_dir(a.as_fd(), b.as_fd(), b"", unchanged_before_ns, &mut out)?;
    Ok(out)
}

fn compare_dir(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    rel: &[u8],
    before: Option<i64>,
    out: &mut Vec<(Vec<u8>, Difference, u64)>,
) -> io::Result<()> {
    let mut all: Vec<Vec<u8>> = names(a)?;
    all.extend(names(b)?);
    all.sort();
    all.dedup();
    for name in all {
        let c = cname(&name)?;
        let path = join(rel, &name);
        match (lstat_opt(a, &c)?, lstat_opt(b, &c)?) {
            (None, None) => {}
            (Some(x), None) => out.push((path, Difference::Removed, x.size)),
            (None, Some(y)) => out.push((path, Difference::Added, y.size)),
            (Some(x), Some(y)) if x.is_dir() && y.is_dir() => {
                let (sa, sb) = (
                    sys::openat(a, &c, DIR_FLAGS, 0)?,
                    sys::openat(b, &c, DIR_FLAGS, 0)?,
                );
                if x.perm() != y.perm() {
                    out.push((path.clone(), Difference::Changed, y.size));
                }
                compare_dir(sa.as_fd(), sb.as_fd(), &path, before, out)?;
            }
            (Some(x), Some(y)) => {
                if !same_entry(a, b, &c, &x, &y, before)? {
                    out.push((path, Difference::Changed, y.size));
                }
            }
        }
    }
    Ok(())
}

fn same_entry(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    name: &CStr,
    x: &Stat,
    y: &Stat,
    before: Option<i64>,
) -> io::Result<bool> {
    if x.file_type() != y.file_type() || x.perm() != y.perm() {
        return Ok(false);
    }
    if x.is_symlink() {
        return Ok(sys::readlinkat(a, name)? == sys::readlinkat(b, name)?);
    }
    if !x.is_file() || x.size != y.size {
        return Ok(x.is_file() && x.size == y.size);
    }
    if x.mtime_ns == y.mtime_ns && before.is_some_and(|t| y.ctime_ns < t) {
        return Ok(true);
    }
    same_content(a, b, name)
}

/// Whether `name` holds the same bytes in both directories: the same
/// blocks on disk, or else byte for byte.
fn same_content(a: BorrowedFd<'_>, b: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
    let mut fa = File::from(sys::openat(a, name, flags, 0)?);
    let mut fb = File::from(sys::openat(b, name, flags, 0)?);
    if sys::same_extents(fa.as_fd(), fb.as_fd()) {
        return Ok(true);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The content of the regular file `rel` under `root` when it is at most
/// `max` bytes, opened one component at a time without following a link;
/// None when it is not such a file.
pub fn read_small(root: &Path, rel: &[u8], max: u64) -> io::Result<Option<Vec<u8>>> {
    let parts =
        relpath::components(rel).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (last, parents) = parts.split_last().expect("components are never empty");
    let mut dir = sys::open_path(root, DIR_FLAGS, 0)?;
    for part in parents {
        dir = sys::openat(dir.as_fd(), &cname(part)?, DIR_FLAGS, 0)?;
    }
    let name = cname(last)?;
    match lstat_opt(dir.as_fd(), &name)? {
        Some(st) if st.is_file() && st.size <= max => {}
        _ => return Ok(None),
    }
    let mut file = File::from(sys::openat(
        dir.as_fd(),
        &name,
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
    )?);
    let mut out = Vec::new();
    (&mut file).take(max + 1).read_to_end(&mut out)?;
    Ok((out.len() as u64 <= max).then_some(out))
}

/// Copies `len` bytes of `from` into the empty `to`: a clone where the
/// filesystem shares extents (true), else in the kernel, else through a
/// buffer (a filesystem with neither).
pub(crate) fn copy_content(from: &File, to: &File, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(false);
    }
    // SAFETY: FICLONE takes the source descriptor as its argument.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) } == 0 {
        return Ok(true);
    }
    match sys::copy_file_range(from, 0, to, 0, len) {
        Ok(n) if n == len => return Ok(false),
        Ok(_) => {
            return Err(io::Error::other(
                "the file changed size while it was copied",
            ));
        }
        Err(e) if sys::is_errno(&e, libc::EXDEV) || sys::is_errno(&e, libc::ENOSYS) => {}
        Err(e) if sys::is_errno(&e, libc::EINVAL) || sys::is_errno(&e, libc::EOPNOTSUPP) => {}
        Err(e) => return Err(e),
    }
    let (mut from, mut to) = (from, to);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(false);
        }
        to.write_all(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::describe_tree as tree;
    use std::os::unix::fs::{PermissionsExt, symlink};

    #[test]
    fn a_tree_is_mirrored_restored_and_limited_to_named_paths() {
        let base = std::env::temp_dir().join(format!("outpost-mirror-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (src, dst) = (base.join("src"), base.join("dst"));
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("a/b/f"), b"one").unwrap();
        std::fs::write(src.join("g"), vec![7u8; 300_000]).unwrap();
        std::fs::set_permissions(src.join("g"), std::fs::Permissions::from_mode(0o751)).unwrap();
        symlink("/etc/passwd", src.join("link")).unwrap();
        let fifo = CString::new(src.join("fifo").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let report = mirror(&src, &dst, &MirrorOptions::default()).unwrap();
        assert_eq!(report.skipped, ["fifo (a fifo)"]);
        let mut want = tree(&src);
        assert_eq!(want.remove("fifo").as_deref(), Some("special"));
        assert_eq!(tree(&dst), want);

        // A link planted where a directory was is replaced, not followed.
        std::fs::remove_dir_all(dst.join("a")).unwrap();
        symlink(&base, dst.join("a")).unwrap();
        std::fs::write(dst.join("extra"), b"x").unwrap();
        std::fs::write(dst.join("g"), b"changed").unwrap();
        let since = sys::now_ns();
        let options = MirrorOptions {
            only: Some(vec![b"a/b/f".to_vec()]),
            unchanged_before_ns: Some(since),
            owner: None,
        };
        mirror(&src, &dst, &options).unwrap();
        assert!(std::fs::symlink_metadata(dst.join("a")).unwrap().is_dir());
        assert_eq!(std::fs::read(dst.join("a/b/f")).unwrap(), b"one");
        assert!(
            base.join("b").symlink_metadata().is_err(),
            "wrote through the link"
        );
        assert_eq!(
            std::fs::read(dst.join("g")).unwrap(),
            b"changed",
            "not named"
        );
        assert!(dst.join("extra").exists(), "not named");

        // The whole tree: extras go, changed files come back.
        let options = MirrorOptions {
            only: None,
            unchanged_before_ns: Some(since),
            owner: None,
        };
        mirror(&src, &dst, &options).unwrap();
        assert_eq!(tree(&dst), want);
        assert!(
            mirror(
                &src,
                &dst,
                &MirrorOptions {
                    only: Some(vec![b"../x".to_vec()]),
                    ..MirrorOptions::default()
                }
            )
            .is_err()
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_comparison_names_exactly_what_changed() {
        let base = std::env::temp_dir().join(format!("outpost-compare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (then, now) = (base.join("then"), base.join("now"));
        for root in [&then, &now] {
            std::fs::create_dir_all(root.join("d")).unwrap();
            std::fs::write(root.join("same"), b"x").unwrap();
            std::fs::write(root.join("d/edit"), b"abc").unwrap();
        }
        std::fs::write(now.join("d/edit"), b"abd").unwrap();
        std::fs::write(then.join("gone"), b"12345").unwrap();
        std::fs::create_dir_all(now.join("new/deep")).unwrap();
        let got = compare(&then, &now, None).unwrap();
        let got: Vec<(String, Difference, u64)> = got
            .into_iter()
            .map(|(p, d, s)| (String::from_utf8(p).unwrap(), d, s))
            .collect();
        assert_eq!(
            got.iter()
                .map(|(p, d, _)| (p.as_str(), *d))
                .collect::<Vec<_>>(),
            [
                ("d/edit", Difference::Changed),
                ("gone", Difference::Removed),
                ("new", Difference::Added)
            ]
        );
        assert_eq!(got[1].2, 5);
        assert_eq!(
            read_small(&now, b"d/edit", 10).unwrap().as_deref(),
            Some(&b"abd"[..])
        );
        assert_eq!(read_small(&now, b"d/edit", 2).unwrap(), None);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A reflinked copy compares equal without reading (its blocks are the
    /// original's), a plain copy by its bytes; a write to the copy not yet
    /// flushed is a change either way.
    #[test]
    fn a_shared_copy_is_the_same_until_written() {
        let plain = crate::testutil::TempDir::new();
        same_until_written(plain.path(), false);
        if let Some(dir) = crate::testutil::reflink_dir() {
            let base = dir.join(format!("outpost-extents-{:016x}", sys::random_u64()));
            std::fs::create_dir(&base).unwrap();
            same_until_written(&base, true);
            std::fs::remove_dir_all(&base).unwrap();
        }
    }

    /// `must_share`: the filesystem shares extents; elsewhere whatever it
    /// does (a plain copy on ext4).
    fn same_until_written(base: &Path, must_share: bool) {
        let (a, b) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("f"), crate::testutil::pseudo_random(3 << 20, 7)).unwrap();
        let (fa, fb) = (
            sys::open_path(&a, DIR_FLAGS, 0).unwrap(),
            sys::open_path(&b, DIR_FLAGS, 0).unwrap(),
        );
        let name = cname(b"f").unwrap();
        let report = mirror(&a, &b, &MirrorOptions::default()).unwrap();
        let reflink = report.cloned == 1;
        assert!(reflink || !must_share, "{report:?}");
        let shared = || {
            let (x, y) = (
                File::open(a.join("f")).unwrap(),
                File::open(b.join("f")).unwrap(),
            );
            sys::same_extents(x.as_fd(), y.as_fd())
        };
        assert_eq!(shared(), reflink);
        assert!(same_content(fa.as_fd(), fb.as_fd(), &name).unwrap());
        let copy = File::options().write(true).open(b.join("f")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&copy, b"x", 2 << 20).unwrap();
        assert!(!shared());
        assert!(!same_content(fa.as_fd(), fb.as_fd(), &name).unwrap());
    }
}
