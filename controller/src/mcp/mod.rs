//! The MCP server: remote-sandbox-mcp's tools, names, parameters and result
//! fields, served over stdio and Streamable HTTP ([`http`]), to clients of
//! both protocol eras: 2025-11-25 sessions and stateless 2026-07-28
//! requests (`server/discover`, each request carrying its version and the
//! client's capabilities). What must outlive a request lives in [`Shared`],
//! per [`Caller`]; long calls may become MCP Tasks (`tasks.rs`); questions
//! for the person go the way the era allows (`ask.rs`).
//!
//! Each tool is thin: it validates its parameters, calls into [`Fleet`] /
//! [`crate::session::Session`], and shapes a compact result (no echo of inputs).
//! Bad parameters and unknown sandboxes come back as `isError` results with a
//! message that says what to do.
//!
//! Every call goes through the hand-written `call_tool`, which records it in
//! the audit log ([`crate::ops::audit`]); the exec tools ask the config file's
//! command policy ([`crate::policy`]) before anything runs, and ask the person
//! through elicitation where a confirm rule says so.
//!
//! Background jobs: the job tools follow remote-sandbox-mcp (`tmux_session` is
//! the job name, `watch_id` the same name); its watch tools are listed only
//! with `REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`. The first job tool used on a
//! sandbox starts its event follower ([`crate::ops::events`]), whose events reach the
//! client as MCP logging notifications.
//!
//! One file per area, each adding its own tool router to [`OutpostServer`]:
//! `sandboxes.rs` (sandboxes and GPU leases), `isolated.rs` (isolated
//! sandboxes made on a host, named `HOST/ID`), `exec.rs` (`exec_bash` and the
//! policy check), `code.rs` (code contexts that keep their state, package
//! installs, one-shot runs), `files.rs` (syncs and remote files), `jobs.rs` (background
//! jobs), `watch.rs` (the advanced watch tools), `resources.rs`,
//! `prompts.rs`, `caller.rs` (who is calling), `tasks.rs` and
//! `task_slot.rs` (the task a call may become), `ask.rs`, `admission.rs`,
//! `linelimit.rs` (oversized messages on stdin) and `shape.rs`
//! (the schemas of results that lower layers define: only `mcp/` knows
//! schemars). This file holds the server, merges the routers and implements
//! `ServerHandler`.

mod admission;
mod answers;
mod ask;
mod budget;
mod caller;
mod checkpoints;
mod code;
pub mod endpoint;
mod exec;
mod files;
mod hostkey;
pub mod http;
mod ids;
mod isolated;
mod jobs;
pub mod linelimit;
mod listing;
mod oauth;
mod progress;
mod prompts;
mod resources;
mod sandboxes;
mod session_scope;
mod shape;
mod status;
mod sync_view;
mod task_slot;
mod tasks;
mod terminals;
mod tokens;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt, prompt_handler};

use crate::fleet::Fleet;
use crate::ops::events::{HookEvent, Watcher};
use crate::ops::jobs::Cursors;
use crate::ops::localpath::Roots;
use crate::ops::transfers::Transfers;
use crate::session::Session;
pub use caller::Caller;
use linelimit::{LineLimit, OVERSIZED_METHOD, oversized_error};
use tasks::TaskStore;

/// The answer to a call the client cancelled (which it no longer reads).
pub(crate) const CANCELLED: &str = "cancelled by the client";

/// Per-host deadline for `list_sandboxes(check_resources=true)`, on top of the
/// connect timeout a fresh connection may need.
const RESOURCE_DEADLINE_EXTRA: Duration = Duration::from_secs(5);

/// Longest MCP message read from stdin or an HTTP request body (rmcp's own
/// defaults are 16 MiB and 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// How long a `roots/list` request may take.
const ROOTS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The resource listing every sandbox.
const LIST_URI: &str = "sandbox://list";

