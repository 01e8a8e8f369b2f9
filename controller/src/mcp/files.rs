//! The file tools: syncs both ways (inline, or continued in the background
//! past the inline limits, as transfer tasks to poll and cancel), and
//! listing, reading and writing remote files. Each is a thin call into
//! [`crate::ops::files`], which also holds their parameter and result types.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::Peer;
use rmcp::{Json, RoleServer, tool, tool_router};

use super::OutpostServer;
use crate::ops::files::{
    self, ListParams as FileListParams, ReadParams, SyncParams, TaskParams, WriteParams,
};

#[tool_router(router = files_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Sync a local file or directory to a sandbox (delta, compressed). Small transfers run inline; past REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES/_BYTES they continue in the background (mode=background, task_id)."
    )]
    async fn sync_local_to_remote(
        &self,
        Parameters(p): Parameters<SyncParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        let roots = self.local_roots(&peer).await;
        files::sync_maybe_inline(&self.fleet, &self.transfers, &roots, p)
            .await
            .map(Json)
    }

    #[tool(
        description = "Start a local-to-sandbox sync in the background; poll with check_file_transfer_task."
    )]
    async fn sync_local_to_remote_background(
        &self,
        Parameters(p): Parameters<SyncParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<files::SyncOutcome>, String> {
        let roots = self.local_roots(&peer).await;
        files::sync_background(&self.fleet, &self.transfers, &roots, p).map(Json)
    }

    #[tool(
        description = "Status, progress (files/bytes done and total, rate), result or error, and log tail of a background transfer."
    )]
    async fn check_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::ops::transfers::TransferView>, String> {
        let task = self.transfers.get(&p.task_id)?;
        Ok(Json(task.view(p.last_n_lines.unwrap_or(50))))
    }

    #[tool(
        description = "Cancel a background transfer; files already committed stay, nothing half-written remains."
    )]
    async fn cancel_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<crate::ops::transfers::TransferView>, String> {
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
        peer: Peer<RoleServer>,
    ) -> Result<Json<crate::sync::SyncReport>, String> {
        let roots = self.local_roots(&peer).await;
        files::pull(&self.fleet, &roots, p).await.map(Json)
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
