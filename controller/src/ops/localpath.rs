//! Local paths the file tools may touch, and nothing outside them.
//!
//! Every local path an MCP argument names (a sync's `local_path`, an
//! `exclude_file`) goes through [`Roots::resolve`] before anything is read or
//! created:
//!
//! 1. `~` is expanded, a relative path is taken from the server's working
//!    directory, and `.` / `..` are removed *lexically*, so `..` can never
//!    climb out of a directory that does not exist yet.
//! 2. The result must lie inside one of the roots: the configured
//!    `local_roots`, else the roots the MCP client declares, else the
//!    directory `outpost mcp` started in (never `/`).
//! 3. Below the root the path is opened prefix by prefix with
//!    `openat2(RESOLVE_BENEATH)` from the root's directory, so a symlink may
//!    be followed only while it stays inside the root (on kernels without
//!    `openat2`, each component is opened with `O_NOFOLLOW` and any symlink is
//!    refused). What exists is then named by the kernel's own path for the
//!    opened directory, checked once more against the root.
//! 4. Missing directories of a destination are created one at a time with
//!    `mkdirat` under the directory opened last, each opened with
//!    `O_NOFOLLOW` right after, so nothing planted meanwhile is followed.
//!
//! Credential stores (`~/.ssh`, cloud and cluster credentials, Outpost's own
//! state, config file and known_hosts wherever they are) are refused as sync
//! locations and excluded from trees that contain them, unless a configured
//! root lies inside one: a tree pushed from `~` must not carry the private
//! keys along, nor a pull write `authorized_keys` or forge the audit log.
//! A pull also never writes what runs at the next login (`.bashrc`,
//! `.profile`, `.config/autostart`, `.local/bin`, …). Both `$HOME` and the
//! account's home from the password database count: they differ when a
//! client sets `HOME`.
//!
//! The CLI passes [`Roots::unrestricted`] when no `local_roots` is configured:
//! there a person typed the path.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Directories under `$HOME` that hold credentials.
const SECRET_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".config/outpost",
    ".outpost",
    ".netrc",
    ".git-credentials",
    ".password-store",
];

/// Files and directories under a home that run code at the next login or
/// session: never written by a pull.
const LOGIN_FILES: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".cshrc",
    ".tcshrc",
    ".xprofile",
    ".xsessionrc",
    ".xinitrc",
    ".pam_environment",
    ".config/autostart",
    ".config/systemd",
    ".config/environment.d",
    ".config/fish",
    ".local/bin",
    ".local/share/systemd",
];

/// Where cron and the system look for jobs to run: never written by a pull.
const SYSTEM_JOB_DIRS: &[&str] = &[
    "/etc/cron.d",
    "/etc/cron.hourly",
    "/etc/cron.daily",
    "/etc/cron.weekly",
    "/etc/cron.monthly",
    "/etc/crontab",
    "/var/spool/cron",
    "/etc/systemd",
    "/etc/profile.d",
];

/// Where the roots came from; it is named in refusals so the user knows what
/// to widen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSource {
    /// `local_roots` in the config file.
    Config,
    /// The MCP client's declared roots.
    Client,
    /// The directory `outpost mcp` was started in.
    StartDir,
    /// No restriction (the CLI without `local_roots`).
    Unrestricted,
}

impl RootSource {
    fn describe(self) -> &'static str {
        match self {
            RootSource::Config => "the configured local_roots",
            RootSource::Client => "the MCP client's roots",
            RootSource::StartDir => "the directory outpost mcp started in",
            RootSource::Unrestricted => "no root",
        }
    }
}

#[derive(Debug, Clone)]
struct Root {
    /// As written (after `~` expansion and lexical normalisation).
    lexical: PathBuf,
    /// As the kernel names it; equal to `lexical` unless a symlink leads there.
    canonical: PathBuf,
}

/// The directories local paths must stay inside.
#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<Root>,
    source: RootSource,
    home: Option<PathBuf>,
    /// The account's home from the password database, when not `home`.
    account_home: Option<PathBuf>,
    /// Outpost's own files: its state dir, config file, known_hosts.
    own: Vec<PathBuf>,
    /// Relative paths are taken from here.
    base: PathBuf,
    /// `openat2(RESOLVE_BENEATH)` works here; else every symlink is refused.
    beneath: bool,
}

