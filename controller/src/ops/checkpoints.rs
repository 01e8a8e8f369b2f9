//! Undo and branch for an isolated sandbox (`HOST/ID`): checkpoints of its
//! work dir, their restore (whole, or named paths) and diff, forks, and
//! pause/resume. Each is one request to its host's agent, which freezes the
//! sandbox's commands while it copies. A checkpoint is named `HOST/ID@N`.
//! A Slurm allocation has none of these: its files live on a node that
//! ends with it.

use outpost_protocol::{Change, CheckpointInfo, CopyReport, Request, Response};
use serde::Serialize;

use super::jobs::{ask, unexpected, utc_time};
use super::sandboxes::SandboxView;
use crate::fleet::Fleet;
use crate::session::Session;

/// A checkpoint as both front ends show it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointView {
    /// `HOST/ID@N`, what `restore_checkpoint` and `diff_checkpoint` take.
    pub checkpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// UTC.
    pub created_at: String,
    #[serde(flatten)]
    pub copy: CopyView,
}

/// What a copy did: files (and symlinks) written, their bytes, how many
/// share their content copy-on-write, how many a checkpoint shares with the
/// one before (unchanged since), entries removed, and what was left out
/// (fifos, sockets, devices).
#[derive(Debug, Clone, Serialize)]
pub struct CopyView {
    pub files: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub copy_on_write: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub unchanged: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub removed: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    pub took_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl From<CopyReport> for CopyView {
    fn from(r: CopyReport) -> Self {
        CopyView {
            files: r.files,
            bytes: r.bytes,
            copy_on_write: r.cloned,
            unchanged: r.unchanged,
            removed: r.removed,
            skipped: r.skipped,
            took_ms: r.took_ms,
        }
    }
}

/// One path that differs from a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeView {
    pub path: String,
    /// `added`, `changed` or `removed`.
    pub change: &'static str,
    pub size: u64,
    /// A unified diff, for small text files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// `HOST/ID@N` into the sandbox's name and N.
pub fn parse(checkpoint: &str) -> Result<(&str, u32), String> {
    checkpoint
        .rsplit_once('@')
        .and_then(|(name, n)| Some((name, n.parse().ok()?)))
        .filter(|(name, n)| name.contains('/') && *n > 0)
        .ok_or_else(|| {
            format!("bad checkpoint {checkpoint:?}: give HOST/ID@N, as checkpoint_sandbox answers")
        })
}

/// The host of the isolated sandbox `name` and its id; an allocation is
/// refused.
fn isolated(fleet: &Fleet, name: &str) -> Result<(std::sync::Arc<Session>, String), String> {
    let (host, id) = fleet.isolated(name)?;
    if host.config.slurm.is_some() {
        return Err(format!(
            "{name} is a Slurm allocation: it has no checkpoints, forks or pauses"
        ));
    }
    Ok((host, id))
}

fn view(name: &str, info: CheckpointInfo) -> CheckpointView {
    CheckpointView {
        checkpoint: format!("{name}@{}", info.number),
        label: info.label,
        created_at: utc_time(info.created_unix),
        copy: info.copy.into(),
    }
}

async fn sandbox_answer(
    host: &Session,
    request: Request,
    what: &str,
) -> Result<SandboxView, String> {
    match ask(host, request).await.map_err(|e| e.to_string())? {
        Response::Sandbox(info) => Ok(SandboxView::of(host.name(), info)),
        other => Err(unexpected(what, other).to_string()),
    }
}

pub async fn checkpoint(
    fleet: &Fleet,
    name: &str,
    label: Option<String>,
) -> Result<CheckpointView, String> {
    let (host, id) = isolated(fleet, name)?;
    let label = label.filter(|l| !l.is_empty());
    match ask(&host, Request::SandboxCheckpoint { id, label })
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Checkpoint(info) => Ok(view(name, info)),
        other => Err(unexpected("checkpointing", other).to_string()),
    }
}

