//! `outpost-agent enter <sandbox dir> <cwd> -- PROGRAM ARGS…`: runs PROGRAM
//! inside the sandbox, in `cwd` as the sandbox sees it. Every command and
//! job of a sandbox starts through it (see [`super::Scope::command`]) but
//! an exec in bwrap, which takes the same steps without it (see [`Entry`]).
//!
//! Where the sandbox has cgroups (the agent is root), the command is forked
//! into them ([`CgroupEntry`]) and `enter` waits for it, passing its exit
//! status on and forwarding the signals a supervisor sends. Then, by rung:
//! under bwrap it takes [`Entry::before`] (the pid namespace, which applies
//! to children) and always forks, and the child takes [`Entry::inside`];
//! under Landlock it becomes
//! the sandbox's uid and restricts itself; in a plain workspace nothing
//! more. Without a cgroup and bwrap, `enter` becomes the command (exec). It
//! runs single-threaded from `main`, as joining a user namespace requires.
//! Failures exit 125 with a message on stderr, as `env` and `docker` do.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use outpost_protocol::Isolation;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use super::cgroup_entry::CgroupEntry;
use super::entry::{self, Entry};
use super::isolation;
use super::ruleset;
use super::store::{self, Dirs};

const FAILED: i32 = 125;

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, sig) };
    }
}

pub fn main(dir: &Path, cwd: &Path, argv: &[String]) -> i32 {
    match run(dir, cwd, argv) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("outpost-agent enter: {message}");
            FAILED
        }
    }
}

fn run(dir: &Path, cwd: &Path, argv: &[String]) -> Result<i32, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("bad sandbox dir")?;
    let dirs = Dirs {
        id: id.to_string(),
        dir: dir.to_path_buf(),
    };
    if dirs.ending() {
        return Err(format!("sandbox {id} has ended"));
    }
    let setup = dirs
        .setup()
        .ok_or_else(|| format!("sandbox {id} is not set up"))?;
    let record = dirs
        .record()
        .ok_or_else(|| format!("cannot read sandbox {id}"))?;
    let cgroups = CgroupEntry::open(&setup.cgroups)
        .map_err(|e| format!("cannot open the sandbox's cgroup: {e}"))?;
    let mut command = Command::new(program);
    command.args(args).env_clear().envs(command_env(id));
    // SAFETY: geteuid and getpid cannot fail.
    let (as_root, parent) = unsafe { (libc::geteuid() == 0, libc::getpid()) };
    match setup.isolation {
        Isolation::Bwrap => {
            let holder = setup
                .holder
                .as_ref()
                .filter(|h| h.alive())
                .ok_or_else(|| format!("sandbox {id}'s bwrap is not running"))?;
            let account = if as_root { record.account } else { None };
            let entry = Entry::open(holder.pid, account, setup.nproc)
                .map_err(|e| format!("cannot open the sandbox's namespaces: {e}"))?;
            let fd_of = |i: usize| entry.fd(i);
            // SAFETY: `enter` is single-threaded (it runs from `main`).
            unsafe { entry.take(&entry.before, fd_of) }
                .map_err(|code| entry::describe(code, &cwd.to_string_lossy()).to_string())?;
            let child = cgroups.fork().map_err(|e| format!("fork: {e}"))?;
            if child == 0 {
                // SAFETY: the child of a single-threaded process.
                if let Err(code) = unsafe { entry.take(&entry.inside, fd_of) } {
                    child_failed(&entry::describe(code, &cwd.to_string_lossy()).to_string());
                }
                // Last: a change of uid would clear it.
                die_with(parent);
                child_failed(&format!("{program}: {}", become_command(&mut command, cwd)));
            }
            drop(entry);
            Ok(wait_for(child))
        }
        Isolation::Landlock => {
            // Fetched while still able to reach the sandbox's meta dir.
            let prebuilt = dirs
                .keeper()
                .and_then(|k| ruleset::fetch(&dirs.meta().join(ruleset::SOCKET), k.pid));
            let restrict = || -> Result<(), String> {
                become_its_account(&record)?;
                match &prebuilt {
                    Some(rules) => isolation::restrict(rules, record.spec.network),
                    None => isolation::apply_landlock(&dirs, record.spec.network, &setup.hidden),
                }
            };
            if cgroups.is_empty() {
                restrict()?;
                return Err(become_command(&mut command, cwd));
            }
            let child = cgroups.fork().map_err(|e| format!("fork: {e}"))?;
            if child == 0 {
                die_with(parent);
                if let Err(e) = restrict() {
                    child_failed(&e);
                }
                child_failed(&format!("{program}: {}", become_command(&mut command, cwd)));
            }
            Ok(wait_for(child))
        }
        _ if cgroups.is_empty() => Err(become_command(&mut command, cwd)),
        _ => {
            let child = cgroups.fork().map_err(|e| format!("fork: {e}"))?;
            if child == 0 {
                die_with(parent);
                child_failed(&format!("{program}: {}", become_command(&mut command, cwd)));
            }
            Ok(wait_for(child))
        }
    }
}

