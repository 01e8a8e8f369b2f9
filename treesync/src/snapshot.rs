//! A checkpoint's copy of a tree: [`crate::mirror`]'s rules for a
//! destination that is new and empty, made fast.
//!
//! * Nothing else writes in the destination until it is complete (the caller
//!   renames it into place), so each file is written at its final name, with
//!   no temporary name, no rename and no look at what was there.
//! * The files of a directory level are copied on several threads.
//! * A file provably unchanged since an [`Earlier`] snapshot (same size,
//!   mode, owner and mtime, and a ctime, which no process can set back,
//!   before that snapshot was taken) is hard-linked to the earlier copy
//!   instead of copied: snapshots are never written in place (a restore
//!   copies out of them), so the link cannot change either. A checkpoint
//!   after a few edits costs a stat and a link per file.
//!
//! Like `mirror`, it walks both trees by directory descriptor without
//! following a symlink, copies content copy-on-write where the filesystem
//! can, and counts what it leaves out (fifos, sockets, devices).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::mirror::{
    DIR_FLAGS, MirrorReport, copy_content, join, lstat_opt, make_symlink, set_attributes,
};
use crate::parallel::in_parallel;
use crate::relpath;
use crate::sys::{self, Stat};

/// Directories whose entries are copied in one parallel round: three
/// descriptors each stay open meanwhile.
const DIRS_PER_ROUND: usize = 128;

/// A snapshot of the same source taken before, whose unchanged files the
/// new one shares.
#[derive(Debug, Clone, Copy)]
pub struct Earlier<'a> {
    pub tree: &'a Path,
    /// A source file whose ctime is before this was not written since the
    /// earlier snapshot copied it.
    pub unchanged_before_ns: i64,
}

/// Copies `src` into `dst`, an empty directory that nothing else writes
/// until this returns: content, modes, mtimes, symlinks and, as root,
/// owners. With `earlier`, files unchanged since are linked to its copies.
pub fn snapshot(src: &Path, dst: &Path, earlier: Option<Earlier<'_>>) -> io::Result<MirrorReport> {
    let earlier_root = match earlier {
        None => None,
        Some(e) => match sys::open_path(e.tree, DIR_FLAGS, 0) {
            Ok(fd) => Some((fd, e.unchanged_before_ns)),
            Err(err) if sys::is_errno(&err, libc::ENOENT) => None,
            Err(err) => return Err(err),
        },
    };
    let roots = Roots {
        src: sys::open_path(src, DIR_FLAGS, 0)?,
        dst: sys::open_path(dst, DIR_FLAGS, 0)?,
        earlier: earlier_root,
        as_root: unsafe { libc::geteuid() } == 0,
    };
    let mut report = MirrorReport::default();
    // Directories made, with their source's attributes, set once nothing
    // more is written in them (writing an entry moves a directory's mtime).
    let mut made: Vec<(Vec<u8>, Stat)> = Vec::new();
    let mut level: Vec<Vec<u8>> = vec![Vec::new()];
    while !level.is_empty() {
        let mut next = Vec::new();
        for round in level.chunks(DIRS_PER_ROUND) {
            for (rel, st) in roots.copy_round(round, &mut report)? {
                next.push(rel.clone());
                made.push((rel, st));
            }
        }
        level = next;
    }
    // Deepest first: setting a directory's mode may take away the right to
    // write in it, and its mtime must come after its entries'.
    made.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.iter().filter(|&&b| b == b'/').count()));
    for (rel, st) in made {
        let dir = open_rel(roots.dst.as_fd(), &rel)?;
        set_attributes(dir.as_fd(), &st, roots.owner(&st))?;
    }
    Ok(report)
}

struct Roots {
    src: OwnedFd,
    dst: OwnedFd,
    earlier: Option<(OwnedFd, i64)>,
    as_root: bool,
}

/// One directory of a round, open in each tree.
struct Dir {
    rel: Vec<u8>,
    src: OwnedFd,
    dst: OwnedFd,
    /// Where the earlier snapshot has this directory.
    earlier: Option<OwnedFd>,
}

enum Copied {
    File {
        bytes: u64,
        cloned: bool,
        linked: bool,
    },
    Symlink,
    Dir(Vec<u8>, Stat),
    Skipped(String),
}

impl Roots {
    fn owner(&self, st: &Stat) -> Option<(u32, u32)> {
        self.as_root.then_some((st.uid, st.gid))
    }

