//! Sandboxes: isolated, expiring places on this host that commands, jobs
//! and file requests can target (`Request::InSandbox`).
//!
//! - `store.rs`: the sandbox on disk and the paths a request may use in it.
//! - `isolation.rs`: the ladder (bwrap → Landlock + seccomp → none), probed.
//! - `limits.rs`: cgroups, or rlimits and what the keeper watches.
//! - `gpu_nodes.rs`: the device nodes of its leased GPUs.
//! - `egress.rs`: `allow_hosts`, through a proxy outside its network.
//! - `keeper.rs`: one process per sandbox that sets it up and ends it.
//! - `staging.rs`: what a root agent's holder sees before bwrap starts.
//! - `enter.rs`: how a command starts inside; `entry.rs`: the steps in,
//!   which a supervised exec also takes without `enter`.
//!
//! The job daemon creates sandboxes (it starts their keepers, and starts a
//! new keeper for a live sandbox whose keeper died); `serve` answers
//! list, renew, delete and the scoped requests straight from the files.
//!
//! Architecture invariant: every process a sandbox runs starts through
//! `outpost-agent enter` or [`entry::Entry`]'s steps (a supervised exec),
//! with the sandbox's marker in its environment, so
//! its keeper finds and ends it whatever rung applies; under bwrap all of
//! them also live in the holder's pid namespace, which dies with the keeper.

pub mod cgroup_entry;
pub mod checkpoint;
pub mod egress;
pub mod enter;
pub mod entry;
pub mod gpu_nodes;
pub mod isolation;
pub mod keeper;
pub mod lifecycle;
pub mod limits;
pub mod listening;
pub mod pause;
pub mod ports;
pub mod ruleset;
pub mod staging;
pub mod store;

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use outpost_protocol::limits::{MAX_SANDBOX_TTL_MS, MIN_SANDBOX_TTL_MS};
use outpost_protocol::{
    AgentError, ErrorKind, Isolation, Response, SandboxInfo, SandboxSpec, SandboxState,
};

use crate::statefile::{make_dir_all, now_unix, write_json};
use crate::{account, paths};
use store::{Dirs, Record, Setup, error};

/// How long a create waits for the keeper to set the sandbox up.
const SETUP_WAIT: Duration = Duration::from_secs(20);
/// How long a delete waits for the keeper to end the sandbox.
const END_WAIT: Duration = Duration::from_secs(10);
/// Records of ended sandboxes are kept this long for status queries.
const ENDED_KEPT: u64 = 24 * 3600;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long `serve` waits for the daemon to answer a `SandboxCreate`:
/// long enough for one create queued behind another, each taking up to
/// its setup wait, so the caller learns the name of what it made.
pub const CREATE_WAIT: Duration = Duration::from_secs(2 * SETUP_WAIT.as_secs() + 10);

fn validate(spec: &SandboxSpec, root: &Path) -> Result<(), AgentError> {
    let bad = |m: String| error(ErrorKind::BadRequest, m);
    if !(MIN_SANDBOX_TTL_MS..=MAX_SANDBOX_TTL_MS).contains(&spec.ttl_ms) {
        return Err(bad(format!(
            "ttl must be {} s to {} days",
            MIN_SANDBOX_TTL_MS / 1000,
            MAX_SANDBOX_TTL_MS / 86_400_000
        )));
    }
    if let Some(id) = &spec.id
        && !store::valid_id(id)
    {
        return Err(bad(format!(
            "invalid sandbox id {id:?}: 1 to 32 of a-z 0-9 -, not starting with -"
        )));
    }
    check_env(&spec.env)?;
    for entry in &spec.allow_hosts {
        egress::check_entry(entry).map_err(bad)?;
    }
    if let Some(uids) = spec.sandbox_uids {
        account::range(Some(uids)).map_err(bad)?;
    }
    if !spec.allow_hosts.is_empty() && spec.network {
        return Err(bad(
            "allow_hosts goes with network: false (network: true reaches everything)".into(),
        ));
    }
    let host = limits::host_size(root);
    let l = &spec.limits;
    let checks: [(&str, Option<u64>, u64, &str); 4] = [
        ("memory_mb", l.memory_mb, host.memory_mb, "MB of memory"),
        (
            "cpus",
            l.cpu_millis.map(u64::from),
            u64::from(host.cpus).saturating_mul(1000),
            "thousandths of a CPU",
        ),
        ("pids", l.pids.map(u64::from), host.pid_max, "pids"),
        ("disk_mb", l.disk_mb, host.disk_mb, "MB of disk"),
    ];
    for (name, value, max, unit) in checks {
        match value {
            Some(0) => return Err(bad(format!("limit {name} must be more than 0"))),
            Some(v) if v > max => {
                return Err(bad(format!(
                    "limit {name} is larger than this host ({max} {unit})"
                )));
            }
            _ => {}
        }
    }
    if spec.gpus > 64 {
        return Err(bad(format!("{} GPUs is more than any host has", spec.gpus)));
    }
    Ok(())
}

