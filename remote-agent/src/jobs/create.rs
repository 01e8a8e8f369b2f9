//! Creating a job's record: the checks a spec must pass, the job dir
//! claimed by name, `spec.json`. The daemon creates the jobs it starts;
//! `serve` creates those of execs it hands over (see [`crate::supervisor`]).

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use outpost_protocol::{AgentError, ErrorKind, ExecResult, JobSpec, NO_ROOM_FOR_JOB};

use super::store::{self, Record};
use crate::paths;
use crate::sandbox::{self, Scope};
use crate::statefile::{self, error};

/// Most bytes of text a job spec may carry: every job is kept and listed,
/// so one job must never crowd the others out of a list answer.
const MAX_SPEC_BYTES: usize = 1 << 20;

/// The text a spec carries, in bytes.
fn spec_bytes(spec: &JobSpec) -> usize {
    let optional = [&spec.name, &spec.cwd, &spec.log_file]
        .into_iter()
        .chain(super::watch_texts(&spec.watch));
    spec.command.len()
        + spec
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + optional
            .map(|s| s.as_ref().map_or(0, String::len))
            .sum::<usize>()
}

/// Validates a spec and creates its job dir with `spec.json`. `adopted`:
/// the exec token of a command already running (handed over by its exec),
/// which then needs no starting and keeps its token.
pub fn create(
    root: &Path,
    mut spec: JobSpec,
    adopted: Option<&str>,
) -> Result<(String, PathBuf), outpost_protocol::AgentError> {
    let bad = |m: String| error(ErrorKind::BadRequest, m);
    // Kept in a file of its own, not in the record every list reads.
    let stdin = spec.stdin.take();
    if let Some(stdin) = &stdin
        && stdin.len() > outpost_protocol::limits::MAX_STDIN_LEN
    {
        return Err(bad(format!(
            "stdin of {} bytes exceeds the {}-byte limit; put it in a file and redirect from it",
            stdin.len(),
            outpost_protocol::limits::MAX_STDIN_LEN
        )));
    }
    if spec.command.trim().is_empty() {
        return Err(bad("the command is empty".into()));
    }
    if spec.command.contains('\0') {
        return Err(bad("the command contains a NUL byte".into()));
    }
    let size = spec_bytes(&spec);
    if size > MAX_SPEC_BYTES {
        return Err(bad(format!(
            "the job's command, environment and watch settings take {size} bytes, more than \
             the {MAX_SPEC_BYTES} allowed; put long scripts or data in a file and refer to it"
        )));
    }
    for (name, value) in &spec.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(bad(format!("invalid environment variable name {name:?}")));
        }
        if value.contains('\0') {
            return Err(bad(format!(
                "environment variable {name} contains a NUL byte"
            )));
        }
    }
    for (what, value) in [
        ("cwd", &spec.cwd),
        ("log_file", &spec.log_file),
        ("resume_command", &spec.watch.resume_command),
    ] {
        if value.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(bad(format!("{what} contains a NUL byte")));
        }
    }
    if let Some(name) = &spec.name
        && !statefile::valid_name(name)
    {
        return Err(bad(format!(
            "invalid job name {name:?}: use 1 to 64 of A-Z a-z 0-9 . _ -"
        )));
    }
    // A sandbox's job starts inside it, and writes its log only there.
    let scope = spec.sandbox.as_deref().map(Scope::of).transpose()?;
    if scope.is_some() {
        sandbox::check_env(&spec.env)?;
    }
    let cwd = match &scope {
        Some(scope) => scope.cwd(spec.cwd.as_deref())?,
        None => paths::resolve_cwd(spec.cwd.as_deref()),
    };
    if adopted.is_none() && scope.as_ref().is_none_or(|s| s.same_inside(&cwd)) && !cwd.is_dir() {
        return Err(error(
            ErrorKind::SpawnFailed,
            format!("cwd not found: {}", cwd.display()),
        ));
    }
    let custom_log = match (spec.log_file.as_deref(), &scope) {
        (None, _) => None,
        // The shim writes it from outside the sandbox: a path the sandbox
        // controls (a symlink planted there) must never be its target.
        (Some(_), Some(_)) => {
            return Err(bad(
                "log_file is not available in a sandbox: its log is read with read_background_log"
                    .into(),
            ));
        }
        (Some(p), None) => Some({
            let home = paths::home_dir();
            let path = paths::expand_tilde(p, home.as_deref());
            match home {
                Some(h) if path.is_relative() => h.join(path),
                _ => path,
            }
        }),
    };
    if let Some(log) = &custom_log
        && let Some(parent) = log.parent()
    {
        fs::create_dir_all(parent).map_err(|e| {
            error(
                ErrorKind::SpawnFailed,
                format!("cannot create {}: {e}", parent.display()),
            )
        })?;
    }

    // Names are claimed by mkdir, which is atomic: a user's name that
    // exists is refused, a generated one is drawn again.
    let (name, dir) = match &spec.name {
        Some(name) => {
            let dir = root.join(name);
            match fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => (name.clone(), dir),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(bad(format!("a job named {name} exists")));
                }
                Err(e) => return Err(write_failed(format!("cannot create {}", dir.display()), &e)),
            }
        }
        None => {
            let mut tries = 0;
            loop {
                let name = store::generated_name();
                let dir = root.join(&name);
                match fs::DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => break (name, dir),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => {
                        tries += 1;
                    }
                    Err(e) => {
                        let what = format!("cannot create a job dir in {}", root.display());
                        return Err(write_failed(what, &e));
                    }
                }
            }
        }
    };
    if let Some(stdin) = stdin
        && let Err(e) = statefile::write_atomic(&dir.join(store::STDIN), &stdin, false)
    {
        let _ = fs::remove_dir_all(&dir);
        return Err(write_failed("cannot write the job's stdin".into(), &e));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let log = match (custom_log, &scope) {
        (Some(log), _) => log,
        (None, Some(scope)) => {
            let logs = scope.dirs.logs();
            match fs::DirBuilder::new().mode(0o700).create(&logs) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(write_failed(
                        format!("cannot create {}", logs.display()),
                        &e,
                    ));
                }
                _ => logs.join(&name),
            }
        }
        (None, None) => dir.join(store::LOG),
    };
    let record = Record {
        log,
        spec,
        created_unix: statefile::now_unix(),
        created_ns: u64::try_from(nanos).unwrap_or(u64::MAX),
        cwd,
        token: adopted.map_or_else(|| format!("job.{name}.{nanos:x}"), str::to_string),
        egress_from: scope
            .as_ref()
            .and_then(Scope::egress_watermark)
            .map(|w| w.from),
    };
    // An exec call's job is flushed only if it outlives its call (see the
    // shim); anything else must survive a crash from the start.
    let durable = !record.spec.split_streams;
    statefile::write_json(&dir.join(store::SPEC), &record, durable).map_err(|e| {
        let _ = fs::remove_dir_all(&dir);
        write_failed("cannot write the job record".into(), &e)
    })?;
    Ok((name, dir))
}

