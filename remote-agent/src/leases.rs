//! GPU leases, kept on the host so that every agent (and so every controller)
//! sees them.
//!
//! The leases are one JSON object per line in `<state dir>/run/gpu-leases`
//! (see [`paths::state_dir`]). Every change happens under an exclusive `flock`
//! of `gpu-leases.lock` beside it and replaces the file by rename, so readers
//! never see half a file and need no lock.
//!
//! A lease belongs to one `serve` process, named by pid, start time and boot
//! id so that a recycled pid cannot keep a dead lease alive. A lease lives as
//! long as that process: leases of processes that are gone are dropped on
//! every change and ignored on every read, and `serve` releases its own
//! leases when it ends. That also covers SIGKILL and reboots.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outpost_protocol::{AgentError, ErrorKind, GpuInfo, GpuLease, GpuLeaseRequest, GpuReport};
use serde::{Deserialize, Serialize};

use crate::{gpu, paths, proctree};

/// How long a change waits for the lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const MIB: u64 = 1024 * 1024;

/// One line of the lease file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: String,
    pub indices: Vec<u32>,
    pub uuids: Vec<String>,
    pub holder_pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot.
    pub holder_start_time: u64,
    /// `/proc/sys/kernel/random/boot_id`; start times repeat across boots.
    #[serde(default)]
    pub holder_boot_id: String,
    pub created_unix: u64,
}

/// Whether this process ever took a lease, so that ending one that did not
/// touches no files.
static LEASED: AtomicBool = AtomicBool::new(false);

/// Reserves `req.count` GPUs for this process.
pub fn lease(req: &GpuLeaseRequest) -> Result<GpuLease, AgentError> {
    if req.count == 0 {
        return Err(error(ErrorKind::BadRequest, "count must be at least 1"));
    }
    let report = gpu::gpus().report();
    if report.gpus.is_empty() {
        return Err(no_gpus(&report));
    }
    let me = holder()?;
    LEASED.store(true, Ordering::Relaxed);
    change(|leases| {
        let chosen = choose(&report.gpus, leases, req)?;
        let lease = Lease {
            id: new_id(),
            indices: chosen.iter().map(|g| g.index).collect(),
            uuids: chosen.iter().map(|g| g.uuid.clone()).collect(),
            holder_pid: me.pid,
            holder_start_time: me.start_time,
            holder_boot_id: me.boot_id.clone(),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let granted = GpuLease {
            lease_id: lease.id.clone(),
            indices: lease.indices.clone(),
            uuids: lease.uuids.clone(),
        };
        leases.push(lease);
        Ok(granted)
    })?
}

/// Ends a live lease, whoever holds it (leases are per user, and the id is
/// only known to whoever got it).
pub fn release(id: &str) -> Result<(), AgentError> {
    change(|leases| {
        let before = leases.len();
        leases.retain(|l| l.id != id);
        if leases.len() == before {
            return Err(error(ErrorKind::BadRequest, format!("no such lease: {id}")));
        }
        Ok(())
    })?
}

/// Ends every lease of this process; for the end of `serve`.
pub fn release_own() {
    if !LEASED.load(Ordering::Relaxed) {
        return;
    }
    let Ok(me) = holder() else {
        return;
    };
    if let Err(e) = change(|leases| leases.retain(|l| !me.holds(l))) {
        // The leases still end with this process, by the liveness rule.
        eprintln!("outpost-agent: cannot release GPU leases: {}", e.message);
    }
}

/// The live leases, read without locking.
pub fn live() -> Vec<Lease> {
    let Some(file) = lease_file() else {
        return Vec::new();
    };
    let mut leases = read(&file);
    leases.retain(is_live);
    leases
}

/// Fills each GPU's `lease` with the live lease holding it.
pub fn annotate(gpus: &mut [GpuInfo], leases: &[Lease]) {
    for gpu in gpus {
        gpu.lease = holder_of(gpu, leases).map(|l| l.id.clone());
    }
}

fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError {
        kind,
        message: message.into(),
    }
}

fn no_gpus(report: &GpuReport) -> AgentError {
    let message = if report.failed {
        format!("the GPUs cannot be read: {}", report.problems.join("; "))
    } else {
        "no NVIDIA GPU on this host".to_string()
    };
    error(ErrorKind::Unavailable, message)
}

