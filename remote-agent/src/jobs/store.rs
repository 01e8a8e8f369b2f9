//! The on-disk record of background jobs, and the job states derived from it.
//!
//! Every job is a directory `<state>/jobs/<name>/`; the processes that touch
//! it (the shim, the daemon, any `serve`) never share memory, only these
//! files:
//!
//! * `spec.json`: the [`JobSpec`] as asked, plus what was resolved at start
//!   (working directory, log path, process-tree token) and the creation time.
//! * `log`: the output, unless the spec names another file.
//! * `stdout`, `stderr`: each stream alone as well, for a job started with
//!   `split_streams` (an `exec_bash` that may outlast its caller).
//! * `stdin`: the bytes the spec gave for the command's standard input.
//! * `shim.json`, `child.json`: the supervising shim and the job's main
//!   process, each named by pid, start time and boot id.
//! * `exit.json`: how the job ended, written once by the shim (or by a cancel
//!   of a job whose shim is gone).
//! * `cancelled`, `end-reported`, `lost-reported`: markers. The `*-reported`
//!   ones are created with `O_EXCL`, so whichever process notices an ending
//!   first records its event and nobody records it twice.
//! * `resume.json`: how many resumes were started.
//! * `detached`: a split job whose caller returned while it ran. Until then
//!   it belongs to that call, which reports it and removes it: no events.
//!
//! The state is never stored, only derived: an exit record means the job
//! ended; otherwise a live shim means it runs; otherwise it is lost, unless
//! processes of the job still run without their shim: then it runs
//! (unsupervised) until the daemon ends them, and only then is it lost. So
//! no crash can leave a state that disagrees with the processes, and a job
//! reported lost never still runs.
//!
//! Events go to `<state>/jobs/events.jsonl`, one [`JobEvent`] per line, under
//! an exclusive `flock` of `events.lock` so sequence numbers stay increasing
//! across every process that appends.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outpost_protocol::{AgentError, ErrorKind, JobEvent, JobInfo, JobSpec, JobState};
use serde::{Deserialize, Serialize};

use crate::statefile::{
    ProcId, claim, error, now_unix, read_json, state_subdir, valid_name, write_atomic,
};
use crate::{flock, proctree};

pub const SPEC: &str = "spec.json";
pub const LOG: &str = "log";
pub const STDOUT: &str = "stdout";
pub const STDERR: &str = "stderr";
/// What the job reads on stdin, when the spec gave it (kept out of `spec.json`).
pub const STDIN: &str = "stdin";
pub const SHIM: &str = "shim.json";
pub const CHILD: &str = "child.json";
pub const EXIT: &str = "exit.json";
pub const CANCELLED: &str = "cancelled";
pub const RESUME: &str = "resume.json";
pub const END_REPORTED: &str = "end-reported";
pub const DETACHED: &str = "detached";
pub const LOST_REPORTED: &str = "lost-reported";
/// Why a shim could not start the command (it then exits without `exit.json`).
pub const SPAWN_ERROR: &str = "spawn-error";
/// `[stdout, stderr]` bytes an exec left out of the output it kept before
/// it was handed over as this job (its files hold only head and tail).
pub const OMITTED: &str = "omitted.json";
const EVENTS: &str = "events.jsonl";
const EVENTS_LOCK: &str = "events.lock";

/// A job dir without `shim.json` counts as starting, not lost, for this long
/// after its creation: the daemon creates the dir, then starts the shim.
const STARTING_GRACE: Duration = Duration::from_secs(10);
/// The events file is trimmed to about half this size when it grows past it.
const EVENTS_MAX: u64 = 8 * 1024 * 1024;
/// How long an event append waits for the lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// `<state>/jobs`, created (0700) if missing.
pub fn root() -> Result<PathBuf, AgentError> {
    state_subdir("jobs")
}

/// The directory of an existing job, or the error the controller shows.
pub fn find(root: &Path, name: &str) -> Result<PathBuf, AgentError> {
    let dir = root.join(name);
    if valid_name(name) && dir.join(SPEC).is_file() {
        Ok(dir)
    } else {
        Err(error(ErrorKind::BadRequest, format!("no job named {name}")))
    }
}

