//! `outpost-agent enter <sandbox dir> <cwd> -- PROGRAM ARGS…`: becomes
//! PROGRAM inside the sandbox, in `cwd` as the sandbox sees it. Every command and job of a sandbox starts through
//! it (see [`super::Scope::command`]).
//!
//! It joins the sandbox's cgroups, becomes its uid when the agent is root
//! (see `crate::account`), then, by rung: under bwrap it enters the
//! holder's namespaces, forks (a pid namespace applies to children) and
//! waits for the child, passing its exit status on; under Landlock it
//! restricts itself and execs; in a plain workspace it just execs. It runs
//! single-threaded from `main`, as joining a user namespace requires.
//! Failures exit 125 with a message on stderr, as `env` and `docker` do.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use outpost_protocol::Isolation;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use super::isolation::{self, Namespaces};
use super::limits;
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
    limits::join(&setup.cgroups).map_err(|e| format!("cannot join the sandbox's cgroup: {e}"))?;
    let mut command = Command::new(program);
    command.args(args).env_clear().envs(command_env(id));
    match setup.isolation {
        Isolation::Bwrap => {
            let holder = setup
                .holder
                .as_ref()
                .filter(|h| h.alive())
                .ok_or_else(|| format!("sandbox {id}'s bwrap is not running"))?;
            let ns = Namespaces::open(holder.pid)
                .map_err(|e| format!("cannot open the sandbox's namespaces: {e}"))?;
            // As its own uid, as the holder is: the namespaces are that
            // uid's to join, and root stays outside.
            become_its_account(&record)?;
            ns.enter()
                .map_err(|e| format!("cannot enter the sandbox's namespaces: {e}"))?;
            drop(ns);
            // SAFETY: single-threaded; the child only execs or exits.
            let child = unsafe { libc::fork() };
            if child == -1 {
                return Err(format!("fork: {}", std::io::Error::last_os_error()));
            }
            if child == 0 {
                // The command dies with `enter`: whoever ends `enter` (a
                // timeout, a cancel, a code context's restart) ends it too,
                // though it lives in a pid namespace the killer cannot see.
                // Its parent is outside that namespace (getppid is 0); a
                // parent already gone shows as the namespace's init.
                // SAFETY: prctl and getppid are plain syscalls.
                if unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 || libc::getppid() != 0
                } {
                    // SAFETY: leave without running the parent's destructors.
                    unsafe { libc::_exit(FAILED) };
                }
                let e = become_command(&mut command, cwd, setup.nproc, true);
                eprintln!("outpost-agent enter: {program}: {e}");
                // SAFETY: leave without running the parent's destructors.
                unsafe { libc::_exit(if e.contains("not found") { 127 } else { FAILED }) };
            }
            Ok(wait_for(child))
        }
        Isolation::Landlock => {
            // Fetched while still able to reach the sandbox's meta dir.
            let prebuilt = dirs
                .keeper()
                .and_then(|k| ruleset::fetch(&dirs.meta().join(ruleset::SOCKET), k.pid));
            become_its_account(&record)?;
            match prebuilt {
                Some(rules) => isolation::restrict(&rules, record.spec.network)?,
                None => isolation::apply_landlock(&dirs, record.spec.network, &setup.hidden)?,
            }
            Err(become_command(&mut command, cwd, None, false))
        }
        _ => Err(become_command(&mut command, cwd, None, false)),
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

/// Execs the command (returning only why it could not). `in_userns`: the
/// joined user namespace granted every capability; drop them.
fn become_command(
    command: &mut Command,
    cwd: &Path,
    nproc: Option<u64>,
    in_userns: bool,
) -> String {
    if let Err(e) = std::env::set_current_dir(cwd) {
        return format!("cannot enter {} inside the sandbox: {e}", cwd.display());
    }
    if let Some(n) = nproc
        && let Err(e) = limits::set_nproc(n)
    {
        return format!("cannot limit processes: {e}");
    }
    if in_userns && let Err(e) = isolation::drop_privileges() {
        return format!("cannot drop privileges: {e}");
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