/// One client session's view of the server (over HTTP, also one stateless
/// request's). What must outlive a session lives in [`Shared`]; each call
/// runs on a copy that holds its caller's share ([`Self::for_caller`]).
#[derive(Clone)]
pub struct OutpostServer {
    fleet: Arc<Fleet>,
    shared: Arc<Shared>,
    /// The calling client's background transfers and job read cursors.
    transfers: Arc<Transfers>,
    cursors: Arc<Cursors>,
    watcher: Arc<Watcher>,
    events: Arc<EventQueue>,
    /// The MCP client's roots, asked once and again after it says they
    /// changed; `None` until then.
    client_roots: Arc<tokio::sync::Mutex<Option<Roots>>>,
    tool_router: Arc<ToolRouter<Self>>,
    prompt_router: PromptRouter<Self>,
    /// The sandboxes this session made that end with it.
    scope: Arc<session_scope::SessionScope>,
    /// Held by the session's server only, not by the copies tasks run on.
    _session: Option<Arc<SessionEnd>>,
}

/// What every session of one process shares: the tool list, built once
/// (its schemas are costly to derive, and over stateless HTTP every request
/// gets a server of its own), the audit log, and what callers start that
/// outlives a request.
pub struct Shared {
    tool_router: Arc<ToolRouter<OutpostServer>>,
    /// What each tool takes but does not list ([`listing::finish`]).
    unlisted: listing::Unlisted,
    /// Every tool call is recorded here (`$OUTPOST_HOME/audit.jsonl`).
    audit: crate::ops::audit::AuditLog,
    /// Calls run as MCP Tasks, for every caller.
    tasks: TaskStore,
    /// Seals the `requestState` of calls that ask by retry ([`ask::Round`]).
    request_states: rmcp::model::RequestStateCodec,
    /// Each caller's background transfers and job read cursors.
    callers: Mutex<HashMap<Caller, CallerState>>,
}

/// What one caller started that outlives its requests, besides its tasks.
type CallerState = (Arc<Transfers>, Arc<Cursors>);

impl Shared {
    pub fn new(fleet: &Fleet) -> Arc<Shared> {
        // Each area's router; tools/list names them in alphabetical order.
        let mut tool_router = OutpostServer::sandboxes_router();
        tool_router.merge(OutpostServer::exec_router());
        tool_router.merge(OutpostServer::code_router());
        tool_router.merge(OutpostServer::gpu_router());
        tool_router.merge(OutpostServer::isolated_router());
        tool_router.merge(OutpostServer::checkpoints_router());
        tool_router.merge(OutpostServer::terminals_router());
        tool_router.merge(OutpostServer::files_router());
        tool_router.merge(OutpostServer::jobs_router());
        if fleet.config.expose_advanced_tools {
            tool_router.merge(OutpostServer::watch_router());
            tool_router.merge(OutpostServer::job_log_router());
            tool_router.merge(OutpostServer::background_push_router());
            tool_router.merge(OutpostServer::bulk_files_router());
            tool_router.merge(OutpostServer::code_contexts_router());
        }
        let slurm = fleet.config.hosts.iter().any(|s| s.slurm.is_some());
        let unlisted = listing::finish(&mut tool_router, fleet.config.expose_advanced_tools, slurm);
        Arc::new(Shared {
            tool_router: Arc::new(tool_router),
            unlisted,
            audit: crate::ops::audit::AuditLog::new(&fleet.config.home),
            tasks: TaskStore::default(),
            request_states: ask::state_codec(),
            callers: Mutex::default(),
        })
    }

    /// `caller`'s transfers and cursors, made on its first call.
    fn of(&self, caller: &Caller) -> CallerState {
        self.callers
            .lock()
            .unwrap()
            .entry(caller.clone())
            .or_default()
            .clone()
    }
}

/// Stops a session's event followers and deletes the sandboxes it owns when
/// its session ends (the server rmcp holds for it is dropped). Matters over
/// HTTP, where the process and the fleet outlive each session. Its tasks go
/// on: they end with their call, their TTL or `tasks/cancel`.
struct SessionEnd {
    watcher: Arc<Watcher>,
    scope: Arc<session_scope::SessionScope>,
}

impl Drop for SessionEnd {
    fn drop(&mut self) {
        self.watcher.stop();
        self.scope.end_soon();
    }
}

/// Job events on their way to the client, in order, as logging notifications.
pub struct EventQueue {
    tx: tokio::sync::mpsc::UnboundedSender<HookEvent>,
    rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<HookEvent>>>,
    /// The client's `logging/setLevel`, as a rank (debug 0 … emergency 7).
    min_level: AtomicU8,
}