/// `job-YYYYMMDD-HHMMSS-xxxx` (UTC, four random hex digits).
pub fn generated_name() -> String {
    let secs = now_unix();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "job-{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{:04x}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        random_u16()
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Random enough to make name collisions rare (they are retried anyway).
/// `/dev/urandom`, else a hash of the clock, pid and a counter: the portable
/// build links against glibc 2.17, which has no getrandom.
fn random_u16() -> u16 {
    let mut buf = [0u8; 2];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
    {
        return u16::from_le_bytes(buf);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!(
        "{nanos}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let hash = blake3::hash(seed.as_bytes());
    u16::from_le_bytes([hash.as_bytes()[0], hash.as_bytes()[1]])
}

/// `spec.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub spec: JobSpec,
    pub created_unix: u64,
    /// Nanoseconds since the epoch at creation: orders jobs started in the
    /// same second (0 in records written before it existed).
    #[serde(default)]
    pub created_ns: u64,
    /// The working directory, resolved when the job was started.
    pub cwd: PathBuf,
    /// The log, resolved: the spec's `log_file` or `<job dir>/log`.
    pub log: PathBuf,
    /// Marks every process of the job (see [`crate::proctree`]).
    pub token: String,
    /// In a sandbox with `allow_hosts`: where its proxy's refusal log stood
    /// when the job was made, so its result names what was refused since.
    #[serde(default)]
    pub egress_from: Option<u64>,
}

/// `exit.json`: exactly one of `exit_code` and `signal` is set, unless a
/// cancel found the shim already gone (then both are None).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_unix: u64,
    /// Killed by the spec's `timeout_ms`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// From the start of this run to its end, measured by the shim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// `resume.json`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ResumeRecord {
    pub attempts: u32,
}

/// Everything known about one job at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub name: String,
    pub dir: PathBuf,
    pub record: Record,
    pub state: JobState,
    pub exit: Option<ExitRecord>,
    pub shim: Option<ProcId>,
    pub child: Option<ProcId>,
    pub attempts: u32,
    /// Running, but its shim is gone: nobody will record how it ends, so the
    /// daemon ends it and records the loss.
    pub unsupervised: bool,
}

impl Snapshot {
    /// Reads the job in `dir`. The exit record is read before the shim is
    /// checked, and again after a dead shim is seen, so a job ending right
    /// now is reported as ended, never as lost.
    pub fn read(dir: &Path) -> Result<Snapshot, AgentError> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let record: Record = read_json(&dir.join(SPEC)).ok_or_else(|| {
            error(
                ErrorKind::Internal,
                format!("the record of job {name} is unreadable"),
            )
        })?;
        let shim: Option<ProcId> = read_json(&dir.join(SHIM));
        let child: Option<ProcId> = read_json(&dir.join(CHILD));
        let attempts = read_json::<ResumeRecord>(&dir.join(RESUME)).map_or(0, |r| r.attempts);
        let mut exit: Option<ExitRecord> = read_json(&dir.join(EXIT));
        let mut unsupervised = false;
        let state = if exit.is_some() {
            ended_state(dir)
        } else {
            let running = match &shim {
                Some(shim) => shim.alive(),
                None => {
                    let age = now_unix().saturating_sub(record.created_unix);
                    age < STARTING_GRACE.as_secs()
                }
            };
            if running {
                JobState::Running
            } else {
                exit = read_json(&dir.join(EXIT));
                if exit.is_some() {
                    ended_state(dir)
                } else if orphans_run(dir, &record, shim.as_ref(), child.as_ref()) {
                    unsupervised = true;
                    JobState::Running
                } else {
                    JobState::Lost
                }
            }
        };
        Ok(Snapshot {
            name,
            dir: dir.to_path_buf(),
            record,
            state,
            exit,
            shim,
            child,
            attempts,
            unsupervised,
        })
    }

    pub fn info(&self) -> JobInfo {
        let log_size = fs::metadata(&self.record.log).map_or(0, |m| m.len());
        let exit = self.exit.as_ref();
        JobInfo {
            name: self.name.clone(),
            command: self.record.spec.command.clone(),
            state: self.state,
            exit_code: exit.and_then(|e| e.exit_code),
            signal: exit.and_then(|e| e.signal),
            // The main process of the latest run, also once it ended.
            pid: self.child.as_ref().map(|c| c.pid as u32),
            started_unix: self.record.created_unix,
            ended_unix: exit.map(|e| e.ended_unix),
            log_file: self.record.log.display().to_string(),
            log_size,
            resume_attempts: self.attempts,
            watch: self.record.spec.watch.clone(),
            timed_out: exit.is_some_and(|e| e.timed_out),
        }
    }

    /// The job's main process, while it is alive (so its pid still names
    /// its process group and session).
    pub fn live_child(&self) -> Option<i32> {
        self.child.as_ref().filter(|c| c.alive()).map(|c| c.pid)
    }
}

