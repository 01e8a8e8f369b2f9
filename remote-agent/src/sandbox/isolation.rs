//! The isolation ladder: bubblewrap → Landlock + seccomp → a plain
//! workspace. Which rung a host reaches is probed, never assumed, and a
//! sandbox that asked for a rung gets it or an error, never a weaker one.
//!
//! bubblewrap is started once per sandbox (the *holder*, pid 1 of its own
//! namespaces, by the keeper); each command then enters the holder's
//! namespaces ([`enter_namespaces`]) instead of paying for a new bwrap.
//! Landlock and seccomp are applied by `outpost-agent enter` to itself just
//! before it becomes the command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use outpost_protocol::Isolation;

use super::store::Dirs;
use crate::{account, paths};

/// Where the agent binary is bound inside a bwrap sandbox, for the holder.
pub const AGENT_INSIDE: &str = "/run/outpost-agent";

/// What this host offers, probed once per process.
#[derive(Debug, Clone)]
pub struct Rungs {
    /// The system bwrap, when its smoke test passed.
    pub bwrap: Result<PathBuf, String>,
    /// The Landlock ABI version, when the kernel has Landlock enabled.
    pub landlock: Result<u32, String>,
}

/// The one-line fix that would let this host reach the bwrap rung.
pub fn bwrap_fix(why: &str) -> &'static str {
    if why.contains("not installed") {
        "install bubblewrap (apt install bubblewrap / dnf install bubblewrap)"
    } else if why.contains(account::RANGE_VAR) {
        "set the agent's OUTPOST_SANDBOX_UIDS to FIRST-LAST, free uids"
    } else if why.contains("uid map")
        || why.contains("Permission denied")
        || why.contains("RTM_NEWADDR")
    {
        "allow user namespaces for bwrap: load the bwrap-userns-restrict AppArmor profile (Ubuntu 24.04) or set kernel.apparmor_restrict_unprivileged_userns=0"
    } else if why.contains("No space left") || why.contains("max_user_namespaces") {
        "raise user.max_user_namespaces (sysctl)"
    } else {
        "run `bwrap --ro-bind / / --unshare-user --unshare-pid true` to see why bwrap fails"
    }
}

/// An agent running as root probes (and runs) bwrap as the first uid of
/// its sandboxes' range: the rung is what an unprivileged uid gets.
pub fn rungs() -> &'static Rungs {
    static RUNGS: OnceLock<Rungs> = OnceLock::new();
    RUNGS.get_or_init(|| Rungs {
        bwrap: probe_bwrap(),
        landlock: landlock_abi().and_then(|abi| match landlock_barrier() {
            Some(why) => Err(why),
            None => Ok(abi),
        }),
    })
}

/// Why an agent running as root cannot give Landlock sandboxes a uid of
/// their own: their commands reach their dirs by path, through the agent's
/// state dir and what lies above it.
fn landlock_barrier() -> Option<String> {
    if !account::needed() {
        return None;
    }
    let state = paths::state_dir()?;
    // The sandboxes dir itself is made passable (0711) with its first
    // sandbox of a uid of its own.
    let barrier = account::barrier_above(&state.join("sandboxes"), None)?;
    Some(format!(
        "as root, Landlock's commands run as a uid of their own and could not pass {} (only its owner may enter it); use bwrap",
        barrier.display()
    ))
}

fn probe_bwrap() -> Result<PathBuf, String> {
    // The system binary first: AppArmor profiles that allow bwrap user
    // namespaces (Ubuntu) are attached to its path.
    let bwrap = ["/usr/bin/bwrap", "/bin/bwrap"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| paths::which("bwrap"))
        .ok_or_else(|| "bwrap is not installed".to_string())?;
    let truth = ["/bin/true", "/usr/bin/true"]
        .iter()
        .find(|p| Path::new(p).exists())
        .copied()
        .unwrap_or("/bin/true");
    let mut cmd = Command::new(&bwrap);
    if account::needed() {
        let first = *account::range(None)?.start();
        let probe = account::Account {
            uid: first,
            gid: first,
        };
        // SAFETY: become_account makes only credential syscalls.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                account::become_account(probe)
            });
        }
    }
    cmd.args([
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--",
        truth,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let out = run_with_limit(cmd, Duration::from_secs(5))?;
    if out.0 {
        Ok(bwrap)
    } else {
        Err(format!("bwrap fails here: {}", out.1.trim()))
    }
}

/// Runs `cmd` to its end within `limit`: (success, stderr).
fn run_with_limit(mut cmd: Command, limit: Duration) -> Result<(bool, String), String> {
    let mut child = cmd.spawn().map_err(|e| format!("cannot run bwrap: {e}"))?;
    let deadline = std::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Ok((status.success(), err));
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("bwrap did not finish its smoke test in 5 s".into());
            }
        }
    }
}

