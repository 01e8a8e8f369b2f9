//! Deciding what to do: compare the source's and the destination's entries.
//!
//! A plan is carried out in field order: `replace_removes`, `mkdirs`,
//! `files`, `symlinks`, `attrs`, `removes`, then `dir_attrs`. Within each list,
//! order is by path bytes (parents before children) unless the field says
//! otherwise.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use outpost_protocol::{EntryKind, RelPath, TreeEntry};

use crate::relpath;

#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Remove destination paths the source lacks (never excluded ones: they
    /// are not in either listing).
    pub delete_extras: bool,
    /// Allow removing more than half of a destination of more than 10 entries.
    pub force: bool,
}

/// A file to send, and what it replaces.
#[derive(Debug, Clone)]
pub struct FileChange {
    pub src: TreeEntry,
    /// The destination's current file at that path (its chunks can be reused).
    pub dst: Option<TreeEntry>,
}

/// A destination entry a plan takes away (one of `removes` or
/// `replace_removes`), and how much goes with it.
#[derive(Debug, Clone)]
pub struct Removed {
    pub path: RelPath,
    /// Directories and other entries taken away: it and, for a directory,
    /// everything inside.
    pub dirs: u64,
    pub files: u64,
    /// Its kind changes (else it is an extra).
    pub replaced: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Paths to remove first because their kind changes (a dir becoming a
    /// file, …), deepest first.
    pub replace_removes: Vec<RelPath>,
    /// Directories to create, parents first. Their `mode` has the owner's
    /// `rwx` added so the directory can be filled even when the source's is
    /// read-only; the exact mode and mtime follow in `dir_attrs`.
    pub mkdirs: Vec<TreeEntry>,
    pub files: Vec<FileChange>,
    /// Symlinks to create or retarget.
    pub symlinks: Vec<TreeEntry>,
    /// Same content, other mode or mtime (files and symlinks).
    pub attrs: Vec<TreeEntry>,
    /// Extras to remove (with delete_extras), deepest first.
    pub removes: Vec<RelPath>,
    /// What goes away: each extra removed and each entry whose kind
    /// changes, with what is inside it.
    pub removed: Vec<Removed>,
    /// Directory modes and mtimes, set last, deepest first: every created
    /// directory, every one whose mode or mtime differs, and every one whose
    /// content the plan changes (writing into a directory bumps its mtime).
    pub dir_attrs: Vec<TreeEntry>,
    /// Entries already identical.
    pub unchanged: u64,
}

impl Plan {
    /// Bytes of file content the plan sends before delta and compression.
    pub fn content_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.src.size).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.replace_removes.is_empty()
            && self.mkdirs.is_empty()
            && self.files.is_empty()
            && self.symlinks.is_empty()
            && self.attrs.is_empty()
            && self.removes.is_empty()
            && self.dir_attrs.is_empty()
    }
}