/// Picks the least used qualifying GPUs (memory used, then utilisation),
/// returned in index order, or says why there are too few.
fn choose<'a>(
    gpus: &'a [GpuInfo],
    leases: &[Lease],
    req: &GpuLeaseRequest,
) -> Result<Vec<&'a GpuInfo>, AgentError> {
    let mut free = Vec::new();
    let mut reasons = Vec::new();
    for gpu in gpus {
        let available = gpu.mem_total_bytes.saturating_sub(gpu.mem_used_bytes);
        if let Some(lease) = holder_of(gpu, leases) {
            reasons.push(format!("GPU {} is leased by {}", gpu.index, lease.id));
        } else if available < req.min_free_mem_bytes {
            reasons.push(format!(
                "GPU {} has only {} MiB free (need {} MiB)",
                gpu.index,
                available / MIB,
                req.min_free_mem_bytes.div_ceil(MIB)
            ));
        } else {
            free.push(gpu);
        }
    }
    let wanted = req.count as usize;
    if free.len() < wanted {
        let plural = |n: usize, one: &str, many: &str| {
            if n == 1 {
                one.to_string()
            } else {
                many.to_string()
            }
        };
        let mut message = format!(
            "{wanted} {} requested, {} {}",
            plural(wanted, "GPU", "GPUs"),
            free.len(),
            plural(free.len(), "qualifies", "qualify"),
        );
        if gpus.len() < wanted {
            message.push_str(&format!(" (this host has {})", gpus.len()));
        }
        if !reasons.is_empty() {
            message.push_str(": ");
            message.push_str(&reasons.join("; "));
        }
        return Err(error(ErrorKind::Unavailable, message));
    }
    free.sort_by_key(|g| (g.mem_used_bytes, g.util_pct.unwrap_or(0), g.index));
    free.truncate(wanted);
    free.sort_by_key(|g| g.index);
    Ok(free)
}

/// The lease holding `gpu`: matched by UUID, by index where a UUID is unknown.
fn holder_of<'a>(gpu: &GpuInfo, leases: &'a [Lease]) -> Option<&'a Lease> {
    leases.iter().find(|l| {
        l.indices.iter().enumerate().any(|(i, &index)| {
            match l.uuids.get(i).filter(|u| !u.is_empty()) {
                Some(uuid) if !gpu.uuid.is_empty() => *uuid == gpu.uuid,
                _ => index == gpu.index,
            }
        })
    })
}

fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("gl-{}-{n}-{millis:x}", std::process::id())
}

/// What names a process across pid reuse.
#[derive(Debug, Clone)]
struct Holder {
    pid: u32,
    start_time: u64,
    boot_id: String,
}

impl Holder {
    fn holds(&self, lease: &Lease) -> bool {
        lease.holder_pid == self.pid
            && lease.holder_start_time == self.start_time
            && lease.holder_boot_id == self.boot_id
    }
}

fn holder() -> Result<Holder, AgentError> {
    static ME: OnceLock<Option<Holder>> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        let (_, start_time) = stat_of(pid)?;
        Some(Holder {
            pid,
            start_time,
            boot_id: boot_id(),
        })
    })
    .clone()
    .ok_or_else(|| error(ErrorKind::Internal, "cannot read /proc/self/stat"))
}

fn boot_id() -> String {
    proctree::boot_id().to_string()
}

/// State and start time of a process.
fn stat_of(pid: u32) -> Option<(u8, u64)> {
    proctree::state_and_start(pid as i32)
}

fn is_live(lease: &Lease) -> bool {
    let boot = proctree::boot_id();
    if !lease.holder_boot_id.is_empty() && !boot.is_empty() && lease.holder_boot_id != boot {
        return false;
    }
    match stat_of(lease.holder_pid) {
        // A zombie holder is dead; only its parent has not noticed yet.
        Some((state, start)) => start == lease.holder_start_time && !proctree::is_dead_state(state),
        None => false,
    }
}

fn lease_file() -> Option<PathBuf> {
    paths::state_dir().map(|d| d.join("run").join("gpu-leases"))
}

