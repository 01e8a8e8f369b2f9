//! The file tools: syncs both ways (inline, or continued in the background
//! past the inline limits, as transfer tasks to poll and cancel), and
//! listing, reading and writing remote files. Each parses its arguments into
//! a request of [`crate::ops::files`] and makes one call there; the results
//! are that module's types, described by the mirrors of [`super::shape`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::RequestMetaObject;
use rmcp::service::Peer;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use super::ids::Id;
use super::progress::{Progress, Report};
use super::shape::{
    BackgroundSyncShape, DownloadShape, FileListShape, ReadShape, Shaped, TransferStatusShape,
    UploadShape, WriteShape,
};
use super::sync_view::{PullReport, PushAnswer, TransferAnswer};
use crate::ops::files::{self, ListRequest, ReadRequest, SyncRequest, WriteRequest};
use crate::ops::human_bytes;
use crate::ops::transfers::Status;
use crate::sync;

/// `sync_local_to_remote`'s parameters (and its background twin's).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PushParams {
    #[schemars(extend("default" = "."))]
    pub local_path: Option<String>,
    #[schemars(extend("default" = "."))]
    pub remote_path: Option<String>,
    /// Push to each (["all"]: all but local).
    pub sandboxes: Option<Vec<String>>,
    #[serde(flatten)]
    pub options: SyncOptions,
}

/// `sync_remote_to_local`'s: remote-sandbox-mcp pulls into ./remote_mirror
/// unless told otherwise.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PullParams {
    #[schemars(extend("default" = "."))]
    pub remote_path: Option<String>,
    #[schemars(extend("default" = "./remote_mirror/"))]
    pub local_path: Option<String>,
    #[serde(flatten)]
    pub options: SyncOptions,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SyncOptions {
    // Never deletes an excluded path.
    #[serde(default)]
    pub delete_extras: bool,
    /// gitignore syntax, added to .git/, node_modules/ ….
    pub excludes: Option<Vec<String>>,
    pub exclude_file: Option<String>,
    #[serde(default)]
    pub use_gitignore: bool,
    #[serde(default)]
    pub dry_run: bool,
    /// Allow emptying most of a target.
    #[serde(default)]
    pub force: bool,
    pub sandbox_name: Option<String>,
}

impl SyncOptions {
    /// The request between these paths; an empty path is the default one.
    fn request(
        self,
        local_path: Option<String>,
        remote_path: Option<String>,
        pull: bool,
    ) -> SyncRequest {
        // A pulled file goes into ./remote_mirror/ (a tree becomes it).
        let local_default = if pull { "./remote_mirror/" } else { "." };
        SyncRequest {
            local_path: given_or(local_path, local_default),
            remote_path: given_or(remote_path, "."),
            delete_extras: self.delete_extras,
            excludes: self.excludes,
            exclude_file: self.exclude_file,
            use_gitignore: self.use_gitignore,
            dry_run: self.dry_run,
            force: self.force,
            sandbox_name: self.sandbox_name,
            sandboxes: None,
        }
    }
}

impl PushParams {
    fn request(self) -> SyncRequest {
        SyncRequest {
            sandboxes: self.sandboxes,
            ..self
                .options
                .request(self.local_path, self.remote_path, false)
        }
    }
}

impl PullParams {
    fn request(self) -> SyncRequest {
        self.options
            .request(self.local_path, self.remote_path, true)
    }
}

