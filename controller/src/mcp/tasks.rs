//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663) for
//! the calls that can outlast a client's patience: `exec_bash`, the two
//! inline syncs, `wait_background_task`, and the code tools
//! (`execute_code`, `install_package`, `create_run_close`, which then wait
//! for their run's end). A client that declares the extension gets a task
//! at once and polls `tasks/get`; what progress
//! notifications would say becomes the task's status message
//! ([`super::progress`]); `tasks/cancel` drops the call, which kills an
//! exec's process tree. Clients that do not declare it get the call inline,
//! with progress and cancellation as usual.

use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CreateTaskResult};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskOptions};

use super::OutpostServer;
use crate::host::ConfirmHostKey;

/// Clients should poll this often.
const POLL_INTERVAL_MS: u64 = 2_000;
/// How long a task outlives the longest its call may take: its result stays
/// readable for this long after the call's own limit.
const TTL_SLACK: Duration = Duration::from_secs(600);
/// A sync has no time limit of its own; its task is kept this long.
const SYNC_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a task is given: what waits with no limit of its own (an
/// `execute_code` that collects a run) gets this.
const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

tokio::task_local! {
    /// The task a call runs as, for its status messages.
    pub(super) static CURRENT_TASK: TaskContext;
}

/// Whether `request` runs as a task for this client, and if so for how long
/// at most: the TTL never cuts a call shorter than its own limit.
pub(super) fn ttl_for(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<Duration> {
    if !context
        .client_capabilities()
        .is_some_and(|c| c.supports_tasks())
    {
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

/// Starts the call as a task and answers with it at once.
pub(super) fn spawn(
    server: &OutpostServer,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
    asker: Option<std::sync::Arc<dyn ConfirmHostKey>>,
    ttl: Duration,
) -> Result<CallToolResponse, McpError> {
    // A copy without the session's guard: a running task must not keep its
    // session from ending, and ends with it.
    let server = OutpostServer {
        _session: None,
        ..server.clone()
    };
    let session_end = server.session_end.clone();
    let options = TaskOptions::new()
        .with_ttl_ms(ttl.as_millis() as u64)
        .with_poll_interval_ms(POLL_INTERVAL_MS)
        .with_status_message("started");
    let task = server.tasks.clone().spawn(options, move |task| {
        Box::pin(async move {
            let status = task.clone();
            let work = async {
                let call = ToolCallContext::new(&server, request, context);
                let work = server.tool_router.call(call);
                match asker {
                    Some(asker) => {
                        crate::host::HOST_KEY_CONFIRMATION
                            .scope(asker, CURRENT_TASK.scope(status, work))
                            .await
                    }
                    None => CURRENT_TASK.scope(status, work).await,
                }
            };
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
                () = session_end.cancelled() => Err(TaskExit::Cancelled),
            }
        })
    });
    Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
}
