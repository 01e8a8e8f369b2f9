//! The account an isolated sandbox runs as when the agent itself is root.
//!
//! Namespaces and Landlock do not make uid 0 harmless: a command that is
//! root outside its namespaces still owns root's files. So an agent running
//! as root gives each isolated sandbox a uid of its own, picked from a range
//! (the host config's `sandbox_uids`, else `OUTPOST_SANDBOX_UIDS=FIRST-LAST`,
//! else [`DEFAULT_RANGE`]) that no
//! account in `/etc/passwd`, no `/etc/subuid` range and no running process
//! uses, with the gid of the same number checked the same way. Its work,
//! home and tmp dirs are chowned to it.
//!
//! Three ways in, each switching to that account:
//! - its bwrap holder is started as it ([`become_account`] in the child), so
//!   the sandbox's user namespace belongs to it, not to root;
//! - `enter` joins the sandbox's cgroups as root, then becomes it before it
//!   joins the namespaces or applies Landlock;
//! - file requests (syncs, reads, writes) run on a thread whose filesystem
//!   identity is switched for the request ([`ActingAs`]): what they write is
//!   the sandbox's, and what only root may read stays unread.
//!
//! Architecture invariant: no process of an isolated sandbox, and no file
//! request into one, acts as root when the agent is root.

use std::collections::{HashMap, HashSet};
use std::io;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use serde::{Deserialize, Serialize};

/// Past systemd's container range (to 1879048191) and short of homed's
/// (2147352576): ids no distribution hands out.
pub const DEFAULT_RANGE: RangeInclusive<u32> = 1_900_000_000..=1_900_065_535;
/// `FIRST-LAST`: the uids this host's sandboxes may use instead.
pub const RANGE_VAR: &str = "OUTPOST_SANDBOX_UIDS";

/// A sandbox's uid and gid (the same number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

/// Whether sandboxes made here need an account of their own.
pub fn needed() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The uids sandboxes may use here: the host config's, else
/// [`RANGE_VAR`]'s, else [`DEFAULT_RANGE`].
pub fn range(configured: Option<(u32, u32)>) -> Result<RangeInclusive<u32>, String> {
    let (first, last, said) = match configured {
        Some((first, last)) => (first, last, format!("sandbox_uids {first}-{last}")),
        None => {
            let Some(raw) = std::env::var_os(RANGE_VAR) else {
                return Ok(DEFAULT_RANGE);
            };
            let raw = raw.to_string_lossy().into_owned();
            let parsed = raw.split_once('-').and_then(|(a, b)| {
                Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?))
            });
            let said = format!("{RANGE_VAR}={raw:?}");
            let (first, last) = parsed.ok_or_else(|| format!("{said}: want FIRST-LAST"))?;
            (first, last, said)
        }
    };
    if first < 1000 || first > last || last == u32::MAX {
        return Err(format!(
            "{said}: want FIRST-LAST, from 1000 to 4294967294, FIRST not past LAST"
        ));
    }
    Ok(first..=last)
}

/// The scheme in one line, for `diagnose`.
pub fn scheme() -> String {
    if !needed() {
        return "commands run as this login (not root)".into();
    }
    match range(None) {
        Ok(r) => format!(
            "as root, each isolated sandbox runs as a uid of its own from {}-{} (none in /etc/passwd, /etc/subuid or in use; a host's sandbox_uids changes it)",
            r.start(),
            r.end()
        ),
        Err(e) => format!("as root, no sandbox account can be picked: {e}"),
    }
}

/// Picks a free account from `configured` (see [`range`]); `taken` are
/// the uids of this host's sandboxes.
pub fn pick(taken: &[u32], configured: Option<(u32, u32)>) -> Result<Account, String> {
    let range = range(configured)?;
    let mut users = ids_in("/etc/passwd", 2);
    users.extend(taken);
    let groups = ids_in("/etc/group", 2);
    let sub_users = ranges_in("/etc/subuid");
    let sub_groups = ranges_in("/etc/subgid");
    let running = running_uids();
    let in_any = |id: u32, ranges: &[RangeInclusive<u32>]| ranges.iter().any(|r| r.contains(&id));
    range
        .clone()
        .find(|&id| {
            !users.contains(&id)
                && !groups.contains(&id)
                && !running.contains(&id)
                && !in_any(id, &sub_users)
                && !in_any(id, &sub_groups)
        })
        .map(|id| Account { uid: id, gid: id })
        .ok_or_else(|| {
            format!(
                "no free sandbox uid in {}-{} (give the host a wider sandbox_uids)",
                range.start(),
                range.end()
            )
        })
}

/// Numeric field `field` (0-based) of each line of a colon-separated file.
fn ids_in(file: &str, field: usize) -> HashSet<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(':').nth(field)?.parse().ok())
        .collect()
}

/// `name:first:count` lines.
fn ranges_in(file: &str) -> Vec<RangeInclusive<u32>> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split(':').skip(1);
            let first: u32 = parts.next()?.trim().parse().ok()?;
            let count: u32 = parts.next()?.trim().parse().ok()?;
            Some(first..=first.saturating_add(count.max(1) - 1))
        })
        .collect()
}

fn running_uids() -> HashSet<u32> {
    use std::os::unix::fs::MetadataExt;
    crate::proctree::all_pids()
        .into_iter()
        .filter_map(|pid| std::fs::metadata(format!("/proc/{pid}")).ok())
        .map(|m| m.uid())
        .collect()
}

/// Hands `dir` (not what is under it) to the account.
pub fn give(dir: &Path, account: Account) -> io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(account.uid), Some(account.gid))
}