impl EventQueue {
    fn new() -> EventQueue {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        EventQueue {
            tx,
            rx: Mutex::new(Some(rx)),
            min_level: AtomicU8::new(0),
        }
    }

    /// Sends the queued events to `peer` for as long as it listens.
    #[allow(deprecated)] // MCP logging: the only way to tell a client unprompted
    fn forward(self: &Arc<Self>, peer: rmcp::Peer<RoleServer>) {
        let Some(mut rx) = self.rx.lock().unwrap().take() else {
            return;
        };
        let queue = self.clone();
        tokio::spawn(async move {
            use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
            while let Some(event) = rx.recv().await {
                let level = if event.is_alarm() {
                    LoggingLevel::Warning
                } else {
                    LoggingLevel::Info
                };
                if (level as u8) < queue.min_level.load(Ordering::Relaxed) {
                    continue;
                }
                let data = serde_json::to_value(&event).unwrap_or_default();
                let param =
                    LoggingMessageNotificationParam::new(level, data).with_logger("outpost.jobs");
                if peer.notify_logging_message(param).await.is_err() {
                    return;
                }
            }
        });
    }
}

impl OutpostServer {
    /// A server of its own, for one client (stdio, tests).
    pub fn new(fleet: Arc<Fleet>) -> Self {
        let shared = Shared::new(&fleet);
        Self::with_shared(fleet, shared)
    }

    /// A session's server over what the whole process shares (HTTP).
    pub fn with_shared(fleet: Arc<Fleet>, shared: Arc<Shared>) -> Self {
        let events = Arc::new(EventQueue::new());
        let since = crate::ops::events::now_unix();
        let tx = events.tx.clone();
        // Clients hear what happens while they are connected; a follower's
        // catch-up on older events only runs the hooks.
        let sink: crate::ops::events::Sink = Arc::new(move |event: &HookEvent| {
            tracing::info!("job event: {}", event.summary());
            if event.at_unix + 5 >= since {
                let _ = tx.send(event.clone());
            }
        });
        let watcher = Watcher::new(fleet.clone(), sink);
        let (transfers, cursors) = shared.of(&Caller::stdio());
        let scope = session_scope::SessionScope::new(fleet.clone());
        OutpostServer {
            _session: Some(Arc::new(SessionEnd {
                watcher: watcher.clone(),
                scope: scope.clone(),
            })),
            scope,
            watcher,
            fleet,
            tool_router: shared.tool_router.clone(),
            shared,
            transfers,
            cursors,
            events,
            client_roots: Arc::default(),
            prompt_router: Self::prompt_router(),
        }
    }

    /// This server as `caller` sees it: with its transfers and cursors.
    fn for_caller(&self, caller: &Caller) -> OutpostServer {
        let (transfers, cursors) = self.shared.of(caller);
        OutpostServer {
            transfers,
            cursors,
            ..self.clone()
        }
    }

    /// Where the file tools may touch local paths: `local_roots` from the
    /// config, else the client's declared roots, else the start directory;
    /// never Outpost's own files.
    async fn local_roots(&self, peer: &Peer<RoleServer>) -> Roots {
        self.declared_roots(peer)
            .await
            .protecting(self.fleet.config.own_files())
    }

    // Roots are deprecated for a later protocol revision; clients send them
    // today, and they are the best signal of the project directory there is.
    #[allow(deprecated)]
    async fn declared_roots(&self, peer: &Peer<RoleServer>) -> Roots {
        if let Some(paths) = &self.fleet.config.local_roots {
            return Roots::configured(paths);
        }
        let mut cached = self.client_roots.lock().await;
        if let Some(roots) = cached.as_ref() {
            return roots.clone();
        }
        let declared = peer
            .peer_info()
            .is_some_and(|info| info.capabilities.roots.is_some());
        if !declared {
            return Roots::start_dir();
        }
        match tokio::time::timeout(ROOTS_WAIT, peer.list_roots()).await {
            Ok(Ok(list)) => {
                let uris: Vec<String> = list.roots.into_iter().map(|r| r.uri).collect();
                let roots = Roots::from_client(&uris);
                *cached = Some(roots.clone());
                roots
            }
            Ok(Err(e)) => {
                tracing::warn!("the client's roots/list failed ({e}); using the start directory");
                Roots::start_dir()
            }
            Err(_) => {
                tracing::warn!("the client did not answer roots/list; using the start directory");
                Roots::start_dir()
            }
        }
    }