pub fn landlock_abi() -> Result<u32, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented way to ask for the ABI version: no ruleset.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if abi >= i64::from(LANDLOCK_SCOPE_ABI) {
        Ok(abi as u32)
    } else if abi >= 1 {
        Err(format!(
            "Landlock ABI {abi} (Linux before 6.12) cannot stop a sandbox signalling this user's other processes, its keeper among them"
        ))
    } else {
        let e = std::io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no Landlock (5.13 or later needed)".into(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is built in but not enabled (add landlock to the lsm= boot parameter)"
                    .into()
            }
            _ => format!("Landlock is unavailable: {e}"),
        })
    }
}

/// The rung a sandbox gets, or why the one it asked for is out of reach.
pub fn choose(asked: Isolation) -> Result<Isolation, String> {
    let rungs = rungs();
    match asked {
        Isolation::Auto => Ok(if rungs.bwrap.is_ok() {
            Isolation::Bwrap
        } else if rungs.landlock.is_ok() {
            Isolation::Landlock
        } else {
            Isolation::None
        }),
        Isolation::Bwrap => match &rungs.bwrap {
            Ok(_) => Ok(Isolation::Bwrap),
            Err(why) => Err(format!("isolation bwrap: {why}; fix: {}", bwrap_fix(why))),
        },
        Isolation::Landlock => match &rungs.landlock {
            Ok(_) => Ok(Isolation::Landlock),
            Err(why) => Err(format!("isolation landlock: {why}")),
        },
        Isolation::None => Ok(Isolation::None),
    }
}

/// Why a sandbox that asked for `asked` gets no isolation rung.
pub fn why_unisolated(asked: Isolation) -> String {
    let rungs = rungs();
    match (asked, &rungs.bwrap, &rungs.landlock) {
        (Isolation::None, _, _) => "isolation none was asked for".into(),
        (_, Err(bwrap), Err(landlock)) if bwrap == landlock => bwrap.clone(),
        (_, Err(bwrap), Err(landlock)) => format!("bwrap: {bwrap}; Landlock: {landlock}"),
        _ => "an isolation rung is available".into(),
    }
}

/// The holder's command line: a bubblewrap sandbox with a read-only `/`,
/// the real home and the agent's state hidden under empty tmpfs, the
/// sandbox's work and home dirs bound at their own paths, its tmp dir at
/// `/tmp`, and `hold` (pid 2 inside) keeping it alive.
pub fn bwrap_args(
    dirs: &Dirs,
    network: bool,
    agent: &Path,
    gpu_devices: &[super::gpu_nodes::Node],
    hidden: &[PathBuf],
) -> Vec<String> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let mut args: Vec<String> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    .map(String::from)
    .to_vec();
    if !network {
        args.push("--unshare-net".into());
    }
    args.extend(["--ro-bind", "/", "/", "--dev", "/dev"].map(String::from));
    for dev in gpu_devices {
        args.extend(["--dev-bind".into(), s(&dev.host), s(&dev.inside)]);
    }
    args.extend(["--proc", "/proc", "--tmpfs", "/run"].map(String::from));
    // Its tmp dir first: a home or state dir under /tmp is mounted over it.
    args.extend(["--bind".into(), s(&dirs.tmp()), "/tmp".into()]);
    for dir in hidden {
        args.extend(["--tmpfs".into(), s(dir)]);
    }
    args.extend(["--bind".into(), s(&dirs.work()), s(&dirs.work())]);
    args.extend(["--bind".into(), s(&dirs.home()), s(&dirs.home())]);
    args.extend(["--ro-bind".into(), s(agent), AGENT_INSIDE.into()]);
    args.extend(["--chdir".into(), s(&dirs.work())]);
    args
}

/// Adds `path` to what is hidden, unless something above it already is;
/// what lies below it is then covered by it.
pub fn hide(hidden: &mut Vec<PathBuf>, path: PathBuf) {
    // As spelled and as resolved: /home may be a link to /data/home.
    for p in [fs_canonical(&path), Some(path)].into_iter().flatten() {
        if p != Path::new("/") && !hidden.iter().any(|h| p.starts_with(h)) {
            hidden.retain(|h| !h.starts_with(&p));
            hidden.push(p);
        }
    }
}

