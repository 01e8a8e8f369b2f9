//! The daemon's job service: it starts each job's shim, watches running
//! jobs for a shim that died without an exit record (lost), ends what such a
//! job left running, records the loss once, and resumes the job when its
//! watch settings ask for it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use outpost_protocol::{ErrorKind, JobSpec, JobState, Response};
use tokio::io::AsyncReadExt;

use super::Daemon;
use crate::jobs::store::{self, ResumeRecord, Snapshot};
use crate::statefile::{self, ProcId, error};
use crate::{jobs, paths, proctree, sandbox};

/// How long `JobStart` waits for the shim to report the job's pid.
const READY_WAIT: Duration = Duration::from_secs(2);
/// Grace between TERM and KILL for leftovers of a lost job.
const LEFTOVER_GRACE: Duration = Duration::from_millis(500);

/// A running job as the daemon watches it.
#[derive(Clone)]
pub(super) struct Watched {
    dir: PathBuf,
    shim: Option<ProcId>,
}

impl Watched {
    fn of(dir: &Path) -> Watched {
        Watched {
            dir: dir.to_path_buf(),
            shim: statefile::read_json(&dir.join(store::SHIM)),
        }
    }

    /// The cheap check, one stat and one `/proc` read: no exit record yet
    /// and the shim alive. Anything else gets a full look.
    fn unchanged(&self) -> bool {
        self.shim.as_ref().is_some_and(ProcId::alive) && !self.dir.join(store::EXIT).exists()
    }
}

impl Daemon {
    /// `JobStart`: validates, creates the job dir, starts its shim and
    /// answers once the job's main process exists.
    pub(super) async fn start(self: &Arc<Self>, spec: JobSpec) -> Response {
        let root = self.root.clone();
        let created =
            tokio::task::spawn_blocking(move || jobs::create::create(&root, spec, None)).await;
        let (name, dir) = match created {
            Ok(Ok(created)) => created,
            Ok(Err(e)) => return Response::Error(e),
            Err(_) => return Response::Error(error(ErrorKind::Internal, "worker panicked")),
        };
        if let Err(message) = launch(&dir, false).await {
            let _ = fs::remove_dir_all(&dir);
            return Response::Error(error(ErrorKind::SpawnFailed, message));
        }
        self.watched().insert(name, Watched::of(&dir));
        match tokio::task::spawn_blocking(move || Snapshot::read(&dir)).await {
            Ok(Ok(snap)) => Response::Job(snap.info()),
            Ok(Err(e)) => Response::Error(e),
            Err(_) => Response::Error(error(ErrorKind::Internal, "worker panicked")),
        }
    }

    /// At start: watch running jobs, report endings and losses nobody
    /// recorded, schedule resumes.
    pub(super) fn adopt(&self) {
        for snap in store::all(&self.root) {
            self.consider(snap);
        }
    }

    /// One look at every watched job and live sandbox.
    pub(super) fn check(&self) {
        self.sandboxes.store(sandbox::supervise(), Ordering::SeqCst);
        self.contexts.prune();
        let jobs: Vec<(String, Watched)> = self
            .watched()
            .iter()
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect();
        for (name, watched) in jobs {
            if watched.unchanged() {
                continue;
            }
            match Snapshot::read(&watched.dir) {
                Ok(snap) => {
                    if snap.state != JobState::Running {
                        self.watched().remove(&name);
                    }
                    self.consider(snap);
                }
                // Removed by hand: nothing left to watch.
                Err(_) => {
                    self.watched().remove(&name);
                }
            }
        }
    }

    fn consider(&self, snap: Snapshot) {
        if snap.unsupervised {
            self.watched().remove(&snap.name);
            self.lost(&snap);
            return;
        }
        match snap.state {
            JobState::Running => {
                let watched = Watched {
                    dir: snap.dir.clone(),
                    shim: snap.shim.clone(),
                };
                self.watched().insert(snap.name.clone(), watched);
            }
            JobState::Exited | JobState::Cancelled => {
                // The shim records the end; stand in only if it died first.
                if let Some(exit) = &snap.exit
                    && !snap.shim.as_ref().is_some_and(ProcId::alive)
                {
                    store::report_end(&self.root, &snap.dir, exit);
                }
            }
            JobState::Lost => self.lost(&snap),
        }
    }

