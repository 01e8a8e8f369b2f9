//! A sandbox on disk: `<state>/sandboxes/<id>/{work,home,tmp,meta}`.
//!
//! `meta/` is the truth every process reads: `spec.json` (what was asked,
//! written once), `expires` (unix milliseconds, rewritten by a renew),
//! `setup.json` (what the keeper made of it: isolation, limits, holder),
//! `keeper.json` (the keeper process), `delete` (asked to end),
//! `end.json` (how it ended), `paused.json` and `frozen` (its commands
//! frozen) and `checkpoints/`. Nothing else of the sandbox lives elsewhere
//! except its cgroups and GPU lease, both named in `setup.json`.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use outpost_protocol::{AgentError, ErrorKind, Isolation, SandboxInfo, SandboxSpec, SandboxState};
use serde::{Deserialize, Serialize};

use crate::paths;
use crate::statefile::{self, ProcId, read_json};

pub const SPEC: &str = "spec.json";
pub const EXPIRES: &str = "expires";
pub const SETUP: &str = "setup.json";
pub const KEEPER: &str = "keeper.json";
pub const KEEPER_LOCK: &str = "keeper.lock";
pub const DELETE: &str = "delete";
pub const END: &str = "end.json";
/// Paused by `SandboxPause` (see [`super::pause`]); `frozen`: frozen for a
/// checkpoint, restore or fork.
pub const PAUSED: &str = "paused.json";
pub const FROZEN: &str = "frozen";
/// `ports/<port>.want` (asked for) and `ports/<port>.path` (where its
/// socket listens; see [`super::ports`]).
pub const PORTS: &str = "ports";
/// Sent to the keeper so it looks at once rather than at its next tick.
pub const NUDGE: libc::c_int = libc::SIGUSR1;
/// One folder per checkpoint, `<n>/{tree,info.json}` (see
/// [`super::checkpoint`]).
pub const CHECKPOINTS: &str = "checkpoints";
/// Written by the keeper, under [`LIFECYCLE_LOCK`], before it ends the
/// sandbox: from then on nothing new starts in it and a renew is refused.
pub const ENDING: &str = "ending";
/// Serialises the keeper's decision to end with a renew.
pub const LIFECYCLE_LOCK: &str = "lifecycle.lock";
/// Environment variables of a command, carried to `enter` under names no
/// dynamic loader reads (`OUTPOST_ENV_<n>=NAME=value`): `enter` itself runs
/// on the host, so `LD_LIBRARY_PATH` and the like must reach only the
/// command it becomes.
pub const CARRIED_VAR: &str = "OUTPOST_ENV_";
/// Why the keeper could not set the sandbox up.
pub const SETUP_ERROR: &str = "setup-error";

/// Names every process of a sandbox (`OUTPOST_SANDBOX=<id>`): the keeper
/// finds them by it when no namespace or cgroup holds them all.
pub const MARKER_VAR: &str = "OUTPOST_SANDBOX";

pub fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    statefile::error(kind, message)
}

/// `spec.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub spec: SandboxSpec,
    pub created_unix: u64,
    /// Who its commands and file requests act as, when the agent is root
    /// (see [`crate::account`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<crate::account::Account>,
}

/// `setup.json`, written by the keeper once the sandbox can run commands.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Setup {
    pub isolation: Isolation,
    /// How each limit is enforced, for people.
    pub enforcement: String,
    /// What the isolation lacks compared with bubblewrap, if anything.
    pub note: Option<String>,
    /// The bwrap sandbox's first process (pid 1 inside), whose namespaces
    /// commands enter.
    pub holder: Option<ProcId>,
    /// The holder's `hold` process under it.
    pub hold_pid: Option<i32>,
    /// The holder's pid namespace (inode), to find every process in it.
    pub pid_ns: Option<u64>,
    /// Cgroup directories every command joins (one per v1 hierarchy).
    pub cgroups: Vec<PathBuf>,
    /// Limits left to the keeper's watchdog.
    pub watch_memory_mb: Option<u64>,
    pub watch_disk_mb: Option<u64>,
    /// `RLIMIT_NPROC` set in each command (bwrap only: counted per user
    /// namespace there).
    pub nproc: Option<u64>,
    pub lease_id: Option<String>,
    pub gpus: Vec<u32>,
    /// Their UUIDs, in the same order (empty where unknown).
    #[serde(default)]
    pub gpu_uuids: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES` for commands, when GPUs are leased.
    pub cuda_visible_devices: Option<String>,
    /// The host paths hidden from it (the real home, the agent's state),
    /// found by the keeper: commands start with the sandbox's own HOME.
    pub hidden: Vec<PathBuf>,
}

/// `end.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct End {
    pub state: SandboxState,
    pub ended_unix: u64,
    pub note: Option<String>,
    pub kept_files: bool,
}