/// The checkpoint a `checkpoint` policy rule asks for before `planned`
/// runs in an isolated sandbox (none on a configured host, or when no
/// rule matches); an error, meaning the command must not run, when it
/// cannot be made.
pub async fn before_command(
    fleet: &Fleet,
    planned: &crate::policy::Planned<'_>,
) -> Result<Option<String>, String> {
    let Some(rule) = fleet
        .policy
        .checkpoint_rule(planned.sandbox, planned.command)
    else {
        return Ok(None);
    };
    if fleet.isolated(planned.sandbox).is_err() {
        return Ok(None);
    }
    let label = format!("before {}: policy rule {rule:?}", planned.field);
    match checkpoint(fleet, planned.sandbox, Some(label)).await {
        Ok(view) => Ok(Some(view.checkpoint)),
        Err(e) => Err(format!(
            "the policy asks for a checkpoint before this command (rule {rule:?}) and it failed, so the command did not run: {e}"
        )),
    }
}

pub async fn list(fleet: &Fleet, name: &str) -> Result<Vec<CheckpointView>, String> {
    let (host, id) = isolated(fleet, name)?;
    match ask(&host, Request::SandboxCheckpoints { id })
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Checkpoints(all) => Ok(all.into_iter().map(|i| view(name, i)).collect()),
        other => Err(unexpected("listing checkpoints", other).to_string()),
    }
}

/// The work dir made as at `checkpoint`, or only `paths` (relative to it).
pub async fn restore(
    fleet: &Fleet,
    checkpoint: &str,
    paths: Vec<String>,
) -> Result<CopyView, String> {
    let (name, number) = parse(checkpoint)?;
    let (host, id) = isolated(fleet, name)?;
    match ask(&host, Request::SandboxRestore { id, number, paths })
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Restored(report) => Ok(report.into()),
        other => Err(unexpected("restoring", other).to_string()),
    }
}

/// The changes since `checkpoint` (the first of them, by path) and how
/// many more there are.
pub async fn diff(fleet: &Fleet, checkpoint: &str) -> Result<(Vec<ChangeView>, u64), String> {
    let (name, number) = parse(checkpoint)?;
    let (host, id) = isolated(fleet, name)?;
    match ask(&host, Request::SandboxDiff { id, number })
        .await
        .map_err(|e| e.to_string())?
    {
        Response::CheckpointDiff { changes, more } => Ok((
            changes
                .into_iter()
                .map(|c| ChangeView {
                    path: c.path,
                    change: match c.change {
                        Change::Added => "added",
                        Change::Changed => "changed",
                        Change::Removed => "removed",
                    },
                    size: c.size,
                    diff: c.diff,
                })
                .collect(),
            more,
        )),
        other => Err(unexpected("diffing", other).to_string()),
    }
}

/// A new sandbox on the same host with `name`'s settings and a copy of its
/// work dir.
pub async fn fork(fleet: &Fleet, name: &str) -> Result<SandboxView, String> {
    let (host, id) = isolated(fleet, name)?;
    sandbox_answer(&host, Request::SandboxFork { id }, "forking").await
}

pub async fn pause(fleet: &Fleet, name: &str, stop_clock: bool) -> Result<SandboxView, String> {
    let (host, id) = isolated(fleet, name)?;
    sandbox_answer(&host, Request::SandboxPause { id, stop_clock }, "pausing").await
}

pub async fn resume(fleet: &Fleet, name: &str) -> Result<SandboxView, String> {
    let (host, id) = isolated(fleet, name)?;
    sandbox_answer(&host, Request::SandboxResume { id }, "resuming").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names() {
        assert_eq!(parse("gpu1/sbx-1@3").unwrap(), ("gpu1/sbx-1", 3));
        for bad in ["gpu1/sbx-1", "gpu1/sbx-1@0", "sbx@2", "a/b@x"] {
            assert!(parse(bad).unwrap_err().contains("HOST/ID@N"), "{bad}");
        }
    }
}
