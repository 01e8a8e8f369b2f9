//! How a root agent's bwrap holder reaches what it binds.
//!
//! The holder runs as the sandbox's own uid (see `crate::account`), and bwrap
//! resolves its sources by path as that uid: through `/root` (0700) or the
//! agent's state dir (0700) it would reach none of them. So the holder's
//! parent, still root, first makes a mount namespace of its own in which
//! each such barrier is an empty tmpfs holding only the sandbox's sources,
//! bound at their own paths; then it becomes the uid and runs bwrap, which
//! copies that view. The host's mounts are untouched.
//!
//! Everything is prepared here, before the fork: the child only makes
//! syscalls on these strings (no allocation after `fork` in a threaded
//! process).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::account;

/// What the child does before it becomes the sandbox's uid.
pub struct Staging {
    barriers: Vec<CString>,
    dirs: Vec<CString>,
    files: Vec<CString>,
    /// Bound at their own paths, from descriptors the child opens before
    /// it covers the barriers (a bind's source must be of its namespace).
    sources: Vec<CString>,
}

/// At most this many sources (tmp, work, home, agent, egress socket).
const MAX_SOURCES: usize = 8;

impl Staging {
    /// The view in which `sources` (directories or files) are reachable by
    /// every uid; None when they already are.
    pub fn for_sources(
        sources: &[PathBuf],
        account: account::Account,
    ) -> Result<Option<Staging>, String> {
        let mut barriers: Vec<PathBuf> = Vec::new();
        for source in sources {
            if let Some(b) = account::barrier_above(source, Some(account))
                && !barriers.iter().any(|known| b.starts_with(known))
            {
                barriers.retain(|known| !known.starts_with(&b));
                barriers.push(b);
            }
        }
        if barriers.is_empty() {
            return Ok(None);
        }
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| format!("{} holds a NUL byte", p.display()))
        };
        let mut staging = Staging {
            barriers: barriers.iter().map(|b| c(b)).collect::<Result<_, _>>()?,
            dirs: Vec::new(),
            files: Vec::new(),
            sources: Vec::new(),
        };
        let mut made: Vec<PathBuf> = Vec::new();
        for source in sources {
            let Some(barrier) = barriers.iter().find(|b| source.starts_with(b)) else {
                continue;
            };
            let is_dir = std::fs::metadata(source)
                .map_err(|e| format!("cannot stat {}: {e}", source.display()))?
                .is_dir();
            // The directories between the barrier and the source, top down.
            let mut between: Vec<&Path> = source
                .ancestors()
                .skip(1)
                .take_while(|a| *a != barrier.as_path())
                .collect();
            between.reverse();
            if is_dir {
                between.push(source);
            }
            for dir in between {
                if !made.iter().any(|m| m == dir) {
                    made.push(dir.to_path_buf());
                    staging.dirs.push(c(dir)?);
                }
            }
            if !is_dir {
                staging.files.push(c(source)?);
            }
            staging.sources.push(c(source)?);
        }
        if staging.sources.len() > MAX_SOURCES {
            return Err("too many sources to stage".into());
        }
        Ok(Some(staging))
    }

    /// In the forked child, as root: a mount namespace of its own with the
    /// barriers replaced. Async-signal-safe.
    pub fn apply(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r == -1 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: syscalls on C strings prepared before the fork.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing done here may reach the host's mounts.
            check(libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            let mut opened = [-1; MAX_SOURCES];
            for (fd, source) in opened.iter_mut().zip(&self.sources) {
                *fd = libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                check(*fd)?;
            }
            for barrier in &self.barriers {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    barrier.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"mode=0755".as_ptr().cast(),
                ))?;
            }
            for dir in &self.dirs {
                if libc::mkdir(dir.as_ptr(), 0o755) == -1
                    && *libc::__errno_location() != libc::EEXIST
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for file in &self.files {
                let fd = libc::open(
                    file.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                check(fd)?;
                libc::close(fd);
            }
            for (fd, target) in opened.iter().zip(&self.sources) {
                let mut name = [0u8; 32];
                fd_path(*fd, &mut name);
                check(libc::mount(
                    name.as_ptr().cast(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
                libc::close(*fd);
            }
        }
        Ok(())
    }
}

/// `/proc/self/fd/N` and a NUL into `out`, without allocating.
fn fd_path(fd: i32, out: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    out[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.max(0) as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[PREFIX.len() + i] = digits[len - 1 - i];
    }
    out[PREFIX.len() + len] = 0;
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptor_paths_are_spelled_without_allocating() {
        for (fd, want) in [
            (0, "/proc/self/fd/0"),
            (7, "/proc/self/fd/7"),
            (1234, "/proc/self/fd/1234"),
        ] {
            let mut out = [0u8; 32];
            super::fd_path(fd, &mut out);
            let end = out.iter().position(|&b| b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&out[..end]).unwrap(), want);
        }
    }
}