    /// The named (or active) sandbox for a job tool, connected; its event
    /// follower starts with the first such call. The connection is made here,
    /// in the call, where an unknown host key can be put to the person, and
    /// not first by the follower's own task. An isolated sandbox's jobs are
    /// its host's user's, whose events its host's follower reports; a Slurm
    /// allocation's are its node's.
    async fn job_session(&self, sandbox: Option<&str>) -> Result<Arc<Session>, String> {
        let session = self.fleet.get(sandbox)?;
        session.connection().await.map_err(|e| e.to_string())?;
        // A Slurm allocation's jobs are its node's, with a daemon of their own.
        let host = match session.isolated_in() {
            Some((h, _)) if session.allocation_job().is_none() => h.name(),
            _ => session.name(),
        };
        self.watcher.follow(host);
        Ok(session)
    }
}

#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for OutpostServer {
    /// The one way into every tool (the basic router, with the watch tools
    /// merged in when asked): each call is recorded in the audit log, also
    /// when it fails or is cancelled.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, McpError> {
        if let Some(problem) = &self.fleet.problem {
            let text = format!(
                "outpost cannot serve: {problem}. Fix the configuration, then restart the MCP server (reconnect it in the client)."
            );
            let answer =
                rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)]);
            return Ok(rmcp::model::CallToolResponse::Complete(answer));
        }
        let client = context
            .client_info()
            .map(|info| crate::ops::audit::truncate(&info.name, 100))
            .unwrap_or_default();
        let args = request.arguments.as_ref();
        let caller = Caller::of(&context);
        let server = self.for_caller(&caller);
        let mut call = crate::ops::audit::Call::begin(
            &self.shared.audit,
            client,
            crate::ops::audit::truncate(&request.name, 100),
            crate::ops::audit::sandbox_of(args, || self.fleet.active_name()),
            crate::ops::audit::digest(args),
        );
        if let Some((subject, oauth_client)) = caller.oauth_identity() {
            call = call.signed_in(subject, oauth_client);
        }
        // rmcp only flags a cancelled request; dropping the call is what
        // stops it: an exec's process tree is killed, a wait given up.
        let cancelled = context.ct.clone();
        let Some(tool) = self.tool_router.get(&request.name) else {
            let error = McpError::invalid_params(
                listing::unknown_tool(&request.name, &self.tool_router),
                None,
            );
            return call.run(async { Err(error) }, audit_outcome).await;
        };
        if let Some(args) = args
            && let Some(refusal) = listing::unknown_argument(
                tool,
                self.shared
                    .unlisted
                    .get(&*request.name)
                    .map_or(&[][..], Vec::as_slice),
                args,
            )
        {
            let answer = Ok(rmcp::model::CallToolResponse::Complete(
                rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(refusal)]),
            ));
            return call.run(async { answer }, audit_outcome).await;
        }
        let ttl = tasks::ttl_for(&request, &context);
        let client_name = context.client_info().map(|info| info.name);
        // A confirm rule's question, or an unknown host key met while
        // connecting for this call, is put to the person, when the client
        // can be asked.
        let person = match ask::Person::of(&context, ttl.is_some()) {
            Some(ask::Person::Retry(_)) => {
                match ask::Round::of(&request, &caller, &self.shared.request_states) {
                    Ok(round) => Some(ask::Person::Retry(Arc::new(round))),
                    Err(e) => return call.run(async { Err(e) }, audit_outcome).await,
                }
            }
            other => other,
        };
        let round = match &person {
            Some(ask::Person::Retry(round)) => Some(round.clone()),
            _ => None,
        };
        let confirm_timeout = self.fleet.policy.confirm_timeout;
        if let Some(ttl) = ttl {
            let answer = tasks::run(&server, &caller, request, context, person, ttl);
            return call.run(answer, audit_outcome).await;
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(&server, request, context);
        let work = with_person(person, confirm_timeout, self.tool_router.call(tcc));
        let work = budget::CLIENT_NAME.scope(client_name, work);
        let states = &self.shared.request_states;
        let call_or_cancel = async move {
            let result = tokio::select! {
                result = work => result,
                () = cancelled.cancelled() => Err(McpError::internal_error(CANCELLED, None)),
            };
            // A question met on the way: the client asks its person and
            // calls again with the answer; this round's result is moot.
            match round.and_then(|r| r.input_required(states, confirm_timeout)) {
                Some(input) => Ok(rmcp::model::CallToolResponse::InputRequired(input)),
                None => result,
            }
        };
        call.run(call_or_cancel, audit_outcome).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, McpError> {
        let cache_hints = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        let listed = self
            .tool_router
            .list_all()
            .into_iter()
            .filter(|t| listing::is_listed(&t.name, self.fleet.config.expose_advanced_tools))
            .collect();
        let mut result = rmcp::model::ListToolsResult::with_all_items(listed);
        if cache_hints {
            result.ttl_ms = Some(0);
            result.cache_scope = Some(rmcp::model::CacheScope::Public);
        }
        Ok(result)
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let task = self
            .shared
            .tasks
            .get(&Caller::of(&context), &request.task_id)?;
        Ok(rmcp::model::GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.shared.tasks.update(
            &Caller::of(&context),
            &request.task_id,
            request.input_responses,
        )
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.shared
            .tasks
            .cancel(&Caller::of(&context), &request.task_id)
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut resources = vec![
            Resource::new(LIST_URI, "sandboxes")
                .with_description("Configured sandboxes and their connection state")
                .with_mime_type("application/json"),
        ];
        for name in self.fleet.names() {
            resources.push(
                Resource::new(format!("sandbox://{name}/status"), format!("{name} status"))
                    .with_description("Connection, CPU, memory, disks and GPUs of this sandbox")
                    .with_mime_type("application/json"),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("sandbox://{name}/status", "sandbox status")
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let value = self.read(&request.uri).await?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(
            value.to_string(),
            request.uri.clone(),
        )])
        .into())
    }

    /// Job events go to every client that finished its handshake (over
    /// HTTP, each session; on stdio `serve_stdio` starts them at once), and
    /// from then on its sandboxes end with its session.
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        self.scope.begin();
        self.events.forward(context.peer.clone());
    }

    #[allow(deprecated)] // MCP logging carries the job events
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.events
            .min_level
            .store(request.level as u8, Ordering::Relaxed);
        Ok(())
    }

    async fn on_roots_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        // Asked again on the next file tool call.
        *self.client_roots.lock().await = None;
    }

    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, McpError> {
        let params = request.params.unwrap_or_default();
        let caller = Caller::of(&context);
        match request.method.as_str() {
            OVERSIZED_METHOD => {}
            linelimit::UNPARSABLE_METHOD => {
                let problem = params.get("error").and_then(|e| e.as_str()).unwrap_or("");
                return Err(McpError::new(
                    rmcp::model::ErrorCode::PARSE_ERROR,
                    format!("{problem}; send one JSON-RPC message per line, valid UTF-8 JSON"),
                    None,
                ));
            }
            // The 2026-07-28 extension dropped these two; a client may still
            // list its own tasks or wait for one's result.
            "tasks/list" => {
                let tasks = self.shared.tasks.list(&caller);
                return Ok(rmcp::model::CustomResult::new(
                    serde_json::json!({ "tasks": tasks }),
                ));
            }
            "tasks/result" => {
                let id = params
                    .get("taskId")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| McpError::invalid_params("taskId is required", None))?;
                let result = tokio::select! {
                    result = self.shared.tasks.result(&caller, id) => result?,
                    () = context.ct.cancelled() => {
                        return Err(McpError::internal_error(CANCELLED, None));
                    }
                };
                return Ok(rmcp::model::CustomResult::new(result.into()));
            }
            _ => {
                return Err(McpError::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    request.method,
                    None,
                ));
            }
        }
        let field = |name: &str| params.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
        Err(McpError::invalid_request(
            oversized_error(field("bytes"), field("limit")),
            None,
        ))
    }

    #[allow(deprecated)] // enable_logging: the job events
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_logging()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("outpost", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Sandboxes are the user's own Linux machines reached over SSH (plus `local`). \
                 exec_bash runs on the active sandbox unless sandbox_name is given. \
                 Long commands: exec_bash_background, then wait_background_task.",
        )
    }
}

