//! GPU leases, kept in one table per host, so that every agent of every user
//! (and so every controller, whatever its remote dir) sees them.
//!
//! The table is a directory all users share: `$OUTPOST_GPU_LEASE_DIR`, else
//! `/tmp/outpost-gpu-leases`. Like `/tmp` it is sticky and world-writable
//! (1777): everyone may add leases, and only remove their own. Each lease is
//! one file, `<lease id>.lease` (JSON, 0644), owned by the user who took it.
//! Every change happens under an exclusive `flock` of `lock` in the
//! directory, which everyone opens read-only (a lock needs no write
//! access), so two users can never take the same GPU. A lease file is
//! written aside and linked into place, so readers, who take no lock, never
//! see half of one.
//!
//! A lease belongs to one `serve` process, named by pid, start time and boot
//! id so that a recycled pid cannot keep a dead lease alive, and that
//! process must run as the file's owner, so nobody can make a lease outlive
//! their own processes (by naming init as its holder, say). A lease lives as
//! long as its holder: `serve` releases its own leases when it ends, and a
//! dead holder's file is ignored by everyone and removed by its own user at
//! their next change (in a sticky directory nobody else can). That also
//! covers SIGKILL and reboots.
//!
//! The directory is used only while it is a real directory, sticky and
//! world-writable, owned by root or by this user: any other owner could
//! remove or fake everyone's leases. Anything else is refused with an error
//! that says so; there is no fallback to a weaker table. The first user to
//! lease creates the directory, so on a host shared by several users an
//! administrator creates it once, owned by root (see the error's advice).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outpost_protocol::{AgentError, ErrorKind, GpuInfo, GpuLease, GpuLeaseRequest, GpuReport};
use serde::{Deserialize, Serialize};

use crate::{flock, gpu, proctree};

/// Names the table's directory, for tests and for hosts that want it
/// elsewhere.
pub const DIR_VAR: &str = "OUTPOST_GPU_LEASE_DIR";
const DEFAULT_DIR: &str = "/tmp/outpost-gpu-leases";
const LOCK_FILE: &str = "lock";
const LEASE_SUFFIX: &str = ".lease";
/// Larger lease files are not ours to read.
const MAX_LEASE_FILE: u64 = 64 * 1024;
/// How long a change waits for the lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const MIB: u64 = 1024 * 1024;

/// One lease file.
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
    let table = Table::open(true)?;
    let _lock = table.lock()?;
    let leases: Vec<Lease> = table
        .read()
        .into_iter()
        .filter_map(|stored| table.live_or_clean(stored))
        .collect();
    let chosen = choose(&report.gpus, &leases, req)?;
    LEASED.store(true, Ordering::Relaxed);
    let mut lease = Lease {
        id: String::new(),
        indices: chosen.iter().map(|g| g.index).collect(),
        uuids: chosen.iter().map(|g| g.uuid.clone()).collect(),
        holder_pid: me.pid,
        holder_start_time: me.start_time,
        holder_boot_id: me.boot_id.clone(),
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    // An id is taken by linking its file into place; one somebody else
    // took (or planted) is skipped.
    let mut tries = 0;
    loop {
        lease.id = new_id();
        match table.write(&lease) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 10 => tries += 1,
            Err(e) => {
                return Err(table.internal(&format!("cannot write lease {}", lease.id), e));
            }
        }
    }
    Ok(GpuLease {
        lease_id: lease.id,
        indices: lease.indices,
        uuids: lease.uuids,
    })
}

/// Ends a live lease of this user (the id is only known to whoever got it,
/// and a lease of another user is not ours to end).
pub fn release(id: &str) -> Result<(), AgentError> {
    let no_such = || error(ErrorKind::BadRequest, format!("no such lease: {id}"));
    if !valid_id(id) || !table_dir().exists() {
        return Err(no_such());
    }
    let table = Table::open(false)?;
    let _lock = table.lock()?;
    let Some(stored) = table.read_one(&table.dir.join(format!("{id}{LEASE_SUFFIX}"))) else {
        return Err(no_such());
    };
    if stored.owner != my_uid() {
        return Err(error(
            ErrorKind::BadRequest,
            format!("lease {id} belongs to another user (uid {})", stored.owner),
        ));
    }
    let live = stored.is_live();
    table.remove(&stored);
    if live { Ok(()) } else { Err(no_such()) }
}

