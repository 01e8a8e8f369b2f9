//! The sandbox tools: list the sandboxes (with the isolated ones live on
//! each connected host), make one the default (by name, or the idlest that
//! fits), check the active one; and GPU leases (reserve, release) that
//! `exec_bash` runs under.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use outpost_protocol::GpuLeaseRequest;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::RequestMetaObject;
use rmcp::{Json, Peer, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::progress::{Progress, Report};
use super::shape::HostRowShape;
use super::{OutpostServer, RESOURCE_DEADLINE_EXTRA};
use crate::ops::sandboxes::HostRow;
use crate::resources::Requirements;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListParams {
    #[serde(default)]
    pub check_resources: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub active_sandbox: String,
    #[schemars(with = "Vec<HostRowShape>")]
    pub sandboxes: Vec<HostRow>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectParams {
    pub sandbox_name: String,
    /// Unleased ones.
    pub min_gpus: Option<u32>,
    pub min_gpu_free_mb: Option<u64>,
    pub min_free_mem_mb: Option<u64>,
    /// 1-minute load.
    pub max_load_per_cpu: Option<f64>,
}

impl SelectParams {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_gpus: self.min_gpus,
            min_gpu_free_mb: self.min_gpu_free_mb,
            min_free_mem_mb: self.min_free_mem_mb,
            max_load_per_cpu: self.max_load_per_cpu,
        }
    }
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
pub struct ReserveParams {
    #[schemars(extend("default" = 1))]
    pub count: Option<u32>,
    /// Per GPU.
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

#[tool_router(router = sandboxes_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Sandboxes, their connections and isolated ones; check_resources adds CPU/memory/GPU use and idle_score (1: idle)."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(p): Parameters<ListParams>,
    ) -> Result<Json<ListResult>, String> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let sandboxes =
            crate::ops::sandboxes::hosts(&self.fleet, p.check_resources, deadline).await;
        Ok(Json(ListResult {
            active_sandbox: self.fleet.active_name(),
            sandboxes,
        }))
    }

    #[tool(description = "Set the default sandbox; \"auto\": the idlest within min_*/max_*.")]
    async fn select_sandbox(
        &self,
        Parameters(p): Parameters<SelectParams>,
        peer: Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<Json<SelectResult>, String> {
        let mut idle_score = None;
        if p.sandbox_name == "auto" && self.fleet.get(Some("auto")).is_err() {
            let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
            let answered = Arc::new(AtomicUsize::new(0));
            let total = self.fleet.names().len();
            let _ticker = Progress::of(&peer, &meta).every({
                let answered = answered.clone();
                move || {
                    let done = answered.load(Ordering::Relaxed);
                    async move {
                        Report {
                            done: done as f64,
                            total: Some(total as f64),
                            message: format!("{done} of {total} sandboxes measured"),
                        }
                    }
                }
            });
            let (_, score) = crate::ops::sandboxes::select_auto(
                &self.fleet,
                &p.requirements(),
                deadline,
                &answered,
                &|_| {},
            )
            .await?;
            idle_score = Some(score);
        } else {
            self.fleet.select(&p.sandbox_name)?;
        }
        Ok(Json(SelectResult {
            active_sandbox: self.fleet.active_name(),
            status: "selected".into(),
            idle_score,
        }))
    }

    #[tool(description = "The default sandbox and its connection.")]
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
}

#[tool_router(router = gpu_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Lease GPUs for exec_bash(gpu_lease) until release_gpus or session end.")]
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
}