/// `work` with `person` as the one to ask, for policy questions and unknown
/// host keys alike.
async fn with_person<F: Future>(
    person: Option<ask::Person>,
    confirm_timeout: Duration,
    work: F,
) -> F::Output {
    let host_keys = person.clone().map(|p| {
        Arc::new(hostkey::AskThePerson::new(p, confirm_timeout))
            as Arc<dyn crate::host::ConfirmHostKey>
    });
    let work = ask::Person::scope(person, work);
    match host_keys {
        Some(asker) => crate::host::HOST_KEY_CONFIRMATION.scope(asker, work).await,
        None => work.await,
    }
}

/// How a tool call ended, for its audit line, and its error's first line.
fn audit_outcome(
    result: &Result<rmcp::model::CallToolResponse, rmcp::ErrorData>,
) -> (&'static str, Option<String>) {
    use rmcp::model::CallToolResponse;
    match result {
        Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
            let text: String = r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect::<Vec<_>>()
                .join(" ");
            let kind = if text.starts_with("refused") {
                "refused"
            } else {
                "tool_error"
            };
            (kind, Some(crate::ops::audit::short_error(&text)))
        }
        Ok(CallToolResponse::Complete(_)) => ("ok", None),
        Ok(CallToolResponse::InputRequired(_)) => ("input_required", None),
        Ok(CallToolResponse::Task(_)) => ("task", None),
        Ok(_) => ("ok", None),
        Err(e) if e.message == CANCELLED => ("cancelled", None),
        Err(e) => ("error", Some(crate::ops::audit::short_error(&e.message))),
    }
}

