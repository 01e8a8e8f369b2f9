//! The MCP server: remote-sandbox-mcp's tools, names, parameters and result
//! fields, served over stdio.
//!
//! Each tool is thin: it validates its parameters, calls into [`Fleet`] /
//! [`crate::session::Session`], and shapes a compact result (no echo of inputs).
//! Bad parameters and unknown sandboxes come back as `isError` results with a
//! message that says what to do.

use std::sync::Arc;
use std::time::Duration;

use outpost_protocol::ExecRequest;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::{Json, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fleet::{Fleet, SandboxStatus};
use crate::session::CallError;

/// Per-host deadline for `list_sandboxes(check_resources=true)`, on top of the
/// connect timeout a fresh connection may need.
const RESOURCE_DEADLINE_EXTRA: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct OutpostServer {
    fleet: Arc<Fleet>,
    tool_router: ToolRouter<Self>,
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
    pub sandbox_name: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SelectResult {
    pub active_sandbox: String,
    pub status: String,
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
}

#[derive(Debug, Serialize, JsonSchema)]
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
            tool_router: Self::tool_router(),
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

    #[tool(description = "Make a sandbox the default for later calls.")]
    async fn select_sandbox(
        &self,
        Parameters(p): Parameters<SelectParams>,
    ) -> Result<Json<SelectResult>, String> {
        self.fleet.select(&p.sandbox_name)?;
        Ok(Json(SelectResult {
            active_sandbox: self.fleet.active_name(),
            status: "selected".into(),
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
    ) -> Result<Json<ExecOutput>, String> {
        let req = exec_request(&p, false)?;
        let session = self.fleet.get(p.sandbox_name.as_deref())?;
        exec_output(session.exec(req, |_, _| {}).await).map(Json)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for OutpostServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
