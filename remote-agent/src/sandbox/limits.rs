//! Resource limits: a cgroup of the sandbox's own where this user may make
//! one (cgroup v2 delegated to the user, or v1 as root), otherwise
//! `RLIMIT_NPROC` (under bwrap, where it counts per user namespace) and the
//! keeper's watchdog for memory and disk. Never `RLIMIT_AS`: CUDA reserves
//! far more address space than it uses.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use outpost_protocol::{Isolation, SandboxLimits};

use super::store::Setup;
use crate::proctree::{self, Stat};

const V2_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
const V1_ROOT: &str = "/sys/fs/cgroup";

/// What [`make`] set up, and how each limit is enforced.
pub struct Made {
    pub cgroups: Vec<PathBuf>,
    pub enforcement: String,
    pub watch_memory_mb: Option<u64>,
    pub watch_disk_mb: Option<u64>,
    pub nproc: Option<u64>,
}

/// Makes the sandbox's cgroups (named `outpost-<id>`) with its limits, or
/// falls back to what the agent can do without them.
pub fn make(id: &str, limits: &SandboxLimits, isolation: Isolation) -> Made {
    let name = format!("outpost-{id}");
    // As root a cgroup is always made, limits or not: it also holds every
    // process of the sandbox for its end. Another user's processes could
    // not be moved into one it made (cgroup delegation asks for a common
    // delegated ancestor that an SSH session does not have), so there the
    // fallbacks apply.
    // SAFETY: geteuid cannot fail.
    let wants_cgroup = unsafe { libc::geteuid() } == 0;
    let mut made = Made {
        cgroups: Vec::new(),
        enforcement: String::new(),
        watch_memory_mb: None,
        watch_disk_mb: limits.disk_mb,
        nproc: None,
    };
    let mut enforced: Vec<&str> = Vec::new();
    let mut watched: Vec<&str> = Vec::new();
    let mut unenforced: Vec<&str> = Vec::new();
    let mut via = "";
    if wants_cgroup {
        if let Some(dir) = make_v2(&name, limits) {
            made.cgroups.push(dir);
            via = "cgroup v2";
        } else if let Some(dirs) = make_v1(&name, limits) {
            made.cgroups = dirs;
            via = "cgroup v1";
        }
    }
    let in_cgroup = !made.cgroups.is_empty();
    if limits.memory_mb.is_some() {
        if in_cgroup {
            enforced.push("memory");
        } else {
            made.watch_memory_mb = limits.memory_mb;
            watched.push("memory");
        }
    }
    if limits.cpu_millis.is_some() {
        if in_cgroup {
            enforced.push("cpus");
        } else {
            unenforced.push("cpus");
        }
    }
    if let Some(pids) = limits.pids {
        if in_cgroup {
            enforced.push("pids");
        } else if isolation == Isolation::Bwrap {
            made.nproc = Some(pids.into());
        } else {
            unenforced.push("pids");
        }
    }
    if limits.disk_mb.is_some() {
        watched.push("disk");
    }
    let mut parts = Vec::new();
    if !enforced.is_empty() {
        parts.push(format!("{via}: {}", enforced.join(", ")));
    }
    if made.nproc.is_some() {
        parts.push("rlimit: pids".into());
    }
    if !watched.is_empty() {
        parts.push(format!("watchdog: {}", watched.join(", ")));
    }
    if !unenforced.is_empty() {
        parts.push(format!(
            "not enforced (no cgroup for this user): {}",
            unenforced.join(", ")
        ));
    }
    made.enforcement = if parts.is_empty() {
        "no limits".into()
    } else {
        parts.join("; ")
    };
    made
}

/// This process's cgroup path in the v2 hierarchy (`0::/path`), or in the
/// v1 hierarchy that has `controller`.
fn own_cgroup(controller: Option<&str>) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            None => controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        hit.then(|| path.to_string())
    })
}

/// Writes a cgroup control file, which must exist: a plain directory that
/// only looks like a cgroup must not get files made in it.
fn write(dir: &Path, file: &str, value: &str) -> bool {
    use std::io::Write;
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join(file))
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .is_ok()
}