/// `<state>/sandboxes`, without creating it.
pub fn root_path() -> Option<PathBuf> {
    paths::state_dir().map(|s| s.join("sandboxes"))
}

/// `<state>/sandboxes`, created (0700) if missing.
pub fn root() -> Result<PathBuf, AgentError> {
    statefile::state_subdir("sandboxes")
}

/// Whether `id` may name a sandbox: `[a-z0-9][a-z0-9-]{0,31}`.
pub fn valid_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 32
        && bytes[0] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// `sbx-` and four random hex digits.
pub fn generated_id() -> String {
    let mut bytes = [0u8; 2];
    if fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        bytes = [(nanos >> 8) as u8, nanos as u8 ^ std::process::id() as u8];
    }
    format!("sbx-{:02x}{:02x}", bytes[0], bytes[1])
}

/// One sandbox's directories.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub id: String,
    pub dir: PathBuf,
}

impl Dirs {
    pub fn new(root: &Path, id: &str) -> Dirs {
        Dirs {
            id: id.to_string(),
            dir: root.join(id),
        }
    }

    /// The sandbox `id`, which must exist.
    pub fn find(id: &str) -> Result<Dirs, AgentError> {
        if !valid_id(id) {
            return Err(error(
                ErrorKind::BadRequest,
                format!("invalid sandbox id {id:?}: [a-z0-9-], at most 32"),
            ));
        }
        let dirs = Dirs::new(&root()?, id);
        if !dirs.meta().join(SPEC).is_file() {
            return Err(error(ErrorKind::BadRequest, format!("no sandbox {id}")));
        }
        Ok(dirs)
    }

    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }
    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }
    pub fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    pub fn meta(&self) -> PathBuf {
        self.dir.join("meta")
    }
    /// Its jobs' logs: outside what it sees (the shim writes them from
    /// outside), inside its disk limit, and gone with its files.
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    pub fn record(&self) -> Option<Record> {
        read_json(&self.meta().join(SPEC))
    }
    pub fn setup(&self) -> Option<Setup> {
        read_json(&self.meta().join(SETUP))
    }
    pub fn end(&self) -> Option<End> {
        read_json(&self.meta().join(END))
    }
    pub fn keeper(&self) -> Option<ProcId> {
        read_json(&self.meta().join(KEEPER))
    }

    /// Ended, or being ended.
    pub fn ending(&self) -> bool {
        self.meta().join(ENDING).exists() || self.meta().join(END).exists()
    }

    /// Unix milliseconds at which it expires.
    pub fn expires_ms(&self) -> Option<u64> {
        fs::read_to_string(self.meta().join(EXPIRES))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn set_expires_ms(&self, at: u64) -> io::Result<()> {
        statefile::write_atomic(&self.meta().join(EXPIRES), at.to_string().as_bytes(), true)
    }

    /// What a client sees of it.
    pub fn info(&self) -> Option<SandboxInfo> {
        let record = self.record()?;
        let setup = self.setup().unwrap_or_default();
        let end = self.end();
        let state = match &end {
            Some(end) => end.state,
            None if self.meta().join(PAUSED).exists() => SandboxState::Paused,
            None => SandboxState::Running,
        };
        let note = end
            .as_ref()
            .and_then(|e| e.note.clone())
            .or_else(|| setup.note.clone());
        Some(SandboxInfo {
            id: self.id.clone(),
            state,
            created_unix: record.created_unix,
            expires_unix: self.expires_ms().unwrap_or(0) / 1000,
            isolation: setup.isolation,
            network: record.spec.network,
            limits: record.spec.limits.clone(),
            enforcement: setup.enforcement.clone(),
            gpus: setup.gpus.clone(),
            work_dir: self.work().to_string_lossy().into_owned(),
            kept_files: end.as_ref().is_some_and(|e| e.kept_files),
            ports: if end.is_some() {
                Vec::new()
            } else {
                self.exposed_ports()
            },
            note,
        })
    }
}

