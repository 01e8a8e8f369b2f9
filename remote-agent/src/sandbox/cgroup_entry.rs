//! A new process started inside a sandbox's cgroups.
//!
//! On cgroup v2 the child is born there (`clone3` with `CLONE_INTO_CGROUP`,
//! Linux 5.7) instead of moved there by writing `cgroup.procs`: a move takes
//! a global lock whose writer waits out an RCU grace period, which costs
//! 5–15 ms once the host has been idle for 20 ms, about what a command an
//! agent runs after thinking costs in all. Elsewhere (cgroup v1, an older
//! kernel) the process moves itself and forks, as before.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// `CLONE_INTO_CGROUP`: the child starts in the cgroup `cgroup` names.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
const CGROUP2_SUPER_MAGIC: libc::c_long = 0x6367_7270;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// The sandbox's cgroups, opened while their paths still resolve (before
/// joining its mount namespace).
pub struct CgroupEntry {
    /// The one v2 cgroup, which a child can be born into.
    v2: Option<OwnedFd>,
    /// Each cgroup's `cgroup.procs`, to move this process when it cannot.
    procs: Vec<(PathBuf, File)>,
}

impl CgroupEntry {
    pub fn open(cgroups: &[PathBuf]) -> io::Result<CgroupEntry> {
        let procs = cgroups
            .iter()
            .map(|dir| {
                let file = File::options().write(true).open(dir.join("cgroup.procs"));
                file.map(|f| (dir.clone(), f))
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let v2 = match cgroups {
            [only] => open_v2(only)?,
            _ => None,
        };
        Ok(CgroupEntry { v2, procs })
    }

    /// No cgroup to be in (the agent is not root, or none could be made).
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// For a child that another process forks with `clone3`: the v2 cgroup
    /// to name there, None without cgroups; Err on cgroup v1, where only a
    /// move ([`CgroupEntry::fork`]) serves.
    pub fn into_v2(self) -> Result<Option<OwnedFd>, CgroupEntry> {
        match self.v2 {
            Some(fd) => Ok(Some(fd)),
            None if self.procs.is_empty() => Ok(None),
            None => Err(self),
        }
    }

    /// Forks a child in the cgroups: 0 in the child, its pid in the parent.
    /// The caller must be single-threaded, and the child may only exec or
    /// exit (after a raw `clone3`, libc's idea of the thread is the
    /// parent's).
    pub fn fork(&self) -> io::Result<libc::pid_t> {
        if let Some(dir) = &self.v2 {
            // SAFETY: the caller is single-threaded.
            let pid = unsafe { fork_into(Some(dir.as_raw_fd()), 0) };
            if pid >= 0 {
                return Ok(pid);
            }
            let e = io::Error::last_os_error();
            // An older kernel: move, then fork.
            if ![libc::ENOSYS, libc::E2BIG, libc::EINVAL].contains(&e.raw_os_error().unwrap_or(0)) {
                return Err(e);
            }
        }
        let me = std::process::id().to_string();
        for (dir, procs) in &self.procs {
            (&*procs).write_all(me.as_bytes()).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot join {}: {e}", dir.display()))
            })?;
        }
        // SAFETY: the caller is single-threaded.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            pid => Ok(pid),
        }
    }
}

/// A raw `clone3` without a new stack, which returns twice like `fork`:
/// the child is born in `cgroup` (a v2 directory) when one is given, and
/// with `CLONE_PARENT` is its caller's sibling (whose exit signal it
/// shares). -1 and errno on failure.
///
/// # Safety
/// As for `fork` in a threaded process: the child may only make
/// async-signal-safe calls (libc's idea of the thread is the parent's).
pub unsafe fn fork_into(cgroup: Option<RawFd>, flags: u64) -> libc::pid_t {
    let parent = flags & libc::CLONE_PARENT as u64 != 0;
    let args = CloneArgs {
        flags: flags
            | if cgroup.is_some() {
                CLONE_INTO_CGROUP
            } else {
                0
            },
        // clone3 refuses one with CLONE_PARENT: the caller's own applies.
        exit_signal: if parent { 0 } else { libc::SIGCHLD as u64 },
        cgroup: cgroup.unwrap_or(0) as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without a new stack returns twice, like fork.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        ) as libc::pid_t
    }
}

/// `dir` opened as a cgroup v2 directory; None when it is v1.
fn open_v2(dir: &Path) -> io::Result<Option<OwnedFd>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    // SAFETY: fstatfs fills the struct for an open descriptor.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fs.f_type as libc::c_long == CGROUP2_SUPER_MAGIC).then(|| file.into()))
}
