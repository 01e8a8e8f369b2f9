//! Directories opened one component at a time without following symlinks
//! (`Dirs`), and the metadata operations done through them.

use super::*;

pub(super) fn mkdir(dirs: &mut Dirs, path: &[u8], mode: u32) -> Result<(), String> {
    let comps = relpath::components(path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    let dir = dirs.parent(parents, true)?;
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    match sys::mkdirat(dir.as_fd(), &name, mode & 0o7777) {
        Ok(()) => dirs.touch(relpath::parent(path), &dir),
        Err(err) if sys::is_errno(&err, libc::EEXIST) => {
            let st = sys::lstatat(dir.as_fd(), &name).map_err(|e| e.to_string())?;
            if !st.is_dir() {
                return Err(format!("exists and is {}, not a directory", st.kind_name()));
            }
        }
        Err(err) => return Err(format!("cannot create the directory: {err}")),
    }
    // mkdir applies the umask; the mode asked for is the mode wanted.
    chmod_nofollow(dir.as_fd(), &name, mode)
}

pub(super) fn symlink(dirs: &mut Dirs, path: &[u8], target: &[u8]) -> Result<(), String> {
    let comps = relpath::components(path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    if target.is_empty() {
        return Err("empty symlink target".to_string());
    }
    let target =
        sys::cstring(target).map_err(|_| "symlink target contains a NUL byte".to_string())?;
    let dir = dirs.parent(parents, false)?;
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    if let Ok(st) = sys::lstatat(dir.as_fd(), &name)
        && st.is_dir()
    {
        return Err("a directory is in the way".to_string());
    }
    let mut tmp = None;
    for _ in 0..8 {
        let candidate =
            sys::cstring(format!("{TEMP_PREFIX}{:016x}.tmp", sys::random_u64()).as_bytes())
                .map_err(|e| e.to_string())?;
        match sys::symlinkat(&target, dir.as_fd(), &candidate) {
            Ok(()) => {
                tmp = Some(candidate);
                break;
            }
            Err(err) if sys::is_errno(&err, libc::EEXIST) => {}
            Err(err) => return Err(format!("cannot create the symlink: {err}")),
        }
    }
    let tmp = tmp.ok_or("no free temporary name")?;
    if let Err(err) = sys::renameat(dir.as_fd(), &tmp, dir.as_fd(), &name, false) {
        let _ = sys::unlinkat(dir.as_fd(), &tmp, false);
        return Err(match err.raw_os_error() {
            Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                "a directory is in the way".to_string()
            }
            _ => format!("cannot rename into place: {err}"),
        });
    }
    dirs.touch(relpath::parent(path), &dir);
    Ok(())
}

pub(super) fn set_attrs(
    dirs: &mut Dirs,
    path: &[u8],
    mode: u32,
    mtime_ns: i64,
) -> Result<(), String> {
    let comps = relpath::components(path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    let dir = dirs.parent(parents, false)?;
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    let st = sys::lstatat(dir.as_fd(), &name).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => "does not exist".to_string(),
        _ => e.to_string(),
    })?;
    // Linux symlinks have no mode of their own; only their mtime is set.
    if !st.is_symlink() {
        chmod_nofollow(dir.as_fd(), &name, mode)?;
    }
    sys::lutimensat(dir.as_fd(), &name, mtime_ns).map_err(|e| format!("cannot set the mtime: {e}"))
}

/// chmod without following a symlink: through a descriptor opened with
/// `O_NOFOLLOW` where possible (files and directories we may read), else by
/// name after checking it is not a symlink.
pub(super) fn chmod_nofollow(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), String> {
    let st = sys::lstatat(dir, name).map_err(|e| e.to_string())?;
    if st.is_symlink() {
        return Err("is a symlink; mode not changed".to_string());
    }
    let err = |e: io::Error| format!("cannot set the mode: {e}");
    // Opening devices or fifos can have side effects; only these two kinds.
    if st.is_file() || st.is_dir() {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        if let Ok(fd) = sys::openat(dir, name, flags, 0) {
            let now = sys::fstat(fd.as_fd()).map_err(err)?;
            if (now.dev, now.ino) != (st.dev, st.ino) {
                return Err("replaced while its mode was being set".to_string());
            }
            return sys::fchmod(fd.as_fd(), mode).map_err(err);
        }
    }
    sys::fchmodat(dir, name, mode).map_err(err)
}

