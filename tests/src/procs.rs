//! Finding processes through /proc (by command line, environment,
//! executable or ancestry) and signalling them.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;

/// Pids of processes whose command line (arguments joined by spaces)
/// contains `needle`. The calling process is never included.
pub fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    proc_pids()
        .into_iter()
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let text: String = String::from_utf8_lossy(&raw).replace('\0', " ");
                text.contains(needle)
            })
        })
        .collect()
}

/// Processes whose environment holds exactly `entry` (`NAME=value`).
pub fn pids_with_env(entry: &str) -> Vec<i32> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// SIGKILLs every process started from under `dir` (by command line or
/// executable), e.g. an agent daemon that left the process tree it was
/// started in, with everything below it; returns how many there were.
pub fn kill_processes_under(dir: &Path) -> usize {
    let needle = dir.to_string_lossy().into_owned();
    let roots: HashSet<i32> = pids_with_cmdline(&needle)
        .into_iter()
        .chain(pids_with_exe_under(dir))
        .collect();
    let table = process_table();
    let mut all: Vec<i32> = roots.iter().copied().collect();
    for &root in &roots {
        all.extend(descendants(&table, root));
    }
    // Stopped first, so none of them starts another in between.
    signal_all(&all, libc::SIGSTOP);
    signal_all(&all, libc::SIGKILL);
    roots.len()
}

/// Sends SIGCONT to each pid (undoes [`Sshd::stop_connections`](crate::Sshd::stop_connections)).
pub fn continue_pids(pids: &[i32]) {
    signal_all(pids, libc::SIGCONT);
}

pub(crate) struct ProcInfo {
    ppid: i32,
    pub(crate) comm: String,
    /// Single-letter state from /proc/<pid>/stat (`Z` = zombie).
    pub(crate) state: char,
}

fn proc_pids() -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Snapshot of pid -> (ppid, comm) from /proc/*/stat.
pub(crate) fn process_table() -> HashMap<i32, ProcInfo> {
    let mut table = HashMap::new();
    for pid in proc_pids() {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Format: "pid (comm) state ppid …"; comm may itself contain spaces
        // and parentheses, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let Some(ppid) = rest.next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        table.insert(pid, ProcInfo { ppid, comm, state });
    }
    table
}

/// All transitive children of `root` in the snapshot (not `root` itself).
pub(crate) fn descendants(table: &HashMap<i32, ProcInfo>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&pid, info) in table {
        children.entry(info.ppid).or_default().push(pid);
    }
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            queue.push(c);
        }
    }
    out
}

/// Pids whose executable lies under `dir` (agents started from the state dir).
pub(crate) fn pids_with_exe_under(dir: &Path) -> Vec<i32> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(dir))
        })
        .collect()
}

pub(crate) fn signal_all(pids: &[i32], signal: libc::c_int) {
    for &pid in pids {
        // Never signal "all processes" or a process group by accident.
        if pid > 1 {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}