/// A sibling of this process's v2 cgroup, under a parent delegated to us
/// (systemd's `user@UID.service` delegates its subtree).
fn make_v2(name: &str, limits: &SandboxLimits) -> Option<PathBuf> {
    let own = own_cgroup(None)?;
    let root = V2_ROOTS
        .iter()
        .map(Path::new)
        .find(|r| r.join("cgroup.controllers").is_file())?;
    let own_dir = root.join(own.trim_start_matches('/'));
    // A sibling of ours; at the root, a child of it.
    let parent = if own == "/" {
        own_dir.as_path()
    } else {
        own_dir.parent()?
    };
    if !parent.starts_with(root) || !parent.join("cgroup.controllers").is_file() {
        return None;
    }
    let available = fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<&str> = [
        limits.memory_mb.map(|_| "memory"),
        limits.cpu_millis.map(|_| "cpu"),
        limits.pids.map(|_| "pids"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !wanted
        .iter()
        .all(|c| available.split_whitespace().any(|a| a == *c))
    {
        return None;
    }
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    for c in &wanted {
        if !enabled.split_whitespace().any(|e| e == *c)
            && !write(parent, "cgroup.subtree_control", &format!("+{c}"))
        {
            return None;
        }
    }
    let dir = parent.join(name);
    fs::create_dir(&dir).ok()?;
    if !dir.join("cgroup.procs").is_file() {
        let _ = fs::remove_dir(&dir);
        return None;
    }
    if limits.memory_mb.is_some() {
        // Where swap is accounted: no paging out past the limit.
        let _ = write(&dir, "memory.swap.max", "0");
    }
    let ok = limits
        .memory_mb
        .is_none_or(|mb| write(&dir, "memory.max", &(mb << 20).to_string()))
        && limits
            .cpu_millis
            .is_none_or(|m| write(&dir, "cpu.max", &format!("{} 100000", u64::from(m) * 100)))
        && limits
            .pids
            .is_none_or(|p| write(&dir, "pids.max", &p.to_string()));
    if ok {
        Some(dir)
    } else {
        let _ = fs::remove_dir(&dir);
        None
    }
}

/// One child per v1 hierarchy of a limit asked for, under this process's
/// own cgroup there (root only, in practice).
fn make_v1(name: &str, limits: &SandboxLimits) -> Option<Vec<PathBuf>> {
    let mut made: Vec<PathBuf> = Vec::new();
    let mut add = |controller: &str, settings: &[(&str, String)]| -> bool {
        let Some(own) = own_cgroup(Some(controller)) else {
            return false;
        };
        let dir = Path::new(V1_ROOT)
            .join(controller)
            .join(own.trim_start_matches('/'))
            .join(name);
        if !dir
            .parent()
            .is_some_and(|p| p.join("cgroup.procs").is_file())
            || fs::create_dir(&dir).is_err()
        {
            return false;
        }
        made.push(dir.clone());
        settings
            .iter()
            .all(|(file, value)| write(&dir, file, value))
    };
    let ok = limits.memory_mb.is_none_or(|mb| {
        add(
            "memory",
            &[("memory.limit_in_bytes", (mb << 20).to_string())],
        )
    }) && limits.cpu_millis.is_none_or(|m| {
        add(
            "cpu",
            &[
                ("cpu.cfs_period_us", "100000".into()),
                ("cpu.cfs_quota_us", (u64::from(m) * 100).to_string()),
            ],
        )
    }) && limits
        .pids
        .is_none_or(|p| add("pids", &[("pids.max", p.to_string())]));
    // No pids limit: the pids hierarchy still holds the processes.
    let ok = ok && (limits.pids.is_some() || add("pids", &[]));
    if ok {
        // Swap counted too where the kernel accounts it, so a hog cannot
        // page out past its limit.
        if let Some(mem) = made.iter().find(|d| d.starts_with("/sys/fs/cgroup/memory"))
            && let Some(mb) = limits.memory_mb
        {
            let _ = write(mem, "memory.memsw.limit_in_bytes", &(mb << 20).to_string());
        }
        Some(made)
    } else {
        remove(&made);
        None
    }
}

/// How limits would be enforced for this user, by trying: a throwaway
/// cgroup is made and removed again.
pub fn probe() -> String {
    let limits = SandboxLimits {
        memory_mb: Some(64),
        cpu_millis: None,
        pids: Some(64),
        disk_mb: None,
    };
    let name = format!("outpost-probe-{}", std::process::id());
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        if let Some(dir) = make_v2(&name, &limits) {
            remove(&[dir]);
            return "cgroup v2 (memory, cpus, pids)".into();
        }
        if let Some(dirs) = make_v1(&name, &limits) {
            remove(&dirs);
            return "cgroup v1 (memory, cpus, pids)".into();
        }
    }
    "no cgroup (made only as root): pids by rlimit under bwrap, memory and disk by the keeper's watchdog, cpus not enforced".into()
}

/// Every process in the sandbox's cgroups.
pub fn cgroup_members(cgroups: &[PathBuf]) -> HashSet<i32> {
    cgroups
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Removes the (emptied) cgroups.
pub fn remove(cgroups: &[PathBuf]) {
    for dir in cgroups {
        let _ = fs::remove_dir(dir);
    }
}

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: i32) -> u64 {
    let pages: u64 = fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf cannot fail for _SC_PAGESIZE.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Memory the processes `pids` hold, shared memory counted once: each one's
/// private resident pages (`RssAnon` + `RssFile`), plus the larger of their
/// resident shared pages (`RssShmem`) and the allocated size of the shared
/// memory files they hold open (memfd, POSIX shm, deleted tmpfs files,
/// each counted once). The second catches what no RSS shows: pages written
/// into a memfd and never mapped.
pub fn memory_bytes(pids: &[i32]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut private = 0u64;
    let mut mapped_shared = 0u64;
    let mut files: HashSet<(u64, u64)> = HashSet::new();
    let mut held = 0u64;
    for &pid in pids {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |field: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        private += (kib("RssAnon:") + kib("RssFile:")) << 10;
        mapped_shared += kib("RssShmem:") << 10;
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            let shared = target.starts_with("/memfd:") || target.starts_with("/dev/shm/");
            if !shared {
                continue;
            }
            if let Ok(meta) = fs::metadata(fd.path())
                && files.insert((meta.dev(), meta.ino()))
            {
                held += meta.blocks() * 512;
            }
        }
    }
    private + mapped_shared.max(held)
}

/// Bytes the tmpfs mounts at `mounts` hold inside a bwrap sandbox whose
/// first process is `holder` (seen through its root): memory that no
/// process's RSS shows.
pub fn tmpfs_bytes(holder: i32, mounts: &[PathBuf]) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    mounts
        .iter()
        .filter_map(|m| {
            let inside = format!("/proc/{holder}/root{}", m.display());
            let c = std::ffi::CString::new(Path::new(&inside).as_os_str().as_bytes()).ok()?;
            // SAFETY: statvfs fills the zeroed struct; `c` is NUL-terminated.
            unsafe {
                let mut st: libc::statvfs = std::mem::zeroed();
                if libc::statvfs(c.as_ptr(), &mut st) != 0 {
                    return None;
                }
                Some((st.f_blocks - st.f_bfree) as u64 * st.f_frsize as u64)
            }
        })
        .sum()
}