pub(super) fn remove(dirs: &mut Dirs, path: &[u8]) -> Result<(), String> {
    let comps = relpath::components(path)?;
    let (leaf, parents) = comps.split_last().expect("components are never empty");
    let dir = match dirs.parent(parents, false) {
        Ok(dir) => dir,
        // Nothing there: already removed.
        Err(DirError { missing: true, .. }) => return Ok(()),
        Err(err) => return Err(err.message),
    };
    let name = sys::cstring(leaf).map_err(|e| e.to_string())?;
    let result = match sys::lstatat(dir.as_fd(), &name) {
        Err(err) if sys::is_errno(&err, libc::ENOENT) => return Ok(()),
        Err(err) => Err(err),
        Ok(st) if st.is_dir() => remove_tree(dir.as_fd(), &name, 0),
        Ok(_) => sys::unlinkat(dir.as_fd(), &name, false),
    };
    dirs.forget(path);
    match result {
        Ok(()) => {
            dirs.touch(relpath::parent(path), &dir);
            Ok(())
        }
        Err(err) if sys::is_errno(&err, libc::ENOENT) => Ok(()),
        Err(err) => Err(format!("cannot remove: {err}")),
    }
}

/// Removes the directory `name` in `parent` and everything below it, never
/// following a symlink (each level is opened with `O_NOFOLLOW`, and symlinks
/// inside are unlinked as names).
pub(super) fn remove_tree(parent: BorrowedFd<'_>, name: &CStr, depth: usize) -> io::Result<()> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(io::Error::other("directory tree too deep to remove"));
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let mut stream = sys::DirStream::new(sys::openat(parent, name, flags, 0)?)?;
    // Names first, removals after: no reliance on how readdir behaves while
    // the directory changes under it.
    let mut children = Vec::new();
    while let Some(entry) = stream.next_entry() {
        children.push(entry?);
    }
    let fd = stream.fd();
    for (child, d_type) in children {
        let is_dir = match d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => sys::lstatat(fd, &child)
                .map(|st| st.is_dir())
                .unwrap_or(false),
            _ => false,
        };
        let result = if is_dir {
            remove_tree(fd, &child, depth + 1)
        } else {
            match sys::unlinkat(fd, &child, false) {
                Err(err) if sys::is_errno(&err, libc::EISDIR) => remove_tree(fd, &child, depth + 1),
                other => other,
            }
        };
        match result {
            Err(err) if !sys::is_errno(&err, libc::ENOENT) => return Err(err),
            _ => {}
        }
    }
    drop(stream);
    sys::unlinkat(parent, name, true)
}

/// Why a parent directory could not be opened.
pub(super) struct DirError {
    /// The root or a parent does not exist (as opposed to being a symlink,
    /// a file, or unreadable).
    pub(super) missing: bool,
    pub(super) message: String,
}

impl From<DirError> for String {
    fn from(err: DirError) -> String {
        err.message
    }
}

/// Parent directories opened during one request, by relative path, and the
/// directories whose names changed (to fsync once at the end).
pub(super) struct Dirs {
    root: PathBuf,
    pub(super) open: HashMap<Vec<u8>, Arc<OwnedFd>>,
    touched: HashMap<Vec<u8>, Arc<OwnedFd>>,
    /// The root's [`crate::cache::local_device`], once asked.
    local_dev: Option<Option<u64>>,
}

impl Dirs {
    pub(super) fn new(root: &Path) -> Dirs {
        Dirs {
            root: root.to_path_buf(),
            open: HashMap::new(),
            touched: HashMap::new(),
            local_dev: None,
        }
    }

    /// The root's device when it is a local filesystem (see
    /// [`crate::cache::local_device`]), found once.
    pub(super) fn local_device(&mut self) -> Option<u64> {
        if let Some(known) = self.local_dev {
            return known;
        }
        let found = self
            .open_root(false)
            .ok()
            .and_then(|fd| crate::cache::local_device(fd.as_fd()));
        self.local_dev = Some(found);
        found
    }

    pub(super) fn open_root(&mut self, create: bool) -> Result<Arc<OwnedFd>, DirError> {
        if let Some(fd) = self.open.get(&b""[..]) {
            return Ok(fd.clone());
        }
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        let opened = match sys::open_path(&self.root, flags, 0) {
            Err(err) if create && sys::is_errno(&err, libc::ENOENT) => {
                std::fs::create_dir_all(&self.root)
                    .and_then(|()| sys::open_path(&self.root, flags, 0))
                    .map_err(|e| DirError {
                        missing: false,
                        message: format!("cannot create the root {}: {e}", self.root.display()),
                    })?
            }
            Ok(fd) => fd,
            Err(err) => {
                let missing = sys::is_errno(&err, libc::ENOENT);
                let message = if missing {
                    format!("the root {} does not exist", self.root.display())
                } else if sys::is_errno(&err, libc::ENOTDIR) {
                    format!("the root {} is not a directory", self.root.display())
                } else {
                    format!("cannot open the root {}: {err}", self.root.display())
                };
                return Err(DirError { missing, message });
            }
        };
        let fd = Arc::new(opened);
        self.open.insert(Vec::new(), fd.clone());
        Ok(fd)
    }