/// Serves MCP on stdin/stdout until the client goes away or SIGTERM/SIGINT.
pub async fn serve_stdio(fleet: Arc<Fleet>) -> anyhow::Result<()> {
    let server = OutpostServer::new(fleet.clone());
    // The process is the session, whatever era the client speaks.
    server.scope.begin();
    let scope = server.scope.clone();
    let events = server.events.clone();
    let (stdin, stdout) = outpost_stdio::streams();
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new(
        LineLimit::new(stdin, MAX_MESSAGE_BYTES),
        stdout,
    )
    // LineLimit already cut longer lines to the limit plus two bytes.
    .with_max_line_length(MAX_MESSAGE_BYTES + 16);
    let service = server.serve(transport).await?;
    events.forward(service.peer().clone());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = service.waiting() => { r?; }
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
    }
    scope.end().await;
    for session in fleet.sessions() {
        session.disconnect().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advanced_tools_are_listed_only_when_asked() {
        let names = |advanced: bool| {
            let mut config = crate::config::Config::new(
                vec![crate::config::HostConfig::local()],
                std::env::temp_dir().join("outpost-mcp-test/known_hosts"),
            );
            config.expose_advanced_tools = advanced;
            let server = OutpostServer::new(Arc::new(Fleet::new(config)));
            let mut names: Vec<String> = server
                .tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            names.sort();
            names
        };
        let basic = names(false);
        for tool in [
            "exec_bash_background",
            "check_background_task",
            "list_background_tasks",
            "cancel_background_task",
            "wait_background_task",
        ] {
            assert!(basic.contains(&tool.to_string()), "{tool} missing");
        }
        assert!(!basic.iter().any(|n| n.contains("watch")), "{basic:?}");
        // Another name of delete_sandbox: routed, never listed.
        assert!(basic.contains(&"close_sandbox".to_string()));
        assert!(
            !listing::is_listed("close_sandbox", true)
                && listing::is_listed("delete_sandbox", false)
        );
        assert!(
            !listing::is_listed("renew_sandbox", false)
                && listing::is_listed("renew_sandbox", true)
        );
        let all = names(true);
        assert_eq!(all.len(), basic.len() + 17, "{all:?}");
        for tool in [
            "read_background_log",
            "upload_files",
            "download_files",
            "sync_local_to_remote_background",
            "get_watchdog_status",
            "exec_bash_background_watch",
            "install_macos_watchdog",
            "code_contexts",
        ] {
            assert!(all.contains(&tool.to_string()), "{tool} missing");
        }
    }
}