/// Compares sorted listings. Files are equal when size and hash match (or,
/// lacking hashes, size and mtime); then mode and mtime are compared. Errs when
/// delete_extras would empty a non-trivial destination without `force`.
///
/// Symlinks are compared by target only: Linux has no symlink modes, and a
/// symlink's mtime is not worth a round trip. Listings that are not sorted are
/// sorted first.
pub fn diff(src: &[TreeEntry], dst: &[TreeEntry], options: &DiffOptions) -> Result<Plan, String> {
    let src = sorted(src);
    let dst = sorted(dst);
    let mut d = Differ {
        plan: Plan::default(),
        touched: HashSet::new(),
        replaced: HashSet::new(),
        removed: HashSet::new(),
        groups: HashMap::new(),
        src_dirs: Vec::new(),
        extras: 0,
        delete_extras: options.delete_extras,
    };
    let (mut i, mut j) = (0, 0);
    while i < src.len() || j < dst.len() {
        let order = match (src.get(i), dst.get(j)) {
            (Some(s), Some(t)) => s.path.cmp(&t.path),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                d.create(&src[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                d.extra(&dst[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                d.both(&src[i], &dst[j]);
                i += 1;
                j += 1;
            }
        }
    }

    if options.delete_extras && !options.force && dst.len() > 10 && d.extras * 2 > dst.len() as u64
    {
        return Err(format!(
            "refusing to delete {} of {} entries under the target; pass force to allow",
            d.extras,
            dst.len()
        ));
    }

    let mut plan = d.plan;
    for (entry, needs) in d.src_dirs {
        if needs || d.touched.contains(entry.path.as_slice()) {
            plan.dir_attrs.push(entry.clone());
        } else {
            plan.unchanged += 1;
        }
    }
    plan.dir_attrs.sort_by(|a, b| {
        relpath::depth(&b.path)
            .cmp(&relpath::depth(&a.path))
            .then_with(|| a.path.cmp(&b.path))
    });
    // Descendants sort after their ancestors, so reversed order is deepest first.
    plan.replace_removes.reverse();
    plan.removes.reverse();
    Ok(plan)
}

fn sorted(entries: &[TreeEntry]) -> Cow<'_, [TreeEntry]> {
    if entries.is_sorted_by(|a, b| a.path <= b.path) {
        Cow::Borrowed(entries)
    } else {
        let mut v = entries.to_vec();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        Cow::Owned(v)
    }
}

struct Differ<'a> {
    plan: Plan,
    /// Directories whose content changes (their mtime will need resetting).
    touched: HashSet<&'a [u8]>,
    /// Destination paths removed because their kind changes.
    replaced: HashSet<&'a [u8]>,
    /// Destination paths removed as extras.
    removed: HashSet<&'a [u8]>,
    /// Index in `plan.removed` of each removed or replaced path.
    groups: HashMap<&'a [u8], usize>,
    /// Source directories, and whether their attributes must be set anyway.
    src_dirs: Vec<(&'a TreeEntry, bool)>,
    /// Destination entries delete_extras removes, implied children included.
    extras: u64,
    delete_extras: bool,
}

impl<'a> Differ<'a> {
    fn touch(&mut self, path: &'a [u8]) {
        self.touched.insert(relpath::parent(path));
    }

    fn create(&mut self, s: &'a TreeEntry) {
        self.touch(&s.path);
        match s.kind {
            EntryKind::Dir => {
                let mut dir = s.clone();
                dir.mode |= 0o700;
                self.plan.mkdirs.push(dir);
                self.src_dirs.push((s, true));
            }
            EntryKind::File => self.plan.files.push(FileChange {
                src: s.clone(),
                dst: None,
            }),
            EntryKind::Symlink { .. } => self.plan.symlinks.push(s.clone()),
        }
    }

    /// Starts the count of what goes with `t`.
    fn count_removed(&mut self, t: &'a TreeEntry, replaced: bool) {
        self.groups.insert(&t.path, self.plan.removed.len());
        self.plan.removed.push(Removed {
            path: t.path.clone(),
            dirs: 0,
            files: 0,
            replaced,
        });
        self.count_inside(t);
    }

    /// Counts `t` with the removed or replaced path it is in (or is).
    fn count_inside(&mut self, t: &TreeEntry) {
        let mut p: &[u8] = &t.path;
        let group = loop {
            if let Some(&i) = self.groups.get(p) {
                break Some(i);
            }
            if p.is_empty() {
                break None;
            }
            p = relpath::parent(p);
        };
        if let Some(group) = group.map(|i| &mut self.plan.removed[i]) {
            match t.kind {
                EntryKind::Dir => group.dirs += 1,
                _ => group.files += 1,
            }
        }
    }

    fn extra(&mut self, t: &'a TreeEntry) {
        if under(&self.replaced, &t.path) {
            self.count_inside(t);
            return;
        }
        if under(&self.removed, &t.path) {
            self.extras += 1;
            self.count_inside(t);
            return;
        }
        if self.delete_extras {
            self.extras += 1;
            self.count_removed(t, false);
            self.removed.insert(&t.path);
            self.touch(&t.path);
            self.plan.removes.push(t.path.clone());
        }
    }

    fn both(&mut self, s: &'a TreeEntry, t: &'a TreeEntry) {
        match (&s.kind, &t.kind) {
            (EntryKind::File, EntryKind::File) => {
                let same_content = s.size == t.size
                    && match (&s.hash, &t.hash) {
                        (Some(a), Some(b)) => a == b,
                        _ => s.mtime_ns == t.mtime_ns,
                    };
                if !same_content {
                    self.touch(&s.path);
                    self.plan.files.push(FileChange {
                        src: s.clone(),
                        dst: Some(t.clone()),
                    });
                } else if s.mode != t.mode || s.mtime_ns != t.mtime_ns {
                    self.plan.attrs.push(s.clone());
                } else {
                    self.plan.unchanged += 1;
                }
            }
            (EntryKind::Dir, EntryKind::Dir) => {
                let differs = s.mode != t.mode || s.mtime_ns != t.mtime_ns;
                self.src_dirs.push((s, differs));
            }
            (EntryKind::Symlink { target: a }, EntryKind::Symlink { target: b }) => {
                if a != b {
                    self.touch(&s.path);
                    self.plan.symlinks.push(s.clone());
                } else {
                    self.plan.unchanged += 1;
                }
            }
            _ => {
                self.replaced.insert(&t.path);
                self.count_removed(t, true);
                self.plan.replace_removes.push(t.path.clone());
                self.create(s);
            }
        }
    }
}

/// Whether an ancestor of `path` is in `set`.
fn under(set: &HashSet<&[u8]>, path: &[u8]) -> bool {
    if set.is_empty() {
        return false;
    }
    let mut p = relpath::parent(path);
    while !p.is_empty() {
        if set.contains(p) {
            return true;
        }
        p = relpath::parent(p);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64, hash: u8, mtime: i64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            mode: 0o644,
            size,
            mtime_ns: mtime,
            hash: Some([hash; 32]),
            chunks: Vec::new(),
        }
    }

    fn dir(path: &str, mtime: i64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            size: 0,
            mtime_ns: mtime,
            hash: None,
            chunks: Vec::new(),
        }
    }

    fn link(path: &str, target: &str) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::Symlink {
                target: target.as_bytes().to_vec(),
            },
            mode: 0o777,
            size: target.len() as u64,
            mtime_ns: 1,
            hash: None,
            chunks: Vec::new(),
        }
    }

    fn paths(v: &[TreeEntry]) -> Vec<String> {
        v.iter().map(|e| relpath::display(&e.path)).collect()
    }

    fn names(v: &[RelPath]) -> Vec<String> {
        v.iter().map(|p| relpath::display(p)).collect()
    }

    #[test]
    fn identical_is_empty() {
        let tree = vec![dir("a", 5), file("a/f", 3, 1, 9), link("l", "a")];
        let plan = diff(&tree, &tree, &DiffOptions::default()).unwrap();
        assert!(plan.is_empty());
        assert_eq!(plan.unchanged, 3);
    }

    #[test]
    fn new_changed_and_attrs() {
        let src = vec![
            dir("a", 5),
            dir("a/new", 6),
            file("a/new/f", 1, 1, 1),
            file("changed", 4, 2, 9),
            file("mode", 3, 3, 9),
            file("mtime", 3, 4, 10),
            link("retarget", "b"),
        ];
        let mut mode = file("mode", 3, 3, 9);
        mode.mode = 0o600;
        let dst = vec![
            dir("a", 5),
            file("changed", 4, 9, 9),
            mode,
            file("mtime", 3, 4, 11),
            link("retarget", "a"),
        ];
        let plan = diff(&src, &dst, &DiffOptions::default()).unwrap();
        assert_eq!(paths(&plan.mkdirs), ["a/new"]);
        assert_eq!(plan.mkdirs[0].mode, 0o755);
        let files: Vec<String> = plan
            .files
            .iter()
            .map(|f| relpath::display(&f.src.path))
            .collect();
        assert_eq!(files, ["a/new/f", "changed"]);
        assert!(plan.files[0].dst.is_none());
        assert_eq!(plan.files[1].dst.as_ref().unwrap().hash, Some([9; 32]));
        assert_eq!(plan.content_bytes(), 5);
        assert_eq!(paths(&plan.attrs), ["mode", "mtime"]);
        assert_eq!(paths(&plan.symlinks), ["retarget"]);
        // The new dir (created) and its parent (written into), deepest first.
        assert_eq!(paths(&plan.dir_attrs), ["a/new", "a"]);
        assert!(plan.removes.is_empty() && plan.replace_removes.is_empty());
    }

    #[test]
    fn without_hashes_mtime_decides() {
        let mut a = file("f", 3, 1, 9);
        let mut b = file("f", 3, 2, 9);
        a.hash = None;
        let plan = diff(&[a.clone()], &[b.clone()], &DiffOptions::default()).unwrap();
        assert_eq!(plan.unchanged, 1);
        b.mtime_ns = 10;
        let plan = diff(&[a], &[b], &DiffOptions::default()).unwrap();
        assert_eq!(plan.files.len(), 1);
    }

    #[test]
    fn kind_changes() {
        let src = vec![
            dir("d2f", 1),
            file("d2f/x", 1, 1, 1),
            file("f2d", 1, 1, 1),
            link("l2f", "x"),
        ];
        let dst = vec![
            file("d2f", 1, 1, 1),
            dir("f2d", 1),
            file("f2d/old", 1, 1, 1),
            file("f2d/old2", 1, 1, 1),
            file("l2f", 1, 1, 1),
        ];
        let plan = diff(&src, &dst, &DiffOptions::default()).unwrap();
        assert_eq!(names(&plan.replace_removes), ["l2f", "f2d", "d2f"]);
        assert_eq!(paths(&plan.mkdirs), ["d2f"]);
        let files: Vec<String> = plan
            .files
            .iter()
            .map(|f| relpath::display(&f.src.path))
            .collect();
        assert_eq!(files, ["d2f/x", "f2d"]);
        assert!(plan.files.iter().all(|f| f.dst.is_none()));
        assert_eq!(paths(&plan.symlinks), ["l2f"]);
        // Children of a replaced directory go with it, even without delete_extras.
        assert!(plan.removes.is_empty());
        let plan = diff(
            &src,
            &dst,
            &DiffOptions {
                delete_extras: true,
                force: false,
            },
        )
        .unwrap();
        assert!(plan.removes.is_empty());
    }

    #[test]
    fn delete_extras_lists_topmost() {
        let src = vec![dir("keep", 1)];
        let dst = vec![
            dir("keep", 1),
            dir("x", 1),
            dir("x.d", 1),
            file("x/a", 1, 1, 1),
            dir("x/b", 1),
            file("x/b/c", 1, 1, 1),
            file("y", 1, 1, 1),
        ];
        let plan = diff(&src, &dst, &DiffOptions::default()).unwrap();
        assert!(plan.removes.is_empty());
        let plan = diff(
            &src,
            &dst,
            &DiffOptions {
                delete_extras: true,
                force: false,
            },
        )
        .unwrap();
        assert_eq!(names(&plan.removes), ["y", "x.d", "x"]);
        // What goes with them, inside removed directories too.
        let dirs: u64 = plan.removed.iter().map(|r| r.dirs).sum();
        let files: u64 = plan.removed.iter().map(|r| r.files).sum();
        assert_eq!((plan.removed.len(), dirs, files), (3, 3, 3));
        assert_eq!(plan.unchanged, 1);
    }

    #[test]
    fn refuses_mass_deletion_without_force() {
        let dst: Vec<TreeEntry> = (0..20)
            .map(|i| file(&format!("f{i:02}"), 1, 1, 1))
            .collect();
        let src = dst[..9].to_vec();
        let opts = DiffOptions {
            delete_extras: true,
            force: false,
        };
        let err = diff(&src, &dst, &opts).unwrap_err();
        assert_eq!(
            err,
            "refusing to delete 11 of 20 entries under the target; pass force to allow"
        );
        let plan = diff(
            &src,
            &dst,
            &DiffOptions {
                delete_extras: true,
                force: true,
            },
        )
        .unwrap();
        assert_eq!(plan.removes.len(), 11);
        // Half exactly is allowed; so is anything on a small target.
        assert!(diff(&dst[..10], &dst, &opts).is_ok());
        assert!(diff(&[], &dst[..10], &opts).is_ok());
        // Without delete_extras nothing is removed, so nothing is refused.
        assert!(diff(&[], &dst, &DiffOptions::default()).is_ok());
    }

    #[test]
    fn unsorted_input_is_sorted() {
        let src = vec![file("b", 1, 1, 1), file("a", 1, 1, 1)];
        let dst = vec![file("a", 1, 1, 1)];
        let plan = diff(&src, &dst, &DiffOptions::default()).unwrap();
        assert_eq!(plan.files.len(), 1);
        assert_eq!(plan.unchanged, 1);
    }
}