    /// A job without exit record and without its shim: end what still runs
    /// of it, record the loss once, and schedule a resume if its watch
    /// settings ask for one.
    fn lost(&self, snap: &Snapshot) {
        let dir = &snap.dir;
        // Nobody would record how these end, and a resume must never run
        // beside them: they are ended before the loss is recorded, so a job
        // reported lost never still runs.
        let ended = if snap.unsupervised {
            let root = snap.live_child();
            let found = proctree::collect_tree(root, &snap.record.token).len();
            proctree::terminate_tree(root, &snap.record.token, LEFTOVER_GRACE);
            found
        } else {
            0
        };
        if statefile::claim(dir, store::LOST_REPORTED) {
            let mut detail = match &snap.shim {
                Some(shim) if !shim.boot_id.is_empty() && shim.boot_id != proctree::boot_id() => {
                    "the host rebooted".to_string()
                }
                Some(shim) => format!(
                    "its supervisor (pid {}) died without recording an exit",
                    shim.pid
                ),
                None => "its supervisor never started".to_string(),
            };
            if ended > 0 {
                detail.push_str(&match ended {
                    1 => "; its remaining process was ended".to_string(),
                    n => format!("; its {n} remaining processes were ended"),
                });
            }
            if let Some(why) = no_resume_reason(snap) {
                detail.push_str(&format!("; {why}"));
            }
            // An exec call's own job is reported by that call.
            if store::is_background(dir)
                && let Err(e) = store::emit(&self.root, &snap.name, "interrupted", &detail)
            {
                eprintln!("outpost-agent daemon: cannot record event: {e}");
            }
        }
        if resumable(snap) && !self.pending().contains_key(&snap.name) {
            let delay = Duration::from_secs(snap.record.spec.watch.resume_delay_s);
            self.pending()
                .insert(snap.name.clone(), Instant::now() + delay);
        }
    }

    /// Starts the resumes whose delay has passed.
    pub(super) async fn resume_due(self: &Arc<Self>) {
        let now = Instant::now();
        let due: Vec<String> = {
            let mut pending = self.pending();
            let due: Vec<String> = pending
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for name in &due {
                pending.remove(name);
            }
            due
        };
        for name in due {
            let dir = self.root.join(&name);
            let prepared = {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || prepare_resume(&dir)).await
            };
            if !matches!(prepared, Ok(true)) {
                continue;
            }
            match launch(&dir, true).await {
                Ok(()) => {
                    self.watched().insert(name, Watched::of(&dir));
                }
                Err(message) => {
                    let root = self.root.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        // Lost again, and already said so.
                        statefile::claim(&dir, store::LOST_REPORTED);
                        if let Err(e) = store::emit(&root, &name, "resume_failed", &message) {
                            eprintln!("outpost-agent daemon: cannot record event: {e}");
                        }
                    })
                    .await;
                }
            }
        }
    }
}

/// Cancels every running job under `root` (their whole trees), as
/// `JobCancel` would, so none outlives the allocation that ran it.
pub(super) fn end_all_jobs(root: &Path) {
    for snap in store::all(root) {
        if snap.state == JobState::Running
            && let Err(e) = jobs::cancel(&snap.name, 0)
        {
            eprintln!("outpost-agent daemon: ending {}: {}", snap.name, e.message);
        }
    }
}

fn resumable(snap: &Snapshot) -> bool {
    let watch = &snap.record.spec.watch;
    watch.auto_resume
        && jobs::resume_command(watch).is_some()
        && snap.attempts < max_attempts(snap)
        && !snap.dir.join(store::CANCELLED).exists()
}

fn max_attempts(snap: &Snapshot) -> u32 {
    snap.record.spec.watch.max_resume_attempts.max(1)
}

/// For the `interrupted` event: why a job with auto-resume is not resumed.
fn no_resume_reason(snap: &Snapshot) -> Option<String> {
    let watch = &snap.record.spec.watch;
    if !watch.auto_resume || resumable(snap) {
        return None;
    }
    Some(if jobs::resume_command(watch).is_none() {
        "no resume: no resume command".to_string()
    } else if snap.attempts >= max_attempts(snap) {
        format!(
            "no resume: {} of {} attempts used",
            snap.attempts,
            max_attempts(snap)
        )
    } else {
        "no resume: cancelled".to_string()
    })
}