/// A job's files could not be written: on a full disk or quota, an error
/// that says so ([`NO_ROOM_FOR_JOB`]), so the caller can run it inline.
pub fn write_failed(what: String, e: &io::Error) -> AgentError {
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => error(
            ErrorKind::Unavailable,
            format!("{NO_ROOM_FOR_JOB}: {what}: {e}"),
        ),
        _ => error(ErrorKind::Internal, format!("{what}: {e}")),
    }
}

/// Records the job an exec becomes when it is handed over (see
/// [`crate::supervisor`]): created under the exec's token, a background
/// job from the start (flushed, its start an event), its output so far in
/// its files. The job dir, for the shim to take on.
pub fn record_handed_over(
    spec: JobSpec,
    token: &str,
    pid: i32,
    so_far: &ExecResult,
) -> Result<PathBuf, AgentError> {
    let root = store::root()?;
    let (name, dir) = create(&root, spec, Some(token))?;
    let written = write_so_far(&dir, so_far).and_then(|()| {
        statefile::claim(&dir, store::DETACHED);
        for file in [store::SPEC, store::OMITTED] {
            match fs::File::open(dir.join(file)) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        fs::File::open(&dir)?.sync_all()
    });
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&dir);
        return Err(write_failed(
            "cannot write the job's output so far".into(),
            &e,
        ));
    }
    let detail = format!("pid {pid}, left running by its exec call");
    if let Err(e) = store::emit(&root, &name, "started", &detail) {
        eprintln!("outpost-agent: cannot record event started of job {name}: {e}");
    }
    Ok(dir)
}

/// Each stream's output so far into its file, both into the log, and what
/// was left out between head and tail into `omitted.json`.
fn write_so_far(dir: &Path, so_far: &ExecResult) -> io::Result<()> {
    let record: Record = statefile::read_json(&dir.join(store::SPEC))
        .ok_or_else(|| io::Error::other("the job record is unreadable"))?;
    let mut log = Vec::new();
    for (file, out) in [
        (store::STDOUT, &so_far.stdout),
        (store::STDERR, &so_far.stderr),
    ] {
        let mut bytes = out.head.clone();
        bytes.extend_from_slice(&out.tail);
        statefile::write_atomic(&dir.join(file), &bytes, false)?;
        log.extend_from_slice(&out.head);
        if out.omitted > 0 {
            log.extend_from_slice(
                format!("\n[... {} bytes omitted ...]\n", out.omitted).as_bytes(),
            );
        }
        log.extend_from_slice(&out.tail);
    }
    statefile::write_atomic(&record.log, &log, false)?;
    if so_far.stdout.omitted > 0 || so_far.stderr.omitted > 0 {
        statefile::write_json(
            &dir.join(store::OMITTED),
            &[so_far.stdout.omitted, so_far.stderr.omitted],
            false,
        )?;
    }
    Ok(())
}