/// What a sandbox must not see of the host: the home (`~/.ssh`, cloud
/// credentials) and the agent's state dir (other sandboxes, job logs)
/// wherever it is. Both `$HOME` and the account's home in the password
/// database: they differ when a client or `sudo` set `HOME`.
pub fn hidden_paths() -> Vec<PathBuf> {
    let mut hidden: Vec<PathBuf> = Vec::new();
    for home in [paths::home_dir(), paths::passwd_home()]
        .into_iter()
        .flatten()
        .filter(|h| h.is_dir())
    {
        hide(&mut hidden, home);
    }
    if let Some(state) = paths::state_dir() {
        hide(&mut hidden, state);
    }
    hidden
}

/// What Landlock also keeps unreadable: the shared `/tmp` and the user's
/// runtime dir hold credentials too (Kerberos tickets, keyrings, agent
/// sockets), `/dev/shm` other programs' shared memory, `/dev/pts` the
/// user's open terminals. bwrap gives the sandbox its own of each.
pub fn landlock_hidden(hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut all = hidden.to_vec();
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    // The user's open terminals and the shared memory of their other
    // programs, besides the shared /tmp and runtime dir.
    let shared = ["/tmp", "/dev/shm", "/dev/pts"].map(|p| Some(PathBuf::from(p)));
    for p in shared.into_iter().chain([runtime]).flatten() {
        for p in [fs_canonical(&p), Some(p)].into_iter().flatten() {
            if !all.iter().any(|h| p.starts_with(h)) {
                all.retain(|h| !h.starts_with(&p));
                all.push(p);
            }
        }
    }
    all
}

fn fs_canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// Landlock for the calling process: everything readable and executable
/// except the home and the agent's state dir (only the sandbox's own
/// directories there), writes only to the sandbox's directories and the
/// harmless devices; with `network` off, no TCP bind or connect, and a
/// seccomp filter refusing IPv4 and IPv6 sockets altogether.
pub fn apply_landlock(dirs: &Dirs, network: bool, hidden: &[PathBuf]) -> Result<(), String> {
    restrict(&landlock_ruleset(dirs, network, hidden)?, network)
}

/// The ruleset [`apply_landlock`] applies, not yet applied (a keeper builds
/// it once and hands it to each command: see [`super::ruleset`]).
pub fn landlock_ruleset(
    dirs: &Dirs,
    network: bool,
    hidden: &[PathBuf],
) -> Result<std::os::fd::OwnedFd, String> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
        RulesetAttr, RulesetCreatedAttr, Scope,
    };
    // Best effort up to ABI 9, which also guards connecting to named unix
    // sockets (an ssh-agent's, say); older kernels get what they have.
    let abi = ABI::V9;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let fail = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(fail)?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(fail)?;
    if !network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(fail)?;
    }
    let mut created = ruleset.create().map_err(fail)?;
    if hidden.is_empty() {
        return Err("landlock: no record of what to hide".into());
    }
    for dir in readable_around(Path::new("/"), &landlock_hidden(hidden)) {
        if let Ok(fd) = PathFd::new(&dir) {
            created = created.add_rule(PathBeneath::new(fd, read)).map_err(fail)?;
        }
    }
    for dir in [dirs.work(), dirs.home(), dirs.tmp()] {
        let fd = PathFd::new(&dir).map_err(|e| format!("landlock: {}: {e}", dir.display()))?;
        created = created.add_rule(PathBeneath::new(fd, all)).map_err(fail)?;
    }
    // Not /dev/pts nor /dev/shm: rights there would reach the user's open
    // terminals and the shared memory of their other programs, which a path
    // rule cannot tell from the sandbox's own. POSIX shared memory and
    // semaphores (Python's multiprocessing) need the bwrap rung, whose
    // /dev is its own.
    for dev in ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"] {
        if let Ok(fd) = PathFd::new(dev) {
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::from_file(abi) | read))
                .map_err(fail)?;
        }
    }
    let fd: Option<std::os::fd::OwnedFd> = created.into();
    fd.ok_or_else(|| "landlock: not enforced by this kernel".to_string())
}

/// Restricts this process (and what it execs) by `ruleset`, then filters
/// its sockets.
pub fn restrict(ruleset: &std::os::fd::OwnedFd, network: bool) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on a descriptor we hold.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0) != 0 {
            return Err(format!("landlock: {}", std::io::Error::last_os_error()));
        }
    }
    match socket_program(network)? {
        Some(program) => seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}")),
        None => Ok(()),
    }
}

