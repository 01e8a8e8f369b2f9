//! Background jobs: commands that outlive the SSH connection, the
//! controller, and the agent processes that started them, with exact exit
//! codes, a byte-complete log, events, and resume of jobs found lost.
//!
//! Three kinds of process share the work, and only files connect them (see
//! [`store`]):
//!
//! * a [`shim`] per job supervises it: starts it, waits for it, records how
//!   it ended;
//! * the per-user [daemon](crate::daemon) starts shims (so jobs are not children of any
//!   SSH session's `serve`), notices lost jobs and resumes them;
//! * `serve` answers everything but `JobStart` straight from the files, so
//!   status, logs, waits, events and cancels work whether or not a daemon
//!   runs.
//!
//! The request handlers here block (files, `/proc`, sleeps); `serve` runs
//! them on blocking threads.

pub mod create;
pub use create::record_handed_over;
pub mod logfile;
pub mod shim;
pub mod store;

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentError, CapturedOutput, ErrorKind, ExecResult, JobCollect, JobInfo, JobLog, JobRead,
    JobState, JobWait, JobWaited, Request, Response, WaitReason, WatchSpec,
};
use regex::bytes::Regex;
use tokio::sync::watch;

use self::logfile::LineMatcher;
use self::store::Snapshot;
use crate::proctree;
use crate::statefile::{self, error};

/// Output returned when a request asks for 0 bytes, and the most any may ask.
const DEFAULT_BYTES: u64 = 64 * 1024;
const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Longest `JobWait`.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// How often a wait looks at the log and the exit record, at most (it
/// starts at 1 ms and doubles).
const WAIT_POLL: Duration = Duration::from_millis(25);
/// How long a wait looks every millisecond before it backs off.
const QUICK_WAIT: Duration = Duration::from_millis(20);
/// Bytes one wait poll or one read request scans for a pattern, so each
/// stays short however fast a job writes.
const POLL_SCAN: u64 = 64 * 1024 * 1024;
const READ_SCAN: u64 = 1024 * 1024 * 1024;
/// Grace between TERM and KILL when a cancel names none, and the most it
/// may name.
const DEFAULT_GRACE: Duration = Duration::from_secs(3);
const MAX_GRACE: Duration = Duration::from_secs(600);
/// Default and largest number of events per request.
const DEFAULT_EVENTS: u32 = 100;
const MAX_EVENTS: u32 = 1000;

/// The command a resume runs: `resume_command`, else the `resume_command`
/// field of `resume_plan_json`.
pub fn resume_command(watch: &WatchSpec) -> Option<String> {
    if let Some(c) = watch
        .resume_command
        .as_ref()
        .filter(|c| !c.trim().is_empty())
    {
        return Some(c.clone());
    }
    let plan: serde_json::Value = serde_json::from_str(watch.resume_plan_json.as_deref()?).ok()?;
    plan.get("resume_command")?
        .as_str()
        .filter(|c| !c.trim().is_empty())
        .map(str::to_string)
}

pub fn status(name: &str) -> Result<Response, AgentError> {
    let root = store::root()?;
    let dir = store::find(&root, name)?;
    Ok(Response::Job(Snapshot::read(&dir)?.info()))
}

/// A job request but `JobStart`; `only`: the sandbox it was made in, whose
/// jobs alone it may see (a name of another's is as unknown as any).
pub fn answer(
    request: Request,
    only: Option<&str>,
    stop: &watch::Receiver<bool>,
) -> Result<Response, AgentError> {
    let named = match &request {
        Request::JobStatus { name } | Request::JobCancel { name, .. } => Some(name),
        Request::JobWait(JobWait { name, .. })
        | Request::JobRead(JobRead { name, .. })
        | Request::JobCollect(JobCollect { name, .. }) => Some(name),
        Request::JobEvents { name, .. } => name.as_ref(),
        _ => None,
    };
    if let (Some(name), Some(sandbox)) = (named, only)
        && !made_in(name, sandbox)
    {
        return Err(error(
            ErrorKind::BadRequest,
            format!("no job named {name} in sandbox {sandbox}"),
        ));
    }
    match request {
        Request::JobStatus { name } => status(&name),
        Request::JobList { state, limit } => list(state, limit, only),
        Request::JobCancel { name, grace_ms } => cancel(&name, grace_ms),
        Request::JobWait(req) => wait(&req, stop),
        Request::JobRead(req) => read(&req),
        Request::JobCollect(req) => collect(&req),
        Request::JobEvents {
            name,
            after_seq,
            limit,
        } => events(name.as_deref(), after_seq, limit, only),
        other => Err(error(
            ErrorKind::Internal,
            format!("not a job request: {other:?}"),
        )),
    }
}

