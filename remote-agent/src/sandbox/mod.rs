//! Sandboxes: isolated, expiring places on this host that commands, jobs
//! and file requests can target (`Request::InSandbox`).
//!
//! - `store.rs`: the sandbox on disk and the paths a request may use in it.
//! - `isolation.rs`: the ladder (bwrap → Landlock + seccomp → none), probed.
//! - `limits.rs`: cgroups, or rlimits and what the keeper watches.
//! - `keeper.rs`: one process per sandbox that sets it up and ends it.
//! - `enter.rs`: how a command starts inside.
//!
//! The job daemon creates sandboxes (it starts their keepers, and starts a
//! new keeper for a live sandbox whose keeper died); `serve` answers
//! list, renew, delete and the scoped requests straight from the files.
//!
//! Architecture invariant: every process a sandbox runs starts through
//! `outpost-agent enter` with the sandbox's marker in its environment, so
//! its keeper finds and ends it whatever rung applies; under bwrap all of
//! them also live in the holder's pid namespace, which dies with the keeper.

pub mod enter;
pub mod isolation;
pub mod keeper;
mod limits;
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
    AgentError, ErrorKind, Isolation, Request, Response, SandboxInfo, SandboxSpec, SandboxState,
};

use crate::jobs::store::{make_dir_all, now_unix, write_json};
use crate::paths;
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

/// `SandboxCreate` from `serve`: the daemon creates it.
pub async fn create(spec: SandboxSpec) -> Response {
    crate::jobs::client::ask_daemon(Request::SandboxCreate(spec)).await
}

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
    for (name, value) in &spec.env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(bad(format!("invalid environment variable {name:?}")));
        }
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

/// Serialises creates in the daemon, so the cap counts every sandbox.
static CREATING: Mutex<()> = Mutex::new(());

/// `SandboxCreate` in the daemon: checks everything it can before it makes
/// anything, makes the dirs and records, starts the keeper and waits until
/// the sandbox can run commands. On failure nothing is left behind.
pub fn create_in_daemon(spec: SandboxSpec) -> Result<SandboxInfo, AgentError> {
    let root = store::root()?;
    validate(&spec, &root)?;
    isolation::choose(spec.isolation).map_err(|m| error(ErrorKind::Unavailable, m))?;
    let _creating = CREATING.lock().unwrap_or_else(|p| p.into_inner());
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
    let dirs = claim(&root, spec.id.as_deref())?;
    let made = (|| -> std::io::Result<()> {
        for dir in [dirs.work(), dirs.home(), dirs.tmp(), dirs.meta()] {
            make_dir_all(&dir)?;
        }
        dirs.set_expires_ms(now_ms() + spec.ttl_ms)?;
        let record = Record {
            spec: SandboxSpec {
                id: Some(dirs.id.clone()),
                ..spec.clone()
            },
            created_unix: now_unix(),
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

/// Forgets sandboxes that ended more than a day ago.
fn prune(root: &Path) {
    let now = now_unix();
    for dirs in store::all(root) {
        if dirs
            .end()
            .is_some_and(|e| now.saturating_sub(e.ended_unix) > ENDED_KEPT)
        {
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
        let keeper_alive = dirs.keeper().is_some_and(|k| k.alive());
        // A dir still being made has no setup and a keeper on its way.
        if !keeper_alive && dirs.meta().join(store::SETUP).is_file() {
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
    let root = store::root()?;
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
    ended_error(&dirs)?;
    dirs.set_expires_ms(now_ms() + ttl_ms)
        .map_err(|e| error(ErrorKind::Internal, format!("cannot renew {id}: {e}")))?;
    // The keeper may have ended it just before the new expiry landed.
    ended_error(&dirs)?;
    info(&dirs)
}

fn info(dirs: &Dirs) -> Result<Response, AgentError> {
    dirs.info().map(Response::Sandbox).ok_or_else(|| {
        error(
            ErrorKind::Internal,
            format!("cannot read sandbox {}", dirs.id),
        )
    })
}

fn ended_error(dirs: &Dirs) -> Result<(), AgentError> {
    match dirs.end() {
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
        crate::jobs::store::write_atomic(&dirs.meta().join(store::DELETE), b"", false)
            .map_err(|e| error(ErrorKind::Internal, format!("cannot delete {id}: {e}")))?;
        let deadline = Instant::now() + END_WAIT;
        while dirs.end().is_none() {
            let keeper_alive = dirs.keeper().is_some_and(|k| k.alive());
            if !keeper_alive || Instant::now() >= deadline {
                keeper::end_here(&dirs, SandboxState::Deleted);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    info(&dirs)
}

/// A live sandbox, as a scoped request sees it.
#[derive(Debug, Clone)]
pub struct Scope {
    pub dirs: Dirs,
    spec: SandboxSpec,
    setup: Setup,
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
        })
    }

    /// Where a command starts: none or a relative path is in the work dir,
    /// `~` the sandbox's home; an absolute path is taken as the sandbox
    /// sees it.
    pub fn cwd(&self, raw: Option<&str>) -> PathBuf {
        match raw {
            None | Some("") => self.dirs.work(),
            Some("~") => self.dirs.home(),
            Some(raw) => match raw.strip_prefix("~/") {
                Some(rest) => self.dirs.home().join(rest),
                None if Path::new(raw).is_absolute() => PathBuf::from(raw),
                None => self.dirs.work().join(raw),
            },
        }
    }

    /// A file request's root, confined to the sandbox ([`store::confine`]).
    pub fn file_root(&self, raw: &str) -> Result<String, AgentError> {
        store::confine(&self.dirs, raw).map(|p| p.to_string_lossy().into_owned())
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
        let mut cmd = Command::new(agent_exe()?);
        cmd.arg("enter")
            .arg(&self.dirs.dir)
            .arg(cwd)
            .arg("--")
            .arg(shell)
            .arg("-c")
            .arg(command)
            // The enter process itself starts where the host can see.
            .current_dir(self.dirs.work())
            .env_clear();
        for name in [
            "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME", "TZ",
        ] {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
        }
        let tmp: OsString = if self.setup.isolation == Isolation::Bwrap {
            "/tmp".into()
        } else {
            self.dirs.tmp().into()
        };
        cmd.env("HOME", self.dirs.home())
            .env("TMPDIR", tmp)
            .env("SHELL", shell)
            .env(store::MARKER_VAR, &self.dirs.id);
        if let Some(devices) = &self.setup.cuda_visible_devices {
            cmd.env("CUDA_VISIBLE_DEVICES", devices);
        }
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k, v)));
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        Ok(cmd)
    }
}