/// Re-checks a job due for resume and records the attempt; false when it
/// must not be resumed after all (cancelled, ended, running again).
fn prepare_resume(dir: &Path) -> bool {
    let Ok(snap) = Snapshot::read(dir) else {
        return false;
    };
    if snap.state != JobState::Lost || !resumable(&snap) {
        return false;
    }
    // A resume must never run beside what is left of the old run.
    proctree::terminate_tree(snap.live_child(), &snap.record.token, LEFTOVER_GRACE);
    let record = ResumeRecord {
        attempts: snap.attempts + 1,
    };
    if statefile::write_json(&dir.join(store::RESUME), &record, true).is_err() {
        return false;
    }
    // A new run may be lost (and reported) again.
    let _ = fs::remove_file(dir.join(store::LOST_REPORTED));
    let _ = fs::remove_file(dir.join(store::CHILD));
    true
}

/// Starts the shim of the job in `dir` and waits until the job's main
/// process exists (or the shim says why it could not start it).
async fn launch(dir: &Path, resume: bool) -> Result<(), String> {
    let exe = paths::running_exe()
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let mut cmd = tokio::process::Command::new(&exe);
    cmd.arg("shim").arg(dir);
    if resume {
        cmd.arg("--resume");
    }
    // stderr stays the daemon log; stdout says when the job runs.
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut shim = cmd
        .spawn()
        .map_err(|e| format!("cannot start the job's shim {}: {e}", exe.display()))?;
    let deadline = Instant::now() + READY_WAIT;
    // The shim writes one byte once the job's main process is recorded; an
    // answer at that moment, not at the next poll, is what lets an exec run
    // as a job cost only a few milliseconds more than inline.
    if let Some(mut said) = shim.stdout.take() {
        let mut byte = [0u8; 1];
        if let Ok(Ok(1)) = tokio::time::timeout(READY_WAIT, said.read(&mut byte)).await {
            tokio::spawn(async move {
                let _ = shim.wait().await;
            });
            return Ok(());
        }
    }
    // It ended or closed its stdout without a word: find out why.
    let mut poll = Duration::from_millis(1);
    let ready = loop {
        if dir.join(store::CHILD).exists() || dir.join(store::EXIT).exists() {
            break Ok(());
        }
        if let Ok(message) = fs::read_to_string(dir.join(store::SPAWN_ERROR)) {
            break Err(message);
        }
        if let Ok(Some(status)) = shim.try_wait() {
            if dir.join(store::CHILD).exists() {
                return Ok(());
            }
            return Err(fs::read_to_string(dir.join(store::SPAWN_ERROR))
                .unwrap_or_else(|_| format!("the job's shim ended at once ({status})")));
        }
        if Instant::now() >= deadline {
            // Slow, not failed: the shim is alive and will carry on.
            break Ok(());
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(Duration::from_millis(20));
    };
    // Reap the shim as soon as it ends, so a dead shim is never mistaken
    // for a live one and no zombies pile up. (If this daemon dies first,
    // the shim is adopted by init like any orphan.)
    tokio::spawn(async move {
        let _ = shim.wait().await;
    });
    ready
}

/// Whether a daemon is needed: a live sandbox (its keeper is watched), or
/// a job in `root` running (to notice its loss), or lost and not yet
/// reported or still to be resumed.
pub fn needed(root: &Path) -> bool {
    if sandbox::any_live() {
        return true;
    }
    let Ok(entries) = fs::read_dir(root) else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        // Ended jobs are the common case: one stat each.
        .filter(|e| !e.path().join(store::EXIT).exists())
        .filter_map(|e| Snapshot::read(&e.path()).ok())
        .any(|snap| match snap.state {
            JobState::Running => true,
            JobState::Lost => !snap.dir.join(store::LOST_REPORTED).exists() || resumable(&snap),
            JobState::Exited | JobState::Cancelled => false,
        })
}