/// Bytes used under `dirs`, counting each inode once, without following
/// symlinks or leaving the file system.
pub fn disk_usage(dirs: &[PathBuf]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}

/// The host's size, to refuse limits larger than it.
pub struct HostSize {
    pub memory_mb: u64,
    pub cpus: u32,
    pub pid_max: u64,
    pub disk_mb: u64,
}

pub fn host_size(dir: &Path) -> HostSize {
    let memory_mb = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        })
        .map_or(u64::MAX, |kb| kb / 1024);
    let cpus = std::thread::available_parallelism().map_or(u32::MAX, |n| n.get() as u32);
    let pid_max = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(u64::MAX);
    let disk_mb = statvfs_total_mb(dir).unwrap_or(u64::MAX);
    HostSize {
        memory_mb,
        cpus,
        pid_max,
        disk_mb,
    }
}

fn statvfs_total_mb(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct; `c` is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some((st.f_blocks as u64 * st.f_frsize as u64) >> 20)
    }
}

/// The processes of a sandbox: marked with its id, in its pid namespace or
/// cgroups, and their descendants; never the caller.
pub fn members(id: &str, pid_ns: Option<u64>, cgroups: &[PathBuf]) -> Vec<Stat> {
    let marker = format!("{}={id}", super::store::MARKER_VAR).into_bytes();
    let in_cgroup = cgroup_members(cgroups);
    proctree::collect(|s| {
        in_cgroup.contains(&s.pid)
            || pid_ns.is_some_and(|ns| pid_namespace(s.pid) == Some(ns))
            || proctree::environ_has(s.pid, &marker)
    })
}

/// The inode of a process's pid namespace.
pub fn pid_namespace(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// How long freezing a sandbox may take before it is given up.
const FREEZE_WINDOW: Duration = Duration::from_secs(5);

/// The v2 cgroup whose `cgroup.freeze` holds all of the sandbox.
fn freezer(setup: &Setup) -> Option<PathBuf> {
    setup
        .cgroups
        .iter()
        .find(|c| c.join("cgroup.freeze").exists())
        .cloned()
}

fn cgroup_frozen(cgroup: &Path) -> bool {
    fs::read_to_string(cgroup.join("cgroup.events"))
        .is_ok_and(|e| e.lines().any(|l| l.trim() == "frozen 1"))
}

/// The sandbox's processes but its holder.
fn commands(id: &str, setup: &Setup) -> Vec<proctree::Stat> {
    let spared = [setup.holder.as_ref().map(|h| h.pid), setup.hold_pid];
    members(id, setup.pid_ns, &setup.cgroups)
        .into_iter()
        .filter(|s| !spared.contains(&Some(s.pid)))
        .collect()
}

pub fn freeze(id: &str, setup: &Setup) -> Result<(), String> {
    let deadline = Instant::now() + FREEZE_WINDOW;
    if let Some(cgroup) = freezer(setup) {
        fs::write(cgroup.join("cgroup.freeze"), "1").map_err(|e| e.to_string())?;
        while !cgroup_frozen(&cgroup) {
            if Instant::now() >= deadline {
                return Err("its cgroup did not freeze".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        return Ok(());
    }
    loop {
        let running: Vec<i32> = commands(id, setup)
            .into_iter()
            .filter(|s| !matches!(s.state, b'T' | b't' | b'Z' | b'X'))
            .map(|s| s.pid)
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("processes kept running: {running:?}"));
        }
        for pid in running {
            // SAFETY: plain syscall on a member of the sandbox.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn thaw(id: &str, setup: &Setup) {
    if let Some(cgroup) = freezer(setup) {
        let _ = fs::write(cgroup.join("cgroup.freeze"), "0");
        return;
    }
    for s in commands(id, setup) {
        // SAFETY: plain syscall on a member of the sandbox.
        unsafe { libc::kill(s.pid, libc::SIGCONT) };
    }
}