fn given_or(value: Option<String>, default: &str) -> String {
    value
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TaskParams {
    pub task_id: Id,
    #[schemars(extend("default" = 50))]
    pub last_n_lines: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelTaskParams {
    pub task_id: Id,
    #[schemars(extend("default" = 10))]
    pub force_kill_after_s: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileListParams {
    #[schemars(extend("default" = "."))]
    pub remote_path: Option<String>,
    #[serde(default)]
    pub recursive: bool,
    #[schemars(extend("default" = 200))]
    pub max_entries: Option<u64>,
    pub sandbox_name: Option<String>,
}

impl From<FileListParams> for ListRequest {
    fn from(p: FileListParams) -> Self {
        ListRequest {
            remote_path: p.remote_path,
            recursive: p.recursive,
            max_entries: p.max_entries,
            sandbox_name: p.sandbox_name,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadParams {
    pub remote_path: String,
    #[schemars(extend("default" = 200000))]
    pub max_bytes: Option<u64>,
    /// Byte offset.
    pub offset: Option<u64>,
    pub sandbox_name: Option<String>,
    /// Bytes as content_base64.
    #[serde(default)]
    pub base64: bool,
}

impl From<ReadParams> for ReadRequest {
    fn from(p: ReadParams) -> Self {
        ReadRequest {
            remote_path: p.remote_path,
            max_bytes: p.max_bytes,
            offset: p.offset,
            sandbox_name: p.sandbox_name,
            base64: p.base64,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteParams {
    pub remote_path: String,
    pub content: String,
    /// content is base64.
    #[serde(default)]
    pub base64: bool,
    #[schemars(extend("default" = "644"))]
    pub mode: Option<String>,
    #[schemars(extend("default" = true))]
    pub create_parents: Option<bool>,
    pub sandbox_name: Option<String>,
}

impl From<WriteParams> for WriteRequest {
    fn from(p: WriteParams) -> Self {
        WriteRequest {
            remote_path: p.remote_path,
            content: p.content,
            base64: p.base64,
            mode: p.mode,
            create_parents: p.create_parents,
            sandbox_name: p.sandbox_name,
        }
    }
}

/// One file of `upload_files`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UploadFileParams {
    pub remote_path: String,
    pub content: String,
    #[serde(default)]
    pub base64: bool,
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct UploadParams {
    pub files: Vec<UploadFileParams>,
    pub sandbox_name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DownloadParams {
    pub remote_paths: Vec<String>,
    /// Per file.
    #[schemars(extend("default" = 200000))]
    pub max_bytes: Option<u64>,
    pub sandbox_name: Option<String>,
}

/// A progress notification from a sync's live counters: bytes done of
/// total, and files.
fn sync_report(p: &sync::Progress) -> Report {
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let (files_done, files_total) = (load(&p.files_done), load(&p.files_total));
    let (bytes_done, bytes_total) = (load(&p.bytes_done), load(&p.bytes_total));
    let message = if files_total == 0 {
        "comparing trees".to_string()
    } else {
        format!(
            "{files_done}/{files_total} files, {} of {}",
            human_bytes(bytes_done),
            human_bytes(bytes_total)
        )
    };
    Report {
        done: bytes_done as f64,
        total: (files_total > 0).then_some(bytes_total as f64),
        message,
    }
}

type BackgroundSync = Shaped<files::SyncOutcome, BackgroundSyncShape>;

/// What a cancel answers: how the transfer ended (its progress, and its
/// report if it finished first, stay with check_file_transfer_task).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CancelledTransfer {
    pub task_id: String,
    #[schemars(with = "TransferStatusShape")]
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// It had ended before the cancel: nothing was stopped.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_finished: bool,
}

#[tool_router(router = files_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Push a local file or tree by delta; big pushes go on in the background.")]
    async fn sync_local_to_remote(
        &self,
        Parameters(p): Parameters<PushParams>,
        peer: Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<Json<PushAnswer>, String> {
        let roots = self.local_roots(&peer).await;
        let progress = Progress::of(&peer, &meta);
        let mut ticker = None;
        let watch = |counters: Arc<sync::Progress>| {
            ticker = Some(progress.every(move || {
                let report = sync_report(&counters);
                async move { report }
            }));
        };
        let request = p.request();
        self.may_write_all(&files::push_targets(&self.fleet, &request)?)?;
        files::sync_maybe_inline(&self.fleet, &self.transfers, &roots, request, watch)
            .await
            .map(|r| Json(PushAnswer::from(r)))
    }

    #[tool(description = "A background transfer's status, progress and report.")]
    async fn check_file_transfer_task(
        &self,
        Parameters(p): Parameters<TaskParams>,
    ) -> Result<Json<TransferAnswer>, String> {
        let task = self.transfers.get(p.task_id.as_str())?;
        Ok(Json(TransferAnswer::from(
            task.view(p.last_n_lines.unwrap_or(50)),
        )))
    }

    #[tool(description = "Cancel a background transfer; nothing half-written stays.")]
    async fn cancel_file_transfer_task(
        &self,
        Parameters(p): Parameters<CancelTaskParams>,
    ) -> Result<Json<CancelledTransfer>, String> {
        let wait =
            crate::ops::jobs::seconds("force_kill_after_s", p.force_kill_after_s, 10.0, 600.0)?;
        let task = self.transfers.get(p.task_id.as_str())?;
        let already_finished = task.view(0).status != Status::Running;
        task.cancel();
        let _ = tokio::time::timeout(wait, task.finished()).await;
        let view = task.view(0);
        Ok(Json(CancelledTransfer {
            task_id: view.task_id,
            status: view.status,
            error: view.error,
            already_finished,
        }))
    }

    #[tool(description = "Pull a sandbox file or tree to a local path by delta.")]
    async fn sync_remote_to_local(
        &self,
        Parameters(p): Parameters<PullParams>,
        peer: Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<Json<PullReport>, String> {
        let roots = self.local_roots(&peer).await;
        let counters = Arc::new(sync::Progress::default());
        let _ticker = Progress::of(&peer, &meta).every({
            let counters = counters.clone();
            move || {
                let report = sync_report(&counters);
                async move { report }
            }
        });
        files::pull(&self.fleet, &roots, p.request(), counters)
            .await
            .map(|r| Json(PullReport::from(r)))
    }

    #[tool(description = "List a sandbox directory.")]
    async fn list_remote_files(
        &self,
        Parameters(p): Parameters<FileListParams>,
    ) -> Result<Json<Shaped<files::ListResult, FileListShape>>, String> {
        files::list(&self.fleet, p.into())
            .await
            .map(|r| Json(Shaped::new(r)))
    }

    #[tool(description = "Read a sandbox file (binary: base64=true).")]
    async fn read_remote_file(
        &self,
        Parameters(p): Parameters<ReadParams>,
    ) -> Result<Json<Shaped<files::ReadResult, ReadShape>>, String> {
        files::read(&self.fleet, p.into())
            .await
            .map(|r| Json(Shaped::new(r)))
    }

    #[tool(description = "Write a sandbox file atomically.")]
    async fn write_remote_file(
        &self,
        Parameters(p): Parameters<WriteParams>,
    ) -> Result<Json<Shaped<files::WriteResult, WriteShape>>, String> {
        self.may_write(p.sandbox_name.as_deref())?;
        files::write(&self.fleet, p.into())
            .await
            .map(|r| Json(Shaped::new(r)))
    }
}

// OpenSandbox's names for several files at once: listed with the advanced
// tools (write_remote_file and read_remote_file do one, binary included).
#[tool_router(router = bulk_files_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Write several sandbox files, each atomically.")]
    async fn upload_files(
        &self,
        Parameters(p): Parameters<UploadParams>,
    ) -> Result<Json<Shaped<files::UploadResult, UploadShape>>, String> {
        self.may_write(p.sandbox_name.as_deref())?;
        let list = p
            .files
            .into_iter()
            .map(|f| files::UploadFile {
                remote_path: f.remote_path,
                content: f.content,
                base64: f.base64,
                mode: f.mode,
            })
            .collect();
        files::upload(&self.fleet, list, p.sandbox_name)
            .await
            .map(|r| Json(Shaped::new(r)))
    }

    #[tool(description = "Read several sandbox files; binary ones as base64.")]
    async fn download_files(
        &self,
        Parameters(p): Parameters<DownloadParams>,
    ) -> Result<Json<Shaped<files::DownloadResult, DownloadShape>>, String> {
        files::download(&self.fleet, p.remote_paths, p.max_bytes, p.sandbox_name)
            .await
            .map(|r| Json(Shaped::new(r)))
    }
}

// Not remote-sandbox-mcp's (its sync_local_to_remote goes to the background
// by itself, as Outpost's does): listed with the advanced tools.
#[tool_router(router = background_push_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Push in the background; poll check_file_transfer_task.")]
    async fn sync_local_to_remote_background(
        &self,
        Parameters(p): Parameters<PushParams>,
        peer: Peer<RoleServer>,
    ) -> Result<Json<BackgroundSync>, String> {
        let roots = self.local_roots(&peer).await;
        let request = p.request();
        self.may_write_all(&files::push_targets(&self.fleet, &request)?)?;
        files::sync_background(&self.fleet, &self.transfers, &roots, request)
            .map(|r| Json(Shaped::new(r)))
    }
}

impl OutpostServer {
    /// Refuses to write files on a sandbox whose allow rules vouch for
    /// command text: a new `train.py` would change what `python3 train.py`
    /// runs.
    fn may_write(&self, sandbox: Option<&str>) -> Result<(), String> {
        self.may_write_all(&[self.fleet.get(sandbox)?])
    }

    fn may_write_all(&self, sessions: &[Arc<crate::session::Session>]) -> Result<(), String> {
        for session in sessions {
            self.fleet
                .policy
                .check_writes(session.name(), "writing its files")
                .map_err(|refusal| refusal.to_string())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_paths_default_as_remote_sandbox_mcp_has_them() {
        let none: PushParams = serde_json::from_value(serde_json::json!({})).unwrap();
        let push = none.request();
        assert_eq!(
            (push.local_path.as_str(), push.remote_path.as_str()),
            (".", ".")
        );
        let none: PullParams =
            serde_json::from_value(serde_json::json!({"local_path": ""})).unwrap();
        let pull = none.request();
        assert_eq!(
            (pull.local_path.as_str(), pull.remote_path.as_str()),
            ("./remote_mirror/", ".")
        );
    }
}
