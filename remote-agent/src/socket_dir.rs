//! Where the agent's unix sockets live (the daemon's, and the exposed
//! ports of sandboxes): a private directory with a short path that no other
//! local user can create first or read (see [`socket_path`]).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::statefile;

pub fn run_dir(state: &Path) -> PathBuf {
    state.join("run")
}

pub fn info_path(state: &Path) -> PathBuf {
    run_dir(state).join("daemon.json")
}

/// The socket's name, in whichever directory holds it.
pub const SOCKET_NAME: &str = "daemon.sock";
/// The longest path a unix socket can have: `sun_path` holds 108 bytes,
/// the terminating NUL included.
const SOCKET_PATH_MAX: usize = 107;
/// The longest name a socket of ours has in the directory (a port's,
/// `pt-<8 hex>-<port>.sock`).
pub const SOCKET_NAME_MAX: usize = 24;
/// `run/socket-dir`: the short directory made for the socket when neither
/// of the usual ones will do.
const SOCKET_DIR_RECORD: &str = "socket-dir";

/// The daemon's socket for the state dir `state`, where the daemon puts it
/// and where a client looks when no `daemon.json` says otherwise:
///
/// 1. `$XDG_RUNTIME_DIR/outpost-<hash>/` when that variable names a private
///    directory of this user (owned, 0700, not a symlink); `<hash>` is 8 hex
///    digits of BLAKE3 of the state dir, since two installs of one user must
///    not share a socket;
/// 2. else `<state>/run/`, when the socket's path fits in `sun_path`;
/// 3. else a directory with an unpredictable name made under `/tmp`
///    (`mkdtemp`) and recorded in `run/socket-dir`.
///
/// Never a predictable name in a shared directory: another local user
/// could create it first and so block every job of this user.
pub fn socket_path(state: &Path) -> PathBuf {
    let dir = runtime_socket_dir(state)
        .or_else(|| Some(run_dir(state)).filter(|d| fits(d)))
        .or_else(|| recorded_socket_dir(state))
        // None made yet: the daemon makes one when it starts.
        .unwrap_or_else(|| run_dir(state));
    dir.join(SOCKET_NAME)
}

/// The daemon's side of [`socket_path`]: the directory to listen in,
/// created or checked, and the short one made and recorded if needed.
pub fn prepare_socket_dir(state: &Path) -> Result<PathBuf, String> {
    use std::os::unix::ffi::OsStrExt;
    if let Some(dir) = runtime_socket_dir(state) {
        private_dir(&dir)?;
        return Ok(dir);
    }
    let run = run_dir(state);
    if fits(&run) {
        private_dir(&run)?;
        return Ok(run);
    }
    // A recorded directory that is gone, or no longer private, is replaced
    // (never re-created under its old, by now known, name).
    if let Some(dir) = recorded_socket_dir(state).filter(|d| is_private_dir(d)) {
        return Ok(dir);
    }
    let dir = make_temp_dir()?;
    let record = run.join(SOCKET_DIR_RECORD);
    statefile::write_atomic(&record, dir.as_os_str().as_bytes(), false)
        .map_err(|e| format!("cannot write {}: {e}", record.display()))?;
    Ok(dir)
}

/// Whether a socket in `dir` has a path short enough to bind.
/// Whether every socket of ours fits in `dir`.
fn fits(dir: &Path) -> bool {
    dir.as_os_str().len() + 1 + SOCKET_NAME_MAX.max(SOCKET_NAME.len()) <= SOCKET_PATH_MAX
}

/// `$XDG_RUNTIME_DIR/outpost-<hash>`, when `$XDG_RUNTIME_DIR` is a private
/// directory of this user and the socket's path fits.
fn runtime_socket_dir(state: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let runtime = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
    if !runtime.is_absolute() || !is_private_dir(&runtime) {
        return None;
    }
    let hash = blake3::hash(state.as_os_str().as_bytes()).to_hex();
    Some(runtime.join(format!("outpost-{}", &hash[..8]))).filter(|d| fits(d))
}

/// The short directory recorded in `run/socket-dir`, if any.
fn recorded_socket_dir(state: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = fs::read(run_dir(state).join(SOCKET_DIR_RECORD)).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes))).filter(|d| d.is_absolute() && fits(d))
}

/// Makes `/tmp/outpost-XXXXXX` (0700) with an unpredictable name.
fn make_temp_dir() -> Result<PathBuf, String> {
    use std::os::unix::ffi::OsStringExt;
    let mut template = b"/tmp/outpost-XXXXXX\0".to_vec();
    // SAFETY: `template` is a NUL-terminated buffer mkdtemp may rewrite.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(format!(
            "cannot make a directory for the socket in /tmp: {}",
            io::Error::last_os_error()
        ));
    }
    template.pop();
    Ok(PathBuf::from(std::ffi::OsString::from_vec(template)))
}

/// Whether `dir` is a directory (not a symlink) of this user that nobody
/// else may enter.
fn is_private_dir(dir: &Path) -> bool {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    fs::symlink_metadata(dir)
        .is_ok_and(|m| m.file_type().is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
}

/// Creates `dir` (0700) or checks that the existing one is a real directory
/// owned by this user and closed to others, so nobody else can put a socket
/// there or read ours.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta =
        fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.file_type().is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != uid {
        return Err(format!(
            "{} belongs to uid {}, not to this user",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} private: {e}", dir.display()))?;
    }
    Ok(())
}