/// Whether job `name` was made in `sandbox` (its spec alone says).
fn made_in(name: &str, sandbox: &str) -> bool {
    store::root()
        .and_then(|root| store::find(&root, name))
        .ok()
        .and_then(|dir| statefile::read_json::<store::Record>(&dir.join(store::SPEC)))
        .is_some_and(|record| record.spec.sandbox.as_deref() == Some(sandbox))
}

/// `JobList`: the newest `limit` jobs in `state` (of sandbox `only`, when
/// given), newest first, as many as fit [`LIST_BYTES`] (a host keeps every
/// job it ran, and some commands are long), and how many older ones were
/// left out.
pub fn list(
    state: Option<JobState>,
    limit: u32,
    only: Option<&str>,
) -> Result<Response, AgentError> {
    let root = store::root()?;
    let mut matching: Vec<Snapshot> = store::all(&root)
        .into_iter()
        .filter(|s| state.is_none_or(|st| s.state == st))
        .filter(|s| only.is_none() || s.record.spec.sandbox.as_deref() == only)
        .collect();
    // Oldest first from the store.
    matching.reverse();
    let limit = if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let mut jobs = Vec::new();
    let mut bytes = 0;
    for snapshot in &matching {
        let info = snapshot.info();
        bytes += info_bytes(&info);
        // The newest always goes in (a spec is at most 1 MiB of text).
        if jobs.len() >= limit || (bytes > LIST_BYTES && !jobs.is_empty()) {
            break;
        }
        jobs.push(info);
    }
    let omitted = (matching.len() - jobs.len()) as u64;
    Ok(Response::Jobs { jobs, omitted })
}

/// Most estimated bytes of jobs in one `Jobs` answer: half a frame.
const LIST_BYTES: usize = outpost_protocol::limits::MAX_FRAME_LEN / 2;

/// An upper bound on a job's encoded size: its strings plus fixed fields.
fn info_bytes(info: &JobInfo) -> usize {
    let strings: usize = [&info.name, &info.command, &info.log_file]
        .iter()
        .map(|s| s.len() + 5)
        .sum::<usize>()
        + watch_texts(&info.watch)
            .iter()
            .map(|s| s.as_ref().map_or(1, |s| s.len() + 6))
            .sum::<usize>();
    strings + 128
}

/// Every optional text of a watch spec.
pub(crate) fn watch_texts(w: &WatchSpec) -> [&Option<String>; 8] {
    [
        &w.run_id,
        &w.watch_name,
        &w.resume_command,
        &w.resume_plan_json,
        &w.checkpoint_path,
        &w.checkpoint_format,
        &w.checkpoint_command,
        &w.metadata_json,
    ]
}

/// `JobEvents` after `after_seq`, of job `name` or of all (of sandbox
/// `only`, when given).
pub fn events(
    name: Option<&str>,
    after_seq: u64,
    limit: u32,
    only: Option<&str>,
) -> Result<Response, AgentError> {
    let root = store::root()?;
    if let Some(name) = name {
        store::find(&root, name)?;
    }
    let limit = if limit == 0 { DEFAULT_EVENTS } else { limit }.min(MAX_EVENTS) as usize;
    let mut events = match (name, only) {
        (None, Some(_)) => store::events(&root, None, after_seq, usize::MAX),
        _ => store::events(&root, name, after_seq, limit),
    };
    if let (None, Some(sandbox)) = (name, only) {
        let mut theirs = std::collections::HashMap::new();
        events.retain(|e| {
            *theirs
                .entry(e.job.clone())
                .or_insert_with(|| made_in(&e.job, sandbox))
        });
        events.truncate(limit);
    }
    Ok(Response::JobEvents(events))
}