    /// Copies the entries of the directories `rels` (made already in the
    /// destination); returns the subdirectories made, for the next level.
    fn copy_round(
        &self,
        rels: &[Vec<u8>],
        report: &mut MirrorReport,
    ) -> io::Result<Vec<(Vec<u8>, Stat)>> {
        let mut dirs = Vec::with_capacity(rels.len());
        let mut entries: Vec<(usize, CString)> = Vec::new();
        for rel in rels {
            let src = open_rel(self.src.as_fd(), rel)?;
            let mut names = Vec::new();
            let mut stream = sys::DirStream::new(src.try_clone()?)?;
            while let Some(entry) = stream.next_entry() {
                names.push(entry?.0);
            }
            // Path order, so reports and errors come out the same each time.
            names.sort();
            entries.extend(names.into_iter().map(|name| (dirs.len(), name)));
            dirs.push(Dir {
                rel: rel.clone(),
                dst: open_rel(self.dst.as_fd(), rel)?,
                earlier: self
                    .earlier
                    .as_ref()
                    .and_then(|(root, _)| open_rel(root.as_fd(), rel).ok()),
                src,
            });
        }
        let copied = in_parallel(entries.len(), 0, |_, j| {
            let (d, name) = &entries[j];
            self.copy_entry(&dirs[*d], name)
        });
        let mut subdirs = Vec::new();
        for outcome in copied {
            match outcome? {
                Copied::File {
                    bytes,
                    cloned,
                    linked,
                } => {
                    report.files += 1;
                    report.bytes += bytes;
                    report.cloned += u64::from(cloned);
                    report.linked += u64::from(linked);
                }
                Copied::Symlink => report.files += 1,
                Copied::Dir(rel, st) => subdirs.push((rel, st)),
                Copied::Skipped(what) => report.skipped.push(what),
            }
        }
        Ok(subdirs)
    }

    fn copy_entry(&self, dir: &Dir, name: &CString) -> io::Result<Copied> {
        let (src, dst) = (dir.src.as_fd(), dir.dst.as_fd());
        let st = sys::lstatat(src, name)?;
        let rel = join(&dir.rel, name.as_bytes());
        if st.is_dir() {
            sys::mkdirat(dst, name, 0o700)?;
            Ok(Copied::Dir(rel, st))
        } else if st.is_file() {
            if self.link_unchanged(dir, name, &st)? {
                return Ok(Copied::File {
                    bytes: st.size,
                    cloned: false,
                    linked: true,
                });
            }
            let from = File::from(sys::openat(
                src,
                name,
                libc::O_RDONLY | libc::O_NOFOLLOW,
                0,
            )?);
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
            let to = File::from(sys::openat(dst, name, flags, 0o600)?);
            let cloned = copy_content(&from, &to, st.size)?;
            set_attributes(to.as_fd(), &st, self.owner(&st))?;
            Ok(Copied::File {
                bytes: st.size,
                cloned,
                linked: false,
            })
        } else if st.is_symlink() {
            let target = sys::readlinkat(src, name)?;
            make_symlink(&target, dst, name, &st, self.owner(&st))?;
            Ok(Copied::Symlink)
        } else {
            Ok(Copied::Skipped(format!(
                "{} ({})",
                relpath::display(&rel),
                st.kind_name()
            )))
        }
    }