/// The Landlock ABI that fences connecting to named unix sockets.
pub const LANDLOCK_UNIX_ABI: u32 = 9;
/// The Landlock ABI that scopes signals and abstract unix sockets.
pub const LANDLOCK_SCOPE_ABI: u32 = 6;

/// The entries of `dir` to grant read access to so that every path except
/// those in `hidden` (and what lies below them) stays readable: a sibling of
/// a hidden path is granted whole, an ancestor is descended into.
fn readable_around(dir: &Path, hidden: &[PathBuf]) -> Vec<PathBuf> {
    if !hidden.iter().any(|h| h.starts_with(dir) && h != dir) {
        return vec![dir.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // A link is not granted: its target is granted (or not) where it
        // really lies, and /home -> /data/home must not open the home.
        if hidden.contains(&path) || entry.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        out.extend(readable_around(&path, hidden));
    }
    out
}

/// seccomp, what Landlock cannot do here: with the network off,
/// `socket(AF_INET | AF_INET6, …)` and io_uring (which makes sockets past
/// the `socket` call) fail; without `unix` (a kernel whose Landlock cannot
/// fence named unix sockets: the user's D-Bus or an SSH agent would be an
/// open door), `socket(AF_UNIX, …)` fails too (`socketpair` still works).
/// The seccomp program that refuses the socket families a Landlock sandbox
/// must not use: the network's unless it has one, and unix sockets where
/// Landlock cannot fence them; None when nothing is refused.
pub fn socket_program(network: bool) -> Result<Option<seccompiler::BpfProgram>, String> {
    // The ABI alone: `rungs()` would also probe bwrap by running it, for
    // every command.
    let unix = landlock_abi().unwrap_or(0) >= LANDLOCK_UNIX_ABI;
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let fail = |e: &dyn std::fmt::Display| format!("seccomp: {e}");
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| fail(&e))?;
    let family = |f: libc::c_int| {
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, f as u64)
            .and_then(|c| SeccompRule::new(vec![c]))
    };
    let mut families = Vec::new();
    if !network {
        // The network's families, and those that reach the host or the
        // wire past it (vsock to a hypervisor, raw packets).
        families.extend([
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_VSOCK,
            libc::AF_PACKET,
        ]);
    }
    if !unix {
        families.push(libc::AF_UNIX);
    }
    if families.is_empty() {
        return Ok(None);
    }
    let mut rules = vec![(
        libc::SYS_socket,
        families
            .into_iter()
            .map(|f| family(f).map_err(|e| fail(&e)))
            .collect::<Result<Vec<_>, _>>()?,
    )];
    if !network {
        // An empty rule list matches the call whatever its arguments.
        rules.push((libc::SYS_io_uring_setup, Vec::new()));
    }
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )
    .map_err(|e| fail(&e))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| fail(&e))?;
    Ok(Some(program))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_exposes_only_the_leased_gpus_and_hides_the_home() {
        let dirs = Dirs::new(Path::new("/s"), "sbx-1");
        let args = bwrap_args(
            &dirs,
            false,
            Path::new("/a/outpost-agent"),
            &["nvidiactl", "nvidia1"].map(|name| super::super::gpu_nodes::Node {
                host: Path::new("/stand-in").join(name),
                inside: Path::new("/dev").join(name),
            }),
            &[PathBuf::from("/home/u")],
        );
        let joined = args.join(" ");
        assert!(joined.contains("--unshare-net"));
        assert!(joined.contains("--dev /dev --dev-bind /stand-in/nvidiactl /dev/nvidiactl --dev-bind /stand-in/nvidia1 /dev/nvidia1"));
        assert!(!joined.contains("nvidia0"));
        // The home is hidden before the sandbox's own dirs are bound in it.
        let tmpfs = joined.find("--tmpfs /home/u").unwrap();
        let work = joined.find("--bind /s/sbx-1/work /s/sbx-1/work").unwrap();
        assert!(tmpfs < work);
        assert!(joined.contains("--bind /s/sbx-1/tmp /tmp"));
        let open = bwrap_args(&dirs, true, Path::new("/a"), &[], &[]);
        assert!(!open.iter().any(|a| a == "--unshare-net"));
    }

    #[test]
    fn readable_around_skips_only_the_hidden_paths() {
        let root = std::env::temp_dir().join(format!("outpost-ll-{}", std::process::id()));
        for d in ["a/b/c", "a/d", "e"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut got = readable_around(&root, &[root.join("a/b")]);
        got.sort();
        assert_eq!(got, vec![root.join("a/d"), root.join("e")]);
        assert_eq!(readable_around(&root, &[]), vec![root.clone()]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