/// Ends every lease of this process; for the end of `serve`.
pub fn release_own() {
    if !LEASED.load(Ordering::Relaxed) {
        return;
    }
    let Ok(me) = holder() else {
        return;
    };
    let ended = Table::open(false).and_then(|table| {
        let _lock = table.lock()?;
        for stored in table.read() {
            if stored.owner == my_uid() && me.holds(&stored.lease) {
                table.remove(&stored);
            }
        }
        Ok(())
    });
    if let Err(e) = ended {
        // The leases still end with this process, by the liveness rule.
        eprintln!("outpost-agent: cannot release GPU leases: {}", e.message);
    }
}

/// The live leases, read without locking; none when the table is missing
/// or refused (a lease then fails and says why).
pub fn live() -> Vec<Lease> {
    let Ok(table) = Table::open(false) else {
        return Vec::new();
    };
    table
        .read()
        .into_iter()
        .filter(Stored::is_live)
        .map(|s| s.lease)
        .collect()
}

/// Where the table is, and what is wrong with it if it cannot be used: for
/// `diagnose`.
pub fn table_status() -> (PathBuf, Result<(), String>) {
    let dir = table_dir();
    let status = match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        _ => Table::open(false).map(drop).map_err(|e| e.message),
    };
    (dir, status)
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

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

fn boot_id() -> String {
    proctree::boot_id().to_string()
}

/// State and start time of a process.
fn stat_of(pid: u32) -> Option<(u8, u64)> {
    proctree::state_and_start(pid as i32)
}

/// The real uid a process runs as (`Uid:` in `/proc/<pid>/status`).
fn uid_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
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

/// Lease ids as this agent makes them (`gl-<pid>-<n>-<hex>`); anything else
/// could name a path outside the table.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn table_dir() -> PathBuf {
    std::env::var_os(DIR_VAR)
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// A lease file as found: the lease, and who owns the file.
struct Stored {
    lease: Lease,
    owner: u32,
    path: PathBuf,
}

impl Stored {
    /// The holder lives, and runs as the user who owns the file.
    fn is_live(&self) -> bool {
        is_live(&self.lease) && uid_of(self.lease.holder_pid) == Some(self.owner)
    }
}

/// The lease table: a checked directory.
struct Table {
    dir: PathBuf,
}

