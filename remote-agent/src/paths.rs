//! Host paths: the home directory, `~` expansion, the state dir and the shell.
//!
//! Commands run where an SSH exec would start them, so relative working
//! directories are taken from `$HOME`, not from wherever the agent was started.

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `$HOME`, or the passwd entry when it is unset or empty.
pub fn home_dir() -> Option<PathBuf> {
    match std::env::var_os("HOME") {
        Some(h) if !h.is_empty() => Some(PathBuf::from(h)),
        _ => passwd_home(),
    }
}

/// This account's home in the password database, whatever `$HOME` says.
pub fn passwd_home() -> Option<PathBuf> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain old data; getpwuid_r fills it and points its
    // strings into `buf`, which outlives every use below.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::getuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        let dir = CStr::from_ptr(pw.pw_dir).to_bytes();
        (!dir.is_empty()).then(|| PathBuf::from(OsString::from_vec(dir.to_vec())))
    }
}

/// Expands a leading `~` or `~/` with `home`. Other forms (`~user`) are left
/// alone: the agent runs as one user and has no business guessing others.
pub fn expand_tilde(path: &str, home: Option<&Path>) -> PathBuf {
    if let Some(home) = home {
        if path == "~" {
            return home.to_path_buf();
        }
        if let Some(rest) = path.strip_prefix("~/") {
            return home.join(rest.trim_start_matches('/'));
        }
    }
    PathBuf::from(path)
}

/// The directory an exec runs in: `~` expanded, relative paths taken from the
/// home directory, and no cwd meaning the home directory (or `/` without one).
pub fn resolve_cwd(cwd: Option<&str>) -> PathBuf {
    let home = home_dir();
    match cwd {
        None => match home {
            Some(h) if h.is_dir() => h,
            _ => PathBuf::from("/"),
        },
        Some(raw) => {
            let path = expand_tilde(raw, home.as_deref());
            match home {
                Some(h) if path.is_relative() => h.join(path),
                _ => path,
            }
        }
    }
}

/// Names the state dir outright. The controller sets it for the agent of
/// one cluster allocation (`<dir>/slurm/<job>`), whose jobs, contexts and
/// leases must stay apart from the login node's even where both share a
/// home directory and so the installed binary.
pub const STATE_DIR_ENV: &str = "OUTPOST_STATE_DIR";

/// The agent's state dir: [`STATE_DIR_ENV`] when set to an absolute path,
/// else `<dir>` when this binary runs from
/// `<dir>/agents/<version>/outpost-agent` (the controller may install into a
/// custom remote dir), else `~/.outpost`. Host-wide state such as GPU leases
/// lives here, so every agent started by any controller finds the same files.
///
/// Found once per process: it cannot change while the process runs, and
/// finding it reads a link in `/proc`, on every sandbox listing of a fleet's
/// `check_resources` among others.
pub fn state_dir() -> Option<PathBuf> {
    static STATE: OnceLock<Option<PathBuf>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os(STATE_DIR_ENV)
                .map(PathBuf::from)
                .filter(|d| d.is_absolute())
            {
                return Some(dir);
            }
            running_exe()
                .as_deref()
                .and_then(install_root)
                .or_else(|| home_dir().map(|h| h.join(".outpost")))
        })
        .clone()
}

/// `<dir>` of an executable at `<dir>/agents/<version>/<file>`.
pub fn install_root(exe: &Path) -> Option<PathBuf> {
    let agents = exe.parent()?.parent()?;
    if agents.file_name()? != "agents" {
        return None;
    }
    agents.parent().map(Path::to_path_buf)
}

/// The running executable's path, without the ` (deleted)` suffix the kernel
/// adds once the file was replaced on disk.
pub fn running_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(
        match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
            Some(s) => PathBuf::from(s),
            None => exe,
        },
    )
}

/// Finds an executable called `name` on `$PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    path.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

/// The shell commands run in: bash when the host has it, else `/bin/sh`.
/// Looked up once; hosts do not lose bash mid-session.
pub fn shell() -> &'static Path {
    static SHELL: OnceLock<PathBuf> = OnceLock::new();
    SHELL.get_or_init(|| find_bash().unwrap_or_else(|| PathBuf::from("/bin/sh")))
}

/// bash on `$PATH` or in the usual places (the agent may run with a bare PATH).
pub fn find_bash() -> Option<PathBuf> {
    which("bash").or_else(|| {
        ["/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"]
            .iter()
            .map(PathBuf::from)
            .find(|p| is_executable(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_forms() {
        let home = Some(Path::new("/home/u"));
        assert_eq!(expand_tilde("~", home), PathBuf::from("/home/u"));
        assert_eq!(expand_tilde("~/a/b", home), PathBuf::from("/home/u/a/b"));
        assert_eq!(expand_tilde("~other/x", home), PathBuf::from("~other/x"));
        assert_eq!(expand_tilde("/abs/~", home), PathBuf::from("/abs/~"));
        assert_eq!(expand_tilde("~/x", None), PathBuf::from("~/x"));
    }

    #[test]
    fn install_root_of_an_installed_agent() {
        let root = |p: &str| install_root(Path::new(p));
        assert_eq!(
            root("/opt/o/agents/0.1.0-abc/outpost-agent"),
            Some(PathBuf::from("/opt/o"))
        );
        assert_eq!(root("/home/u/target/debug/outpost-agent"), None);
        assert_eq!(root("/agents/v/outpost-agent"), Some(PathBuf::from("/")));
        assert_eq!(root("outpost-agent"), None);
    }
}