/// Whether processes of a job whose shim died without an exit record still
/// run. Whoever records the loss (`lost-reported`) ends them first, and
/// nothing survives a reboot, so only an unreported loss in this boot costs
/// a look at `/proc`.
fn orphans_run(dir: &Path, record: &Record, shim: Option<&ProcId>, child: Option<&ProcId>) -> bool {
    // No shim, no job process: the shim writes its record before it starts
    // the job.
    let Some(shim) = shim else {
        return false;
    };
    if !shim.boot_id.is_empty() && shim.boot_id != proctree::boot_id() {
        return false;
    }
    if dir.join(LOST_REPORTED).exists() {
        return false;
    }
    child.is_some_and(ProcId::alive) || !proctree::collect_tree(None, &record.token).is_empty()
}

fn ended_state(dir: &Path) -> JobState {
    if dir.join(CANCELLED).exists() {
        JobState::Cancelled
    } else {
        JobState::Exited
    }
}

/// Every job, oldest first. Entries that are not job dirs are skipped.
pub fn all(root: &Path) -> Vec<Snapshot> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut jobs: Vec<Snapshot> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().is_some_and(valid_name))
        .filter_map(|e| Snapshot::read(&e.path()).ok())
        .collect();
    jobs.sort_by(|a, b| {
        let key = |s: &Snapshot| (s.record.created_unix, s.record.created_ns);
        (key(a), &a.name).cmp(&(key(b), &b.name))
    });
    jobs
}

/// The event kind and detail for a job that ended.
pub fn end_event(exit: &ExitRecord, cancelled: bool) -> (&'static str, String) {
    let how = match (exit.exit_code, exit.signal) {
        _ if exit.timed_out => "timed out".to_string(),
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "ended while its supervisor was gone".to_string(),
    };
    let kind = if cancelled {
        "cancelled"
    } else if exit.exit_code == Some(0) {
        "completed"
    } else {
        "failed"
    };
    (kind, how)
}

/// Whether the job in `dir` is a background job whose events others hear
/// of: any job but a split one its exec call has not detached. (A record
/// that cannot be read is no one's to report: its call is removing it.)
pub fn is_background(dir: &Path) -> bool {
    dir.join(DETACHED).exists()
        || read_json::<Record>(&dir.join(SPEC)).is_some_and(|r| !r.spec.split_streams)
}

/// Records the end event of the job in `dir` unless someone already did.
pub fn report_end(root: &Path, dir: &Path, exit: &ExitRecord) {
    if !is_background(dir) {
        return;
    }
    if !claim(dir, END_REPORTED) {
        return;
    }
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let (kind, detail) = end_event(exit, dir.join(CANCELLED).exists());
    if let Err(e) = emit(root, &name, kind, &detail) {
        eprintln!("outpost-agent: cannot record event {kind} of job {name}: {e}");
    }
}

/// Appends one event; returns its sequence number.
pub fn emit(root: &Path, job: &str, kind: &str, detail: &str) -> io::Result<u64> {
    let lock = flock::open_private(&root.join(EVENTS_LOCK))?;
    if !flock::lock_within(&lock, LOCK_WAIT)? {
        return Err(io::Error::other("the events file stayed locked for 5 s"));
    }
    let path = root.join(EVENTS);
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)?;
    let seq = last_seq(&mut file)? + 1;
    let len = file.metadata()?.len();
    let mut last = [0u8; 1];
    let torn = len > 0 && {
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        last[0] != b'\n'
    };
    let event = JobEvent {
        seq,
        job: job.to_string(),
        kind: kind.to_string(),
        at_unix: now_unix(),
        detail: detail.to_string(),
    };
    // A torn line left by a crash mid-append is ended first, so it cannot
    // swallow this one.
    let mut line = if torn { vec![b'\n'] } else { Vec::new() };
    serde_json::to_writer(&mut line, &event).map_err(io::Error::other)?;
    line.push(b'\n');
    // One write on an O_APPEND descriptor: readers see whole lines or none.
    file.write_all(&line)?;
    if file.metadata()?.len() > EVENTS_MAX {
        trim_events(&path, &mut file)?;
    }
    Ok(seq)
}