/// `JobCancel`: marks the job cancelled, then TERM to its whole tree (found
/// by token, process group, session and descendants), KILL after the
/// grace, and waits for the shim to record the signal.
pub fn cancel(name: &str, grace_ms: u64) -> Result<Response, AgentError> {
    let root = store::root()?;
    let dir = store::find(&root, name)?;
    let mut snap = Snapshot::read(&dir)?;
    if matches!(snap.state, JobState::Exited | JobState::Cancelled) {
        return Ok(Response::Job(snap.info()));
    }
    let grace = match grace_ms {
        0 => DEFAULT_GRACE,
        ms => Duration::from_millis(ms).min(MAX_GRACE),
    };
    statefile::claim(&dir, store::CANCELLED);
    // A shim that has not started the job yet will: wait for it, so the
    // tree to kill exists.
    let deadline = Instant::now() + Duration::from_secs(2);
    while snap.state == JobState::Running && snap.child.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        snap = Snapshot::read(&dir)?;
    }
    proctree::terminate_tree(snap.live_child(), &snap.record.token, grace);
    // The shim reaps the job and writes the exit record right away.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        snap = Snapshot::read(&dir)?;
        if snap.state != JobState::Running || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if snap.state == JobState::Lost {
        // Nobody will write the record: the shim is gone.
        let exit = store::ExitRecord {
            exit_code: None,
            signal: None,
            ended_unix: statefile::now_unix(),
            timed_out: false,
            duration_ms: None,
        };
        statefile::write_json(&dir.join(store::EXIT), &exit, true).map_err(|e| {
            error(
                ErrorKind::Internal,
                format!("cannot record the cancel: {e}"),
            )
        })?;
        store::report_end(&root, &dir, &exit);
        snap = Snapshot::read(&dir)?;
    }
    Ok(Response::Job(snap.info()))
}

fn compile(what: &str, pattern: &str) -> Result<Regex, AgentError> {
    Regex::new(pattern).map_err(|e| {
        error(
            ErrorKind::BadRequest,
            format!("invalid {what} regex {pattern:?}: {e}"),
        )
    })
}

fn byte_limit(max_bytes: u64) -> u64 {
    if max_bytes == 0 {
        DEFAULT_BYTES
    } else {
        max_bytes.min(MAX_BYTES)
    }
}

fn io_error(log: &Path, e: std::io::Error) -> AgentError {
    error(
        ErrorKind::Internal,
        format!("cannot read {}: {e}", log.display()),
    )
}

/// `JobRead`: a page from an offset, the last lines, or matching lines.
pub fn read(req: &JobRead) -> Result<Response, AgentError> {
    let root = store::root()?;
    let dir = store::find(&root, &req.name)?;
    let re = req
        .grep
        .as_deref()
        .map(|p| compile("grep", p))
        .transpose()?;
    let snap = Snapshot::read(&dir)?;
    let max = byte_limit(req.max_bytes);
    let log = &snap.record.log;
    let file = match File::open(log) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Response::JobLog(JobLog {
                data: Vec::new(),
                offset: 0,
                next_offset: 0,
                log_size: 0,
            }));
        }
        Err(e) => return Err(io_error(log, e)),
    };
    let size = file.metadata().map_err(|e| io_error(log, e))?.len();
    let page = match (req.offset, req.tail_lines, re) {
        (None, Some(lines), None) => {
            let start =
                logfile::tail_start(&file, size, lines, max).map_err(|e| io_error(log, e))?;
            let data =
                logfile::read_range(&file, start, size - start).map_err(|e| io_error(log, e))?;
            JobLog {
                data,
                offset: start,
                next_offset: size,
                log_size: size,
            }
        }
        (None, Some(lines), Some(re)) => {
            let (data, stopped) = logfile::grep_backward(&file, &re, size, lines, max, READ_SCAN)
                .map_err(|e| io_error(log, e))?;
            JobLog {
                data,
                offset: stopped,
                next_offset: size,
                log_size: size,
            }
        }
        (offset, _, Some(re)) => {
            let from = offset.unwrap_or(0).min(size);
            let done = snap.state != JobState::Running;
            let (data, next) = logfile::grep_forward(&file, &re, from, size, max, READ_SCAN, done)
                .map_err(|e| io_error(log, e))?;
            JobLog {
                data,
                offset: from,
                next_offset: next,
                log_size: size,
            }
        }
        (offset, _, None) => {
            let from = offset.unwrap_or(0).min(size);
            let data = logfile::read_range(&file, from, max.min(size - from))
                .map_err(|e| io_error(log, e))?;
            JobLog {
                next_offset: from + data.len() as u64,
                data,
                offset: from,
                log_size: size,
            }
        }
    };
    Ok(Response::JobLog(page))
}

