//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663) for
//! the calls that can outlast a client's patience: `exec_bash`, the two
//! inline syncs, `wait_background_task`, and the code tools
//! (`execute_code`, `install_package`, `create_run_close`, which then wait
//! for their run's end).
//!
//! A call becomes a task only where the protocol lets the server decide:
//! the request negotiated 2026-07-28 or later and declares the extension.
//! Even then a call that ends within [`INLINE_GRACE`] (most commands end in
//! milliseconds) is answered inline: a task costs the client at least one
//! poll interval.
//! An older session answers inline even if it declares the extension's key
//! (its clients read only a plain result), with progress and the deadline
//! path as usual. The 2025-11-25 Tasks (a client asks for one with a `task`
//! parameter) are not offered: rmcp drops that parameter and has no
//! capability for them, so nothing here tells such a client it may ask.
//! `tasks/list` and `tasks/result`, which the 2026-07-28 extension dropped,
//! still answer for this store.
//!
//! Tasks live in one [`TaskStore`] per process, not per session or
//! request: a stateless HTTP client polls `tasks/get` on a fresh server
//! each time. Each task belongs to the [`Caller`] that started it; to any
//! other it does not exist. A task ends with its call, its TTL, or
//! `tasks/cancel` (which drops the call and so kills an exec's process
//! tree), never with a connection. What progress notifications would say
//! becomes the task's status message ([`super::progress`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CreateTaskResult, DetailedTask, JsonObject,
    ProtocolVersion, Task, TaskPayload,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};

use super::OutpostServer;
use super::ask::Person;
use super::caller::Caller;
use super::task_slot::{CURRENT_TASK, TaskSlot};