impl Table {
    /// The table's directory, checked (see the module docs), and created
    /// when `create` and it is missing.
    fn open(create: bool) -> Result<Table, AgentError> {
        let dir = table_dir();
        let refuse = |why: String| {
            error(
                ErrorKind::Unavailable,
                format!("the GPU lease table {} is not used: {why}", dir.display()),
            )
        };
        let meta = match fs::symlink_metadata(&dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                // Made private first, opened to all once complete.
                match DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => {
                        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).map_err(
                            |e| internal(&format!("cannot open up {}", dir.display()), e),
                        )?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(internal(&format!("cannot create {}", dir.display()), e));
                    }
                }
                fs::symlink_metadata(&dir)
                    .map_err(|e| internal(&format!("cannot inspect {}", dir.display()), e))?
            }
            Err(e) => return Err(internal(&format!("cannot inspect {}", dir.display()), e)),
        };
        if meta.file_type().is_symlink() {
            return Err(refuse("it is a symbolic link".into()));
        }
        if !meta.is_dir() {
            return Err(refuse("it is not a directory".into()));
        }
        let me = my_uid();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(refuse(format!(
                "it belongs to uid {}, who could remove or fake anyone's leases; \
                 an administrator can make it shared with `chown root: {}` \
                 (or point {DIR_VAR} elsewhere)",
                meta.uid(),
                dir.display()
            )));
        }
        if meta.mode() & 0o1777 != 0o1777 {
            if meta.uid() != me {
                return Err(refuse(format!(
                    "its mode is {:o}, not 1777 (sticky, open to every user); \
                     an administrator can fix it with `chmod 1777 {}`",
                    meta.mode() & 0o7777,
                    dir.display()
                )));
            }
            // Ours, and left narrower (a umask, an older agent): open it up.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777))
                .map_err(|e| internal(&format!("cannot open up {}", dir.display()), e))?;
        }
        Ok(Table { dir })
    }

    fn internal(&self, what: &str, e: io::Error) -> AgentError {
        internal(&format!("{what} in {}", self.dir.display()), e)
    }

    /// Takes the table's lock; held until the file is dropped. The lock file
    /// is opened read-only, so whoever created it, everyone can lock it.
    fn lock(&self) -> Result<File, AgentError> {
        let path = self.dir.join(LOCK_FILE);
        let open = || {
            OpenOptions::new()
                .read(true)
                // Neither a planted symlink nor a FIFO (which would block).
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
        };
        let lock = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&path)
                {
                    Ok(f) => {
                        // Readable by everyone whatever the umask.
                        let _ = f.set_permissions(fs::Permissions::from_mode(0o644));
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(self.internal("cannot create the lock", e)),
                }
                open()
            }
            other => other,
        }
        .map_err(|e| self.internal("cannot open the lock", e))?;
        if !lock.metadata().is_ok_and(|m| m.is_file()) {
            return Err(error(
                ErrorKind::Unavailable,
                format!("{} is not a regular file", path.display()),
            ));
        }
        if flock::lock_within(&lock, LOCK_WAIT)
            .map_err(|e| self.internal("cannot lock the lease table", e))?
        {
            return Ok(lock);
        }
        Err(error(
            ErrorKind::Unavailable,
            format!(
                "the GPU lease table {} stayed locked by another process for 5 s",
                self.dir.display()
            ),
        ))
    }

    /// Every lease file that parses. A file that does not, or that is not
    /// what a lease file is, is skipped: one bad file must not drop, or
    /// block, everyone else's leases.
    fn read(&self) -> Vec<Stored> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(LEASE_SUFFIX))
            })
            .filter_map(|e| self.read_one(&e.path()))
            .collect()
    }

    fn read_one(&self, path: &Path) -> Option<Stored> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() > MAX_LEASE_FILE {
            return None;
        }
        let mut text = Vec::new();
        file.take(MAX_LEASE_FILE).read_to_end(&mut text).ok()?;
        let lease: Lease = serde_json::from_slice(&text).ok()?;
        // The name is the id: nobody can pass a file off as another lease.
        let name = path.file_name()?.to_str()?;
        if name.strip_suffix(LEASE_SUFFIX) != Some(lease.id.as_str()) {
            return None;
        }
        Some(Stored {
            lease,
            owner: meta.uid(),
            path: path.to_path_buf(),
        })
    }

    /// The lease of a live holder; a dead holder's file is removed if it is
    /// this user's (others cannot remove it, and ignore it).
    fn live_or_clean(&self, stored: Stored) -> Option<Lease> {
        if stored.is_live() {
            return Some(stored.lease);
        }
        if stored.owner == my_uid() {
            self.remove(&stored);
        }
        None
    }

    fn remove(&self, stored: &Stored) {
        if let Err(e) = fs::remove_file(&stored.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            eprintln!(
                "outpost-agent: cannot remove {}: {e}",
                stored.path.display()
            );
        }
    }

    /// Writes `lease` aside, then links it into place: readers see the whole
    /// file or none, and an existing file (whoever made it) is never
    /// replaced. Called under the lock, so a temp file is never shared.
    fn write(&self, lease: &Lease) -> io::Result<()> {
        let text = serde_json::to_vec(lease).map_err(io::Error::other)?;
        let path = self.dir.join(format!("{}{LEASE_SUFFIX}", lease.id));
        let tmp = self.dir.join(format!(".{}.tmp", lease.id));
        let result = (|| {
            let mut out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            // Readable by every user's agent whatever the umask.
            out.set_permissions(fs::Permissions::from_mode(0o644))?;
            out.write_all(&text)?;
            drop(out);
            fs::hard_link(&tmp, &path)
        })();
        let _ = fs::remove_file(&tmp);
        result
    }
}

fn internal(what: &str, e: io::Error) -> AgentError {
    error(ErrorKind::Internal, format!("{what}: {e}"))
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
