//! A sync being applied ([`Run`]): where to ([`Dest`]: through the agent,
//! or here through an applier), its counters and its report so far, and the
//! metadata phases around the file contents: kind changes and new
//! directories before them; symlinks, attributes, removals and directory
//! attributes after.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use outpost_protocol::{
    ApplyMeta, EntryKind, MetaOp, Partial, RelPath, Request, Response, TreeEntry,
};
use outpost_treesync::apply::Applier;
use outpost_treesync::plan::{FileChange, Plan};
use outpost_treesync::relpath;

use super::helpers::{add_problems, blocking, check_cancelled, lock, problem, unexpected};
use super::limits::{MAX_RESUME_CHUNKS, META_BYTES, META_OPS};
use super::parts::{Part, Staged, resume_plan, tiles};
use super::pipeline::final_answer;
use super::planning::count_deleted;
use super::types::{Progress, SyncError, SyncReport};
use crate::session::{CallError, ScopedConn};

/// Where a plan is applied.
pub(super) enum Dest {
    /// Through the agent.
    Remote { conn: ScopedConn, root: String },
    /// Here.
    Local { applier: Arc<Mutex<Applier>> },
}

/// A sync being applied: where, its counters, and its report so far.
pub(super) struct Run {
    pub(super) dest: Dest,
    pub(super) progress: Arc<Progress>,
    pub(super) report: SyncReport,
    /// Source paths the scan already reported a problem for (a file it could
    /// not hash, say), so skipping them does not report them twice.
    pub(super) src_problems: HashSet<RelPath>,
    /// Partial files the target scan found: (directory, hash prefix, size).
    pub(super) partials: HashSet<(RelPath, [u8; 16], u64)>,
}

pub(super) fn partial_set(partials: &[Partial]) -> HashSet<(RelPath, [u8; 16], u64)> {
    partials
        .iter()
        .map(|p| (p.dir.clone(), p.hash_prefix, p.size))
        .collect()
}

/// Whether the target holds a partial file of `src`'s content (of its
/// size, in its directory).
pub(super) fn has_partial(partials: &HashSet<(RelPath, [u8; 16], u64)>, src: &TreeEntry) -> bool {
    let Some(hash) = src.hash else { return false };
    let prefix: [u8; 16] = hash[..16].try_into().expect("16 of 32 bytes");
    partials.contains(&(relpath::parent(&src.path).to_vec(), prefix, src.size))
}

impl Run {
    /// Whether an interrupted transfer left a partial file of this change's
    /// new content that chunks can be checked against.
    pub(super) fn resumable(&self, change: &FileChange) -> bool {
        let src = &change.src;
        tiles(&src.chunks, src.size)
            && src.chunks.len() <= MAX_RESUME_CHUNKS
            && has_partial(&self.partials, src)
    }

    /// Takes a resume's answer in: the chunks the partial file holds count
    /// as done, and `parts` becomes what is left to send.
    pub(super) fn take_resumed(
        &mut self,
        staged: &mut Staged,
        present: &[u32],
        parts: &mut Vec<Part>,
    ) {
        if present.is_empty() {
            return;
        }
        let (held, rest) = resume_plan(&staged.change, present);
        *parts = rest;
        staged.counted += held;
        self.report.bytes_resumed += held;
        self.progress.bytes_done.fetch_add(held, Ordering::Relaxed);
    }

    /// Reports a file that is not sent at all, unless the scan already did.
    pub(super) fn skip(&mut self, change: &FileChange, message: &str) {
        if !self.src_problems.contains(&change.src.path) {
            let line = problem(&change.src.path, message);
            self.report.problems.push(line);
        }
        let progress = &self.progress;
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        progress
            .bytes_done
            .fetch_add(change.src.size, Ordering::Relaxed);
    }
}

impl Run {
    /// Kind changes, then new directories.
    pub(super) async fn before_files(&mut self, plan: &Plan) -> Result<(), SyncError> {
        let removes = plan
            .replace_removes
            .iter()
            .map(|p| MetaOp::Remove { path: p.clone() });
        self.meta(removes.collect()).await?;
        let mkdirs = plan.mkdirs.iter().map(|e| MetaOp::Mkdir {
            path: e.path.clone(),
            mode: e.mode,
        });
        self.report.dirs_created = self.meta(mkdirs.collect()).await?;
        Ok(())
    }

    /// Symlinks, attributes, extras, directory attributes.
    pub(super) async fn after_files(&mut self, plan: &Plan) -> Result<(), SyncError> {
        let links = plan.symlinks.iter().filter_map(|e| match &e.kind {
            EntryKind::Symlink { target } => Some(MetaOp::Symlink {
                path: e.path.clone(),
                target: target.clone(),
            }),
            _ => None,
        });
        self.report.symlinks = self.meta(links.collect()).await?;
        self.report.attrs_updated = self.meta(set_attrs(&plan.attrs)).await?;
        let removes = plan
            .removes
            .iter()
            .map(|p| MetaOp::Remove { path: p.clone() });
        self.report.deleted = self.meta(removes.collect()).await?;
        // As planned: a delete that failed is among the problems.
        count_deleted(&mut self.report, plan);
        self.meta(set_attrs(&plan.dir_attrs)).await?;
        Ok(())
    }

    pub(super) fn finish(mut self, plan: &Plan, started: Instant) -> SyncReport {
        self.report.files_unchanged = plan.unchanged;
        self.report.duration_s = started.elapsed().as_secs_f64();
        self.report
    }

    /// Applies `ops` in order, in requests of bounded size, one at a time
    /// (later ops may depend on earlier ones: a parent before its child).
    /// Returns how many succeeded.
    async fn meta(&mut self, ops: Vec<MetaOp>) -> Result<u64, SyncError> {
        let mut done = 0;
        for batch in meta_batches(ops) {
            check_cancelled(&self.progress)?;
            let report = match &self.dest {
                Dest::Remote { conn, root } => {
                    let call = conn.start(Request::ApplyMeta(ApplyMeta {
                        root: root.clone(),
                        ops: batch,
                    }))?;
                    match final_answer(call).await? {
                        Response::Applied(report) => report,
                        Response::Error(e) => return Err(CallError::Agent(e).into()),
                        other => return Err(unexpected("metadata changes", &other).into()),
                    }
                }
                Dest::Local { applier } => {
                    let applier = Arc::clone(applier);
                    blocking(move || lock(&applier).apply_meta(&batch)).await?
                }
            };
            done += u64::from(report.done);
            add_problems(&mut self.report, &report.problems);
        }
        Ok(done)
    }
}

fn set_attrs(entries: &[TreeEntry]) -> Vec<MetaOp> {
    entries
        .iter()
        .map(|e| MetaOp::SetAttrs {
            path: e.path.clone(),
            mode: e.mode,
            mtime_ns: e.mtime_ns,
        })
        .collect()
}

/// Splits ops into requests, keeping their order.
pub(super) fn meta_batches(ops: Vec<MetaOp>) -> Vec<Vec<MetaOp>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let size = 32
            + match &op {
                MetaOp::Mkdir { path, .. }
                | MetaOp::SetAttrs { path, .. }
                | MetaOp::Remove { path } => path.len(),
                MetaOp::Symlink { path, target } => path.len() + target.len(),
                MetaOp::Abort { .. } => 0,
            };
        if !batch.is_empty() && (batch.len() >= META_OPS || bytes + size > META_BYTES) {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push(op);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}