/// Environment variables a sandbox's command may be given: no `OUTPOST_`
/// names, which would unmark it or smuggle entries past `enter`.
pub fn check_env(env: &[(String, String)]) -> Result<(), AgentError> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(error(
                ErrorKind::BadRequest,
                format!("invalid environment variable {name:?}"),
            ));
        }
        if name.starts_with("OUTPOST_") {
            return Err(error(
                ErrorKind::BadRequest,
                format!("{name}: OUTPOST_ variables are the sandbox's own"),
            ));
        }
    }
    Ok(())
}

/// Serialises creates in the daemon, so the cap counts every sandbox.
static CREATING: Mutex<()> = Mutex::new(());

/// `SandboxCreate` in the daemon: checks everything it can before it makes
/// anything, makes the dirs and records, starts the keeper and waits until
/// the sandbox can run commands. On failure nothing is left behind.
pub fn create_in_daemon(spec: SandboxSpec) -> Result<SandboxInfo, AgentError> {
    let root = store::root()?;
    validate(&spec, &root)?;
    let rung = isolation::choose(spec.isolation).map_err(|m| error(ErrorKind::Unavailable, m))?;
    if !spec.allow_hosts.is_empty() && rung != Isolation::Bwrap {
        return Err(error(
            ErrorKind::Unavailable,
            format!(
                "allow_hosts needs bwrap (a network of its own, reached only through a proxy), and this sandbox would get {rung:?}; ask for isolation bwrap on a host that has it"
            ),
        ));
    }
    // The workspace rung cannot cut a sandbox off the network: refused
    // rather than answered as if it had.
    if !spec.network && rung == Isolation::None {
        return Err(error(
            ErrorKind::Unavailable,
            format!(
                "network: false needs bwrap or Landlock to hold, and this sandbox would have neither ({}); \
                 ask for network: true, or make an isolation rung available",
                isolation::why_unisolated(spec.isolation)
            ),
        ));
    }
    // Bounded: with the setup wait, well within what the caller waits.
    let _creating = {
        let deadline = Instant::now() + SETUP_WAIT;
        loop {
            match CREATING.try_lock() {
                Ok(guard) => break guard,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(error(
                        ErrorKind::Unavailable,
                        "other sandboxes are being created on this host; try again",
                    ));
                }
            }
        }
    };
    prune(&root);
    let live = store::all(&root)
        .iter()
        .filter(|d| d.end().is_none())
        .count();
    if spec.max_sandboxes > 0 && live >= spec.max_sandboxes as usize {
        return Err(error(
            ErrorKind::Unavailable,
            format!(
                "{live} sandboxes are live on this host, the most allowed (max_sandboxes_per_host); delete one"
            ),
        ));
    }
    // Picked under the create lock: the records read are every sandbox
    // that could hold a uid.
    let account = if rung != Isolation::None && account::needed() {
        let taken: Vec<u32> = store::all(&root)
            .iter()
            .filter_map(|d| Some(d.record()?.account?.uid))
            .collect();
        Some(
            account::pick(&taken, spec.sandbox_uids)
                .map_err(|m| error(ErrorKind::Unavailable, m))?,
        )
    } else {
        None
    };
    let dirs = claim(&root, spec.id.as_deref())?;
    let made = (|| -> std::io::Result<()> {
        for dir in [dirs.work(), dirs.home(), dirs.tmp(), dirs.meta()] {
            make_dir_all(&dir)?;
        }
        if let Some(account) = account {
            for dir in [dirs.work(), dirs.home(), dirs.tmp()] {
                account::give(&dir, account)?;
            }
            // Searchable, not readable: Landlock's commands reach their own
            // dirs by path (bwrap's holder has them staged).
            use std::os::unix::fs::PermissionsExt;
            for dir in [&root, &dirs.dir] {
                fs::set_permissions(dir, fs::Permissions::from_mode(0o711))?;
            }
        }
        dirs.set_expires_ms(now_ms() + spec.ttl_ms)?;
        let record = Record {
            spec: SandboxSpec {
                id: Some(dirs.id.clone()),
                ..spec.clone()
            },
            created_unix: now_unix(),
            account,
        };
        write_json(&dirs.meta().join(store::SPEC), &record, true)
    })();
    if let Err(e) = made {
        let _ = fs::remove_dir_all(&dirs.dir);
        return Err(error(
            ErrorKind::Internal,
            format!("cannot create {}: {e}", dirs.dir.display()),
        ));
    }
    if let Err(message) = launch(&dirs, false) {
        let _ = fs::remove_dir_all(&dirs.dir);
        return Err(error(ErrorKind::Unavailable, message));
    }
    dirs.info()
        .ok_or_else(|| error(ErrorKind::Internal, "the sandbox record vanished"))
}