/// `JobWait`: polls the exit record and the log until the job is no longer
/// running, new output matches, output stays silent, or time is up (or the
/// request is cancelled, which answers like a timeout).
pub fn wait(req: &JobWait, cancel: &watch::Receiver<bool>) -> Result<Response, AgentError> {
    let root = store::root()?;
    let dir = store::find(&root, &req.name)?;
    let re = req
        .pattern
        .as_deref()
        .map(|p| compile("pattern", p))
        .transpose()?;
    let started = Instant::now();
    let deadline = started + Duration::from_millis(req.timeout_ms).min(MAX_WAIT);
    let silence = req.silence_ms.map(Duration::from_millis);
    let max = byte_limit(req.max_bytes);

    let mut snap = Snapshot::read(&dir)?;
    let log = snap.record.log.clone();
    let size_now = |log: &Path| std::fs::metadata(log).map_or(0, |m| m.len());
    let cursor = req.cursor.min(size_now(&log));
    let mut matcher = re.map(|re| LineMatcher::new(re, cursor));
    let mut seen = cursor;
    let mut last_growth = Instant::now();
    let mut file: Option<File> = None;
    let mut poll = Duration::from_millis(1);

    let (reason, stop) = loop {
        // The state first: once it says ended, every byte is in the log.
        snap = Snapshot::read(&dir)?;
        let size = size_now(&log);
        if size > seen {
            last_growth = Instant::now();
            seen = size;
        }
        if let Some(m) = matcher.as_mut()
            && m.pos() < size
        {
            if file.is_none() {
                file = Some(File::open(&log).map_err(|e| io_error(&log, e))?);
            }
            let f = file.as_ref().expect("opened above");
            if let Some(end) = scan(f, m, size).map_err(|e| io_error(&log, e))? {
                break (WaitReason::Matched, end);
            }
        }
        let scanned = matcher.as_ref().map_or(size, LineMatcher::pos);
        let caught_up = scanned >= size;
        if caught_up && matcher.as_ref().is_some_and(LineMatcher::partial_matches) {
            break (WaitReason::Matched, scanned);
        }
        if snap.state != JobState::Running && caught_up {
            break (WaitReason::Ended, scanned);
        }
        let now = Instant::now();
        if silence.is_some_and(|s| now.duration_since(last_growth) >= s) {
            break (WaitReason::Silent, scanned);
        }
        if now >= deadline || *cancel.borrow() {
            break (WaitReason::TimedOut, scanned);
        }
        if caught_up {
            std::thread::sleep(poll.min(deadline.saturating_duration_since(now)));
            // Short jobs (an exec_bash run as a job) are answered within a
            // millisecond of their end; long ones cost a look per poll.
            if started.elapsed() > QUICK_WAIT {
                poll = (poll * 2).min(WAIT_POLL);
            }
        }
    };

    let start = stop.saturating_sub(max).max(cursor);
    let output = if stop > start {
        let f = match file {
            Some(f) => f,
            None => File::open(&log).map_err(|e| io_error(&log, e))?,
        };
        logfile::read_range(&f, start, stop - start).map_err(|e| io_error(&log, e))?
    } else {
        Vec::new()
    };
    Ok(Response::JobWaited(JobWaited {
        job: snap.info(),
        reason,
        omitted: start - cursor,
        output,
        cursor_after: stop,
    }))
}