/// Clients should poll this often.
const POLL_INTERVAL_MS: u64 = 1_000;
/// How long a task outlives the longest its call may take: its result stays
/// readable for this long after the call's own limit.
const TTL_SLACK: Duration = Duration::from_secs(600);
/// A sync has no time limit of its own; its task is kept this long.
const SYNC_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a task is given: what waits with no limit of its own (an
/// `execute_code` that collects a run) gets this.
const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Unfinished tasks one caller may have at once: each holds a call open.
const MAX_UNFINISHED_PER_CALLER: usize = 256;
/// How often `tasks/result` looks at a task it waits for.
const RESULT_POLL: Duration = Duration::from_millis(100);
/// How long a call that may become a task runs first as a plain call.
const INLINE_GRACE: Duration = Duration::from_millis(1_000);

/// Whether `request` runs as a task for this client, and if so for how long
/// at most: the TTL never cuts a call shorter than its own limit.
pub(super) fn ttl_for(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<Duration> {
    if !server_may_decide(
        context.protocol_version(),
        context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks()),
    ) {
        return None;
    }
    let argument = |name: &str| request.arguments.as_ref().and_then(|a| a.get(name));
    let seconds = |name: &str, default: f64| {
        let s = argument(name)
            .and_then(serde_json::Value::as_f64)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(default);
        Duration::from_secs_f64(s.min(MAX_TTL.as_secs_f64()))
    };
    let limit = match request.name.as_ref() {
        "exec_bash" => seconds("timeout_s", crate::ops::exec::DEFAULT_TIMEOUT_S),
        "wait_background_task" => seconds("timeout_s", 60.0),
        "sync_local_to_remote" | "sync_remote_to_local" => SYNC_TTL,
        // Empty code collects a run, which keeps the timeout it started
        // with: this call cannot know it.
        "execute_code" if argument("code").and_then(|c| c.as_str()) == Some("") => {
            return Some(MAX_TTL);
        }
        "execute_code" | "create_run_close" => {
            seconds("timeout_s", crate::ops::code::DEFAULT_TIMEOUT_S)
        }
        "install_package" => seconds("timeout_s", crate::ops::code::DEFAULT_INSTALL_TIMEOUT_S),
        _ => return None,
    };
    Some(limit + TTL_SLACK)
}

/// SEP-2663: the server decides per request, but only for a request of the
/// era that defines it and a client that declares it. A 2025-11-25 client
/// that merely lists the extension's key expects a plain result.
fn server_may_decide(version: Option<ProtocolVersion>, declared: bool) -> bool {
    declared && version.is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// Every task of this process, each bound to the caller that started it.
/// Cheap to clone; clones share the store.
#[derive(Clone, Default)]
pub(crate) struct TaskStore {
    manager: TaskManager,
    owners: Arc<Mutex<HashMap<String, Caller>>>,
}

impl TaskStore {
    /// Starts `work` as a task of `caller`.
    fn spawn(
        &self,
        caller: &Caller,
        options: TaskOptions,
        work: impl FnOnce(TaskContext) -> rmcp::task_manager::TaskFuture,
    ) -> Result<Task, McpError> {
        let mut owners = self.owners.lock().unwrap();
        let mut unfinished = 0;
        // The manager forgets a task some time after its TTL; so do we.
        owners.retain(|id, owner| match self.manager.get_task(id) {
            Ok(task) => {
                if owner == caller && !task.status().is_terminal() {
                    unfinished += 1;
                }
                true
            }
            Err(_) => false,
        });
        if unfinished >= MAX_UNFINISHED_PER_CALLER {
            return Err(McpError::invalid_request(
                format!(
                    "{unfinished} tasks of this caller are still running; \
                     wait for some or cancel them (tasks/cancel)"
                ),
                None,
            ));
        }
        let task = self.manager.spawn(options, work);
        owners.insert(task.task_id.clone(), caller.clone());
        Ok(task)
    }

    /// Whether `id` is `caller`'s. Another caller's task is answered as
    /// unknown, exactly as one that never existed.
    fn check(&self, caller: &Caller, id: &str) -> Result<(), McpError> {
        match self.owners.lock().unwrap().get(id) {
            Some(owner) if owner == caller => Ok(()),
            _ => Err(McpError::invalid_params(
                format!("unknown task: {id}"),
                None,
            )),
        }
    }

    /// `tasks/get`.
    pub(super) fn get(&self, caller: &Caller, id: &str) -> Result<DetailedTask, McpError> {
        self.check(caller, id)?;
        self.manager.get_task(id)
    }

    /// `tasks/cancel`: the call is dropped, which ends what it started.
    pub(super) fn cancel(&self, caller: &Caller, id: &str) -> Result<(), McpError> {
        self.check(caller, id)?;
        self.manager.cancel_task(id)
    }

    /// `tasks/update`.
    pub(super) fn update(
        &self,
        caller: &Caller,
        id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        self.check(caller, id)?;
        self.manager.update_task(id, responses)
    }

    /// `tasks/list`: the caller's tasks, oldest first.
    pub(super) fn list(&self, caller: &Caller) -> Vec<Task> {
        let ids: Vec<String> = self
            .owners
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, owner)| *owner == caller)
            .map(|(id, _)| id.clone())
            .collect();
        let mut tasks: Vec<Task> = ids
            .iter()
            .filter_map(|id| self.manager.get_task(id).ok())
            .map(|detailed| detailed.task)
            .collect();
        tasks.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        tasks
    }

    /// `tasks/result`: waits for the task to end, then its call's result
    /// (or the error it failed with).
    pub(super) async fn result(&self, caller: &Caller, id: &str) -> Result<JsonObject, McpError> {
        loop {
            let task = self.get(caller, id)?;
            match task.payload {
                TaskPayload::Completed { result } => return Ok(result),
                TaskPayload::Failed { error } => {
                    return Err(serde_json::from_value(error.into()).unwrap_or_else(|_| {
                        McpError::internal_error(format!("task {id} failed"), None)
                    }));
                }
                TaskPayload::Cancelled => {
                    return Err(McpError::invalid_request(
                        format!("task {id} was cancelled"),
                        None,
                    ));
                }
                _ => tokio::time::sleep(RESULT_POLL).await,
            }
        }
    }
}

type CallFuture = Pin<Box<dyn Future<Output = Result<CallToolResponse, McpError>> + Send>>;