/// How long a new command waits out a checkpoint's freeze.
const THAW_WAIT: Duration = Duration::from_secs(60);

/// `meta/paused.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Paused {
    pub since_ms: u64,
    /// The TTL waits while paused: this much was left.
    pub remaining_ms: Option<u64>,
}

impl Dirs {
    /// The ports its keeper serves now.
    pub fn exposed_ports(&self) -> Vec<u16> {
        let mut out: Vec<u16> = fs::read_dir(self.meta().join(PORTS))
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.strip_suffix(".path")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// Wakes its keeper, if it lives, to look at its files now.
    pub fn nudge_keeper(&self) {
        if let Some(k) = self.keeper().filter(|k| k.alive()) {
            // SAFETY: a signal to the recorded, still living keeper.
            unsafe { libc::kill(k.pid, NUDGE) };
        }
    }

    /// Whether the sandbox is paused.
    pub fn paused(&self) -> Option<Paused> {
        read_json(&self.meta().join(PAUSED))
    }

    /// For a command about to start: refused while paused, held while a
    /// checkpoint has the sandbox frozen.
    pub fn may_start(&self) -> Result<(), String> {
        let dirs = self;
        if dirs.paused().is_some() {
            return Err(format!(
                "sandbox {} is paused; resume_sandbox first",
                dirs.id
            ));
        }
        let deadline = Instant::now() + THAW_WAIT;
        while dirs.meta().join(FROZEN).exists() {
            if Instant::now() >= deadline {
                return Err(format!("sandbox {} stayed frozen", dirs.id));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// Every sandbox dir under `root` with a record.
pub fn all(root: &Path) -> Vec<Dirs> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().into_string().ok()?;
            let dirs = Dirs::new(root, &id);
            (valid_id(&id) && dirs.meta().join(SPEC).is_file()).then_some(dirs)
        })
        .collect()
}

/// A path inside the sandbox, as a file request names it: relative paths
/// are in the work dir, `~` is the sandbox's home, and an absolute path must
/// lie in one of its three directories. The deepest existing ancestor is
/// resolved (symlinks included) and must still lie there, so a link planted
/// inside cannot point a request at the host's files.
pub fn confine(dirs: &Dirs, raw: &str) -> Result<PathBuf, AgentError> {
    let bad = |m: String| error(ErrorKind::BadRequest, m);
    if raw.is_empty() {
        return Err(bad("the path is empty".into()));
    }
    if raw.contains('\0') {
        return Err(bad("the path contains a NUL byte".into()));
    }
    let path = if raw == "~" {
        dirs.home()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        dirs.home().join(rest)
    } else if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        dirs.work().join(raw)
    };
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(bad(format!("{raw:?}: `..` is not allowed in a sandbox")));
    }
    let allowed = [dirs.work(), dirs.home(), dirs.tmp()];
    let outside = || {
        bad(format!(
            "{raw:?} is outside the sandbox (its work dir {}, home or tmp)",
            dirs.work().display()
        ))
    };
    if !allowed.iter().any(|a| path.starts_with(a)) {
        return Err(outside());
    }
    // The deepest ancestor that exists, resolved.
    let mut existing = path.as_path();
    let real = loop {
        match fs::canonicalize(existing) {
            Ok(real) => break real,
            Err(_) => match existing.parent() {
                Some(parent) => existing = parent,
                None => return Err(outside()),
            },
        }
    };
    let real_allowed: Vec<PathBuf> = allowed
        .iter()
        .filter_map(|a| fs::canonicalize(a).ok())
        .collect();
    if !real_allowed.iter().any(|a| real.starts_with(a)) {
        return Err(outside());
    }
    Ok(path)
}