/// In a child: dies with `enter`, so whoever ends `enter` (a timeout, a
/// cancel, a code context's restart) ends the command too, though it may
/// live in a pid namespace the killer cannot see. Its parent is `parent`,
/// or, from inside that namespace, outside it (getppid is 0); a parent
/// already gone shows as another.
fn die_with(parent: libc::pid_t) {
    // SAFETY: prctl and getppid are plain syscalls.
    unsafe {
        let ppid = libc::getppid();
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 || (ppid != 0 && ppid != parent)
        {
            libc::_exit(FAILED);
        }
    }
}

/// In a child: says why it could not become the command, and leaves
/// without running the parent's destructors.
fn child_failed(why: &str) -> ! {
    eprintln!("outpost-agent enter: {why}");
    // SAFETY: _exit ends the process at once.
    unsafe {
        libc::_exit(if why.contains("not found") {
            127
        } else {
            FAILED
        })
    }
}

/// Becomes the sandbox's own uid when the agent is root (the cgroups are
/// joined by then: root's right to move a process).
fn become_its_account(record: &store::Record) -> Result<(), String> {
    match record.account {
        Some(a) => crate::account::become_account(a)
            .map_err(|e| format!("cannot become the sandbox's uid {}: {e}", a.uid)),
        None => Ok(()),
    }
}

/// The command's environment: what this process was given (the exec's
/// token), then the carried entries in order, then the sandbox's marker,
/// which nothing overrides.
fn command_env(id: &str) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let mut carried: Vec<(usize, OsString)> = Vec::new();
    for (k, v) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if let Some(n) = name.strip_prefix(store::CARRIED_VAR) {
            if let Ok(n) = n.parse() {
                carried.push((n, v));
            }
        } else if name != store::MARKER_VAR && name != "PATH" {
            env.push((k, v));
        }
    }
    carried.sort_by_key(|(n, _)| *n);
    for (_, entry) in carried {
        let bytes = entry.as_bytes();
        if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
            let (k, v) = (&bytes[..eq], &bytes[eq + 1..]);
            env.retain(|(name, _)| name.as_bytes() != k);
            env.push((OsStr::from_bytes(k).into(), OsStr::from_bytes(v).into()));
        }
    }
    env.push((store::MARKER_VAR.into(), id.into()));
    env
}

/// Execs the command (returning only why it could not).
fn become_command(command: &mut Command, cwd: &Path) -> String {
    if let Err(e) = std::env::set_current_dir(cwd) {
        return format!("cannot enter {} inside the sandbox: {e}", cwd.display());
    }
    let e = command.exec();
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("not found: {e}")
    } else {
        e.to_string()
    }
}

/// Waits for the child, forwarding the signals a supervisor sends, and
/// returns its exit code, or dies of the signal that killed it.
fn wait_for(child: libc::pid_t) -> i32 {
    CHILD.store(child, Ordering::SeqCst);
    // SAFETY: the handler only calls kill.
    unsafe {
        for sig in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::signal(sig, forward as *const () as libc::sighandler_t);
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return FAILED;
        }
    }
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    let sig = libc::WTERMSIG(status);
    // SAFETY: restore the default action and die the same way.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    128 + sig
}
