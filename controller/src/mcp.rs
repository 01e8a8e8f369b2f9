//! The MCP server: remote-sandbox-mcp's tools, names, parameters and result
//! fields, served over stdio.
//!
//! Each tool is thin: it validates its parameters, calls into [`Fleet`] /
//! [`crate::session::Session`], and shapes a compact result (no echo of inputs).
//! Bad parameters and unknown sandboxes come back as `isError` results with a
//! message that says what to do.

use std::sync::Arc;
use std::time::Duration;

use outpost_protocol::{ExecRequest, GpuLeaseRequest};
use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, Role, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData as McpError, Json, RoleServer, ServerHandler, ServiceExt, prompt, prompt_handler,
    prompt_router, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::files::{
    self, ListParams as FileListParams, ReadParams, SyncParams, TaskParams, WriteParams,
};
use crate::fleet::{Fleet, SandboxStatus};
use crate::resources::Requirements;
use crate::session::CallError;
use crate::transfers::Transfers;

/// Per-host deadline for `list_sandboxes(check_resources=true)`, on top of the
/// connect timeout a fresh connection may need.
const RESOURCE_DEADLINE_EXTRA: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct OutpostServer {
    fleet: Arc<Fleet>,
    transfers: Arc<Transfers>,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TaskPrompt {
    /// What to run, test or debug.
    pub task: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListParams {
    /// Also report CPU, memory, GPU use and idle_score (connects to every host).
    #[serde(default)]
    pub check_resources: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub active_sandbox: String,
    pub sandboxes: Vec<SandboxStatus>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectParams {
    /// A sandbox name, or "auto": the idlest sandbox meeting the requirements.
    pub sandbox_name: String,
    #[serde(flatten)]
    pub requirements: Requirements,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SelectResult {
    pub active_sandbox: String,
    pub status: String,
    /// With "auto": the chosen sandbox's idle_score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_score: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ActiveResult {
    pub active_sandbox: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub connection_alive: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_error: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// Bash command line.
    pub command: String,
    /// Working directory (~ is the remote home). Default: home.
    pub cwd: Option<String>,
    /// Kill the whole process tree after this many seconds. Default 120.
    pub timeout_s: Option<f64>,
    /// Output kept per stream (first and last halves). Default 20000.
    pub max_output_chars: Option<i64>,
    /// Run here instead of the active sandbox.
    pub sandbox_name: Option<String>,
    /// Run on several sandboxes in parallel (["all"] for every one); results are
    /// grouped by identical output.
    pub sandboxes: Option<Vec<String>>,
    /// A reserve_gpus lease: sets CUDA_VISIBLE_DEVICES to its GPUs.
    pub gpu_lease: Option<String>,
}

#[derive(Debug, PartialEq, Serialize, JsonSchema)]
pub struct ExecOutput {
    /// Exit status; 124 on timeout, 128+N when killed by signal N, -1 when the
    /// connection failed.
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Set when the host could not be reached or the connection dropped; the
    /// command may not have run. Not retried automatically.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub connection_error: bool,
}

/// exec_bash's result: the single-sandbox fields, or with `sandboxes`, one
/// group per distinct outcome.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecReply {
    #[serde(flatten)]
    pub single: Option<ExecOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<ExecGroup>>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecGroup {
    pub sandboxes: Vec<String>,
    #[serde(flatten)]
    pub output: ExecOutput,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReserveParams {
    /// Number of GPUs. Default 1.
    pub count: Option<u32>,
    /// Free memory each GPU must have, MiB.
    pub min_free_mb: Option<u64>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReserveResult {
    pub lease_id: String,
    pub sandbox: String,
    pub gpus: Vec<u32>,
    pub cuda_visible_devices: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReleaseParams {
    pub lease_id: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusResult {
    pub status: String,
}

pub const DEFAULT_TIMEOUT_S: f64 = 120.0;
pub const DEFAULT_MAX_OUTPUT: i64 = 20_000;

/// Builds the agent request for an `exec_bash` call, or says what is wrong.
pub fn exec_request(p: &ExecParams, stream: bool) -> Result<ExecRequest, String> {
    let timeout_s = p.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(timeout_s > 0.0 && timeout_s.is_finite()) {
        return Err(format!(
            "timeout_s must be a positive number of seconds, got {timeout_s}"
        ));
    }
    let max_output = p.max_output_chars.unwrap_or(DEFAULT_MAX_OUTPUT);
    if max_output < 0 {
        return Err(format!(
            "max_output_chars must be 0 or more, got {max_output}"
        ));
    }
    if p.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    Ok(ExecRequest {
        command: p.command.clone(),
        cwd: p.cwd.clone().filter(|c| !c.is_empty()),
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some((timeout_s * 1000.0).min(u64::MAX as f64 / 2.0) as u64),
        output_limit: max_output as u64,
        stream,
    })
}

/// Shapes an agent exec result for the `exec_bash` tool.
pub fn exec_output(
    result: Result<outpost_protocol::ExecResult, CallError>,
) -> Result<ExecOutput, String> {
    match result {
        Ok(r) => Ok(ExecOutput {
            exit_code: if r.timed_out {
                124
            } else {
                r.exit_code.or(r.signal.map(|s| 128 + s)).unwrap_or(-1)
            },
            stdout: r.stdout.to_text(),
            stderr: r.stderr.to_text(),
            timed_out: r.timed_out,
            signal: if r.timed_out { None } else { r.signal },
            connection_error: false,
        }),
        Err(e) if e.is_connection() => Ok(ExecOutput {
            exit_code: -1,
            stdout: String::new(),
            stderr: e.to_string(),
            timed_out: false,
            signal: None,
            connection_error: true,
        }),
        Err(e) => Err(e.to_string()),
    }
}

#[tool_router(router = tool_router)]
impl OutpostServer {
    pub fn new(fleet: Arc<Fleet>) -> Self {
        OutpostServer {
            fleet,
            transfers: Arc::new(Transfers::default()),
            tool_router: Self::tool_router(),
            prompt_router: Self::prompt_router(),
        }
    }

    #[tool(
        description = "List sandboxes (SSH hosts and `local`) with connection state; check_resources adds CPU/memory/GPU load and idle_score (0 busy … 1 idle)."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(p): Parameters<ListParams>,
    ) -> Result<Json<ListResult>, String> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let sandboxes = self.fleet.list(p.check_resources, deadline).await;
        Ok(Json(ListResult {
            active_sandbox: self.fleet.active_name(),
            sandboxes,
        }))
    }

    #[tool(
        description = "Make a sandbox the default for later calls. sandbox_name \"auto\" picks the idlest one meeting min_gpus, min_gpu_free_mb, min_free_mem_mb, max_load_per_cpu."
    )]
    async fn select_sandbox(
        &self,
        Parameters(p): Parameters<SelectParams>,
    ) -> Result<Json<SelectResult>, String> {
        let mut idle_score = None;
        if p.sandbox_name == "auto" && self.fleet.get(Some("auto")).is_err() {
            let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
            let (_, r) = self.fleet.select_auto(&p.requirements, deadline).await?;
            idle_score = Some(r.idle_score);
        } else {
            self.fleet.select(&p.sandbox_name)?;
        }
        Ok(Json(SelectResult {
            active_sandbox: self.fleet.active_name(),
            status: "selected".into(),
            idle_score,
        }))
    }

    #[tool(description = "The active sandbox and whether it is reachable.")]
    async fn get_active_sandbox(&self) -> Result<Json<ActiveResult>, String> {
        let (session, err) = self.fleet.check(None).await?;
        let (host, port, user) = session.config.address();
        Ok(Json(ActiveResult {
            active_sandbox: session.name().to_string(),
            host,
            port,
            user,
            connection_alive: err.is_none(),
            connection_error: err.map(|e| e.to_string()),
        }))
    }

    #[tool(
        description = "Run a bash command in a sandbox and return exit_code, stdout, stderr. The timeout kills the whole process tree. For long jobs use a background task."
    )]
    async fn exec_bash(
        &self,
        Parameters(p): Parameters<ExecParams>,
    ) -> Result<Json<ExecReply>, String> {
        let mut req = exec_request(&p, false)?;
        let mut target = p.sandbox_name.clone();
        if let Some(id) = &p.gpu_lease {
            let (sandbox, devices) = self
                .fleet
                .with_lease(id, |h| (h.sandbox.clone(), h.cuda_visible_devices()))?;
            if target.as_ref().is_some_and(|t| *t != sandbox) || p.sandboxes.is_some() {
                return Err(format!("GPU lease {id} belongs to sandbox {sandbox}"));
            }
            target = Some(sandbox);
            req.env
                .push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            req.env.push(("CUDA_VISIBLE_DEVICES".into(), devices));
        }
        Ok(Json(match &p.sandboxes {
            Some(names) => ExecReply {
                single: None,
                groups: Some(self.fan_out(names, &req).await?),
            },
            None => {
                let session = self.fleet.get(target.as_deref())?;
                ExecReply {
                    single: Some(exec_output(session.exec(req, |_, _| {}).await)?),
                    groups: None,
                }
            }
        }))
    }

    #[tool(
        description = "Reserve GPUs on a sandbox for exec_bash(gpu_lease=...). The lease is recorded on the host; it ends on release_gpus or when this server's connection ends."
    )]
    async fn reserve_gpus(
        &self,
        Parameters(p): Parameters<ReserveParams>,
    ) -> Result<Json<ReserveResult>, String> {
        let request = GpuLeaseRequest {
            count: p.count.unwrap_or(1),
            min_free_mem_bytes: p.min_free_mb.unwrap_or(0) * 1024 * 1024,
        };
        let id = self
            .fleet
            .reserve_gpus(p.sandbox_name.as_deref(), request)
            .await
            .map_err(|e| e.to_string())?;
        self.fleet
            .with_lease(&id, |h| ReserveResult {
                lease_id: id.clone(),
                sandbox: h.sandbox.clone(),
                gpus: h.lease.indices.clone(),
                cuda_visible_devices: h.cuda_visible_devices(),
            })
            .map(Json)
    }

    #[tool(description = "End a GPU lease.")]
    async fn release_gpus(
        &self,
        Parameters(p): Parameters<ReleaseParams>,
    ) -> Result<Json<StatusResult>, String> {
        self.fleet.release_gpus(&p.lease_id).await?;
        Ok(Json(StatusResult {
            status: "released".into(),
        }))
    }

    #[tool(
        description = "Sync a local file or directory to a sandbox (delta, compressed). Small transfers run inline; past REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES/_BYTES they continue in the background (mode=background, task_id)."
    )]
    async fn sync_local_to_remote(
        &self,
        Parameters(p): Parameters<SyncParams>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        files::sync_maybe_inline(&self.fleet, &self.transfers, p)
            .await
            .map(Json)
    }

    #[tool(
        description = "Start a local-to-sandbox sync in the background; poll with check_file_transfer_task."
    )]
    async fn sync_local_to_remote_background(
        &self,
        Parameters(p): Parameters<SyncParams>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        files::sync_background(&self.fleet, &self.transfers, p).map(Json)
    }

    #[tool(
        description = "Status, progress (files/bytes done and total, rate), result or error, and log tail of a background transfer."
    )]
    async fn check_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::transfers::TransferView>, String> {
        let task = self.transfers.get(&p.task_id)?;
        Ok(Json(task.view(p.last_n_lines.unwrap_or(50))))
    }

    #[tool(
        description = "Cancel a background transfer; files already committed stay, nothing half-written remains."
    )]
    async fn cancel_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::transfers::TransferView>, String> {
        let task = self.transfers.get(&p.task_id)?;
        task.cancel();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), task.finished()).await;
        Ok(Json(task.view(p.last_n_lines.unwrap_or(10))))
    }

    #[tool(
        description = "Sync a sandbox file or directory to a local path (delta, compressed, atomic writes)."
    )]
    async fn sync_remote_to_local(
        &self,
        Parameters(p): Parameters<SyncParams>,
    ) -> Result<Json<crate::sync::SyncReport>, String> {
        files::pull(&self.fleet, p).await.map(Json)
    }

    #[tool(
        description = "List a sandbox directory: entries[{path, is_dir, size, mtime}], truncated."
    )]
    async fn list_remote_files(
        &self,
        Parameters(p): Parameters<FileListParams>,
    ) -> Result<Json<files::ListResult>, String> {
        files::list(&self.fleet, p).await.map(Json)
    }

    #[tool(
        description = "Read a sandbox file from offset, up to max_bytes (default 200000). Binary files are reported as binary, not dumped."
    )]
    async fn read_remote_file(
        &self,
        Parameters(p): Parameters<ReadParams>,
    ) -> Result<Json<files::ReadResult>, String> {
        files::read(&self.fleet, p).await.map(Json)
    }

    #[tool(description = "Write a sandbox file atomically (parents created by default).")]
    async fn write_remote_file(
        &self,
        Parameters(p): Parameters<WriteParams>,
    ) -> Result<Json<files::WriteResult>, String> {
        files::write(&self.fleet, p).await.map(Json)
    }
}