/// What a resolved path is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Read an existing file or tree.
    Read,
    /// A directory to write into; missing directories are created unless
    /// `create` is false (a dry run).
    Dest { create: bool },
}

/// A path checked against the roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPath {
    /// Absolute, free of `..`, symlinks resolved where the path exists.
    pub path: PathBuf,
    /// gitignore-style patterns (anchored at `path`) for credential stores
    /// inside the tree.
    pub secret_excludes: Vec<String>,
}

impl Roots {
    /// The configured `local_roots`. A root that does not exist yet is kept
    /// as written.
    pub fn configured(paths: &[PathBuf]) -> Roots {
        Roots::new(paths.iter().cloned(), RootSource::Config)
    }

    /// The MCP client's roots (`file://` URIs; others are ignored), else the
    /// start directory.
    pub fn from_client(uris: &[String]) -> Roots {
        let paths: Vec<PathBuf> = uris.iter().filter_map(|u| file_uri_path(u)).collect();
        if paths.is_empty() {
            return Roots::start_dir();
        }
        Roots::new(paths.into_iter(), RootSource::Client)
    }

    /// The directory this process started in.
    pub fn start_dir() -> Roots {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        Roots::new(std::iter::once(cwd), RootSource::StartDir)
    }

    pub fn unrestricted() -> Roots {
        Roots {
            roots: Vec::new(),
            source: RootSource::Unrestricted,
            home: home(),
            account_home: None,
            own: Vec::new(),
            base: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            beneath: openat2_supported(),
        }
    }

    fn new(paths: impl Iterator<Item = PathBuf>, source: RootSource) -> Roots {
        let home = home();
        let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let roots = paths
            .map(|p| {
                let lexical = normalize(&absolute_from(&expand(&p, home.as_deref()), &base));
                let canonical = lexical.canonicalize().unwrap_or_else(|_| lexical.clone());
                Root { lexical, canonical }
            })
            // The whole filesystem is a root only when configured so.
            .filter(|r| source == RootSource::Config || r.canonical != Path::new("/"))
            .collect();
        let account_home = account_home().filter(|a| Some(a) != home.as_ref());
        Roots {
            roots,
            source,
            home,
            account_home,
            own: Vec::new(),
            base,
            beneath: openat2_supported(),
        }
    }

    /// These roots, keeping `files` (Outpost's own) out of every sync.
    pub fn protecting(mut self, files: Vec<PathBuf>) -> Roots {
        self.own = files;
        self
    }

    pub fn source(&self) -> RootSource {
        self.source
    }

    /// The roots, for messages.
    pub fn describe(&self) -> String {
        let list: Vec<String> = self
            .roots
            .iter()
            .map(|r| r.lexical.display().to_string())
            .collect();
        format!("{} ({})", self.source.describe(), list.join(", "))
    }

    /// Checks `raw` against the roots; see the module docs.
    pub fn resolve(&self, raw: &str, intent: Intent) -> Result<LocalPath, String> {
        if raw.is_empty() {
            return Err("the local path is empty".into());
        }
        if raw.contains('\0') {
            return Err("the local path contains a NUL byte".into());
        }
        let wanted = normalize(&absolute_from(
            &expand(Path::new(raw), self.home.as_deref()),
            &self.base,
        ));
        if self.source == RootSource::Unrestricted {
            return Ok(LocalPath {
                path: wanted,
                secret_excludes: Vec::new(),
            });
        }
        if self.roots.is_empty() {
            return Err(format!(
                "no local directory is allowed ({} gives none); set local_roots in the config file",
                self.source.describe()
            ));
        }
        let (root, rel) = self
            .roots
            .iter()
            .find_map(|r| {
                [&r.lexical, &r.canonical]
                    .into_iter()
                    .find_map(|form| wanted.strip_prefix(form).ok())
                    .map(|rel| (r, rel.to_path_buf()))
            })
            .ok_or_else(|| format!("{} is outside {}", wanted.display(), self.describe()))?;
        let path = walk(root, &rel, intent, self.beneath).map_err(|e| match e {
            WalkError::Escapes => format!(
                "{} leads outside {} through a symlink",
                wanted.display(),
                self.describe()
            ),
            WalkError::NotDir(at) => format!("{} is not a directory", at.display()),
            WalkError::Missing => format!("local path not found: {}", wanted.display()),
            WalkError::Io(at, e) => format!("cannot open {}: {e}", at.display()),
        })?;
        let secret_excludes = self.guard_secrets(&path, intent)?;
        Ok(LocalPath {
            path,
            secret_excludes,
        })
    }