/// `JobCollect`: an exec-shaped result from a split job's stream files, and
/// when asked, the job's record removed if it ended: an `exec_bash` that
/// finished within its caller's patience leaves no job behind. A job still
/// running gives the output so far and, when asked, is detached from its
/// call: a background job like any from then on, kept when it ends.
pub fn collect(req: &JobCollect) -> Result<Response, AgentError> {
    let root = store::root()?;
    let dir = store::find(&root, &req.name)?;
    let mut snap = Snapshot::read(&dir)?;
    if !snap.record.spec.split_streams {
        return Err(error(
            ErrorKind::BadRequest,
            format!(
                "job {} keeps one merged log; read it with a log request",
                req.name
            ),
        ));
    }
    if snap.state == JobState::Running && req.detach && statefile::claim(&dir, store::DETACHED) {
        // A background job from now on: its record must survive a crash
        // (it was written without a flush while it was the call's).
        for file in [store::SPEC, store::STDIN] {
            let _ = File::open(dir.join(file)).and_then(|f| f.sync_all());
        }
        let _ = File::open(&dir).and_then(|d| d.sync_all());
        // Its start is an event before anyone can report its end.
        let pid = snap.child.as_ref().map_or(0, |c| c.pid);
        let detail = format!("pid {pid}, left running by its exec call");
        if let Err(e) = store::emit(&root, &snap.name, "started", &detail) {
            eprintln!(
                "outpost-agent: cannot record event started of job {}: {e}",
                snap.name
            );
        }
        // A job that ended meanwhile may have missed the mark: its end is
        // reported here then (once, whoever comes first).
        snap = Snapshot::read(&dir)?;
        if let Some(exit) = &snap.exit {
            store::report_end(&root, &dir, exit);
        }
    }
    let running = snap.state == JobState::Running;
    let limit = req
        .output_limit
        .min(outpost_protocol::limits::MAX_EXEC_OUTPUT_LIMIT);
    let omitted: [u64; 2] = statefile::read_json(&dir.join(store::OMITTED)).unwrap_or_default();
    let stream = |file: &str, before: u64| {
        let path = dir.join(file);
        let mut out = head_and_tail(&path, limit).map_err(|e| io_error(&path, e))?;
        out.omitted += before;
        Ok::<_, AgentError>(out)
    };
    let exit = snap.exit.as_ref();
    let result = ExecResult {
        exit_code: exit.and_then(|e| e.exit_code),
        signal: exit.and_then(|e| e.signal),
        timed_out: exit.is_some_and(|e| e.timed_out),
        cancelled: snap.state == JobState::Cancelled,
        stdout: stream(store::STDOUT, omitted[0])?,
        stderr: stream(store::STDERR, omitted[1])?,
        duration_ms: exit.and_then(|e| e.duration_ms).unwrap_or_else(|| {
            statefile::now_unix().saturating_sub(snap.record.created_unix) * 1000
        }),
        egress_denied: egress_since(&snap.record),
        listening: Vec::new(),
    };
    let job = snap.info();
    // The call keeps the end to itself only if no background job's end was
    // (or can now be) reported: the claim settles it against the shim.
    if req.remove_if_ended
        && !running
        && !dir.join(store::DETACHED).exists()
        && statefile::claim(&dir, store::END_REPORTED)
        && let Err(e) = std::fs::remove_dir_all(&dir)
    {
        // The result is what matters; a leftover directory is only listed.
        eprintln!("outpost-agent: cannot remove {}: {e}", dir.display());
    }
    Ok(Response::JobCollected { job, result })
}

/// A file's first and last bytes as [`crate::capture::Capture`] keeps a
/// stream: half the limit each, and the count of what lies between.
fn head_and_tail(path: &Path, limit: u64) -> std::io::Result<CapturedOutput> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(CapturedOutput::default()),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    let head_len = (limit / 2).min(size);
    let tail_len = (limit - limit / 2).min(size - head_len);
    Ok(CapturedOutput {
        head: logfile::read_range(&file, 0, head_len)?,
        tail: logfile::read_range(&file, size - tail_len, tail_len)?,
        omitted: size - head_len - tail_len,
    })
}

/// Feeds the matcher up to [`POLL_SCAN`] new bytes, in chunks; the offset
/// past the first matching line, if any.
fn scan(file: &File, m: &mut LineMatcher, size: u64) -> std::io::Result<Option<u64>> {
    let limit = size.min(m.pos() + POLL_SCAN);
    while m.pos() < limit {
        let len = (limit - m.pos()).min(logfile::CHUNK as u64);
        let chunk = logfile::read_range(file, m.pos(), len)?;
        if chunk.is_empty() {
            break;
        }
        if let Some(end) = m.feed(&chunk) {
            return Ok(Some(end));
        }
    }
    Ok(None)
}

/// What a sandbox's proxy refused since the job was made.
fn egress_since(record: &store::Record) -> Vec<String> {
    let (Some(id), Some(from)) = (&record.spec.sandbox, record.egress_from) else {
        return Vec::new();
    };
    crate::sandbox::store::Dirs::find(id).map_or_else(
        |_| Vec::new(),
        |dirs| crate::sandbox::egress::Watermark::at(&dirs.meta(), from).since(),
    )
}