impl OutpostServer {
    /// Runs on several sandboxes and groups identical outcomes.
    async fn fan_out(&self, names: &[String], req: &ExecRequest) -> Result<Vec<ExecGroup>, String> {
        let names: Vec<String> = if names.iter().any(|n| n == "all") {
            self.fleet.names()
        } else {
            for n in names {
                self.fleet.get(Some(n))?;
            }
            names.to_vec()
        };
        if names.is_empty() {
            return Err("sandboxes is empty; name sandboxes or use [\"all\"]".into());
        }
        let mut groups: Vec<ExecGroup> = Vec::new();
        for (name, result) in self.fleet.exec_many(&names, req).await {
            let output = exec_output(result)?;
            match groups.iter_mut().find(|g| g.output == output) {
                Some(g) => g.sandboxes.push(name),
                None => groups.push(ExecGroup {
                    sandboxes: vec![name],
                    output,
                }),
            }
        }
        Ok(groups)
    }
}

#[prompt_router]
impl OutpostServer {
    #[prompt(description = "Run a task on the idlest sandbox with a free GPU.")]
    async fn run_on_idlest_gpu(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Run this on the idlest sandbox that has a free GPU: {}\n\
                 1. select_sandbox(sandbox_name=\"auto\", min_gpus=1) picks it (or explains why none fits).\n\
                 2. reserve_gpus(count=1) and pass its lease_id as gpu_lease to exec_bash, so the GPU is yours alone.\n\
                 3. release_gpus when done.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Test code in a sandbox: set up, run the tests, report.")]
    async fn test_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Test this in a sandbox: {}\n\
                 Use list_sandboxes to see what is available and exec_bash to install dependencies and run \
                 the tests (set timeout_s to fit). Report the failing tests with the relevant output only.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Debug a problem in a sandbox by reproducing it first.")]
    async fn debug_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Debug this in a sandbox: {}\n\
                 Reproduce it with exec_bash first, then narrow it down step by step (logs, versions, \
                 a minimal case). Change one thing at a time and show the evidence for the cause you find.",
                p.task
            ),
        )]
    }
}