/// Runs the call; if it has not ended within [`INLINE_GRACE`], or it has
/// something to ask its person, it goes on as a task of `caller`, and the
/// answer is that task. The task runs on
/// `server`, the caller's view of this process, and ends with its call,
/// its TTL or `tasks/cancel`, not with the request or session that started
/// it. Before it is a task, the request's cancellation ends it.
pub(super) async fn run(
    server: &OutpostServer,
    caller: &Caller,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
    person: Option<Person>,
    ttl: Duration,
) -> Result<CallToolResponse, McpError> {
    // A copy without the session's guard: a running task must not keep its
    // session's followers alive.
    let server = OutpostServer {
        _session: None,
        ..server.clone()
    };
    let store = server.shared.tasks.clone();
    let confirm_timeout = server.fleet.policy.confirm_timeout;
    let cancelled = context.ct.clone();
    let slot = TaskSlot::default();
    let scope = slot.clone();
    let mut work: CallFuture = Box::pin(async move {
        let call = ToolCallContext::new(&server, request, context);
        let work = CURRENT_TASK.scope(scope, server.tool_router.call(call));
        super::with_person(person, confirm_timeout, work).await
    });
    tokio::select! {
        result = &mut work => return result,
        () = cancelled.cancelled() => {
            return Err(McpError::internal_error(super::CANCELLED, None));
        }
        () = tokio::time::sleep(INLINE_GRACE) => {}
        () = slot.wanted() => {}
    }
    let options = TaskOptions::new()
        .with_ttl_ms(ttl.as_millis() as u64)
        .with_poll_interval_ms(POLL_INTERVAL_MS)
        .with_status_message("running");
    let task = store.spawn(caller, options, move |task| {
        slot.set(task.clone());
        Box::pin(async move {
            tokio::select! {
                result = work => match result {
                    Ok(CallToolResponse::Complete(result)) => Ok(result),
                    Ok(_) => Err(TaskExit::Error(McpError::internal_error(
                        "a call run as a task asked for input",
                        None,
                    ))),
                    Err(e) => Err(TaskExit::Error(e)),
                },
                () = task.cancelled() => Err(TaskExit::Cancelled),
            }
        })
    })?;
    Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::CallToolResult;

    #[test]
    fn only_a_declaring_client_of_the_tasks_era_gets_a_task() {
        let v = |s: &str| Some(serde_json::from_value(serde_json::json!(s)).unwrap());
        assert!(server_may_decide(v("2026-07-28"), true));
        assert!(!server_may_decide(v("2026-07-28"), false));
        // The newest Inspector's default era declares the key, then reads
        // the answer as a plain result.
        assert!(!server_may_decide(v("2025-11-25"), true));
        assert!(!server_may_decide(None, true));
    }

    #[tokio::test]
    async fn a_task_is_its_caller_s_alone() {
        let store = TaskStore::default();
        let (alice, bob) = (Caller::token("alice"), Caller::token("bob"));
        let task = store
            .spawn(&alice, TaskOptions::new(), |_| {
                Box::pin(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(CallToolResult::success(vec![]))
                })
            })
            .unwrap();
        let id = task.task_id.as_str();
        for err in [
            store.get(&bob, id).unwrap_err(),
            store.cancel(&bob, id).unwrap_err(),
            store.update(&bob, id, []).unwrap_err(),
            store.result(&bob, id).await.unwrap_err(),
        ] {
            assert_eq!(err.message, format!("unknown task: {id}"));
        }
        assert!(store.list(&bob).is_empty());
        assert_eq!(store.list(&alice).len(), 1);
        // Bob's attempts changed nothing: the task runs to its end.
        let result = store.result(&alice, id).await.unwrap();
        assert!(result.contains_key("content"), "{result:?}");
        assert!(store.get(&alice, id).unwrap().status().is_terminal());
    }

    #[tokio::test]
    async fn a_cancelled_task_ends_its_work_and_says_so() {
        let store = TaskStore::default();
        let caller = Caller::stdio();
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
        let task = store
            .spawn(&caller, TaskOptions::new(), move |task| {
                Box::pin(async move {
                    // Dropped when the work is given up, as an exec's guard is.
                    let _guard = ended_tx;
                    tokio::select! {
                        () = std::future::pending::<()>() => unreachable!(),
                        () = task.cancelled() => Err(TaskExit::Cancelled),
                    }
                })
            })
            .unwrap();
        store.cancel(&caller, &task.task_id).unwrap();
        let err = store.result(&caller, &task.task_id).await.unwrap_err();
        assert!(err.message.contains("cancelled"), "{err:?}");
        assert!(ended_rx.await.is_err(), "the work was not dropped");
    }

    #[tokio::test]
    async fn a_caller_s_unfinished_tasks_are_bounded() {
        let store = TaskStore::default();
        let caller = Caller::token("busy");
        let pending = || -> rmcp::task_manager::TaskFuture { Box::pin(std::future::pending()) };
        for _ in 0..MAX_UNFINISHED_PER_CALLER {
            store
                .spawn(&caller, TaskOptions::new(), |_| pending())
                .unwrap();
        }
        let err = store
            .spawn(&caller, TaskOptions::new(), |_| pending())
            .unwrap_err();
        assert!(err.message.contains("still running"), "{err:?}");
        // Another caller is not held back by this one.
        store
            .spawn(&Caller::token("other"), TaskOptions::new(), |_| pending())
            .unwrap();
        store.manager.shutdown();
    }
}
