//! Background file transfers: syncs that run as tasks of this process while
//! tool calls return at once, polled with `check_file_transfer_task`.
//!
//! A transfer lives as long as the controller process. If it dies (or is
//! cancelled), nothing half-written is left at a final path, and running the
//! same sync again resends nothing that already arrived.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use crate::session::Session;
use crate::sync::{self, Progress, SyncError, SyncOptions, SyncReport};

/// Lines of log kept per transfer.
const LOG_LINES: usize = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Running,
    Completed,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Push,
    Pull,
}

pub struct Transfer {
    pub id: String,
    pub progress: Arc<Progress>,
    started: Instant,
    state: Mutex<TransferState>,
    done: tokio::sync::Notify,
}

struct TransferState {
    status: Status,
    result: Option<SyncReport>,
    /// A push to several hosts: each one's report or error.
    hosts: Vec<HostResult>,
    error: Option<String>,
    log: VecDeque<String>,
}

/// One host's part of a push to several.
#[derive(Debug, Clone, Serialize)]
pub struct HostResult {
    pub sandbox: String,
    #[serde(flatten)]
    pub report: Option<SyncReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProgressView {
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Content bytes per second since the start.
    pub rate_mb_s: f64,
}

/// What `check_file_transfer_task` returns.
#[derive(Debug, Clone, Serialize)]
pub struct TransferView {
    pub task_id: String,
    pub status: Status,
    /// Present (true) while the transfer runs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    pub progress: ProgressView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<SyncReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub log_tail: String,
}

impl Transfer {
    fn log(&self, line: String) {
        let mut state = self.state.lock().unwrap();
        if state.log.len() == LOG_LINES {
            state.log.pop_front();
        }
        state.log.push_back(line);
    }

    pub fn status(&self) -> Status {
        self.state.lock().unwrap().status
    }

    /// Asks the transfer to stop between requests.
    pub fn cancel(&self) {
        self.progress.cancelled.store(true, Ordering::Relaxed);
        self.log("cancel requested".into());
    }

    /// Waits until the transfer has ended.
    pub async fn finished(&self) {
        loop {
            let notified = self.done.notified();
            if self.status() != Status::Running {
                return;
            }
            notified.await;
        }
    }