const LIST_URI: &str = "sandbox://list";

impl OutpostServer {
    async fn read(&self, uri: &str) -> Result<serde_json::Value, McpError> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let value = if uri == LIST_URI {
            serde_json::to_value(ListResult {
                active_sandbox: self.fleet.active_name(),
                sandboxes: self.fleet.list(false, deadline).await,
            })
        } else if let Some(name) = uri
            .strip_prefix("sandbox://")
            .and_then(|rest| rest.strip_suffix("/status"))
        {
            let session = self
                .fleet
                .get(Some(name))
                .map_err(|e| McpError::resource_not_found(e, None))?;
            let (host, port, user) = session.config.address();
            let status = match Fleet::resources(&session, deadline).await {
                Ok(r) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": true, "resources": r,
                }),
                Err(e) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": false, "connection_error": e,
                }),
            };
            Ok(status)
        } else {
            return Err(McpError::resource_not_found(
                format!("unknown resource {uri}; try {LIST_URI} or sandbox://NAME/status"),
                None,
            ));
        };
        value.map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}

#[tool_handler(router = self.tool_router)]
#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for OutpostServer {
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

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("outpost", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Sandboxes are the user's own Linux machines reached over SSH (plus `local`). \
                 exec_bash runs on the active sandbox unless sandbox_name is given.",
        )
    }
}

/// Serves MCP on stdin/stdout until the client goes away or SIGTERM/SIGINT.
pub async fn serve_stdio(fleet: Arc<Fleet>) -> anyhow::Result<()> {
    let server = OutpostServer::new(fleet.clone());
    let service = server.serve(rmcp::transport::stdio()).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = service.waiting() => { r?; }
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
    }
    for session in fleet.sessions() {
        session.disconnect().await;
    }
    Ok(())
}
