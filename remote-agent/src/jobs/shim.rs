//! `outpost-agent shim <job dir> [--resume]`: the supervisor of one job.
//!
//! One small process per job, in the pattern of conmon: it owns nothing but
//! its job, so the job's exit status is known exactly whatever else dies. It
//! leaves the daemon's session, ignores the signals a dying session or
//! terminal sends, starts `bash -c <command>` (its own session and process
//! group, output appended to the log through one descriptor), waits for it,
//! and writes the exit record durably before recording the end event.
//!
//! A shim never talks to anyone: the daemon and `serve` learn everything from
//! the files it writes (see [`super::store`]).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

use super::store::{self, ExitRecord, ProcId, Record};
use crate::exec;
use crate::paths;
use crate::proctree::TOKEN_VAR;

/// Runs the shim to the job's end; the process exit code.
pub fn run(dir: &Path, resume: bool) -> i32 {
    // SAFETY: setsid and signal are plain syscalls; the shim is single-threaded.
    unsafe {
        // Fails only if already a session leader, which is just as good.
        libc::setsid();
        // A closing SSH session or terminal must not take the job's record
        // keeper with it; the job itself gets default dispositions back.
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // Hold no directory (and so no mount) busy.
    let _ = std::env::set_current_dir("/");
    match supervise(dir, resume) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("outpost-agent shim {}: {message}", dir.display());
            let _ = store::write_atomic(&dir.join(store::SPAWN_ERROR), message.as_bytes(), false);
            1
        }
    }
}

fn supervise(dir: &Path, resume: bool) -> Result<(), String> {
    let root = dir.parent().ok_or("the job dir has no parent")?;
    let _ = std::fs::remove_file(dir.join(store::SPAWN_ERROR));
    let me = ProcId::of(std::process::id() as i32).ok_or("cannot read /proc/self/stat")?;
    store::write_json(&dir.join(store::SHIM), &me, false)
        .map_err(|e| format!("cannot write {}: {e}", store::SHIM))?;
    let record: Record = store::read_json(&dir.join(store::SPEC))
        .ok_or_else(|| format!("cannot read {}", store::SPEC))?;
    let command = if resume {
        super::resume_command(&record.spec.watch).ok_or("the job has no resume command")?
    } else {
        record.spec.command.clone()
    };

    // One descriptor for both streams, opened O_APPEND: output lands in the
    // order a terminal would show, and a resumed run appends.
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&record.log)
        .map_err(|e| format!("cannot open the log {}: {e}", record.log.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("cannot duplicate the log descriptor: {e}"))?;
    let shell = paths::shell();
    let mut cmd = Command::new(shell);
    cmd.arg("-c")
        .arg(&command)
        .current_dir(&record.cwd)
        .envs(record.spec.env.iter().map(|(k, v)| (k, v)))
        .env(TOKEN_VAR, &record.token)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    // SAFETY: child_setup only makes async-signal-safe calls.
    unsafe {
        cmd.pre_exec(exec::child_setup);
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start {} in {}: {e}",
            shell.display(),
            record.cwd.display()
        )
    })?;
    let pid = child.id() as i32;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let (kind, detail) = if resume {
        let attempts = store::read_json::<store::ResumeRecord>(&dir.join(store::RESUME))
            .map_or(0, |r| r.attempts);
        ("resume_started", format!("pid {pid}, attempt {attempts}"))
    } else {
        ("started", format!("pid {pid}"))
    };
    if let Err(e) = store::emit(root, &name, kind, &detail) {
        eprintln!("outpost-agent shim: cannot record event {kind} of job {name}: {e}");
    }
    // After the event: the daemon answers `JobStart` once this file exists,
    // and the event must already be there by then. The child is ours and
    // unreaped, so its stat is its own.
    if let Some(id) = ProcId::of(pid) {
        let _ = store::write_json(&dir.join(store::CHILD), &id, false);
    }

    let status = loop {
        match child.wait() {
            Ok(status) => break Some(status),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("outpost-agent shim: cannot wait for pid {pid}: {e}");
                break None;
            }
        }
    };
    let exit = ExitRecord {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        ended_unix: store::now_unix(),
    };
    store::write_json(&dir.join(store::EXIT), &exit, true)
        .map_err(|e| format!("cannot write {}: {e}", store::EXIT))?;
    store::report_end(root, dir, &exit);
    Ok(())
}
