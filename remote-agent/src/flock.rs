//! Exclusive `flock` locks with a deadline.
//!
//! Three places serialise processes that share no memory: the job daemon (one
//! per state dir), the events file (one writer at a time) and the host-wide
//! GPU lease table. They open and wait for their locks here, so all three
//! agree on what a lock file is and how a wait ends.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Opens (creating it `0600` if missing) a lock file private to this user.
/// A planted symlink is refused rather than followed.
pub fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Takes an exclusive lock on `file`, polling until `wait` has passed.
/// `Ok(false)` when another process still holds it then; the lock lasts
/// until the file is closed.
pub fn lock_within(file: &File, wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_times_out_and_a_released_one_is_taken() {
        let dir = std::env::temp_dir().join(format!("outpost-flock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let first = open_private(&path).unwrap();
        assert!(lock_within(&first, Duration::ZERO).unwrap());
        // flock locks belong to the open file description: a second open
        // contends even within one process.
        let second = open_private(&path).unwrap();
        assert!(!lock_within(&second, Duration::from_millis(30)).unwrap());
        drop(first);
        assert!(lock_within(&second, Duration::from_millis(30)).unwrap());
        std::os::unix::fs::symlink(&path, dir.join("link")).unwrap();
        assert!(open_private(&dir.join("link")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