/// Opens `path` (inside `base`, as [`confine`] gave it) one component at a
/// time from `base` without following symlinks, making missing directories
/// when `create`. None: it does not exist. The descriptor names the very
/// directory checked, so a link swapped in afterwards redirects nothing.
/// `base` is opened as the agent; what lies beneath, as `account` when
/// there is one (what is made is its).
pub fn open_beneath(
    base: &Path,
    path: &Path,
    create: bool,
    account: Option<crate::account::Account>,
) -> Result<Option<std::os::fd::OwnedFd>, AgentError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bad = |m: String| error(ErrorKind::BadRequest, m);
    let rest = path
        .strip_prefix(base)
        .map_err(|_| bad(format!("{} is outside {}", path.display(), base.display())))?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let c = |p: &[u8]| std::ffi::CString::new(p).map_err(|_| bad("a NUL byte in the path".into()));
    let base_c = c(base.as_os_str().as_bytes())?;
    // SAFETY: a valid path; the result is checked.
    let fd = unsafe { libc::open(base_c.as_ptr(), flags) };
    if fd < 0 {
        return Err(error(
            ErrorKind::Internal,
            format!(
                "cannot open {}: {}",
                base.display(),
                io::Error::last_os_error()
            ),
        ));
    }
    // SAFETY: a descriptor we own from here on.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let _as = crate::account::act_as(account);
    for comp in rest.components() {
        let name = match comp {
            Component::Normal(n) => c(n.as_bytes())?,
            Component::CurDir => continue,
            _ => return Err(bad(format!("{}: `..` is not allowed", path.display()))),
        };
        // SAFETY: plain syscalls on descriptors we own.
        let mut next = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
        if next < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            if !create {
                return Ok(None);
            }
            // SAFETY: as above; EEXIST means someone made it meanwhile.
            let made = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
            if made < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(error(
                    ErrorKind::SpawnFailed,
                    format!(
                        "cannot create {}: {}",
                        path.display(),
                        io::Error::last_os_error()
                    ),
                ));
            }
            // SAFETY: as above.
            next = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
        }
        if next < 0 {
            let e = io::Error::last_os_error();
            return Err(bad(match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => format!(
                    "{} is not a directory in the sandbox (a symlink is not followed)",
                    path.display()
                ),
                _ => format!("cannot open {}: {e}", path.display()),
            }));
        }
        // SAFETY: a descriptor we own from here on.
        dir = unsafe { OwnedFd::from_raw_fd(next) };
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(valid_id("sbx-3f2a"));
        assert!(valid_id("a"));
        for bad in ["", "-a", "A", "a/b", "..", "a.b", &"a".repeat(33)] {
            assert!(!valid_id(bad), "{bad}");
        }
        let id = generated_id();
        assert!(valid_id(&id) && id.len() == 8, "{id}");
    }

    #[test]
    fn paths_are_confined_to_the_sandbox() {
        let root = std::env::temp_dir().join(format!("outpost-sbx-confine-{}", std::process::id()));
        let dirs = Dirs::new(&root, "sbx-1");
        for d in [dirs.work(), dirs.home(), dirs.tmp()] {
            fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink("/etc", dirs.work().join("link")).unwrap();
        assert_eq!(confine(&dirs, "a/b").unwrap(), dirs.work().join("a/b"));
        assert_eq!(confine(&dirs, "~/x").unwrap(), dirs.home().join("x"));
        let inside = dirs.tmp().join("f");
        assert_eq!(confine(&dirs, inside.to_str().unwrap()).unwrap(), inside);
        for bad in [
            "/etc/passwd",
            "../x",
            "link/passwd",
            "link",
            "~/../meta",
            "",
        ] {
            assert!(confine(&dirs, bad).is_err(), "{bad}");
        }
        // Opened component by component: a link is never followed.
        let work = dirs.work();
        assert!(open_beneath(&work, &work.join("link"), false, None).is_err());
        assert!(
            open_beneath(&work, &work.join("new/deep"), false, None)
                .unwrap()
                .is_none()
        );
        assert!(
            open_beneath(&work, &work.join("new/deep"), true, None)
                .unwrap()
                .is_some()
        );
        assert!(work.join("new/deep").is_dir());
        let _ = fs::remove_dir_all(&root);
    }
}