/// The highest sequence number in the events file: from its last whole line
/// that parses, found by reading backwards; 0 for an empty file.
fn last_seq(file: &mut File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut tail: Vec<u8> = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(64 * 1024);
        let mut chunk = vec![0u8; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        // Whole lines only: from the first newline on, unless at the start.
        let from = if start == 0 {
            0
        } else {
            match tail.iter().position(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => {
                    end = start;
                    continue;
                }
            }
        };
        for line in tail[from..].split(|&b| b == b'\n').rev() {
            if let Ok(event) = serde_json::from_slice::<JobEvent>(line) {
                return Ok(event.seq);
            }
        }
        tail.truncate(from);
        end = start;
    }
    Ok(0)
}

/// Keeps the newer half of the events file (whole lines), by rename. Called
/// under the lock.
fn trim_events(path: &Path, file: &mut File) -> io::Result<()> {
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len - EVENTS_MAX / 2))?;
    let mut reader = BufReader::new(&mut *file);
    let mut skipped = Vec::new();
    reader.read_until(b'\n', &mut skipped)?;
    let mut kept = Vec::new();
    reader.read_to_end(&mut kept)?;
    write_atomic(path, &kept, false)
}

/// Events after `after_seq`, oldest first, at most `limit`; only those of
/// job `name` when given. Streams the file line by line.
pub fn events(root: &Path, name: Option<&str>, after_seq: u64, limit: usize) -> Vec<JobEvent> {
    let Ok(file) = File::open(root.join(EVENTS)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut reader = BufReader::new(file);
    while out.len() < limit {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(event) = serde_json::from_slice::<JobEvent>(&line) else {
            continue;
        };
        if event.seq > after_seq && name.is_none_or(|n| n == event.job) {
            out.push(event);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statefile::make_dir_all;

    #[test]
    fn names() {
        for ok in ["a", "job-1", "A.b_c-9", &"x".repeat(64), "..a"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"x".repeat(65), "a\0"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        let g = generated_name();
        assert!(
            valid_name(&g) && g.starts_with("job-") && g.len() == 24,
            "{g}"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_416), (2025, 11, 24));
    }

    #[test]
    fn end_events() {
        let exit = |exit_code, signal| ExitRecord {
            exit_code,
            signal,
            ended_unix: 0,
            timed_out: false,
            duration_ms: None,
        };
        assert_eq!(end_event(&exit(Some(0), None), false).0, "completed");
        assert_eq!(
            end_event(&exit(Some(3), None), false),
            ("failed", "exit code 3".into())
        );
        assert_eq!(
            end_event(&exit(None, Some(9)), false),
            ("failed", "killed by signal 9".into())
        );
        assert_eq!(end_event(&exit(None, Some(15)), true).0, "cancelled");
    }

    #[test]
    fn events_keep_increasing() {
        let dir = std::env::temp_dir().join(format!("outpost-events-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        make_dir_all(&dir).unwrap();
        assert_eq!(emit(&dir, "a", "started", "").unwrap(), 1);
        assert_eq!(emit(&dir, "b", "started", "x").unwrap(), 2);
        // A torn last line (a crash mid-append) is skipped.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(EVENTS))
            .unwrap();
        f.write_all(b"{\"seq\":99,").unwrap();
        drop(f);
        assert_eq!(emit(&dir, "a", "completed", "exit code 0").unwrap(), 3);
        let all = events(&dir, None, 0, 100);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let a = events(&dir, Some("a"), 1, 100);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].kind, "completed");
        assert_eq!(events(&dir, None, 0, 2).len(), 2);
        let _ = fs::remove_dir_all(&dir);
    }
}