    /// Links the earlier snapshot's copy of `name` when the source file was
    /// provably not written since; false when it was, or cannot be linked.
    fn link_unchanged(&self, dir: &Dir, name: &CString, st: &Stat) -> io::Result<bool> {
        let (Some(earlier), Some((_, before))) = (&dir.earlier, &self.earlier) else {
            return Ok(false);
        };
        if st.ctime_ns >= *before {
            return Ok(false);
        }
        let Some(have) = lstat_opt(earlier.as_fd(), name)? else {
            return Ok(false);
        };
        let same = have.is_file()
            && have.size == st.size
            && have.mtime_ns == st.mtime_ns
            && have.perm() == st.perm()
            && (!self.as_root || (have.uid, have.gid) == (st.uid, st.gid));
        if !same {
            return Ok(false);
        }
        match sys::linkat(earlier.as_fd(), name, dir.dst.as_fd(), name) {
            Ok(()) => Ok(true),
            // Too many links already, or another filesystem: copy instead.
            Err(e) if sys::is_errno(&e, libc::EMLINK) || sys::is_errno(&e, libc::EXDEV) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// The directory `rel` under `root`, opened one component at a time
/// without following a symlink.
fn open_rel(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let mut dir = sys::openat(root, c".", DIR_FLAGS, 0)?;
    if rel.is_empty() {
        return Ok(dir);
    }
    for part in rel.split(|&b| b == b'/') {
        dir = sys::openat(dir.as_fd(), &sys::cstring(part)?, DIR_FLAGS, 0)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, describe_tree, reflink_dir};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    #[test]
    fn a_snapshot_copies_the_tree_and_links_only_what_is_unchanged() {
        let plain = TempDir::new();
        copies_and_links(plain.path(), false);
        if let Some(dir) = reflink_dir() {
            let base = dir.join(format!("outpost-snapshot-{:016x}", sys::random_u64()));
            std::fs::create_dir(&base).unwrap();
            copies_and_links(&base, true);
            std::fs::remove_dir_all(&base).unwrap();
        }
    }

    /// `reflink`: `base` shares extents, so every copied file must too.
    fn copies_and_links(base: &Path, reflink: bool) {
        let (src, one, two) = (base.join("src"), base.join("one"), base.join("two"));
        // Wide enough that the copies run on several threads.
        for d in 0..3 {
            std::fs::create_dir_all(src.join(format!("d{d}/deep"))).unwrap();
            for f in 0..20 {
                std::fs::write(src.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
            }
        }
        std::fs::write(src.join("d0/deep/edit"), b"before").unwrap();
        std::fs::write(src.join("same-size"), b"aaaa").unwrap();
        std::fs::set_permissions(src.join("d1"), std::fs::Permissions::from_mode(0o750)).unwrap();
        std::fs::set_permissions(src.join("d2/f3"), std::fs::Permissions::from_mode(0o741))
            .unwrap();
        symlink("../outside", src.join("d2/link")).unwrap();
        let fifo = CString::new(src.join("fifo").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let mtime = |p: &Path| std::fs::symlink_metadata(p).unwrap().mtime();

        std::fs::create_dir(&one).unwrap();
        let first = snapshot(&src, &one, None).unwrap();
        let mut want = describe_tree(&src);
        assert_eq!(want.remove("fifo").as_deref(), Some("special"));
        assert_eq!(describe_tree(&one), want);
        assert_eq!(first.skipped, ["fifo (a fifo)"]);
        assert_eq!((first.files, first.linked), (63, 0));
        if reflink {
            // All but the symlink.
            assert_eq!(first.cloned, 62, "{first:?}");
        }
        for p in ["d1", "d0/deep", "d2/f3", "d2/link"] {
            assert_eq!(mtime(&one.join(p)), mtime(&src.join(p)), "{p}");
        }

        // Taken once the first snapshot is done; the file clock is coarse,
        // so the edits wait a little.
        let before = sys::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        std::fs::write(src.join("d0/deep/edit"), b"after!").unwrap();
        std::fs::write(src.join("d1/new"), b"new").unwrap();
        // Same size, and the mtime set back: only the ctime tells.
        let old_mtime = std::fs::metadata(src.join("same-size"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::write(src.join("same-size"), b"bbbb").unwrap();
        std::fs::File::options()
            .write(true)
            .open(src.join("same-size"))
            .unwrap()
            .set_modified(old_mtime)
            .unwrap();
        std::fs::create_dir(&two).unwrap();
        let earlier = Earlier {
            tree: &one,
            unchanged_before_ns: before,
        };
        let second = snapshot(&src, &two, Some(earlier)).unwrap();
        let mut want = describe_tree(&src);
        want.remove("fifo");
        assert_eq!(describe_tree(&two), want);
        assert_eq!((second.files, second.linked), (64, 60));
        if reflink {
            assert_eq!(second.cloned, 3, "{second:?}");
        }
        let ino = |p: &Path| std::fs::symlink_metadata(p).unwrap().ino();
        assert_eq!(ino(&two.join("d2/f3")), ino(&one.join("d2/f3")));
        for p in ["d0/deep/edit", "same-size", "d2/link"] {
            assert_ne!(ino(&two.join(p)), ino(&one.join(p)), "{p}");
        }
        // The earlier snapshot is as it was.
        assert_eq!(std::fs::read(one.join("d0/deep/edit")).unwrap(), b"before");
        assert_eq!(std::fs::read(one.join("same-size")).unwrap(), b"aaaa");
    }
}
