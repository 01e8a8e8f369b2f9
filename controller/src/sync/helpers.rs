//! Small helpers every stage of a sync uses: file IO off the async workers,
//! the lock of the local applier, cancellation, the one form of a per-path
//! problem (and the messages push and pull share), and the error for an
//! answer of the wrong kind.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use outpost_protocol::{PathProblem, Response};
use outpost_treesync::apply::Applier;
use outpost_treesync::relpath;

use super::types::{Progress, SyncError, SyncReport};
use crate::session::CallError;

pub(super) fn lock(applier: &Mutex<Applier>) -> MutexGuard<'_, Applier> {
    applier.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs blocking file IO off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SyncError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SyncError::Invalid(format!("a file operation failed unexpectedly: {e}")))
}

pub(super) fn check_cancelled(progress: &Progress) -> Result<(), SyncError> {
    if progress.cancelled.load(Ordering::Relaxed) {
        Err(SyncError::Cancelled)
    } else {
        Ok(())
    }
}

/// How often a long wait (a scan) looks at [`Progress::cancelled`].
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Runs `work` until it ends or the sync is cancelled (dropping it then,
/// which cancels its requests on the agent).
pub(super) async fn until_cancelled<T>(
    progress: &Progress,
    work: impl Future<Output = Result<T, SyncError>>,
) -> Result<T, SyncError> {
    let watch = async {
        loop {
            if progress.cancelled.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    tokio::select! {
        result = work => result,
        () = watch => Err(SyncError::Cancelled),
    }
}

/// `path: message`, the form of every per-path problem in a report.
pub(super) fn problem(path: &[u8], message: &str) -> String {
    if path.is_empty() {
        message.to_string()
    } else {
        format!("{}: {message}", relpath::display(path))
    }
}

pub(super) fn add_problems(report: &mut SyncReport, problems: &[PathProblem]) {
    report
        .problems
        .extend(problems.iter().map(|p| problem(&p.path, &p.message)));
}

pub(super) const CHANGED: &str = "changed while syncing; sync again to send it";
pub(super) const UNHASHED: &str = "could not be hashed; not sent";

pub(super) fn unexpected(what: &str, response: &Response) -> CallError {
    let name = match response {
        Response::Output { .. } => "Output",
        Response::ExecDone(_) => "ExecDone",
        Response::Pong => "Pong",
        Response::Metrics(_) => "Metrics",
        Response::Error(_) => "Error",
        Response::GpuLease(_) => "GpuLease",
        Response::Released => "Released",
        Response::Entries(_) => "Entries",
        Response::ScanDone(_) => "ScanDone",
        Response::Applied(_) => "Applied",
        Response::Ack => "Ack",
        Response::FileData { .. } => "FileData",
        Response::ReadDone { .. } => "ReadDone",
        Response::Job(_) => "Job",
        Response::Jobs { .. } => "Jobs",
        Response::JobWaited(_) => "JobWaited",
        Response::JobLog(_) => "JobLog",
        Response::JobEvents(_) => "JobEvents",
        Response::Resumed { .. } => "Resumed",
        Response::ExecProgress(_) => "ExecProgress",
        Response::JobCollected { .. } => "JobCollected",
        Response::Sandbox(_) => "Sandbox",
        Response::Sandboxes(_) => "Sandboxes",
        Response::CodeRan(_) => "CodeRan",
        Response::CodeContexts(_) => "CodeContexts",
        Response::ExecHandedOver { .. } => "ExecHandedOver",
        Response::ExecCutShort { .. } => "ExecCutShort",
        Response::Checkpoint(_) => "Checkpoint",
        Response::Checkpoints(_) => "Checkpoints",
        Response::Restored(_) => "Restored",
        Response::CheckpointDiff { .. } => "CheckpointDiff",
        Response::Exposed { .. } => "Exposed",
        Response::Terminal(_) => "Terminal",
    };
    CallError::Protocol(format!("unexpected answer to {what}: {name}"))
}