    /// Refuses a path at or inside a credential store, Outpost's own files,
    /// or (for a pull) a login file, unless a configured root is; and lists
    /// those inside it as excludes.
    fn guard_secrets(&self, path: &Path, intent: Intent) -> Result<Vec<String>, String> {
        let homes = self.home.iter().chain(&self.account_home);
        let mut guarded: Vec<(PathBuf, &str)> = Vec::new();
        for home in homes {
            guarded.extend(
                SECRET_DIRS
                    .iter()
                    .map(|n| (home.join(n), "holds credentials")),
            );
            if matches!(intent, Intent::Dest { .. }) {
                guarded.extend(
                    LOGIN_FILES
                        .iter()
                        .map(|n| (home.join(n), "runs at the next login")),
                );
            }
        }
        guarded.extend(self.own.iter().map(|p| (p.clone(), "is Outpost's own")));
        if matches!(intent, Intent::Dest { .. }) {
            guarded.extend(
                SYSTEM_JOB_DIRS
                    .iter()
                    .map(|p| (PathBuf::from(p), "runs scheduled jobs")),
            );
        }
        let mut excludes = Vec::new();
        for (lexical, why) in guarded {
            let guarded = lexical.canonicalize().unwrap_or(lexical);
            let root_inside = self.source == RootSource::Config
                && self.roots.iter().any(|r| r.canonical.starts_with(&guarded));
            if root_inside {
                continue;
            }
            if path.starts_with(&guarded) {
                return Err(format!(
                    "{} {why}; the file tools never touch it unless local_roots names it",
                    guarded.display()
                ));
            }
            if let Ok(rel) = guarded.strip_prefix(path) {
                let mut pattern = String::from("/");
                pattern.push_str(&outpost_treesync::filter::escape(&rel.to_string_lossy()));
                if !excludes.contains(&pattern) {
                    excludes.push(pattern);
                }
            }
        }
        Ok(excludes)
    }
}

/// The roots `local_roots` names, else `fallback`.
pub fn configured_or(configured: Option<&[PathBuf]>, fallback: impl FnOnce() -> Roots) -> Roots {
    match configured {
        Some(paths) => Roots::configured(paths),
        None => fallback(),
    }
}

#[derive(Debug)]
enum WalkError {
    Escapes,
    NotDir(PathBuf),
    Missing,
    Io(PathBuf, io::Error),
}