    /// Opens the directory made of `comps` (relative to the root), one
    /// component at a time without following symlinks; with `create`,
    /// missing ones (and the root) are created.
    pub(super) fn parent(
        &mut self,
        comps: &[&[u8]],
        create: bool,
    ) -> Result<Arc<OwnedFd>, DirError> {
        let mut cur = self.open_root(create)?;
        let mut prefix: Vec<u8> = Vec::new();
        for comp in comps {
            let parent_len = prefix.len();
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(comp);
            if let Some(fd) = self.open.get(&prefix) {
                cur = fd.clone();
                continue;
            }
            let name = sys::cstring(comp).map_err(|e| DirError {
                missing: false,
                message: e.to_string(),
            })?;
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let mut opened = sys::openat(cur.as_fd(), &name, flags, 0);
            if create
                && let Err(err) = &opened
                && sys::is_errno(err, libc::ENOENT)
            {
                match sys::mkdirat(cur.as_fd(), &name, PARENT_MODE) {
                    Ok(()) => {
                        let parent = prefix[..parent_len].to_vec();
                        self.touched.insert(parent, cur.clone());
                    }
                    Err(err) if sys::is_errno(&err, libc::EEXIST) => {}
                    Err(err) => {
                        return Err(DirError {
                            missing: false,
                            message: format!(
                                "cannot create the parent {}: {err}",
                                relpath::display(&prefix)
                            ),
                        });
                    }
                }
                opened = sys::openat(cur.as_fd(), &name, flags, 0);
            }
            let not_dir = || DirError {
                missing: false,
                message: format!(
                    "parent is not a directory (symlink?): {}",
                    relpath::display(&prefix)
                ),
            };
            let fd = match opened {
                Ok(fd) => fd,
                Err(err)
                    if sys::is_errno(&err, libc::ELOOP) || sys::is_errno(&err, libc::ENOTDIR) =>
                {
                    return Err(not_dir());
                }
                Err(err) if sys::is_errno(&err, libc::ENOENT) => {
                    return Err(DirError {
                        missing: true,
                        message: format!("parent {} does not exist", relpath::display(&prefix)),
                    });
                }
                Err(err) => {
                    return Err(DirError {
                        missing: false,
                        message: format!(
                            "cannot open the parent {}: {err}",
                            relpath::display(&prefix)
                        ),
                    });
                }
            };
            // Belt and braces: O_PATH|O_NOFOLLOW may hand back the link itself.
            match sys::fstat(fd.as_fd()) {
                Ok(st) if st.is_dir() => {}
                _ => return Err(not_dir()),
            }
            cur = Arc::new(fd);
            self.open.insert(prefix.clone(), cur.clone());
        }
        Ok(cur)
    }

    /// Forgets open directories at or below `path` (it was removed).
    pub(super) fn forget(&mut self, path: &[u8]) {
        self.open.retain(|k, _| {
            !(k == path || (k.starts_with(path) && k.get(path.len()) == Some(&b'/')))
        });
        self.touched.retain(|k, _| {
            !(k == path || (k.starts_with(path) && k.get(path.len()) == Some(&b'/')))
        });
    }

    /// Notes that a name in directory `rel` was added, replaced or removed.
    pub(super) fn touch(&mut self, rel: &[u8], fd: &Arc<OwnedFd>) {
        if !self.touched.contains_key(rel) {
            self.touched.insert(rel.to_vec(), fd.clone());
        }
    }

    /// fsyncs every touched directory once, so new names survive a crash.
    pub(super) fn sync_touched(&mut self) -> Vec<PathProblem> {
        let mut problems = Vec::new();
        let dot = c".";
        for (rel, fd) in self.touched.drain() {
            // fsync needs a real descriptor; ours are O_PATH.
            let flags = libc::O_RDONLY | libc::O_DIRECTORY;
            let result = sys::openat(fd.as_fd(), dot, flags, 0).and_then(|d| sys::fsync(d.as_fd()));
            match result {
                Ok(()) => {}
                // A directory we may not read cannot be opened to fsync; its
                // names still reach the disk with the next journal commit.
                Err(err) if sys::is_errno(&err, libc::EACCES) => {}
                Err(err) => problems.push(PathProblem {
                    path: rel,
                    message: format!("could not flush the directory: {err}"),
                }),
            }
        }
        problems
    }
}