    pub fn view(&self, last_n_lines: usize) -> TransferView {
        let state = self.state.lock().unwrap();
        let p = &self.progress;
        let bytes_done = p.bytes_done.load(Ordering::Relaxed);
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
        let skip = state.log.len().saturating_sub(last_n_lines);
        TransferView {
            task_id: self.id.clone(),
            status: state.status,
            running: state.status == Status::Running,
            progress: ProgressView {
                files_done: p.files_done.load(Ordering::Relaxed),
                files_total: p.files_total.load(Ordering::Relaxed),
                bytes_done,
                bytes_total: p.bytes_total.load(Ordering::Relaxed),
                rate_mb_s: ((bytes_done as f64 / elapsed / 1e6) * 100.0).round() / 100.0,
            },
            result: state.result.clone(),
            hosts: state.hosts.clone(),
            error: state.error.clone(),
            log_tail: state
                .log
                .iter()
                .skip(skip)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// What a transfer's sync gave: one report, or one per host.
enum Outcome {
    One(SyncReport),
    Many(Vec<HostResult>),
}

fn host_results(names: &[String], results: Vec<Result<SyncReport, SyncError>>) -> Vec<HostResult> {
    names
        .iter()
        .zip(results)
        .map(|(name, result)| {
            let (report, error) = match result {
                Ok(report) => (Some(report), None),
                Err(e) => (None, Some(e.to_string())),
            };
            HostResult {
                sandbox: name.clone(),
                report,
                error,
            }
        })
        .collect()
}

#[derive(Default)]
pub struct Transfers {
    tasks: Mutex<HashMap<String, Arc<Transfer>>>,
    seq: AtomicU64,
}

impl Transfers {
    /// Starts a sync as a task and returns at once. A push may go to
    /// several sessions at once (`fan_out`: each gets its own result, even
    /// when there is one).
    pub fn start(
        &self,
        sessions: Vec<Arc<Session>>,
        fan_out: bool,
        direction: Direction,
        local: PathBuf,
        remote: String,
        options: SyncOptions,
    ) -> Arc<Transfer> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("xfer-{}-{n}", std::process::id());
        let transfer = Arc::new(Transfer {
            id: id.clone(),
            progress: Arc::new(Progress::default()),
            started: Instant::now(),
            state: Mutex::new(TransferState {
                status: Status::Running,
                result: None,
                hosts: Vec::new(),
                error: None,
                log: VecDeque::new(),
            }),
            done: tokio::sync::Notify::new(),
        });
        let names: Vec<String> = sessions.iter().map(|s| s.name().to_string()).collect();
        let remote_side = format!("{}:{remote}", names.join(","));
        let (from, to) = match direction {
            Direction::Push => (local.display().to_string(), remote_side),
            Direction::Pull => (remote_side, local.display().to_string()),
        };
        transfer.log(format!("sync {from} → {to}"));
        self.tasks.lock().unwrap().insert(id, transfer.clone());
        let task = transfer.clone();
        // The person who can confirm an unknown host key for the starting
        // call also does for its transfer, which connects in its own task.
        let confirmation = crate::host::HOST_KEY_CONFIRMATION.try_with(Arc::clone).ok();
        tokio::spawn(async move {
            let progress = task.progress.clone();
            let work = async {
                match (direction, sessions.as_slice()) {
                    (Direction::Push, [session]) if !fan_out => {
                        sync::push(session, &local, &remote, &options, progress)
                            .await
                            .map(Outcome::One)
                    }
                    (Direction::Push, _) => {
                        sync::push_many(&sessions, &local, &remote, &options, progress)
                            .await
                            .map(|results| Outcome::Many(host_results(&names, results)))
                    }
                    (Direction::Pull, sessions) => {
                        let session = sessions.first().expect("a pull has one session");
                        sync::pull(session, &remote, &local, &options, progress)
                            .await
                            .map(Outcome::One)
                    }
                }
            };
            let result = match confirmation {
                Some(c) => crate::host::HOST_KEY_CONFIRMATION.scope(c, work).await,
                None => work.await,
            };
            {
                let mut state = task.state.lock().unwrap();
                match result {
                    Ok(Outcome::One(report)) => {
                        state.status = Status::Completed;
                        state.result = Some(report);
                    }
                    Ok(Outcome::Many(hosts)) => {
                        let failed = hosts.iter().filter(|h| h.error.is_some()).count();
                        let cancelled = task.progress.cancelled.load(Ordering::Relaxed);
                        state.status = match failed {
                            0 => Status::Completed,
                            _ if cancelled => Status::Cancelled,
                            _ => {
                                state.error =
                                    Some(format!("{failed} of {} hosts failed", hosts.len()));
                                Status::Failed
                            }
                        };
                        state.hosts = hosts;
                    }
                    Err(SyncError::Cancelled) => state.status = Status::Cancelled,
                    Err(e) => {
                        state.status = Status::Failed;
                        state.error = Some(e.to_string());
                    }
                }
            }
            let view = task.view(0);
            let line = match (&view.result, &view.error, view.status) {
                (Some(r), ..) => format!(
                    "completed: {} files sent ({} bytes on the wire), {} unchanged, {} deleted, {} problems, {:.2} s",
                    r.files_sent,
                    r.bytes_sent,
                    r.files_unchanged,
                    r.deleted,
                    r.problems.len(),
                    r.duration_s
                ),
                (None, Some(e), _) => format!("failed: {e}"),
                (None, None, Status::Completed) => {
                    format!("completed on {} hosts", view.hosts.len())
                }
                (None, None, _) => "cancelled".into(),
            };
            task.log(line);
            if let Some(r) = &view.result {
                for p in &r.problems {
                    task.log(format!("problem: {p}"));
                }
            }
            for host in &view.hosts {
                match (&host.report, &host.error) {
                    (Some(r), _) => task.log(format!(
                        "{}: {} files sent, {} problems, {:.2} s",
                        host.sandbox,
                        r.files_sent,
                        r.problems.len(),
                        r.duration_s
                    )),
                    (None, Some(e)) => task.log(format!("{}: failed: {e}", host.sandbox)),
                    (None, None) => {}
                }
            }
            task.done.notify_waiters();
        });
        transfer
    }

    pub fn get(&self, id: &str) -> Result<Arc<Transfer>, String> {
        self.tasks
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no transfer task {id:?} (tasks live as long as this server)"))
    }
}