/// Lines that do not parse are skipped: one bad line must not drop, or block,
/// everyone else's leases.
fn read(file: &std::path::Path) -> Vec<Lease> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Runs `f` on the live leases under the lock and saves what it leaves, if
/// anything changed.
fn change<T>(f: impl FnOnce(&mut Vec<Lease>) -> T) -> Result<T, AgentError> {
    let internal =
        |what: &str, e: std::io::Error| error(ErrorKind::Internal, format!("{what}: {e}"));
    let file = lease_file().ok_or_else(|| {
        error(
            ErrorKind::Internal,
            "no state directory ($HOME unset and no passwd entry)",
        )
    })?;
    let dir = file.parent().expect("lease file has a parent");
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| internal(&format!("cannot create {}", dir.display()), e))?;
    let lock_path = dir.join("gpu-leases.lock");
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| internal(&format!("cannot open {}", lock_path.display()), e))?;
    lock_exclusive(&lock)?;

    let stored = read(&file);
    let mut leases = stored.clone();
    leases.retain(is_live);
    let result = f(&mut leases);
    if leases != stored {
        write(&file, &leases)
            .map_err(|e| internal(&format!("cannot write {}", file.display()), e))?;
    }
    // Dropping `lock` closes it, which releases the flock.
    Ok(result)
}

fn lock_exclusive(lock: &File) -> Result<(), AgentError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK)
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            return Err(error(
                ErrorKind::Internal,
                format!("cannot lock the lease file: {e}"),
            ));
        }
        if Instant::now() >= deadline {
            return Err(error(
                ErrorKind::Internal,
                "the lease file stayed locked by another process for 5 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Replaces the file by rename. No fsync: a crash that loses the file also
/// ends every process that held a lease in it.
fn write(file: &std::path::Path, leases: &[Lease]) -> std::io::Result<()> {
    let mut text = String::new();
    for lease in leases {
        text.push_str(&serde_json::to_string(lease).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    let tmp = file.with_file_name(format!(".gpu-leases.{}.tmp", std::process::id()));
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    out.write_all(text.as_bytes())?;
    drop(out);
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, used_mib: u64, util: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            mem_used_bytes: used_mib * MIB,
            mem_total_bytes: 1000 * MIB,
            util_pct: Some(util),
            ..Default::default()
        }
    }

    fn lease_of(id: &str, index: u32) -> Lease {
        Lease {
            id: id.into(),
            indices: vec![index],
            uuids: vec![format!("GPU-{index}")],
            holder_pid: 1,
            holder_start_time: 0,
            holder_boot_id: String::new(),
            created_unix: 0,
        }
    }

    fn req(count: u32, min_free_mib: u64) -> GpuLeaseRequest {
        GpuLeaseRequest {
            count,
            min_free_mem_bytes: min_free_mib * MIB,
        }
    }

    #[test]
    fn least_used_first_in_index_order() {
        let gpus = [
            gpu(0, 500, 0),
            gpu(1, 10, 50),
            gpu(2, 10, 5),
            gpu(3, 900, 0),
        ];
        let pick = |n| -> Vec<u32> {
            choose(&gpus, &[], &req(n, 0))
                .unwrap()
                .iter()
                .map(|g| g.index)
                .collect()
        };
        assert_eq!(pick(1), [2]);
        assert_eq!(pick(2), [1, 2]);
        assert_eq!(pick(3), [0, 1, 2]);
    }

    #[test]
    fn too_few_says_why() {
        let gpus = [gpu(0, 500, 0), gpu(1, 10, 0), gpu(2, 950, 0)];
        let leases = [lease_of("gl-x", 1)];
        let e = choose(&gpus, &leases, &req(2, 100)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert_eq!(
            e.message,
            "2 GPUs requested, 1 qualifies: GPU 1 is leased by gl-x; \
             GPU 2 has only 50 MiB free (need 100 MiB)"
        );
        let e = choose(&gpus, &[], &req(4, 0)).unwrap_err();
        assert_eq!(e.message, "4 GPUs requested, 3 qualify (this host has 3)");
    }

    #[test]
    fn stat_fields() {
        let me = std::process::id();
        let (state, start) = stat_of(me).unwrap();
        assert!(matches!(state, b'R' | b'S'));
        assert!(start > 0);
        let mut l = lease_of("a", 0);
        l.holder_pid = me;
        l.holder_start_time = start;
        l.holder_boot_id = boot_id();
        assert!(is_live(&l));
        l.holder_start_time += 1;
        assert!(!is_live(&l));
    }
}
