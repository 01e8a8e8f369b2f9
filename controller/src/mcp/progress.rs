//! Progress notifications for tool calls that take a while.
//!
//! A request that carries a `progressToken` gets a notification at once and
//! then one every [`EVERY`] until its result: clients such as Claude Code keep
//! a call alive while progress arrives, and show its message to the person.
//! A request without a token costs nothing here. A call that runs as an MCP
//! Task reports the same text as the task's status message instead, once
//! it has become one ([`super::tasks`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken, RequestMetaObject};
use rmcp::{Peer, RoleServer};
use tokio::task::JoinHandle;

use super::task_slot::{CURRENT_TASK, TaskSlot};

/// Between two notifications of one call (the spec's clients expect one at
/// least every 5 s).
pub(super) const EVERY: Duration = Duration::from_secs(3);

/// How often the agent reports a running command's progress: more often than
/// [`EVERY`], so that each notification carries recent figures.
pub(super) const AGENT_EVERY_MS: u32 = 1000;

/// One notification's content.
pub(super) struct Report {
    /// Grows with the work (bytes, files, seconds); see [`Progress::send`].
    pub done: f64,
    pub total: Option<f64>,
    pub message: String,
}

/// Where a call's progress goes. Clones share the token and its last value.
#[derive(Clone)]
pub(super) struct Progress(Option<Arc<Target>>);

struct Target {
    /// The request's progress token, if it gave one.
    notifications: Option<Notifications>,
    /// Set where the call may become an MCP Task: once it has, its status
    /// message is the one progress channel the extension allows.
    task: Option<TaskSlot>,
}

struct Notifications {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    last: Mutex<f64>,
}

impl Progress {
    /// The progress channel of the request with `meta`: its task's status,
    /// or notifications if it asked for them.
    pub fn of(peer: &Peer<RoleServer>, meta: &RequestMetaObject) -> Progress {
        let task = CURRENT_TASK.try_with(TaskSlot::clone).ok();
        let notifications = meta.get_progress_token().map(|token| Notifications {
            peer: peer.clone(),
            token,
            last: Mutex::new(f64::NEG_INFINITY),
        });
        if task.is_none() && notifications.is_none() {
            return Progress(None);
        }
        Progress(Some(Arc::new(Target {
            notifications,
            task,
        })))
    }

    pub fn wanted(&self) -> bool {
        self.0.is_some()
    }

    /// Sends one notification. The spec asks that `progress` grow with
    /// every notification; a call that made none since the last one repeats
    /// its figure plus a thousandth.
    pub async fn send(&self, report: Report) {
        let Some(target) = self.0.as_deref() else {
            return;
        };
        if let Some(task) = target.task.as_ref().and_then(TaskSlot::get) {
            return task.set_status_message(report.message);
        }
        let Some(Notifications { peer, token, last }) = &target.notifications else {
            return;
        };
        let done = {
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            *last = if report.done > *last {
                report.done
            } else {
                *last + 0.001
            };
            *last
        };
        let mut param =
            ProgressNotificationParam::new(token.clone(), done).with_message(report.message);
        if let Some(total) = report.total {
            param = param.with_total(total.max(done));
        }
        // A client that went away is noticed by the request itself.
        let _ = peer.notify_progress(param).await;
    }

    /// Sends `snapshot()` at once and then every [`EVERY`] until the returned
    /// guard is dropped (when the call has its result).
    pub fn every<F, Fut>(&self, mut snapshot: F) -> Ticker
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Report> + Send,
    {
        if !self.wanted() {
            return Ticker(None);
        }
        let progress = self.clone();
        Ticker(Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(EVERY);
            loop {
                ticks.tick().await;
                let report = snapshot().await;
                progress.send(report).await;
            }
        })))
    }
}

/// Stops a call's notifications when dropped.
pub(super) struct Ticker(Option<JoinHandle<()>>);

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}
