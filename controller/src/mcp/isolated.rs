//! The isolated sandbox tools: create one on a host, see, renew and delete
//! it (`close_sandbox` is accepted as `delete_sandbox`, never listed). The
//! name they answer, `HOST/ID`, is a `sandbox_name` every other tool takes.
//! The work is [`crate::ops::sandboxes`]'s; `list_sandboxes` (in
//! `sandboxes.rs`) shows the live ones under each host.

use std::collections::BTreeMap;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::sync::{Arc, Mutex};

use rmcp::model::RequestMetaObject;
use rmcp::{Peer, RoleServer};

use super::OutpostServer;
use super::progress::{Progress, Report};
use super::shape::{SandboxShape, Shaped};
use crate::ops::sandboxes::{self, CreateRequest, Limits, SandboxView};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateParams {
    /// "auto": the idlest with `gpus` free.
    #[schemars(extend("default" = "auto"))]
    pub host: Option<String>,
    /// At most 7 days.
    #[schemars(extend("default" = 3600))]
    pub ttl_s: Option<f64>,
    /// auto: the strongest there.
    #[schemars(extend("enum" = ["auto", "bwrap", "landlock", "none"], "default" = "auto"))]
    pub isolation: Option<String>,
    #[schemars(extend("default" = true))]
    pub network: Option<bool>,
    pub limits: Option<LimitParams>,
    pub gpus: Option<u32>,
    pub env: Option<BTreeMap<String, String>>,
    // With network false (the error says so): names its commands reach
    // through a proxy; not described, to keep the tool list small.
    pub allow_hosts: Option<Vec<String>>,
    /// Keep its files after it ends.
    #[serde(default)]
    pub keep_files_on_expiry: bool,
    /// Outlive this MCP session.
    #[serde(default)]
    pub keep: bool,
    /// Slurm cluster: time limit (2:00:00).
    pub time: Option<String>,
    /// Slurm cluster.
    pub partition: Option<String>,
}

// A misspelt limit is an error, never a limit silently not set.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitParams {
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u32>,
    pub disk_mb: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct NameParams {
    pub sandbox_name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PortParams {
    pub sandbox_name: String,
    pub port: u16,
}

/// Where this machine serves it, `http://127.0.0.1:LOCAL`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PortResult {
    pub url: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenewParams {
    pub sandbox_name: String,
    pub ttl_s: f64,
}

/// What renewing changes.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RenewResult {
    pub state: String,
    pub expires_at: String,
}

/// How a delete ended: `deleted`, and where the files stay when kept.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DeleteResult {
    pub state: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kept_files: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl From<SandboxView> for RenewResult {
    fn from(view: SandboxView) -> Self {
        RenewResult {
            state: view.state.into(),
            expires_at: view.expires_at,
        }
    }
}

impl From<SandboxView> for DeleteResult {
    fn from(view: SandboxView) -> Self {
        DeleteResult {
            state: view.state.into(),
            kept_files: view.kept_files,
            work_dir: view.kept_files.then_some(view.work_dir),
            note: view.note,
        }
    }
}

impl CreateParams {
    fn request(self) -> CreateRequest {
        let defaults = CreateRequest::default();
        CreateRequest {
            host: self.host.filter(|h| !h.is_empty()).unwrap_or(defaults.host),
            id: None,
            ttl_s: self.ttl_s.unwrap_or(defaults.ttl_s),
            isolation: self.isolation.unwrap_or(defaults.isolation),
            network: self.network.unwrap_or(defaults.network),
            limits: self.limits.map_or_else(Limits::default, |l| Limits {
                memory_mb: l.memory_mb,
                cpus: l.cpus,
                pids: l.pids,
                disk_mb: l.disk_mb,
            }),
            gpus: self.gpus.unwrap_or(defaults.gpus),
            env: self.env.unwrap_or_default().into_iter().collect(),
            keep_files: self.keep_files_on_expiry,
            allow_hosts: self.allow_hosts.unwrap_or_default(),
            time: self.time.filter(|t| !t.is_empty()),
            partition: self.partition.filter(|p| !p.is_empty()),
        }
    }
}

fn shaped(
    result: Result<SandboxView, String>,
) -> Result<Json<Shaped<SandboxView, SandboxShape>>, String> {
    result.map(|view| Json(Shaped::new(view)))
}

#[tool_router(router = isolated_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Make an isolated, expiring sandbox for every tool's sandbox_name.")]
    async fn create_sandbox(
        &self,
        Parameters(p): Parameters<CreateParams>,
        peer: Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<Json<Shaped<SandboxView, SandboxShape>>, String> {
        // Only a Slurm allocation waits long enough to say why.
        let waiting = Arc::new(Mutex::new(String::new()));
        let _ticker = Progress::of(&peer, &meta).every({
            let waiting = waiting.clone();
            move || {
                let message = waiting.lock().unwrap().clone();
                async move {
                    Report {
                        done: 0.0,
                        total: None,
                        message,
                    }
                }
            }
        });
        let progress = move |m: String| *waiting.lock().unwrap() = m;
        let keep = p.keep;
        let view = sandboxes::create(&self.fleet, p.request(), &progress).await?;
        if !keep {
            self.scope.own(&view.sandbox_name);
        }
        shaped(Ok(view))
    }

    #[tool(description = "An isolated sandbox's state and expiry.")]
    async fn get_sandbox_status(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> Result<Json<Shaped<SandboxView, SandboxShape>>, String> {
        shaped(sandboxes::status(&self.fleet, &p.sandbox_name).await)
    }

    #[tool(description = "Make an isolated sandbox expire ttl_s from now.")]
    async fn renew_sandbox(
        &self,
        Parameters(p): Parameters<RenewParams>,
    ) -> Result<Json<RenewResult>, String> {
        let view = sandboxes::renew(&self.fleet, &p.sandbox_name, p.ttl_s).await?;
        Ok(Json(view.into()))
    }

    #[tool(description = "Delete an isolated sandbox, its processes and files.")]
    async fn delete_sandbox(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> Result<Json<DeleteResult>, String> {
        let view = sandboxes::delete(&self.fleet, &p.sandbox_name).await?;
        self.scope.forget(&p.sandbox_name);
        Ok(Json(view.into()))
    }

    #[tool(description = "Serve a sandbox's loopback port here; answers its URL.")]
    async fn expose_port(
        &self,
        Parameters(p): Parameters<PortParams>,
    ) -> Result<Json<PortResult>, String> {
        let url = crate::ops::ports::expose(&self.fleet, &p.sandbox_name, p.port).await?;
        Ok(Json(PortResult { url }))
    }

    /// Another name of `delete_sandbox`, for agents that guess it:
    /// accepted, never listed ([`super::listing::UNLISTED_TOOLS`]).
    #[tool(description = "delete_sandbox.")]
    async fn close_sandbox(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> Result<Json<DeleteResult>, String> {
        self.delete_sandbox(Parameters(p)).await
    }
}