/// Makes the sandbox's own directory: the given id, or a fresh one.
fn claim(root: &Path, id: Option<&str>) -> Result<Dirs, AgentError> {
    let mkdir = |dirs: &Dirs| {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new().mode(0o700).create(&dirs.dir)
    };
    if let Some(id) = id {
        let dirs = Dirs::new(root, id);
        return match mkdir(&dirs) {
            Ok(()) => Ok(dirs),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(error(
                ErrorKind::BadRequest,
                format!("a sandbox named {id} exists"),
            )),
            Err(e) => Err(error(
                ErrorKind::Internal,
                format!("cannot create {}: {e}", dirs.dir.display()),
            )),
        };
    }
    for _ in 0..64 {
        let dirs = Dirs::new(root, &store::generated_id());
        match mkdir(&dirs) {
            Ok(()) => return Ok(dirs),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(error(
                    ErrorKind::Internal,
                    format!("cannot create {}: {e}", dirs.dir.display()),
                ));
            }
        }
    }
    Err(error(ErrorKind::Internal, "no free sandbox id"))
}

/// Starts the sandbox's keeper; when not adopting, waits until it has set
/// the sandbox up (or says why it could not).
fn launch(dirs: &Dirs, adopt: bool) -> Result<(), String> {
    let exe = agent_exe()?;
    let mut cmd = Command::new(&exe);
    cmd.arg("keeper").arg(&dirs.dir);
    if adopt {
        cmd.arg("--adopt");
    }
    // stderr stays the daemon's log.
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut keeper = cmd
        .spawn()
        .map_err(|e| format!("cannot start the sandbox's keeper {}: {e}", exe.display()))?;
    let said = keeper.stdout.take();
    // Reaped as soon as it ends, so it is never mistaken for a live one.
    let reaper = std::thread::spawn(move || keeper.wait());
    if adopt {
        return Ok(());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        let ok = said.is_some_and(|mut s| s.read(&mut byte).is_ok_and(|n| n == 1));
        let _ = tx.send(ok);
    });
    match rx.recv_timeout(SETUP_WAIT) {
        Ok(true) => Ok(()),
        Ok(false) => {
            let _ = reaper.join();
            Err(fs::read_to_string(dirs.meta().join(store::SETUP_ERROR))
                .unwrap_or_else(|_| "the sandbox's keeper ended at once".into()))
        }
        Err(_) => {
            if let Some(keeper) = dirs.keeper() {
                // SAFETY: plain syscall on the keeper we started.
                unsafe { libc::kill(keeper.pid, libc::SIGTERM) };
            }
            Err(format!(
                "the sandbox was not set up within {} s",
                SETUP_WAIT.as_secs()
            ))
        }
    }
}

pub(crate) fn agent_exe() -> Result<PathBuf, String> {
    paths::running_exe()
        .filter(|p| p.is_file())
        .ok_or_else(|| "cannot find the agent binary".to_string())
}