/// The topmost directory above `path` that `account` (None: any uid of
/// the range, owner of nothing) cannot search: it could not reach `path`
/// through it.
pub fn barrier_above(path: &Path, account: Option<Account>) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let searchable = |m: &std::fs::Metadata| {
        let bit = match account {
            Some(a) if m.uid() == a.uid => 0o100,
            Some(a) if m.gid() == a.gid => 0o010,
            _ => 0o001,
        };
        m.mode() & bit != 0
    };
    path.ancestors()
        .skip(1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|dir| std::fs::metadata(dir).is_ok_and(|m| !searchable(&m)))
        .map(Path::to_path_buf)
}

/// Makes this process the account, for good: no supplementary groups, then
/// the gid, then the uid. Async-signal-safe (for a forked child).
pub fn become_account(account: Account) -> io::Result<()> {
    // SAFETY: plain credential syscalls.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) == -1
            || libc::setresgid(account.gid, account.gid, account.gid) == -1
            || libc::setresuid(account.uid, account.uid, account.uid) == -1
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This thread's filesystem identity switched to an account while the value
/// lives (raw syscalls: glibc's wrappers would switch every thread). Threads
/// started meanwhile inherit it. Dropping it restores root's.
pub struct ActingAs {
    groups: Vec<libc::gid_t>,
    gid: libc::gid_t,
}

/// Switches this thread to `account` for file access; None when there is
/// none to switch to.
pub fn act_as(account: Option<Account>) -> Option<ActingAs> {
    let account = account?;
    // SAFETY: getgroups fills at most `n` entries; getegid cannot fail.
    let (groups, gid) = unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut()).max(0);
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let got = libc::getgroups(n, groups.as_mut_ptr()).max(0);
        groups.truncate(got as usize);
        (groups, libc::getegid())
    };
    let acting = ActingAs { groups, gid };
    // SAFETY: thread-local credential syscalls; setfsuid and setfsgid
    // answer the previous id, so each is checked by asking again (-1).
    let switched = unsafe {
        libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0 && {
            libc::syscall(libc::SYS_setfsgid, account.gid);
            libc::syscall(libc::SYS_setfsuid, account.uid);
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32 == account.gid
                && libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 == account.uid
        }
    };
    if !switched {
        // Dropping `acting` restores what was switched; the request fails
        // (its worker's panic is answered) rather than run as root.
        drop(acting);
        panic!("cannot act as the sandbox's account {}", account.uid);
    }
    Some(acting)
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // SAFETY: thread-local credential syscalls back to the process's own.
        let restored = unsafe {
            libc::syscall(libc::SYS_setfsuid, libc::geteuid());
            libc::syscall(libc::SYS_setfsgid, self.gid);
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) == 0
                && libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 == libc::geteuid()
        };
        // A pooled thread left acting as a sandbox would serve the next
        // request as it: not survivable.
        if !restored {
            std::process::abort();
        }
    }
}

/// The accounts of the sandbox roots this process opened, by descriptor
/// number (`/proc/self/fd/N`), so the file engine acts as their owner.
static ROOT_OWNERS: LazyLock<Mutex<HashMap<i32, Account>>> = LazyLock::new(Mutex::default);

/// Notes who owns the sandbox root opened as descriptor `fd`.
pub fn note_root(fd: i32, account: Option<Account>) {
    let mut owners = ROOT_OWNERS.lock().unwrap_or_else(|p| p.into_inner());
    match account {
        Some(a) => owners.insert(fd, a),
        None => owners.remove(&fd),
    };
}

/// Acts as the owner of `root` when it is a sandbox's root with one.
pub fn act_for_root(root: &Path) -> Option<ActingAs> {
    let fd: i32 = root
        .strip_prefix("/proc/self/fd")
        .ok()?
        .components()
        .next()?
        .as_os_str()
        .to_str()?
        .parse()
        .ok()?;
    let account = ROOT_OWNERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&fd)
        .copied();
    act_as(account)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed when dropped.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(label: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("outpost-{label}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn subordinate_ranges_are_read_inclusively() {
        let dir = Scratch::new("account-subuid");
        let file = dir.path().join("subuid");
        std::fs::write(&file, "alice:100000:65536\nbob:165536:1\n# junk\n").unwrap();
        let ranges = ranges_in(file.to_str().unwrap());
        assert_eq!(ranges, vec![100000..=165535, 165536..=165536]);
    }

    #[test]
    fn the_barrier_is_the_topmost_unsearchable_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = Scratch::new("account-barrier");
        let (a, b) = (dir.path().join("a"), dir.path().join("a/b"));
        std::fs::create_dir_all(b.join("c")).unwrap();
        for d in [dir.path(), a.as_path(), b.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // /tmp itself is searchable; nothing above blocks.
        assert_eq!(barrier_above(&b.join("c"), None), None);
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(barrier_above(&b.join("c"), None), Some(a));
    }

    #[test]
    fn a_thread_acts_as_the_account_and_gets_root_back() {
        if !needed() {
            // CI runs as root: there this test must run.
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "needs root");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let dir = Scratch::new("account-acting");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root's").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let account = Account {
            uid: 1_900_065_000,
            gid: 1_900_065_000,
        };
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        give(&open, account).unwrap();
        {
            let _as = act_as(Some(account)).unwrap();
            std::fs::write(open.join("made"), "x").unwrap();
            let e = std::fs::read(&secret).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            // A thread started meanwhile inherits it.
            std::thread::scope(|s| {
                s.spawn(|| assert!(std::fs::read(&secret).is_err()));
            });
        }
        assert_eq!(
            std::fs::metadata(open.join("made")).unwrap().uid(),
            account.uid
        );
        assert_eq!(std::fs::read(&secret).unwrap(), b"root's");
    }
}