/// Opens `root/rel` prefix by prefix without leaving `root`, creates what is
/// missing when asked, and returns the kernel's name for the result.
fn walk(root: &Root, rel: &Path, intent: Intent, beneath: bool) -> Result<PathBuf, WalkError> {
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let root_fd = open_path(libc::AT_FDCWD, root.canonical.as_os_str(), false).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            WalkError::Io(
                root.lexical.clone(),
                io::Error::other("the root does not exist; create it first"),
            )
        } else {
            WalkError::Io(root.lexical.clone(), e)
        }
    })?;
    // The deepest existing path and how many names it covers.
    let mut deepest: Option<OwnedFd> = None;
    let mut found = 0;
    for i in 0..names.len() {
        let opened = if beneath {
            // Every prefix from the root, so a symlink may lead anywhere
            // below the root but never above it.
            open_beneath(root_fd.as_raw_fd(), &join(&names[..=i]))
        } else {
            let parent = deepest.as_ref().unwrap_or(&root_fd);
            open_path(parent.as_raw_fd(), names[i], true)
        };
        match opened {
            Ok(fd) => {
                deepest = Some(fd);
                found = i + 1;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => {
                let at = root.canonical.join(join(&names[..=i]));
                return Err(match e.raw_os_error() {
                    Some(libc::EXDEV) | Some(libc::ELOOP) => WalkError::Escapes,
                    Some(libc::ENOTDIR) => WalkError::NotDir(at),
                    _ => WalkError::Io(at, e),
                });
            }
        }
    }
    let mut deepest = deepest.unwrap_or(root_fd);
    let missing = &names[found..];
    let is_dir = fstat(&deepest)
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
        .unwrap_or(false);
    if !missing.is_empty() && !is_dir {
        return Err(WalkError::NotDir(fd_path(&deepest)));
    }
    if matches!(intent, Intent::Dest { .. }) && missing.is_empty() && !is_dir {
        return Err(WalkError::NotDir(fd_path(&deepest)));
    }
    let create = matches!(intent, Intent::Dest { create: true });
    if !missing.is_empty() {
        match intent {
            Intent::Read => return Err(WalkError::Missing),
            Intent::Dest { create: false } => {}
            Intent::Dest { create: true } => {
                for name in missing {
                    deepest = make_dir(&deepest, name)
                        .map_err(|e| WalkError::Io(fd_path(&deepest).join(name), e))?;
                }
            }
        }
    }
    let mut path = fd_path(&deepest);
    if !path.starts_with(&root.canonical) {
        // The kernel names something other than what the walk promised.
        return Err(WalkError::Escapes);
    }
    if !create {
        path.extend(missing);
    }
    Ok(path)
}

fn join(names: &[&OsStr]) -> PathBuf {
    names.iter().collect()
}

fn cstring(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: a fresh descriptor the kernel just returned, owned by no one else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// An `O_PATH` descriptor of `path` under `dir`. With `nofollow`, a symlink
/// is refused (`ELOOP`) rather than opened.
fn open_path(dir: RawFd, path: &OsStr, nofollow: bool) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = check(unsafe { libc::openat(dir, c.as_ptr(), flags) })?;
    // O_PATH|O_NOFOLLOW opens a symlink itself rather than failing.
    if nofollow && fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data that fstat fills.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// `openat2(dir, path, O_PATH, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS)`.
fn open_beneath(dir: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path.as_os_str())?;
    // SAFETY: open_how is plain old data.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid path and open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    check(fd as libc::c_int)
}

/// Whether this kernel (and any seccomp filter around us) allows openat2.
fn openat2_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| match open_beneath(libc::AT_FDCWD, Path::new(".")) {
        Ok(_) => true,
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)),
    })
}

/// `mkdirat` then an `O_NOFOLLOW` open of what is there now.
fn make_dir(parent: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstring(name)?;
    // SAFETY: valid NUL-terminated name relative to an open directory.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    let fd = open_path(parent.as_raw_fd(), name, true).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            io::Error::other("a symlink appeared where a directory was being created")
        } else {
            e
        }
    })?;
    if fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(fd)
}

/// The kernel's path of an open directory.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// This account's home in the password database.
fn account_home() -> Option<PathBuf> {
    // SAFETY: passwd is plain old data; getpwuid_r fills it and points its
    // strings into `buf`, read before `buf` goes.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut result = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr(pw.pw_dir).to_bytes();
        (!dir.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(dir)))
    }
}

fn expand(path: &Path, home: Option<&Path>) -> PathBuf {
    match path.to_str() {
        Some(s) => crate::config::expand_tilde(s, home),
        None => path.to_path_buf(),
    }
}

fn absolute_from(path: &Path, base: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

/// Removes `.` and `..` without looking at the filesystem; `..` at `/`
/// stays at `/`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `file:///a%20b` → `/a b`.
fn file_uri_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    // `file://localhost/x` and `file:///x` both name /x.
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let raw = rest.as_bytes();
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = (raw[i] == b'%' && i + 2 < raw.len())
            .then(|| Some(hex(raw[i + 1])? * 16 + hex(raw[i + 2])?))
            .flatten();
        match escaped {
            Some(b) => {
                bytes.push(b);
                i += 3;
            }
            None => {
                bytes.push(raw[i]);
                i += 1;
            }
        }
    }
    Some(PathBuf::from(OsString::from(OsStr::from_bytes(&bytes))))
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests;