/// Forgets sandboxes that ended more than a day ago: their records, and
/// their dirs unless they keep their files (those stay, unlisted).
fn prune(root: &Path) {
    let now = now_unix();
    for dirs in store::all(root) {
        let Some(end) = dirs.end() else {
            continue;
        };
        if now.saturating_sub(end.ended_unix) <= ENDED_KEPT {
            continue;
        }
        if end.kept_files {
            let _ = fs::remove_dir_all(dirs.meta());
        } else {
            let _ = fs::remove_dir_all(&dirs.dir);
        }
    }
}

/// The daemon's periodic look: a live sandbox whose keeper is gone gets a
/// new one (which ends it, if its time is up). Returns whether any sandbox
/// is live, so the daemon stays to watch.
pub fn supervise() -> bool {
    let Ok(root) = store::root() else {
        return false;
    };
    let mut any = false;
    for dirs in store::all(&root) {
        if dirs.end().is_some() {
            continue;
        }
        any = true;
        let keeper = dirs.keeper().filter(|k| k.alive());
        // A stopped keeper (SIGSTOP) enforces nothing: replace it.
        if let Some(k) = &keeper
            && crate::proctree::state_and_start(k.pid)
                .is_some_and(|(s, _)| matches!(s, b'T' | b't'))
        {
            // SAFETY: plain syscall on the process recorded as the keeper.
            unsafe { libc::kill(k.pid, libc::SIGKILL) };
            eprintln!(
                "outpost-agent daemon: sandbox {}'s keeper was stopped; replacing it",
                dirs.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let keeper_alive = dirs.keeper().is_some_and(|k| {
            k.alive()
                && !crate::proctree::state_and_start(k.pid)
                    .is_some_and(|(s, _)| matches!(s, b'T' | b't'))
        });
        let set_up = dirs.meta().join(store::SETUP).is_file();
        // A dir still being made has no setup and a keeper on its way; one
        // whose keeper died before setting it up is ended.
        let stale = dirs
            .record()
            .is_none_or(|r| now_unix().saturating_sub(r.created_unix) > 2 * SETUP_WAIT.as_secs());
        if !keeper_alive && !set_up && stale {
            eprintln!(
                "outpost-agent daemon: sandbox {} was never set up; ending it",
                dirs.id
            );
            keeper::end_here(&dirs, SandboxState::Failed);
            continue;
        }
        if !keeper_alive && set_up {
            eprintln!(
                "outpost-agent daemon: sandbox {}'s keeper is gone; starting another",
                dirs.id
            );
            if let Err(e) = launch(&dirs, true) {
                eprintln!("outpost-agent daemon: sandbox {}: {e}", dirs.id);
            }
        }
    }
    any
}

/// Whether any sandbox is live (the daemon must run to watch its keeper).
pub fn any_live() -> bool {
    store::root().is_ok_and(|root| store::all(&root).iter().any(|d| d.end().is_none()))
}

/// How limits would be enforced for this user here, for `diagnose`.
pub fn limits_probe() -> String {
    limits::probe()
}

pub fn list() -> Result<Response, AgentError> {
    // Nothing is created to list: where there is no directory there are no
    // sandboxes.
    let Some(root) = store::root_path() else {
        return Ok(Response::Sandboxes(Vec::new()));
    };
    let mut infos: Vec<SandboxInfo> = store::all(&root).iter().filter_map(Dirs::info).collect();
    infos.sort_by(|a, b| b.created_unix.cmp(&a.created_unix).then(b.id.cmp(&a.id)));
    Ok(Response::Sandboxes(infos))
}

pub fn renew(id: &str, ttl_ms: u64) -> Result<Response, AgentError> {
    if !(MIN_SANDBOX_TTL_MS..=MAX_SANDBOX_TTL_MS).contains(&ttl_ms) {
        return Err(error(
            ErrorKind::BadRequest,
            format!(
                "ttl must be {} s to {} days",
                MIN_SANDBOX_TTL_MS / 1000,
                MAX_SANDBOX_TTL_MS / 86_400_000
            ),
        ));
    }
    let dirs = Dirs::find(id)?;
    // The keeper decides to end under the same lock: a renew lands before
    // that decision (and counts) or finds the sandbox ending.
    let lock = lifecycle_lock(&dirs)?;
    ended_error(&dirs)?;
    if dirs.meta().join(store::DELETE).exists() {
        return Err(error(
            ErrorKind::BadRequest,
            format!("sandbox {id} is being deleted"),
        ));
    }
    dirs.set_expires_ms(now_ms() + ttl_ms)
        .map_err(|e| error(ErrorKind::Internal, format!("cannot renew {id}: {e}")))?;
    drop(lock);
    info(&dirs)
}

/// Holds the sandbox's lifecycle lock (see [`store::LIFECYCLE_LOCK`]).
pub(crate) fn lifecycle_lock(dirs: &Dirs) -> Result<fs::File, AgentError> {
    let failed = |e: String| error(ErrorKind::Internal, format!("sandbox {}: {e}", dirs.id));
    let file = crate::flock::open_private(&dirs.meta().join(store::LIFECYCLE_LOCK))
        .map_err(|e| failed(e.to_string()))?;
    match crate::flock::lock_within(&file, Duration::from_secs(5)) {
        Ok(true) => Ok(file),
        Ok(false) => Err(failed("its lifecycle lock is held".into())),
        Err(e) => Err(failed(e.to_string())),
    }
}

fn info(dirs: &Dirs) -> Result<Response, AgentError> {
    dirs.info().map(Response::Sandbox).ok_or_else(|| {
        error(
            ErrorKind::Internal,
            format!("cannot read sandbox {}", dirs.id),
        )
    })
}

/// Whether sandbox `id` is gone or ending (its code contexts with it).
pub fn has_ended(id: &str) -> bool {
    Dirs::find(id).map_or(true, |dirs| ended_error(&dirs).is_err())
}

fn ended_error(dirs: &Dirs) -> Result<(), AgentError> {
    match dirs.end() {
        None if dirs.meta().join(store::ENDING).exists() => Err(error(
            ErrorKind::BadRequest,
            format!("sandbox {} is ending", dirs.id),
        )),
        None => Ok(()),
        Some(end) => Err(error(
            ErrorKind::BadRequest,
            format!(
                "sandbox {} {}",
                dirs.id,
                match end.state {
                    SandboxState::Expired => "has expired",
                    SandboxState::Deleted => "was deleted",
                    _ => "has failed",
                }
            ),
        )),
    }
}

/// Ends the sandbox through its keeper, or here when the keeper is gone.
pub fn delete(id: &str) -> Result<Response, AgentError> {
    let dirs = Dirs::find(id)?;
    if dirs.end().is_none() {
        crate::statefile::write_atomic(&dirs.meta().join(store::DELETE), b"", false)
            .map_err(|e| error(ErrorKind::Internal, format!("cannot delete {id}: {e}")))?;
        dirs.nudge_keeper();
        let deadline = Instant::now() + END_WAIT;
        while dirs.end().is_none() {
            let keeper_alive = dirs.keeper().is_some_and(|k| k.alive());
            if !keeper_alive || Instant::now() >= deadline {
                keeper::end_here(&dirs, SandboxState::Deleted);
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    info(&dirs)
}

/// The sandbox roots one connection's file requests opened, kept open for
/// its life: a root keeps one name (`/proc/self/fd/N`, the directory
/// checked, whatever is renamed or linked later) for the appliers and
/// caches that key on it, as long as it is the same directory.
#[derive(Default)]
pub struct ConfinedRoots {
    open: Mutex<std::collections::HashMap<PathBuf, std::os::fd::OwnedFd>>,
    /// Replaced ones stay open, so their numbers never name another file
    /// while an applier may still hold them.
    retired: Mutex<Vec<std::os::fd::OwnedFd>>,
}

/// A root opened for one request: its name for the file engine, and the
/// descriptor behind that name when it lives only as long as the request.
pub struct OpenedRoot {
    pub name: String,
    _held: Option<std::os::fd::OwnedFd>,
}

impl ConfinedRoots {
    /// `raw` inside `scope`, as a root the file engine may open as given
    /// (see [`Scope::open_root`]). None: it does not exist. A root a
    /// request only reads is held for that request alone (reads of many
    /// files would otherwise keep a descriptor per directory); one that is
    /// written keeps its name for the connection, for its applier.
    pub fn resolve(
        &self,
        scope: &Scope,
        raw: &str,
        create: bool,
        written: bool,
    ) -> Result<Option<OpenedRoot>, AgentError> {
        use std::os::fd::AsRawFd;
        let Some((path, fd)) = scope.open_root(raw, create)? else {
            return Ok(None);
        };

        if !written {
            account::note_root(fd.as_raw_fd(), scope.account);
            return Ok(Some(OpenedRoot {
                name: format!("/proc/self/fd/{}", fd.as_raw_fd()),
                _held: Some(fd),
            }));
        }
        let identity = |fd: &std::os::fd::OwnedFd| {
            let meta = fs::File::from(fd.try_clone().ok()?).metadata().ok()?;
            use std::os::unix::fs::MetadataExt;
            Some((meta.dev(), meta.ino()))
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let number = match open.get(&path) {
            Some(old) if identity(old).is_some() && identity(old) == identity(&fd) => {
                old.as_raw_fd()
            }
            _ => {
                let number = fd.as_raw_fd();
                if let Some(old) = open.insert(path, fd) {
                    self.retired
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(old);
                }
                number
            }
        };
        account::note_root(number, scope.account);
        Ok(Some(OpenedRoot {
            name: format!("/proc/self/fd/{number}"),
            _held: None,
        }))
    }
}

/// A live sandbox, as a scoped request sees it.
#[derive(Debug, Clone)]
pub struct Scope {
    pub dirs: Dirs,
    spec: SandboxSpec,
    setup: Setup,
    account: Option<account::Account>,
}

impl Scope {
    /// The live sandbox `id`.
    pub fn of(id: &str) -> Result<Scope, AgentError> {
        let dirs = Dirs::find(id)?;
        ended_error(&dirs)?;
        let record = dirs
            .record()
            .ok_or_else(|| error(ErrorKind::Internal, format!("cannot read sandbox {id}")))?;
        let setup = dirs.setup().ok_or_else(|| {
            error(
                ErrorKind::Unavailable,
                format!("sandbox {id} is still being set up"),
            )
        })?;
        Ok(Scope {
            dirs,
            spec: record.spec,
            setup,
            account: record.account,
        })
    }

    /// Where a command starts: none or a relative path is in the work dir,
    /// `~` the sandbox's home; an absolute path is taken as the sandbox
    /// sees it.
    pub fn cwd(&self, raw: Option<&str>) -> Result<PathBuf, AgentError> {
        let path = match raw {
            None | Some("") => self.dirs.work(),
            Some("~") => self.dirs.home(),
            Some(raw) => match raw.strip_prefix("~/") {
                Some(rest) => self.dirs.home().join(rest),
                None if Path::new(raw).is_absolute() => PathBuf::from(raw),
                None => self.dirs.work().join(raw),
            },
        };
        // Taken lexically as the sandbox's path; `..` could leave it.
        if path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(error(
                ErrorKind::BadRequest,
                "cwd: `..` is not allowed in a sandbox",
            ));
        }
        Ok(path)
    }

    /// Whether `raw` names a regular file of the sandbox: its directory
    /// opened as a root is, the file itself is no link.
    pub fn is_plain_file(&self, raw: &str) -> bool {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let Ok(path) = store::confine(&self.dirs, raw) else {
            return false;
        };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        let Ok(Some((_, dir))) = self.open_root(&parent.to_string_lossy(), false) else {
            return false;
        };
        let Ok(name) = std::ffi::CString::new(name.as_bytes()) else {
            return false;
        };
        // SAFETY: fstatat fills the zeroed struct; `dir` is open.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            ) == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFREG
        }
    }

    /// A file request's root, opened inside the sandbox without following
    /// a symlink ([`store::open_beneath`]), made when `create`: its path
    /// and the descriptor naming it. None: it does not exist.
    pub fn open_root(
        &self,
        raw: &str,
        create: bool,
    ) -> Result<Option<(PathBuf, std::os::fd::OwnedFd)>, AgentError> {
        let path = store::confine(&self.dirs, raw)?;
        let base = [self.dirs.work(), self.dirs.home(), self.dirs.tmp()]
            .into_iter()
            .find(|b| path.starts_with(b))
            .ok_or_else(|| {
                error(
                    ErrorKind::BadRequest,
                    format!("{raw:?} is outside the sandbox"),
                )
            })?;
        // A root made is the sandbox's, and none is opened through anything
        // only root may search.
        Ok(store::open_beneath(&base, &path, create, self.account)?.map(|fd| (path, fd)))
    }

    /// Whether a path the sandbox sees is the same path on the host (not so
    /// for `/tmp` under bwrap).
    pub fn same_inside(&self, path: &Path) -> bool {
        self.setup.isolation != Isolation::Bwrap
            || path.starts_with(self.dirs.work())
            || path.starts_with(self.dirs.home())
    }

    /// `shell -c command` inside the sandbox, started in `cwd` (as the
    /// sandbox sees it), with a clean environment: the basics, the
    /// sandbox's own variables, then `env`. Nothing of the agent's
    /// environment (an SSH agent socket, tokens) passes.
    pub fn command(
        &self,
        shell: &Path,
        command: &str,
        cwd: &Path,
        env: &[(String, String)],
    ) -> Result<Command, String> {
        let shell = shell.to_string_lossy();
        self.program(&shell, &["-c", command], cwd, env)
    }

    /// Where its proxy's refusals stand before a command runs, when it has
    /// `allow_hosts`.
    pub fn egress_watermark(&self) -> Option<egress::Watermark> {
        (!self.spec.allow_hosts.is_empty()).then(|| egress::Watermark::of(&self.dirs.meta()))
    }

    /// The ports it listens on before a command runs, to name those the
    /// command opened; only a sandbox with a network of its own has them.
    pub fn listening(&self) -> Option<listening::Listening> {
        listening::Listening::of(&self.setup, self.spec.network)
    }

    /// The account (uid, gid) its commands run as, when it has one.
    pub fn account_ids(&self) -> Option<(u32, u32)> {
        self.account.map(|a| (a.uid, a.gid))
    }

    /// Whether its commands may reach the network.
    pub fn has_network(&self) -> bool {
        self.spec.network
    }

    /// What a command's environment is made of, in order (a later entry
    /// wins): the basics, the sandbox's own variables, then `env`.
    fn environment(&self, env: &[(String, String)]) -> Vec<(OsString, OsString)> {
        let mut carried: Vec<(OsString, OsString)> = Vec::new();
        for name in [
            "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME", "TZ",
        ] {
            if let Some(value) = std::env::var_os(name) {
                carried.push((name.into(), value));
            }
        }
        let tmp: OsString = if self.setup.isolation == Isolation::Bwrap {
            "/tmp".into()
        } else {
            self.dirs.tmp().into()
        };
        carried.push(("HOME".into(), self.dirs.home().into()));
        carried.push(("TMPDIR".into(), tmp));
        carried.push(("SHELL".into(), crate::paths::shell().into()));
        if !self.spec.allow_hosts.is_empty() {
            for (k, v) in egress::proxy_env() {
                carried.push((k.into(), v.into()));
            }
        }
        for (k, v) in self.spec.env.iter().chain(env) {
            carried.push((k.into(), v.into()));
        }
        // Last: the leased GPUs are the ones it gets, whatever it asked.
        if let Some(devices) = &self.setup.cuda_visible_devices {
            carried.push(("CUDA_VISIBLE_DEVICES".into(), devices.into()));
        }
        carried
    }

    /// `program args…` inside the sandbox, as [`Scope::command`] has it.
    pub fn program(
        &self,
        program: &str,
        args: &[&str],
        cwd: &Path,
        env: &[(String, String)],
    ) -> Result<Command, String> {
        self.dirs.may_start()?;
        let mut cmd = Command::new(agent_exe()?);
        cmd.arg("enter")
            .arg(&self.dirs.dir)
            .arg(cwd)
            .arg("--")
            .arg(program)
            .args(args)
            // The enter process itself starts where the host can see.
            .current_dir(self.dirs.work())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env(store::MARKER_VAR, &self.dirs.id);
        // Everything the command gets travels under loader-inert names;
        // later entries win, as `env` would have it.
        let carried = self.environment(env);
        for (i, (k, v)) in carried.into_iter().enumerate() {
            let mut entry = k;
            entry.push("=");
            entry.push(v);
            cmd.env(format!("{}{i}", store::CARRIED_VAR), entry);
        }
        Ok(cmd)
    }
}
