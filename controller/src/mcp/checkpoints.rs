//! Undo and branch: checkpoint an isolated sandbox's work dir, restore or
//! diff a checkpoint, fork the sandbox, pause and resume it. The work is
//! [`crate::ops::checkpoints`]'s. Listing checkpoints and pausing are
//! rarely needed, so only the advanced listing names them.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use super::isolated::{NameParams, RenewResult};
use crate::ops::checkpoints::{self, ChangeView, CheckpointView, CopyView};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CheckpointParams {
    pub sandbox_name: String,
    pub label: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RestoreParams {
    pub checkpoint: String,
    /// Relative to the work dir.
    pub paths: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DiffParams {
    pub checkpoint: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkParams {
    pub sandbox_name: String,
    /// Outlive this MCP session.
    #[serde(default)]
    pub keep: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PauseParams {
    pub sandbox_name: String,
    /// Its TTL waits too.
    #[serde(default)]
    pub stop_clock: bool,
}

/// A checkpoint made: its name, files and bytes, how many share content
/// copy-on-write or are unchanged since the checkpoint before (and share
/// its copy), what was left out (fifos, sockets, devices).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckpointResult {
    pub checkpoint: String,
    pub files: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub copy_on_write: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub unchanged: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    pub took_ms: u64,
}

/// A checkpoint as listed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListedCheckpoint {
    pub checkpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub created_at: String,
    pub files: u64,
    pub bytes: u64,
}

/// Files written back, their bytes, entries removed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RestoreResult {
    pub files: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub removed: u64,
    pub took_ms: u64,
}

/// The new sandbox: its name, expiry and work dir; the rest is the
/// original's.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ForkResult {
    pub sandbox_name: String,
    pub expires_at: String,
    pub work_dir: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<ListedCheckpoint>,
}

/// What changed since the checkpoint, by path; `more`: changes past these.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DiffResult {
    pub changes: Vec<ChangeResult>,
    #[serde(skip_serializing_if = "is_zero")]
    pub more: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeResult {
    pub path: String,
    /// added, changed or removed.
    pub change: String,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

impl From<CopyView> for RestoreResult {
    fn from(c: CopyView) -> Self {
        RestoreResult {
            files: c.files,
            bytes: c.bytes,
            removed: c.removed,
            took_ms: c.took_ms,
        }
    }
}

impl From<CheckpointView> for CheckpointResult {
    fn from(v: CheckpointView) -> Self {
        CheckpointResult {
            checkpoint: v.checkpoint,
            files: v.copy.files,
            bytes: v.copy.bytes,
            copy_on_write: v.copy.copy_on_write,
            unchanged: v.copy.unchanged,
            skipped: v.copy.skipped,
            took_ms: v.copy.took_ms,
        }
    }
}

impl From<CheckpointView> for ListedCheckpoint {
    fn from(v: CheckpointView) -> Self {
        ListedCheckpoint {
            checkpoint: v.checkpoint,
            label: v.label,
            created_at: v.created_at,
            files: v.copy.files,
            bytes: v.copy.bytes,
        }
    }
}

impl From<ChangeView> for ChangeResult {
    fn from(c: ChangeView) -> Self {
        ChangeResult {
            path: c.path,
            change: c.change.into(),
            size: c.size,
            diff: c.diff,
        }
    }
}

#[tool_router(router = checkpoints_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Save a sandbox's work dir as checkpoint HOST/ID@N.")]
    async fn checkpoint_sandbox(
        &self,
        Parameters(p): Parameters<CheckpointParams>,
    ) -> Result<Json<CheckpointResult>, String> {
        let made = checkpoints::checkpoint(&self.fleet, &p.sandbox_name, p.label).await?;
        Ok(Json(made.into()))
    }

    #[tool(description = "An isolated sandbox's checkpoints.")]
    async fn list_checkpoints(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> Result<Json<CheckpointList>, String> {
        let all = checkpoints::list(&self.fleet, &p.sandbox_name).await?;
        Ok(Json(CheckpointList {
            checkpoints: all.into_iter().map(Into::into).collect(),
        }))
    }

    #[tool(description = "Put the work dir (or paths) back as at a checkpoint.")]
    async fn restore_checkpoint(
        &self,
        Parameters(p): Parameters<RestoreParams>,
    ) -> Result<Json<RestoreResult>, String> {
        // Where allow rules vouch for command text, files that change what
        // it runs are not written back (as `write_remote_file` is refused).
        let (sandbox, _) = checkpoints::parse(&p.checkpoint)?;
        self.fleet
            .policy
            .check_writes(sandbox, "restoring its files")
            .map_err(|refusal| refusal.to_string())?;
        let paths = p.paths.unwrap_or_default();
        let restored = checkpoints::restore(&self.fleet, &p.checkpoint, paths).await?;
        Ok(Json(restored.into()))
    }

    #[tool(description = "What changed since a checkpoint.")]
    async fn diff_checkpoint(
        &self,
        Parameters(p): Parameters<DiffParams>,
    ) -> Result<Json<DiffResult>, String> {
        let (changes, more) = checkpoints::diff(&self.fleet, &p.checkpoint).await?;
        Ok(Json(DiffResult {
            changes: changes.into_iter().map(Into::into).collect(),
            more,
        }))
    }

    #[tool(description = "Copy a sandbox, settings and work dir, into a new one.")]
    async fn fork_sandbox(
        &self,
        Parameters(p): Parameters<ForkParams>,
    ) -> Result<Json<ForkResult>, String> {
        let view = checkpoints::fork(&self.fleet, &p.sandbox_name).await?;
        if !p.keep {
            self.scope.own(&view.sandbox_name);
        }
        Ok(Json(ForkResult {
            sandbox_name: view.sandbox_name,
            expires_at: view.expires_at,
            work_dir: view.work_dir,
        }))
    }

    #[tool(description = "Freeze every process of an isolated sandbox.")]
    async fn pause_sandbox(
        &self,
        Parameters(p): Parameters<PauseParams>,
    ) -> Result<Json<RenewResult>, String> {
        let view = checkpoints::pause(&self.fleet, &p.sandbox_name, p.stop_clock).await?;
        Ok(Json(view.into()))
    }

    #[tool(description = "Thaw a paused sandbox.")]
    async fn resume_sandbox(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> Result<Json<RenewResult>, String> {
        let view = checkpoints::resume(&self.fleet, &p.sandbox_name).await?;
        Ok(Json(view.into()))
    }
}
