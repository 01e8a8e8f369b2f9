//! Finding and killing every process a command started, via `/proc`.
//!
//! A process tree cannot be found from one angle alone: children reparent to
//! init when their parent dies, `setsid` leaves the session and process group,
//! and `env -i` drops the marker variable. So the target set is the union of
//! three views, which together catch everything short of a deliberate escape:
//!
//! * processes whose environment holds the exec's `OUTPOST_EXEC_TOKEN`,
//! * processes in the child's process group or session (the child is a session
//!   leader, so both ids equal its pid),
//! * descendants of any of the above, by `ppid` links.
//!
//! The functions here block (they read `/proc` and sleep); run them on a
//! blocking thread.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Name of the environment variable that marks an exec's processes.
pub const TOKEN_VAR: &str = "OUTPOST_EXEC_TOKEN";

/// How long processes get to exit after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_millis(500);
/// How long SIGKILL is repeated against processes that keep appearing.
const KILL_WINDOW: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(20);

/// The fields of `/proc/<pid>/stat` this module needs.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub pid: i32,
    pub state: u8,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
}

impl Stat {
    /// Zombies and dead tasks hold no resources worth killing and ignore signals.
    fn is_gone(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// Parses `/proc/<pid>/stat`. The command name sits in parentheses and may hold
/// spaces or parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &[u8]) -> Option<Stat> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let pid = std::str::from_utf8(&text[..open])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(Stat {
        pid,
        state,
        ppid,
        pgrp,
        session,
    })
}

pub fn read_stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// State and start time (field 22, clock ticks after boot) of a process; the
/// pair names a process across pid reuse within one boot.
pub fn state_and_start(pid: i32) -> Option<(u8, u64)> {
    let text = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22 comes 19 after it.
    let state = *fields.next()?.as_bytes().first()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether a `/proc/<pid>/stat` state letter means the process is dead (a
/// zombie only waits for its parent to notice).
pub fn is_dead_state(state: u8) -> bool {
    matches!(state, b'Z' | b'X' | b'x')
}

/// `/proc/sys/kernel/random/boot_id`, read once: start times repeat across
/// boots, so records that outlive a process carry it too.
pub fn boot_id() -> &'static str {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT_ID.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// Every process id currently listed in `/proc`.
pub fn all_pids() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether the process's environment holds exactly `entry` (`NAME=value`).
/// Processes of other users are unreadable and count as not holding it.
pub fn environ_has(pid: i32, entry: &[u8]) -> bool {
    match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|&b| b == 0).any(|e| e == entry),
        Err(_) => false,
    }
}

/// Every live process that belongs to the exec rooted at `root` (see the module
/// docs), never including the agent itself or init. The root may be unknown
/// (a background job whose main process is gone): then the token and
/// descendants alone name the tree.
pub fn collect_tree(root: Option<i32>, token: &str) -> Vec<i32> {
    let entry = format!("{TOKEN_VAR}={token}").into_bytes();
    let root_pid = root;
    // Session and group ids of 0 belong to kernel threads; never match them.
    let root = root.filter(|&r| r > 1);
    collect(|s| {
        root_pid == Some(s.pid)
            || root.is_some_and(|r| s.pgrp == r || s.session == r)
            || (!s.is_gone() && environ_has(s.pid, &entry))
    })
    .into_iter()
    .map(|s| s.pid)
    .collect()
}

/// Every live process that `matches` or descends from one that does, by
/// pid, never including the caller or init.
pub fn collect(matches: impl Fn(&Stat) -> bool) -> Vec<Stat> {
    let me = std::process::id() as i32;
    let stats: Vec<Stat> = all_pids().into_iter().filter_map(read_stat).collect();

    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for s in &stats {
        children.entry(s.ppid).or_default().push(s.pid);
    }
    let mut found: HashSet<i32> = HashSet::new();
    let mut queue: Vec<i32> = stats.iter().filter(|s| matches(s)).map(|s| s.pid).collect();
    while let Some(pid) = queue.pop() {
        if !found.insert(pid) {
            continue;
        }
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids.iter().copied());
        }
    }
    let mut out: Vec<Stat> = stats
        .into_iter()
        .filter(|s| !s.is_gone() && s.pid > 1 && s.pid != me && found.contains(&s.pid))
        .collect();
    out.sort_unstable_by_key(|s| s.pid);
    out
}

