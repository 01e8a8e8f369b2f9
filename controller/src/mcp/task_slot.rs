//! The MCP Task a call may become ([`super::tasks`]): empty while the call
//! runs inline, set once it is a task. Progress reports go to its status
//! message once set ([`super::progress`]); a question for the person makes
//! the call a task at once ([`super::ask`]).

use std::sync::{Arc, OnceLock};

use rmcp::task_manager::TaskContext;

tokio::task_local! {
    /// Set for a call that may become a task: the task, once it is one, for
    /// its status messages. A call under it has no client budget of its own.
    pub(super) static CURRENT_TASK: TaskSlot;
}

/// The task a call became, once it did. Clones share it.
#[derive(Clone, Default)]
pub(super) struct TaskSlot(Arc<Slot>);

#[derive(Default)]
struct Slot {
    task: OnceLock<TaskContext>,
    /// The call wants to be a task now (to ask its person something).
    wanted: tokio::sync::Notify,
    /// It has become one.
    made: tokio::sync::Notify,
    /// Input requests made so far, for their keys.
    inputs: std::sync::atomic::AtomicU32,
}

impl TaskSlot {
    pub(super) fn get(&self) -> Option<&TaskContext> {
        self.0.task.get()
    }

    /// The task this call is, made one at once if it is not yet.
    pub(super) async fn now(&self) -> TaskContext {
        let made = self.0.made.notified();
        tokio::pin!(made);
        made.as_mut().enable();
        if let Some(task) = self.get() {
            return task.clone();
        }
        self.0.wanted.notify_one();
        made.await;
        self.get().expect("set before it is announced").clone()
    }

    /// Resolves when the call asks to become a task now.
    pub(super) async fn wanted(&self) {
        self.0.wanted.notified().await
    }

    pub(super) fn set(&self, task: TaskContext) {
        let _ = self.0.task.set(task);
        self.0.made.notify_waiters();
    }

    /// A key for the next input request, unique within the task.
    pub(super) fn next_input_key(&self) -> String {
        let n = self
            .0
            .inputs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("ask-{}", n + 1)
    }
}