fn alive(pid: i32) -> bool {
    read_stat(pid).is_some_and(|s| !s.is_gone())
}

fn signal_all(root: Option<i32>, pids: &[i32], sig: libc::c_int) {
    let me = std::process::id() as i32;
    // SAFETY: plain syscalls; errors (ESRCH, EPERM) are expected and ignored.
    unsafe {
        if let Some(root) = root.filter(|&r| r > 1) {
            libc::killpg(root, sig);
        }
        for &pid in pids {
            if pid > 1 && pid != me {
                libc::kill(pid, sig);
            }
        }
    }
}

/// Terminates the whole tree of the exec rooted at `root`: SIGTERM (and
/// SIGCONT, so stopped processes can act on it), a short grace, then SIGKILL
/// repeated until nothing is left or [`KILL_WINDOW`] passed.
///
/// `root` must not have been reaped yet, so that its pid (and with it the
/// process group and session id) cannot have been reused.
pub fn terminate(root: i32, token: &str) {
    terminate_tree(Some(root), token, TERM_GRACE);
}

/// [`terminate`] with a chosen grace between SIGTERM and SIGKILL, and a root
/// that may be unknown (None: only the token and descendants count). A known
/// root must be alive or an unreaped zombie, for the same reason as above.
pub fn terminate_tree(root: Option<i32>, token: &str, grace: Duration) {
    let mut targets = collect_tree(root, token);
    signal_all(root, &targets, libc::SIGTERM);
    signal_all(root, &targets, libc::SIGCONT);

    let grace_end = Instant::now() + grace;
    while Instant::now() < grace_end {
        std::thread::sleep(POLL);
        // Cheap check first; a full rescan only once the known ones are gone.
        if targets.iter().any(|&p| alive(p)) {
            continue;
        }
        let fresh = collect_tree(root, token);
        if fresh.is_empty() {
            return;
        }
        signal_all(root, &fresh, libc::SIGTERM);
        signal_all(root, &fresh, libc::SIGCONT);
        targets = fresh;
    }

    // A process can fork between a scan and the signal, so scan and kill again
    // until a scan comes back empty.
    let kill_end = Instant::now() + KILL_WINDOW;
    loop {
        let left = collect_tree(root, token);
        if left.is_empty() {
            return;
        }
        signal_all(root, &left, libc::SIGKILL);
        if Instant::now() >= kill_end {
            eprintln!("outpost-agent: processes survived SIGKILL: {left:?}");
            return;
        }
        std::thread::sleep(POLL);
    }
}

/// Blocks until `pid` (a child of ours) has exited, leaving it unreaped: its
/// pid still names its process group and session until it is reaped.
pub fn wait_unreaped(pid: i32) {
    loop {
        // SAFETY: waitid fills the zeroed siginfo it is given.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Whether `pid` (a child of ours) has exited, leaving it unreaped.
pub fn has_exited(pid: i32) -> bool {
    // SAFETY: waitid fills the zeroed siginfo it is given.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() != 0
    }
}

/// Executables of all processes we may inspect, for telling which installed
/// agent versions are in use. Deleted files keep their old path here.
pub fn running_executables() -> Vec<PathBuf> {
    all_pids()
        .into_iter()
        .filter_map(|pid| fs::read_link(format!("/proc/{pid}/exe")).ok())
        .map(|p| {
            // The kernel appends " (deleted)" to unlinked executables.
            match p.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
                Some(s) => PathBuf::from(s),
                None => p,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_command_name() {
        let s = parse_stat(b"123 (a) b (c)) S 45 67 89 0 -1 4194560 0 0").unwrap();
        assert_eq!(
            (s.pid, s.state, s.ppid, s.pgrp, s.session),
            (123, b'S', 45, 67, 89)
        );
    }

    #[test]
    fn garbage_stat_is_none() {
        assert!(parse_stat(b"").is_none());
        assert!(parse_stat(b"12 (x").is_none());
        assert!(parse_stat(b"x (y) S a b c").is_none());
    }

    #[test]
    fn own_process_is_never_collected() {
        let me = std::process::id() as i32;
        assert!(!collect_tree(Some(me), "no-such-token").contains(&me));
    }
}
